"""One large graph with a label per node: what node-level templates and loaders share.

A :class:`NodeDataset` is PyG's ``Data`` for node classification as numpy arrays:
``x`` (nodes x features), ``edge_index`` (2 x edges, row 0 the source, row 1 the
target: a message flows from ``edge_index[0]`` to ``edge_index[1]``, as in PyG),
``y`` (one class per node) and boolean split masks. :func:`neurovec.datasets.planetoid.load_planetoid`
and :func:`neurovec.datasets.synthetic.rmat_dataset` make one; ``datasets.gcn/sage/gin``
take one and build a node-level model (one output per node, no readout).

Construction checks shapes and ranges and names the argument that is wrong (a
node index past the end, a mask of the wrong length, features of the wrong height).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._common import DatasetError

__all__ = ["NodeDataset", "in_csr", "k_hop", "induced_edges"]


@dataclass(frozen=True, eq=False)
class NodeDataset:
    """A graph with node features, node labels and train/validation/test masks (see the module doc)."""

    name: str
    x: np.ndarray
    edge_index: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    num_classes: int | None = None
    info: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        where = f"NodeDataset {self.name!r}"
        x = np.asarray(self.x)
        if x.ndim != 2:
            raise DatasetError(f"{where}: x must be a (nodes, features) matrix (got shape {x.shape})")
        if x.dtype.kind not in "fiu":
            raise DatasetError(f"{where}: x must hold real numbers (got dtype {x.dtype})")
        n = x.shape[0]
        edge_index = np.asarray(self.edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise DatasetError(f"{where}: edge_index must have shape (2, edges) (got {edge_index.shape})")
        if edge_index.dtype.kind not in "iu":
            raise DatasetError(f"{where}: edge_index must hold integer node ids (got dtype {edge_index.dtype})")
        if edge_index.size:
            low, high = int(edge_index.min()), int(edge_index.max())
            if low < 0 or high >= n:
                bad = low if low < 0 else high
                column = int(np.flatnonzero((edge_index == bad).any(axis=0))[0])
                raise DatasetError(f"{where}: edge_index column {column} names node {bad}, but x has {n} rows "
                                   f"(node ids are 0..{n - 1})")
        y = np.asarray(self.y)
        if y.shape != (n,):
            raise DatasetError(f"{where}: y must have one label per node, shape ({n},) (got {y.shape}); x has "
                               f"{n} rows")
        if y.dtype.kind not in "iu":
            raise DatasetError(f"{where}: y must hold integer class ids (got dtype {y.dtype})")
        if n and y.min() < 0:
            raise DatasetError(f"{where}: y holds a negative class id {int(y.min())}")
        classes = int(y.max()) + 1 if n else 0
        if self.num_classes is not None and self.num_classes < classes:
            raise DatasetError(f"{where}: num_classes={self.num_classes}, but y holds class {classes - 1}")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "edge_index", np.ascontiguousarray(edge_index, dtype=np.int64))
        object.__setattr__(self, "y", y.astype(np.int64, copy=False))
        object.__setattr__(self, "num_classes", classes if self.num_classes is None else int(self.num_classes))
        for name in ("train_mask", "val_mask", "test_mask"):
            mask = getattr(self, name)
            if mask is None:
                continue
            mask = np.asarray(mask)
            if mask.shape != (n,) or mask.dtype != np.bool_:
                raise DatasetError(f"{where}: {name} must be a boolean array of shape ({n},), one entry per "
                                   f"node (got {mask.dtype} {mask.shape})")
            object.__setattr__(self, name, mask)

    @property
    def n_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def node_features(self, use_attributes: bool = False) -> np.ndarray:
        """The feature matrix (the TU datasets' method, so templates read both alike)."""
        return self.x

    def split(self, name: str) -> np.ndarray:
        """The node ids of split ``train``, ``val`` or ``test``."""
        mask = getattr(self, f"{name}_mask", None) if name in ("train", "val", "test") else None
        if mask is None:
            raise DatasetError(f"NodeDataset {self.name!r} has no {name!r} split")
        return np.flatnonzero(mask)

    def __repr__(self) -> str:
        return (f"NodeDataset({self.name!r}, {self.n_nodes} nodes, {self.n_edges} edges, "
                f"{self.num_features} features, {self.num_classes} classes)")


def check_nodes(nodes, n: int, argument: str = "nodes") -> np.ndarray:
    """``nodes`` as a sorted-or-not int64 array of valid node ids; errors name ``argument``."""
    array = np.asarray(nodes)
    if array.ndim != 1 or array.size == 0:
        raise DatasetError(f"{argument} must be a non-empty 1-D array of node ids (got shape {array.shape})")
    if array.dtype.kind not in "iu":
        raise DatasetError(f"{argument} must hold integer node ids (got dtype {array.dtype})")
    bad = np.flatnonzero((array < 0) | (array >= n))
    if bad.size:
        raise DatasetError(f"{argument}[{int(bad[0])}] = {int(array[bad[0]])} is not a node: the graph has "
                           f"{n} nodes (ids 0..{n - 1})")
    return array.astype(np.int64, copy=False)


def in_csr(edge_index: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, sources)``: the sources of the edges into node ``i`` are ``sources[ptr[i]:ptr[i+1]]``."""
    src, dst = edge_index
    order = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    return ptr, src[order]


def k_hop(edge_index: np.ndarray, n: int, seeds: np.ndarray, hops: int) -> np.ndarray:
    """The seeds first (in their order), then every node with a path of at most ``hops`` edges into a seed.

    Level by level over the in-edges, whole arrays per level (no loop per node or edge).
    """
    ptr, sources = in_csr(edge_index, n)
    seen = np.zeros(n, dtype=bool)
    seen[seeds] = True
    order = [seeds]
    frontier = np.unique(seeds)
    for _ in range(hops):
        if frontier.size == 0:
            break
        starts, ends = ptr[frontier], ptr[frontier + 1]
        lengths = ends - starts
        flat = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())
        found = np.unique(sources[flat])
        found = found[~seen[found]]
        seen[found] = True
        order.append(found)
        frontier = found
    return np.concatenate(order)


def induced_edges(edge_index: np.ndarray, n: int, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges with both ends in ``nodes`` (distinct ids), relabelled to positions in ``nodes``.

    Returns ``(edge_index of the subgraph, ids of the kept edges)``; edges keep their order.
    """
    position = np.full(n, -1, dtype=np.int64)
    position[nodes] = np.arange(nodes.size)
    src, dst = position[edge_index[0]], position[edge_index[1]]
    kept = np.flatnonzero((src >= 0) & (dst >= 0))
    return np.stack([src[kept], dst[kept]]), kept
