"""One rank's share of a graph on disk: each rank loads only its own edges and feature rows.

    partition.write_shards("shards/", x, edge_index, parts, y=y, train_mask=train)   # once, offline
    shard = partition.load_shard("shards/", rank)                                    # on each rank
    source = partition.NodeGNN("gcn", shard.x, shard.edge_index, widths, x_ids=shard.x_ids,
                               n_nodes=shard.n_nodes, cut=shard.cut)

As DistDGL's ``partition_graph`` does, the partition is made once and each part is
written on its own; a rank then never holds the whole edge list or feature matrix
(at friendster's size, 3.6B edges are 58 GB of int64 ids). Rank ``r``'s shard holds:

* ``edges``: the in-edges of its nodes, in the whole list's order (each neuron's
  inputs then come in the whole graph's order, so sums are the same), then the edges
  from its nodes to other ranks' (what it sends);
* ``x`` and ``x_ids``: the feature rows its neurons read (its nodes; for SAGE, whose
  first aggregation reads the neighbours' features, their sources too), ascending;
* ``y`` and ``train_mask`` of its nodes, ascending (the order of its outputs);
* the whole ``parts`` vector (one small integer per node) and ``meta.json`` (the node
  count, the rank count, whether any edge is cut, the number of classes, the
  partition's quality).

Files are ``.npy``, read whole (``np.load``): a rank's memory holds its share only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .partitioner import PartitionError, check_parts, partition_quality
from .plan import present

__all__ = ["Shard", "write_shards", "load_shard"]


@dataclass(frozen=True, eq=False)
class Shard:
    """One rank's share (module doc); ``nodes`` are the ids it owns, ascending."""

    rank: int
    world_size: int
    n_nodes: int
    cut: bool
    nodes: np.ndarray
    edge_index: np.ndarray
    x: np.ndarray
    x_ids: np.ndarray
    parts: np.ndarray
    y: np.ndarray | None
    train_mask: np.ndarray | None
    num_classes: int | None
    quality: dict


def write_shards(folder, x, edge_index, parts, *, y=None, train_mask=None, num_classes: int | None = None,
                 neighbour_features: bool = True) -> Path:
    """Write every rank's shard into ``folder`` (module doc); returns the folder.

    ``neighbour_features``: keep the features of the sources of a rank's in-edges too
    (SAGE's first aggregation reads them; GCN's reads computed rows only, and
    ``False`` keeps a GCN shard to its own nodes' features).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    x, edge_index = np.asarray(x), np.asarray(edge_index)
    n = x.shape[0]
    parts = check_parts(parts, n)
    world = int(parts.max()) + 1
    src, dst = edge_index
    reader, owner = parts[dst], parts[src]
    for rank in range(world):
        nodes = np.flatnonzero(parts == rank)
        into = reader == rank
        out = (owner == rank) & ~into
        edges = np.concatenate([edge_index[:, into], edge_index[:, out]], axis=1)
        read = np.concatenate([nodes, src[into]]) if neighbour_features else nodes
        x_ids = present(read, n)
        np.save(folder / f"edges{rank}.npy", edges)
        np.save(folder / f"x{rank}.npy", x[x_ids])
        np.save(folder / f"x_ids{rank}.npy", x_ids)
        if y is not None:
            np.save(folder / f"y{rank}.npy", np.asarray(y)[nodes])
        if train_mask is not None:
            np.save(folder / f"train{rank}.npy", np.asarray(train_mask)[nodes])
    np.save(folder / "parts.npy", parts.astype(np.int16 if world < 2**15 else np.int32))
    quality = partition_quality(edge_index, parts, world)
    meta = {"n_nodes": n, "world_size": world, "cut": bool(quality.edge_cut), "num_classes": num_classes,
            "labels": y is not None, "train_mask": train_mask is not None, "quality": quality.as_dict()}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def load_shard(folder, rank: int, world_size: int | None = None) -> Shard:
    """Rank ``rank``'s shard from ``folder``; ``world_size`` (the group's) must be the one it was written for."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise PartitionError(f"{folder}: no meta.json; write the shards with partition.write_shards first")
    meta = json.loads(meta_path.read_text())
    world = int(meta["world_size"])
    if world_size is not None and world_size != world:
        raise PartitionError(f"{folder}: the shards were written for {world} ranks, but the process group has "
                             f"{world_size}; write them again for {world_size} ranks")
    if not 0 <= rank < world:
        raise PartitionError(f"{folder}: rank {rank} is outside 0..{world - 1}")
    parts = np.load(folder / "parts.npy").astype(np.int64)
    return Shard(rank, world, int(meta["n_nodes"]), bool(meta["cut"]), np.flatnonzero(parts == rank),
                 np.load(folder / f"edges{rank}.npy"), np.load(folder / f"x{rank}.npy"),
                 np.load(folder / f"x_ids{rank}.npy"), parts,
                 np.load(folder / f"y{rank}.npy") if meta["labels"] else None,
                 np.load(folder / f"train{rank}.npy") if meta["train_mask"] else None,
                 meta["num_classes"], meta["quality"])
