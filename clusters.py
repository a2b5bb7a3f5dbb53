"""Cluster mini-batches on one large graph (Cluster-GCN, Chiang et al. 2019), each compiled once.

    build = functools.partial(datasets.gcn, ds, hidden=128, layers=3, subgraph="induced", seed=0)
    model = neurovec.MiniBatchModel(build)                          # build(samples=node ids) -> graph
    loader = ClusterLoader(model, ds, parts=50, clusters_per_batch=5, seed=0)
    for epoch in range(epochs):
        for batch in loader:                                        # a MiniBatch: .samples are node ids
            train = torch.as_tensor(ds.train_mask[batch.samples])
            loss = F.cross_entropy(model(batch)[train], y[batch.samples][train])
            ...

The nodes are partitioned into ``parts`` clusters (the partitioner of one graph across
processes, :func:`neurovec.partition.partition_nodes`: METIS through ``pymetis`` where it is
installed, else a numpy breadth-first partition; each balances rows plus in-edges), the
clusters are grouped into batches of ``clusters_per_batch`` (seeded), and each batch
is the subgraph **induced** by its nodes: the edges among them, nothing from
outside, GCN's degrees those of that subgraph (as Cluster-GCN normalises each
batch). Every batch is compiled once by the model (cached by its node list); each
epoch visits the batches in a new order. Nothing of a batch's k-hop neighbourhood
outside it is computed: that is the approximation (edges cut by the partition are
dropped during training), and why METIS, which cuts few edges, matters. For exact
outputs of a set of nodes, build with ``subgraph="k-hop"`` instead (their whole
``layers``-hop in-neighbourhood, with the whole graph's degrees), at the cost of that
neighbourhood, which on a skewed graph quickly becomes most of it.

Against neighbour sampling (GraphSAGE, PyG's ``NeighborLoader``): a sampler draws a
new neighbourhood per batch and step, so every batch would be a new graph and a new
compile; cluster batches are fixed subgraphs, compiled once and reused for every
epoch, and compute every node of a batch on all its in-batch neighbours (no sampling
variance) but none of the edges between batches. ``partitions=k`` cycles through
``k`` different groupings of the clusters into batches (epoch ``e`` uses grouping
``e % k``), for ``k`` times the compiles, as Cluster-GCN's random cluster grouping
does per epoch without recompiling forever.
"""
from __future__ import annotations

import logging
from typing import Iterator

import numpy as np

from .datasets.nodes import NodeDataset
from .loader import MiniBatch, MiniBatchModel
from .partition.partitioner import partition_nodes
from .progress import Progress

__all__ = ["ClusterLoader"]

logger = logging.getLogger(__name__)

COMPILE_PROGRESS_DELAY_S = 3.0


class ClusterLoader:
    """Batches of graph clusters, compiled by ``model``; iterate once per epoch (module doc).

    Args:
        model: a :class:`~neurovec.loader.MiniBatchModel` whose ``build(samples=node ids)``
            builds the induced subgraph (``datasets.gcn(ds, ..., subgraph="induced")``).
        ds: the :class:`~neurovec.datasets.nodes.NodeDataset` it is built from.
        parts: clusters of the partition; clusters_per_batch: clusters in one batch.
        seed: partition and grouping seed; method: ``"auto"``, ``"metis"``, ``"bfs"`` or ``"contiguous"``
            (:func:`neurovec.partition.partition_nodes`).
        partitions: how many groupings of clusters into batches epochs cycle through.
        membership: a precomputed cluster per node (then ``parts`` is its number of clusters).

    Batch membership is fixed across epochs (each batch compiled once, cached), the
    visiting order is new every epoch. ``batches(epoch)`` lists an epoch's node sets.
    """

    def __init__(self, model: MiniBatchModel, ds: NodeDataset, parts: int = 50, clusters_per_batch: int = 5,
                 shuffle: bool = True, seed: int = 0, method: str = "auto", partitions: int = 1,
                 membership: np.ndarray | None = None):
        if not isinstance(model, MiniBatchModel):
            raise TypeError(f"ClusterLoader needs a MiniBatchModel (got {type(model).__name__})")
        if clusters_per_batch < 1 or partitions < 1:
            raise ValueError(f"clusters_per_batch and partitions must be positive (got {clusters_per_batch}, "
                             f"{partitions})")
        self.model, self.ds = model, ds
        if membership is None:
            if not 1 <= parts <= ds.n_nodes:
                raise ValueError(f"parts must be between 1 and the {ds.n_nodes} nodes (got {parts})")
            membership = partition_nodes(ds.edge_index, ds.n_nodes, parts, method=method, seed=seed)
        membership = np.asarray(membership)
        if membership.shape != (ds.n_nodes,):
            raise ValueError(f"membership must give a cluster to each of the {ds.n_nodes} nodes "
                             f"(got shape {membership.shape})")
        self.membership = membership
        self.parts = int(membership.max()) + 1
        order = np.argsort(membership, kind="stable")
        cuts = np.searchsorted(membership[order], np.arange(1, self.parts))
        self.clusters = [c for c in np.split(order, cuts) if c.size]
        self.clusters_per_batch, self.shuffle, self.seed, self.partitions = clusters_per_batch, shuffle, seed, partitions
        self.epoch = 0

    def _grouping(self, p: int) -> list[np.ndarray]:
        ids = np.arange(len(self.clusters))
        if self.shuffle:
            ids = np.random.default_rng([self.seed, 2, p]).permutation(ids)
        groups = [ids[i:i + self.clusters_per_batch] for i in range(0, ids.size, self.clusters_per_batch)]
        return [np.sort(np.concatenate([self.clusters[c] for c in g])) for g in groups]

    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The node sets of ``epoch``'s batches, in visiting order."""
        epoch = self.epoch if epoch is None else epoch
        batches = self._grouping(epoch % self.partitions)
        if self.shuffle:
            batches = [batches[k] for k in np.random.default_rng([self.seed, 3, epoch]).permutation(len(batches))]
        return batches

    def edge_share(self) -> float:
        """The share of the graph's edges that some batch keeps (both ends in one batch) in the first grouping."""
        batch_of = np.empty(self.ds.n_nodes, dtype=np.int64)
        for k, nodes in enumerate(self._grouping(0)):
            batch_of[nodes] = k
        src, dst = self.ds.edge_index
        return float(np.mean(batch_of[src] == batch_of[dst])) if src.size else 1.0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._grouping(0))

    def __iter__(self) -> Iterator[MiniBatch]:
        batches = self.batches(self.epoch)
        self.epoch += 1
        compiled = []
        with Progress("neurovec compile cluster batches", len(batches), "batches", COMPILE_PROGRESS_DELAY_S) as bar:
            for k, nodes in enumerate(batches):
                bar.update(k, f"{nodes.size} nodes")
                compiled.append(self.model.batch(nodes))
        return iter(compiled)
