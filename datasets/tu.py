"""Loader for graph classification datasets in the raw TU Dortmund text format.

A dataset ``DS`` is a folder of comma-separated text files, one row per line:

* ``DS_A.txt``: the directed edges ``src, dst`` (1-based global node ids),
* ``DS_graph_indicator.txt``: the graph (1-based) of every node,
* ``DS_graph_labels.txt``: the class label of every graph,
* ``DS_node_labels.txt``: the (integer) label of every node, if present,
* ``DS_node_attributes.txt``: real node attributes, if present.

Where the folder is looked for, in order: the ``data_dir`` argument, the
``NEUROVEC_DATA`` environment variable, then the cache ``~/.cache/neurovec/tu``;
inside it ``NAME/``, ``NAME/raw/`` (PyG's layout) and ``tu/NAME[/raw]/`` are
accepted. If nothing is found the dataset is downloaded into the cache with
PyTorch Geometric's ``TUDataset``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ._common import DatasetError, Groups

__all__ = ["TUDataset", "TUFormatError", "load_tu", "find_tu", "DEFAULT_CACHE"]

DEFAULT_CACHE = Path.home() / ".cache" / "neurovec" / "tu"


class TUFormatError(DatasetError):
    """A TU dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True, eq=False)
class TUDataset:
    """One TU dataset as numpy arrays (all ids 0-based).

    ``edge_index[:, e] = (src, dst)``: a message from node ``src`` to node ``dst``
    (TU files list both directions of undirected edges). ``graph_labels`` are class
    indices ``0..num_classes-1`` (the raw labels, e.g. -1/1, are kept in ``label_values``).
    """

    name: str
    edge_index: np.ndarray
    graph_of_node: np.ndarray
    graph_labels: np.ndarray
    node_labels: np.ndarray | None
    node_attributes: np.ndarray | None
    label_values: np.ndarray = field(repr=False, default=None)

    @property
    def n_graphs(self) -> int:
        return int(self.graph_labels.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.graph_of_node.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.graph_labels.max()) + 1

    @property
    def num_node_labels(self) -> int:
        return 0 if self.node_labels is None else int(self.node_labels.max()) + 1

    def node_features(self, use_attributes: bool = False) -> np.ndarray:
        """Node feature matrix ``(n_nodes, k)``, float64.

        One-hot node labels; with ``use_attributes`` the real attributes come first
        (PyG's ``TUDataset(use_node_attr=True)`` column order).
        """
        parts = []
        if use_attributes and self.node_attributes is not None:
            parts.append(self.node_attributes)
        if self.node_labels is not None:
            parts.append(np.eye(self.num_node_labels)[self.node_labels])
        if not parts:
            # No labels at all: a constant feature, so every node still has an input.
            parts.append(np.ones((self.n_nodes, 1)))
        return np.concatenate(parts, axis=1)

    @cached_property
    def nodes(self) -> Groups:
        """The nodes grouped by graph."""
        return Groups.of(self.graph_of_node, self.n_graphs)

    @cached_property
    def edges(self) -> Groups:
        """The edges grouped by the graph of their source node."""
        return Groups.of(self.graph_of_node[self.edge_index[0]], self.n_graphs)

    def __repr__(self) -> str:
        return (f"TUDataset({self.name!r}, {self.n_graphs} graphs, {self.n_nodes} nodes, "
                f"{self.n_edges} edges, {self.num_classes} classes)")


def find_tu(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``name``'s raw files, or ``None`` if none of the candidates has them."""
    roots = [Path(data_dir)] if data_dir is not None else []
    if data_dir is None and os.environ.get("NEUROVEC_DATA"):
        roots.append(Path(os.environ["NEUROVEC_DATA"]))
    if data_dir is None:
        roots.append(DEFAULT_CACHE)
    for root in roots:
        for folder in (root, root / name, root / name / "raw", root / "tu" / name, root / "tu" / name / "raw"):
            if (folder / f"{name}_A.txt").is_file():
                return folder
    return None


def load_tu(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> TUDataset:
    """Load TU dataset ``name`` (e.g. ``"MUTAG"``), downloading it if no local copy exists."""
    folder = find_tu(name, data_dir)
    if folder is None:
        if not download:
            raise TUFormatError(f"TU dataset {name!r} not found (looked in {data_dir or 'NEUROVEC_DATA'} "
                                f"and {DEFAULT_CACHE})")
        folder = _download(name, Path(data_dir) if data_dir is not None else DEFAULT_CACHE)
    return read_tu_folder(folder, name)


def _download(name: str, root: Path) -> Path:
    """Fetch ``NAME.zip`` from the TU collection via PyG; files end up in ``root/NAME/raw``."""
    try:
        from torch_geometric.datasets import TUDataset as PygTUDataset
    except ImportError as error:
        raise TUFormatError(f"TU dataset {name!r} is not available locally and torch_geometric (needed to "
                            "download it) is not installed; pip install torch-geometric, or point "
                            "NEUROVEC_DATA at a folder with the raw files") from error
    root.mkdir(parents=True, exist_ok=True)
    PygTUDataset(str(root), name)
    folder = root / name / "raw"
    if not (folder / f"{name}_A.txt").is_file():
        raise TUFormatError(f"downloading TU dataset {name!r} did not produce {folder / (name + '_A.txt')}")
    return folder


def _read(path: Path, dtype, columns: int | None = None) -> np.ndarray:
    """Read a comma-separated numeric file with numpy; errors name the file."""
    try:
        array = np.loadtxt(path, delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as error:
        raise TUFormatError(f"{path.name}: malformed content ({error})") from None
    if columns is not None and array.size and array.shape[1] != columns:
        raise TUFormatError(f"{path.name}: expected {columns} comma-separated columns per line, "
                            f"got {array.shape[1]}")
    return array


def _require(path: Path) -> Path:
    if not path.is_file():
        raise TUFormatError(f"missing file {path}")
    return path


def read_tu_folder(folder: str | os.PathLike, name: str) -> TUDataset:
    """Parse and validate the raw files of dataset ``name`` in ``folder``."""
    folder = Path(folder)
    file = lambda suffix: folder / f"{name}_{suffix}.txt"  # noqa: E731

    indicator = _read(_require(file("graph_indicator")), np.int64, 1)[:, 0]
    n_nodes = indicator.size
    if n_nodes == 0:
        raise TUFormatError(f"{name}_graph_indicator.txt is empty")
    n_graphs = int(indicator.max())
    if indicator.min() < 1:
        line = int(np.argmin(indicator)) + 1
        raise TUFormatError(f"{name}_graph_indicator.txt, line {line}: graph id {indicator[line - 1]} < 1")
    present = np.bincount(indicator, minlength=n_graphs + 1)[1:]
    if np.any(present == 0):
        raise TUFormatError(f"{name}_graph_indicator.txt: graph {int(np.flatnonzero(present == 0)[0]) + 1} "
                            f"has no nodes (graph ids must be 1..{n_graphs} without gaps)")

    edges = _read(_require(file("A")), np.int64, 2)
    bad = np.flatnonzero(((edges < 1) | (edges > n_nodes)).any(axis=1))
    if bad.size:
        raise TUFormatError(f"{name}_A.txt, line {bad[0] + 1}: node id out of range 1..{n_nodes} "
                            f"(got {edges[bad[0]].tolist()})")
    edge_index = np.ascontiguousarray(edges.T - 1)
    graph_of_node = indicator - 1
    crossing = np.flatnonzero(graph_of_node[edge_index[0]] != graph_of_node[edge_index[1]])
    if crossing.size:
        raise TUFormatError(f"{name}_A.txt, line {crossing[0] + 1}: edge joins nodes of different graphs")

    raw_labels = _read(_require(file("graph_labels")), np.float64, 1)[:, 0]
    if raw_labels.size != n_graphs:
        raise TUFormatError(f"{name}_graph_labels.txt has {raw_labels.size} lines, expected {n_graphs} "
                            "(one per graph)")
    label_values, graph_labels = np.unique(raw_labels, return_inverse=True)

    node_labels = None
    if file("node_labels").is_file():
        labels = _read(file("node_labels"), np.int64)
        if labels.shape[0] != n_nodes:
            raise TUFormatError(f"{name}_node_labels.txt has {labels.shape[0]} lines, expected {n_nodes} "
                                "(one per node)")
        # Only the first label column is used; shift so the smallest label is 0 (as PyG does).
        node_labels = labels[:, 0] - labels[:, 0].min()

    node_attributes = None
    if file("node_attributes").is_file():
        node_attributes = _read(file("node_attributes"), np.float64)
        if node_attributes.shape[0] != n_nodes:
            raise TUFormatError(f"{name}_node_attributes.txt has {node_attributes.shape[0]} lines, "
                                f"expected {n_nodes} (one per node)")

    return TUDataset(name, edge_index, graph_of_node, graph_labels.astype(np.int64), node_labels,
                     node_attributes, label_values)
