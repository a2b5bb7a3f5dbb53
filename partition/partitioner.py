"""Node partitions of one graph: which rank owns each node, and how good the split is.

    parts = partition_nodes(edge_index, n_nodes, 4)          # METIS if pymetis is installed, else BFS blocks
    print(partition_quality(edge_index, parts, 4))             # edge cut, balance, halo rows per rank

``edge_index`` is a ``(2, E)`` integer array of directed edges ``src -> dst``: node
``dst`` reads node ``src`` (PyG's convention). A rank then owns its nodes' rows of
every layer and reads the rows of the sources of its nodes' in-edges: those owned
elsewhere are its *halo*, exchanged before each layer that reads them.

Methods (``method=``):

* ``"metis"``: METIS k-way edge-cut partitioning (``pymetis``, an optional extra:
  ``pip install pymetis``) of the undirected graph, without self loops and repeated
  edges, balancing the vertex weights ``1 + in-degree`` (one row and its edges:
  a rank's compute and memory).
* ``"bfs"``: breadth-first order over the undirected graph (each component from
  its lowest unvisited node, isolated nodes last), cut into runs of equal weight
  ``1 + in-degree``. Whole-array numpy, one step per BFS level; no extra needed.
* ``"contiguous"``: runs of consecutive node ids of equal weight (good when ids
  already follow locality, e.g. a graph stored in a crawl or community order).
* ``"auto"`` (default): ``"metis"`` where pymetis is installed, else ``"bfs"``.

Every method gives each of the ``n_parts`` ranks at least one node, and refuses
more ranks than nodes.
"""
from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import numpy as np

__all__ = ["METHODS", "PartitionError", "PartitionQuality", "partition_nodes", "partition_quality",
           "check_parts", "metis_available"]

logger = logging.getLogger(__name__)

METHODS = ("auto", "metis", "bfs", "contiguous")


class PartitionError(ValueError):
    """A partition that cannot be made or used: the message names the argument and what is wrong."""


def metis_available() -> bool:
    """Whether the optional ``pymetis`` package is importable."""
    return importlib.util.find_spec("pymetis") is not None


def _edges(edge_index, n_nodes: int, where: str = "edge_index") -> tuple[np.ndarray, np.ndarray]:
    edge_index = np.asarray(edge_index)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise PartitionError(f"{where}: expected an array of shape (2, E) (got shape {edge_index.shape})")
    if edge_index.size and edge_index.dtype.kind not in "iu":
        raise PartitionError(f"{where}: expected integer node ids (got {edge_index.dtype})")
    src, dst = edge_index
    if edge_index.size:
        low, high = int(edge_index.min()), int(edge_index.max())
        if low < 0 or high >= n_nodes:
            bad = low if low < 0 else high
            raise PartitionError(f"{where}: node id {bad} is outside 0..{n_nodes - 1} (n_nodes = {n_nodes})")
    return src, dst


def check_parts(parts, n_nodes: int, n_parts: int | None = None, where: str = "parts") -> np.ndarray:
    """``parts`` as an int64 array of one rank per node; a :class:`PartitionError` says what is wrong.

    ``n_parts`` (default: ``max(parts) + 1``) is the number of ranks it is meant for:
    every rank must own at least one node.
    """
    parts = np.asarray(parts)
    if parts.ndim != 1 or parts.shape[0] != n_nodes:
        raise PartitionError(f"{where}: expected one rank per node, {n_nodes} values (got an array of shape "
                             f"{parts.shape})")
    if parts.size and parts.dtype.kind not in "iu":
        raise PartitionError(f"{where}: expected integer ranks (got {parts.dtype})")
    parts = parts.astype(np.int64, copy=False)
    if n_parts is None:
        n_parts = int(parts.max()) + 1 if parts.size else 0
    if n_parts > n_nodes:
        raise PartitionError(f"{where}: {n_parts} ranks for a graph of {n_nodes} nodes; every rank must own at "
                             f"least one node, so use at most {n_nodes} ranks")
    bad = np.flatnonzero((parts < 0) | (parts >= n_parts))
    if bad.size:
        raise PartitionError(f"{where}: node {int(bad[0])} is given rank {int(parts[bad[0]])}, outside "
                             f"0..{n_parts - 1} ({n_parts} ranks)")
    sizes = np.bincount(parts, minlength=n_parts)
    if n_parts and sizes.min() == 0:
        raise PartitionError(f"{where}: rank {int(np.argmin(sizes))} owns no node; every one of the {n_parts} "
                             "ranks must own at least one")
    return parts


def partition_nodes(edge_index, n_nodes: int, n_parts: int, method: str = "auto", seed: int = 0) -> np.ndarray:
    """One rank in ``0..n_parts-1`` per node (int64), each rank owning at least one node.

    See the module doc for the methods. ``seed`` makes METIS reproducible (BFS and
    contiguous blocks are deterministic).
    """
    if method not in METHODS:
        raise PartitionError(f"method: unknown partitioning method {method!r} (expected one of {METHODS})")
    if not isinstance(n_parts, (int, np.integer)) or n_parts < 1:
        raise PartitionError(f"n_parts: expected a positive number of ranks (got {n_parts!r})")
    if n_parts > n_nodes:
        raise PartitionError(f"n_parts: {n_parts} ranks for a graph of {n_nodes} nodes; every rank must own at "
                             f"least one node, so use at most {n_nodes} ranks")
    src, dst = _edges(edge_index, n_nodes)
    if method == "auto":
        method = "metis" if metis_available() else "bfs"
    if n_parts == 1:
        return np.zeros(n_nodes, np.int64)
    weight = np.bincount(dst, minlength=n_nodes) + 1
    if method == "metis":
        parts = _metis(src, dst, n_nodes, n_parts, weight, seed)
    elif method == "bfs":
        parts = _cut(_bfs_order(src, dst, n_nodes), weight, n_parts)
    else:
        parts = _cut(np.arange(n_nodes), weight, n_parts)
    return check_parts(parts, n_nodes, n_parts, where=f"the {method} partition")


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: one in-place sort of a copy (numpy 2's ``np.unique`` hashes
    first, 7x slower here on millions of int64 keys)."""
    values = np.sort(values)
    if values.size > 1:
        values = values[np.concatenate([[True], values[1:] != values[:-1]])]
    return values


def _undirected(src: np.ndarray, dst: np.ndarray, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (starts, neighbours) of the undirected simple graph: both directions, no loops, no repeats."""
    keep = src != dst
    a = np.concatenate([src[keep], dst[keep]]).astype(np.int64)
    b = np.concatenate([dst[keep], src[keep]]).astype(np.int64)
    key = sorted_unique(a * n_nodes + b)  # sorted by (a, b): CSR order, repeats gone
    a, b = np.divmod(key, n_nodes)
    starts = np.zeros(n_nodes + 1, np.int64)
    np.cumsum(np.bincount(a, minlength=n_nodes), out=starts[1:])
    return starts, b


def _metis(src, dst, n_nodes, n_parts, weight, seed) -> np.ndarray:
    if not metis_available():
        raise PartitionError("method 'metis' needs the optional pymetis package (pip install pymetis); "
                             "method 'bfs' or 'contiguous' needs nothing")
    import pymetis

    starts, neighbours = _undirected(src, dst, n_nodes)
    adjacency = pymetis.CSRAdjacency(starts.astype(np.int32) if starts[-1] < 2**31 else starts,
                                     neighbours.astype(np.int32))
    result = pymetis.part_graph(n_parts, adjacency, vweights=weight.astype(np.int32),
                                options=pymetis.Options(seed=seed))
    parts = np.frombuffer(result.vertex_part, dtype=np.int64 if result.vertex_part.itemsize == 8 else np.int32)
    parts = parts.astype(np.int64)
    empty = np.flatnonzero(np.bincount(parts, minlength=n_parts) == 0)
    if empty.size:  # METIS may leave a part empty on tiny or disconnected graphs: give it nodes of the largest
        logger.info("METIS left %d of %d parts empty; moving nodes into them", empty.size, n_parts)
        for part in empty.tolist():
            largest = int(np.argmax(np.bincount(parts, minlength=n_parts)))
            parts[np.flatnonzero(parts == largest)[-1]] = part
    return parts


def _bfs_order(src, dst, n_nodes) -> np.ndarray:
    """Nodes in breadth-first order over the undirected graph, level by level in bulk.

    Each component starts from its lowest unvisited node; isolated nodes come last
    (they read nothing and nobody reads them, so they only balance the parts).
    """
    starts, neighbours = _undirected(src, dst, n_nodes)
    degree = np.diff(starts)
    visited = degree == 0
    candidates = np.flatnonzero(~visited)  # the seeds, in id order; a pointer walks them once
    order, position = [], 0
    while True:
        position = _next_unvisited(candidates, visited, position)
        if position == candidates.size:
            break
        frontier = candidates[position:position + 1]
        visited[frontier] = True
        while frontier.size:
            order.append(frontier)
            counts = degree[frontier]
            offsets = np.repeat(starts[frontier] - (np.cumsum(counts) - counts), counts)
            reached = neighbours[offsets + np.arange(offsets.size)]
            frontier = sorted_unique(reached[~visited[reached]])
            visited[frontier] = True
    order.append(np.flatnonzero(degree == 0))
    return np.concatenate(order)


def _next_unvisited(candidates: np.ndarray, visited: np.ndarray, position: int) -> int:
    """The first index from ``position`` on whose candidate is unvisited (or ``candidates.size``),
    scanning windows that double in size: the pointer passes every node once in all."""
    step = 1024
    while position < candidates.size:
        hits = np.flatnonzero(~visited[candidates[position:position + step]])
        if hits.size:
            return position + int(hits[0])
        position += step
        step = min(step * 2, 1 << 20)
    return candidates.size


def _cut(order: np.ndarray, weight: np.ndarray, n_parts: int) -> np.ndarray:
    """Cut ``order`` into ``n_parts`` consecutive runs of about equal total ``weight``, none empty."""
    n = order.size
    cumulative = np.cumsum(weight[order])
    bounds = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, n_parts) / n_parts, side="right")
    # Run k ends at bounds[k]: strictly increasing and leaving a node for every later run. With
    # shifted = bounds - k, that is shifted non-decreasing within 1..n - n_parts + 1.
    k = np.arange(n_parts - 1)
    shifted = np.clip(np.maximum.accumulate(bounds - k), 1, n - n_parts + 1)
    parts = np.empty(n, np.int64)
    parts[order] = np.repeat(np.arange(n_parts), np.diff(np.concatenate([[0], shifted + k, [n]])))
    return parts


@dataclass(frozen=True)
class PartitionQuality:
    """How good a node partition is for halo exchange (every run reports it).

    ``edge_cut``: directed edges whose ends are on different ranks (``cut_fraction`` of
    all). ``nodes``/``edges``: per rank, the nodes it owns and their in-edges (its
    rows and its share of each aggregation). ``halo``: per rank, the distinct nodes
    owned elsewhere that its nodes read: the rows it receives per exchanged layer.
    """

    n_parts: int
    n_edges: int
    edge_cut: int
    nodes: tuple[int, ...]
    edges: tuple[int, ...]
    halo: tuple[int, ...]
    method: str = ""

    @property
    def cut_fraction(self) -> float:
        return self.edge_cut / self.n_edges if self.n_edges else 0.0

    @property
    def node_imbalance(self) -> float:
        """Largest part over the mean part, in nodes (1.0 is perfect)."""
        return max(self.nodes) / (sum(self.nodes) / self.n_parts)

    @property
    def edge_imbalance(self) -> float:
        """Largest part over the mean part, in in-edges."""
        mean = sum(self.edges) / self.n_parts
        return max(self.edges) / mean if mean else 1.0

    def __str__(self) -> str:
        method = f" ({self.method})" if self.method else ""
        return (f"{self.n_parts} parts{method}: edge cut {self.edge_cut:,} of {self.n_edges:,} "
                f"({100 * self.cut_fraction:.1f}%), largest/mean part {self.node_imbalance:.3f} in nodes, "
                f"{self.edge_imbalance:.3f} in edges; halo rows per rank {list(self.halo)}")

    @classmethod
    def from_dict(cls, d: dict) -> "PartitionQuality":
        return cls(d["n_parts"], d["n_edges"], d["edge_cut"], tuple(d["nodes"]), tuple(d["edges"]), tuple(d["halo"]),
                   d.get("method", ""))

    def as_dict(self) -> dict:
        return {"n_parts": self.n_parts, "method": self.method, "n_edges": self.n_edges, "edge_cut": self.edge_cut,
                "cut_fraction": self.cut_fraction, "nodes": list(self.nodes), "edges": list(self.edges),
                "halo": list(self.halo), "node_imbalance": self.node_imbalance,
                "edge_imbalance": self.edge_imbalance}


def partition_quality(edge_index, parts, n_parts: int | None = None, method: str = "") -> PartitionQuality:
    """The edge cut, balance and halo rows of ``parts`` (see :class:`PartitionQuality`)."""
    parts = np.asarray(parts)
    n_nodes = parts.shape[0] if parts.ndim == 1 else -1
    parts = check_parts(parts, n_nodes, n_parts)
    n_parts = int(parts.max()) + 1 if n_parts is None else n_parts
    src, dst = _edges(edge_index, n_nodes)
    reader, owner = parts[dst], parts[src]
    crossing = reader != owner
    # Halo of rank r: distinct sources owned elsewhere read by r's nodes.
    halo_keys = sorted_unique(reader[crossing] * np.int64(n_nodes) + src[crossing])
    halo = np.bincount(halo_keys // n_nodes, minlength=n_parts)
    return PartitionQuality(n_parts, int(src.size), int(crossing.sum()),
                            tuple(np.bincount(parts, minlength=n_parts).tolist()),
                            tuple(np.bincount(reader, minlength=n_parts).tolist()), tuple(halo.tolist()), method)
