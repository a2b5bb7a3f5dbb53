"""Loader for graph classification datasets in the raw TU Dortmund text format.

A dataset ``DS`` is a folder of comma-separated text files, one row per line:

* ``DS_A.txt``: the directed edges ``src, dst`` (1-based global node ids),
* ``DS_graph_indicator.txt``: the graph (1-based) of every node,
* ``DS_graph_labels.txt``: the class label of every graph,
* ``DS_node_labels.txt``: one or more integer label columns per node, if present,
* ``DS_node_attributes.txt``: real node attributes, if present,
* ``DS_edge_labels.txt`` / ``DS_edge_attributes.txt``: integer label columns / real
  attributes of every line of ``DS_A.txt``, if present.

Where the folder is looked for: the ``data_dir`` argument if given (and nowhere
else), otherwise the ``NEUROVEC_DATA`` environment variable, then the cache
``~/.cache/neurovec/tu``; inside each, ``NAME/``, ``NAME/raw/`` (PyG's layout) and
``tu/NAME[/raw]/`` are accepted. Only when no ``data_dir`` is given and nothing is
found is the dataset downloaded, into the cache, with a message through
:mod:`logging`; offline this fails with one line that says so.

**As PyG's** ``TUDataset`` **reads the files:**

* self loops in ``DS_A.txt`` are removed, and an edge listed twice is kept once;
* every node-label column is one-hot encoded, columns concatenated: a column's
  labels are shifted so that its smallest is 0, and its one-hot is
  ``max - min + 1`` wide; :meth:`TUDataset.node_features` puts real attributes
  (if asked for) first, then the one-hots;
* edge labels and attributes: :meth:`TUDataset.edge_features` is PyG's ``edge_attr``;
* graph labels become class indices ``0..k-1`` in sorted order of the raw labels;
* a graph id that no node names (real Fingerprint has 651) is a graph without nodes, except after the last
  node's graph, where the dataset ends (``DS_graph_labels.txt`` may list more graphs; their labels still
  count as classes). Both are logged. The GNN templates need a node per sample: pass
  ``samples=np.flatnonzero(ds.nodes.sizes > 0)``.

**Where neurovec differs, on purpose:**

* *Edge order*: edges keep the order of their first line in ``DS_A.txt``; PyG sorts
  them by (source, target). Only the order of a sum's terms differs.
* *Duplicated edges with labels*: PyG sums the features of the copies (an edge
  listed twice gets a 2 in its one-hot); neurovec keeps one copy, and refuses copies
  whose labels or attributes disagree.
* *Refused instead of read*: a value that is not a number, ``nan``/``inf``, a
  fractional id or label (PyG truncates ``1.7`` to 1), a file whose last line has
  no line break (a truncated file; PyG drops that line silently), and a label
  column whose one-hot would be mostly empty: wider than 64 columns and more than
  twice as wide as its number of distinct labels (one label of 100000 among 0..6
  would make PyG build 100001 columns). Errors name the file and the 1-based line.
* *An edge label carried only by removed self loops*, as the largest of its
  column, gets no one-hot column (PyG keeps an all-zero one).
* *Negative labels* are shifted like any other (as PyG does), with a warning
  through :mod:`logging`, since every other label's one-hot column moves too.
* *Nodes without labels or attributes* get one constant feature 1 (PyG: none).
* ``DS_graph_attributes.txt`` (regression targets) is not read.
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ._common import DatasetError, Groups, find_folder, searched_roots

__all__ = ["TUDataset", "TUFormatError", "TUDownloadError", "load_tu", "find_tu", "read_tu_folder",
           "DEFAULT_CACHE", "TU_URL"]

logger = logging.getLogger(__name__)

DEFAULT_CACHE = Path.home() / ".cache" / "neurovec" / "tu"
TU_URL = "https://www.chrsmrrs.com/graphkerneldatasets"  # the TU collection, as PyG downloads it
DOWNLOAD_TIMEOUT_S = 60

# A label column whose one-hot is wider than this, and more than twice as wide as its
# number of distinct labels, is refused (see the module doc).
SPARSE_LABELS_MIN_WIDTH = 64


class TUFormatError(DatasetError):
    """A TU dataset file is missing or malformed; the message names the file and line."""


class TUDownloadError(TUFormatError):
    """A TU dataset is not available locally and could not be downloaded."""


@dataclass(frozen=True, eq=False)
class TUDataset:
    """One TU dataset as numpy arrays (all ids 0-based).

    ``edge_index[:, e] = (src, dst)``: a message from node ``src`` to node ``dst``
    (TU files list both directions of undirected edges). ``graph_labels`` are class
    indices ``0..num_classes-1`` (the raw labels, e.g. -1/1, are kept in ``label_values``).
    ``node_labels`` is ``(n_nodes, columns)``, each column shifted to start at 0
    (a 1-D array is one column); ``edge_labels`` likewise, one row per edge.
    """

    name: str
    edge_index: np.ndarray
    graph_of_node: np.ndarray
    graph_labels: np.ndarray
    node_labels: np.ndarray | None
    node_attributes: np.ndarray | None
    label_values: np.ndarray = field(repr=False, default=None)
    edge_labels: np.ndarray | None = field(repr=False, default=None)
    edge_attributes: np.ndarray | None = field(repr=False, default=None)

    def __post_init__(self):
        for name in ("node_labels", "edge_labels"):
            labels = getattr(self, name)
            if labels is not None and np.ndim(labels) == 1:
                object.__setattr__(self, name, np.asarray(labels).reshape(-1, 1))

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
        """The number of classes: every raw label value, as PyG counts them (a label held only by graphs after the
        last one with nodes, which PyG and neurovec drop, still counts)."""
        if self.label_values is not None:
            return max(int(self.label_values.size), int(self.graph_labels.max()) + 1)
        return int(self.graph_labels.max()) + 1

    @property
    def num_node_labels(self) -> int:
        """The width of the one-hot node labels (all columns together), PyG's ``num_node_labels``."""
        return int(_label_widths(self.node_labels).sum())

    @property
    def num_edge_labels(self) -> int:
        return int(_label_widths(self.edge_labels).sum())

    def num_node_features(self, use_attributes: bool = False) -> int:
        """``node_features(use_attributes).shape[1]``, without building the matrix."""
        width = self.num_node_labels
        if use_attributes and self.node_attributes is not None:
            width += self.node_attributes.shape[1]
        return width or 1

    def node_features(self, use_attributes: bool = False) -> np.ndarray:
        """Node feature matrix ``(n_nodes, k)``, float64.

        One-hot node labels (every column); with ``use_attributes`` the real
        attributes come first (PyG's ``TUDataset(use_node_attr=True)`` column order).
        """
        parts = []
        if use_attributes and self.node_attributes is not None:
            parts.append(self.node_attributes)
        if self.node_labels is not None:
            parts.append(_one_hot(self.node_labels))
        if not parts:
            # No labels at all: a constant feature, so every node still has an input.
            parts.append(np.ones((self.n_nodes, 1)))
        return np.concatenate(parts, axis=1)

    def edge_features(self, use_attributes: bool = False) -> np.ndarray:
        """Edge feature matrix ``(n_edges, k)``: PyG's ``edge_attr`` (``use_edge_attr=use_attributes``).

        ``k`` is 0 if the dataset has no edge labels (and no attributes asked for).
        """
        parts = [np.zeros((self.n_edges, 0))]
        if use_attributes and self.edge_attributes is not None:
            parts.append(self.edge_attributes)
        if self.edge_labels is not None:
            parts.append(_one_hot(self.edge_labels))
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


def _label_widths(labels: np.ndarray | None) -> np.ndarray:
    """The one-hot width of every label column (labels start at 0)."""
    if labels is None or labels.size == 0:
        return np.zeros(0 if labels is None else labels.shape[1], np.int64)
    return labels.max(axis=0) + 1


def _one_hot(labels: np.ndarray) -> np.ndarray:
    """Each column one-hot encoded, the encodings side by side: ``(rows, sum of widths)``.

    Memory is rows x width; no identity matrix is built.
    """
    widths = _label_widths(labels)
    start = np.concatenate([[0], np.cumsum(widths)[:-1]])
    out = np.zeros((labels.shape[0], int(widths.sum())))
    out[np.arange(labels.shape[0])[:, None], labels + start] = 1.0
    return out


# -- locating and downloading ----------------------------------------------------------------

def _candidates(root: Path, name: str) -> list[Path]:
    return [root, root / name, root / name / "raw", root / "tu" / name, root / "tu" / name / "raw"]


def find_tu(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``name``'s raw files, or ``None`` if none of the candidates has them.

    With ``data_dir`` only that folder is searched; without it ``$NEUROVEC_DATA``, then the cache.
    """
    return find_folder(data_dir, DEFAULT_CACHE, lambda root: _candidates(root, name), f"{name}_A.txt")


def load_tu(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> TUDataset:
    """Load TU dataset ``name`` (e.g. ``"MUTAG"``).

    With ``data_dir`` the dataset must be there (a mistyped folder is an error, never
    a download into it). Without it, ``$NEUROVEC_DATA`` and the cache are searched,
    and if ``download`` the dataset is downloaded into the cache when missing.
    """
    folder = find_tu(name, data_dir)
    if folder is not None:
        return read_tu_folder(folder, name)
    if data_dir is not None:
        where = Path(data_dir).expanduser()
        looked = ", ".join(str(p) for p in _candidates(where, name))
        problem = "does not exist" if not where.exists() else f"has no {name}_A.txt"
        raise TUFormatError(f"TU dataset {name!r} not found: data_dir {str(where)!r} {problem} (looked in "
                            f"{looked}); give the folder that holds {name}/ (or tu/{name}/), or give no data_dir "
                            f"(no --data-dir) to search $NEUROVEC_DATA and {DEFAULT_CACHE}")
    searched = searched_roots(DEFAULT_CACHE)
    if not download:
        hint = "" if os.environ.get("NEUROVEC_DATA") else " ($NEUROVEC_DATA is not set)"
        raise TUFormatError(f"TU dataset {name!r} not found (looked in {searched}){hint}: set NEUROVEC_DATA to the "
                            f"folder that holds {name}/ or tu/{name}/ (e.g. NEUROVEC_DATA=../shared/data), pass "
                            "that folder as data_dir (--data-dir), or allow a download (download=True, --download)")
    logger.warning("TU dataset %r not found in %s: downloading it from %s into %s",
                   name, searched, TU_URL, DEFAULT_CACHE)
    return read_tu_folder(_download(name, DEFAULT_CACHE), name)


def _download(name: str, cache: Path) -> Path:
    """Fetch ``NAME.zip`` from the TU collection and unpack it into ``cache/NAME``."""
    url = f"{TU_URL}/{name}.zip"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        archive = Path(tmp) / f"{name}.zip"
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(archive, "wb") as out:
                shutil.copyfileobj(response, out)
        except urllib.error.HTTPError as error:
            raise TUDownloadError(f"could not download TU dataset {name!r} from {url}: HTTP {error.code} "
                                  f"{error.reason} (is the name right?)") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise TUDownloadError(f"could not download TU dataset {name!r} from {url} ({reason}); offline? "
                                  f"Put the raw files in {cache / name} or pass data_dir") from None
        try:
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(tmp)
        except zipfile.BadZipFile as error:
            raise TUDownloadError(f"the download of TU dataset {name!r} from {url} is not a zip file "
                                  f"({error})") from None
        found = find_tu(name, tmp)
        if found is None:
            raise TUDownloadError(f"the download of TU dataset {name!r} from {url} has no {name}_A.txt")
        target = cache / name
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(found), str(target))
    logger.warning("TU dataset %r downloaded into %s", name, target)
    return target


# -- reading ---------------------------------------------------------------------------------

def _read_numbers(path: Path, integer: bool, columns: int | None = None) -> np.ndarray:
    """The comma-separated numbers of ``path``, one row per line.

    Returns ``(lines, columns)``, int64 if ``integer`` else float64. Every problem
    (a wrong column count, a token that is not a number, ``nan``/``inf``, a fraction
    where an integer belongs, a missing final line break) names the file and the
    1-based line.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise TUFormatError(f"{path.name}: not a text file ({error})") from None
    if not text:
        return np.zeros((0, columns or 1), np.int64 if integer else np.float64)
    if not text.endswith("\n"):
        raise TUFormatError(f"{path.name}, line {text.count(chr(10)) + 1}: the last line has no line break, so "
                            "the file looks truncated (a cut-off line would be read as a wrong value); if the "
                            "file is complete, end it with a newline")
    lines = text.count("\n")
    try:  # numpy's C parser; on any problem the slow parse below finds the line for the message
        values = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64 if integer else np.float64,
                            ndmin=2, comments=None)
        if values.shape[0] != lines or (columns is not None and values.shape[1] != columns):
            raise ValueError("numpy skipped a blank line, or wrong column count")
        if integer:
            return values
    except ValueError:
        values = _parse_lines(path, text[:-1].split("\n"), columns)
    bad_rows = ~np.isfinite(values).all(axis=1)
    if integer:
        bad_rows |= (values != np.round(values)).any(axis=1) | (np.abs(values) > 2 ** 53).any(axis=1)
    if bad_rows.any():
        k = int(np.flatnonzero(bad_rows)[0])
        kind = "integers" if integer else "finite numbers"
        raise TUFormatError(f"{path.name}, line {k + 1}: expected {kind}, got {_line(text, k)!r:.80}")
    return values.astype(np.int64) if integer else values


def _line(text: str, k: int) -> str:
    """Line ``k`` (0-based) of ``text``, found without splitting the whole file."""
    start = 0
    for _ in range(k):
        start = text.index("\n", start) + 1
    return text[start:text.index("\n", start)]


def _parse_lines(path: Path, lines: list[str], columns: int | None) -> np.ndarray:
    """The slow, line-by-line parse: finds the first bad line for a message (or parses what numpy would not)."""
    expected = columns or lines[0].count(",") + 1
    rows = []
    for k, line in enumerate(lines):
        tokens = line.split(",")
        if not line.strip():
            raise TUFormatError(f"{path.name}, line {k + 1}: is empty")
        if len(tokens) != expected:
            raise TUFormatError(f"{path.name}, line {k + 1}: expected {expected} comma-separated values, got "
                                f"{len(tokens)} ({line!r:.80})")
        try:
            rows.append([float(token) for token in tokens])
        except ValueError:
            token = next(t for t in tokens if not _is_number(t))
            what = f"{token.strip()!r} is not a number" if line.strip() else "is empty"
            if line.strip() and not token.strip():
                what = f"a value is empty ({line!r:.80})"
            raise TUFormatError(f"{path.name}, line {k + 1}: {what}") from None
    return np.array(rows, dtype=np.float64).reshape(len(lines), expected)


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _require(path: Path) -> Path:
    if not path.is_file():
        raise TUFormatError(f"missing file {path}")
    return path


def _rows(path: Path, values: np.ndarray, expected: int, what: str) -> np.ndarray:
    if values.shape[0] != expected:
        raise TUFormatError(f"{path.name} has {values.shape[0]} lines, expected {expected} ({what})")
    return values


def _label_columns(path: Path, labels: np.ndarray) -> np.ndarray:
    """Shift every column to start at 0 (PyG); refuse a column whose one-hot would be mostly empty."""
    low, high = labels.min(axis=0), labels.max(axis=0)
    for c in range(labels.shape[1]):
        width = int(high[c] - low[c]) + 1
        distinct = np.unique(labels[:, c]).size
        where = f"{path.name}" + (f", column {c + 1}" if labels.shape[1] > 1 else "")
        low_line, high_line = int(np.argmin(labels[:, c])) + 1, int(np.argmax(labels[:, c])) + 1
        if width > SPARSE_LABELS_MIN_WIDTH and width > 2 * distinct:
            raise TUFormatError(
                f"{where}: labels range from {low[c]} (line {low_line}) to {high[c]} (line {high_line}), so their "
                f"one-hot encoding would be {width} columns wide, but only {distinct} distinct labels occur; "
                "TU labels are small consecutive integers: is the file corrupt?")
        if low[c] < 0:
            logger.warning("%s: negative label %d (line %d): as PyG does, the column's labels are shifted by %d, "
                           "so its one-hot has %d columns and label 0 is column %d",
                           where, low[c], low_line, -low[c], width, -low[c])
    return labels - low


def _dedupe_edges(edges: np.ndarray, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Lines of ``DS_A.txt`` to keep (no self loops, first copy of each edge), and each line's first copy."""
    key = edges[:, 0] * n_nodes + edges[:, 1]
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    first_copy = first[inverse.reshape(-1)]
    keep = np.flatnonzero((first_copy == np.arange(key.size)) & (edges[:, 0] != edges[:, 1]))
    return keep, first_copy


def _copies_agree(path: Path, values: np.ndarray, first_copy: np.ndarray, edges: np.ndarray, name: str) -> None:
    """Every repeated line of ``DS_A.txt`` must carry its first copy's labels / attributes."""
    differs = np.flatnonzero((values != values[first_copy]).any(axis=1))
    if differs.size:
        k = int(differs[0])
        f = int(first_copy[k])
        raise TUFormatError(f"{path.name}, lines {f + 1} and {k + 1}: edge {edges[k].tolist()} is listed twice in "
                            f"{name}_A.txt with different values ({values[f].tolist()} and "
                            f"{values[k].tolist()}); an edge is kept once, so its copies must agree")


def _note_empty_graphs(name: str, nodes_per_graph: np.ndarray, listed: int) -> None:
    """Log the graph ids that have no nodes (real Fingerprint has 651), kept or dropped as PyG's TUDataset does."""
    empty = np.flatnonzero(nodes_per_graph == 0)
    after = listed - nodes_per_graph.size
    if empty.size:
        logger.warning("%s: %d graph(s) have no nodes in %s_graph_indicator.txt (first: graph %d); as PyG's "
                       "TUDataset, they are read as graphs without nodes (the GNN templates need a node per sample: "
                       "pass samples=np.flatnonzero(ds.nodes.sizes > 0))", name, empty.size, name, int(empty[0]) + 1)
    if after:
        logger.warning("%s: %s_graph_labels.txt lists %d graph(s) after the last one with nodes (graph %d); as "
                       "PyG's TUDataset, the dataset ends at that graph (their labels still count as classes)",
                       name, name, after, nodes_per_graph.size)


def read_tu_folder(folder: str | os.PathLike, name: str) -> TUDataset:
    """Parse and validate the raw files of dataset ``name`` in ``folder`` (see the module doc)."""
    folder = Path(folder)
    file = lambda suffix: folder / f"{name}_{suffix}.txt"  # noqa: E731

    indicator = _read_numbers(_require(file("graph_indicator")), True, 1)[:, 0]
    n_nodes = indicator.size
    if n_nodes == 0:
        raise TUFormatError(f"{name}_graph_indicator.txt is empty")
    if indicator.min() < 1:
        line = int(np.argmin(indicator)) + 1
        raise TUFormatError(f"{name}_graph_indicator.txt, line {line}: graph id {indicator[line - 1]} < 1")
    n_graphs = int(indicator.max())
    graph_of_node = indicator - 1

    edges = _read_numbers(_require(file("A")), True, 2) - 1
    bad = np.flatnonzero(((edges < 0) | (edges >= n_nodes)).any(axis=1))
    if bad.size:
        raise TUFormatError(f"{name}_A.txt, line {bad[0] + 1}: node id out of range 1..{n_nodes} "
                            f"(got {(edges[bad[0]] + 1).tolist()})")
    crossing = np.flatnonzero(graph_of_node[edges[:, 0]] != graph_of_node[edges[:, 1]])
    if crossing.size:
        raise TUFormatError(f"{name}_A.txt, line {crossing[0] + 1}: edge joins nodes of different graphs")
    keep, first_copy = _dedupe_edges(edges, n_nodes)

    raw_labels = _read_numbers(_require(file("graph_labels")), True, 1)[:, 0]
    if raw_labels.size < n_graphs:
        _rows(file("graph_labels"), raw_labels, n_graphs, "one per graph")
    # Graph ids without nodes are read as PyG reads them: a graph with no nodes, except after the last node's graph,
    # where PyG's TUDataset ends (its labels still number the classes, as PyG's do).
    label_values, graph_labels = np.unique(raw_labels, return_inverse=True)
    graph_labels = graph_labels.reshape(-1)[:n_graphs]
    _note_empty_graphs(name, np.bincount(graph_of_node, minlength=n_graphs), raw_labels.size)

    def optional(suffix: str, integer: bool, rows: int, what: str) -> np.ndarray | None:
        path = file(suffix)
        return _rows(path, _read_numbers(path, integer), rows, what) if path.is_file() else None

    node_labels = optional("node_labels", True, n_nodes, "one per node")
    if node_labels is not None:
        node_labels = _label_columns(file("node_labels"), node_labels)
    node_attributes = optional("node_attributes", False, n_nodes, "one per node")

    per_edge = f"one per line of {name}_A.txt"
    edge_labels = optional("edge_labels", True, edges.shape[0], per_edge)
    if edge_labels is not None:
        _copies_agree(file("edge_labels"), edge_labels, first_copy, edges + 1, name)
        edge_labels = _label_columns(file("edge_labels"), edge_labels)[keep]
    edge_attributes = optional("edge_attributes", False, edges.shape[0], per_edge)
    if edge_attributes is not None:
        _copies_agree(file("edge_attributes"), edge_attributes, first_copy, edges + 1, name)
        edge_attributes = edge_attributes[keep]

    return TUDataset(name, np.ascontiguousarray(edges[keep].T), graph_of_node, graph_labels.astype(np.int64),
                     node_labels, node_attributes, label_values, edge_labels, edge_attributes)
