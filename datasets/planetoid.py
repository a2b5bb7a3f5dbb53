"""The Planetoid citation graphs (Cora, CiteSeer, PubMed), read from their raw files as PyG reads them.

    cora = load_planetoid("Cora", data_dir="../shared/data/planetoid")   # or $NEUROVEC_DATA; else downloads
    cora.x, cora.edge_index, cora.y, cora.train_mask, cora.val_mask, cora.test_mask

The raw files (``ind.cora.x``, ``.tx``, ``.allx``, ``.y``, ``.ty``, ``.ally``,
``.graph``, ``.test.index``) are Python pickles of scipy sparse matrices, numpy
arrays and a dict of adjacency lists, as published with Planetoid (Yang et al.
2016). They are read with a restricted unpickler that builds only those types
(no scipy needed, and no other code a pickle could name runs).

**As PyG's** ``Planetoid(root, name)`` **(split "public"):**

* features: ``allx`` then ``tx`` stacked, and the test rows put back in the order
  of ``test.index`` (CiteSeer: test nodes missing from ``tx`` get zero rows), as
  float32; no normalisation (PyG's ``NormalizeFeatures`` is
  :func:`normalize_features`);
* labels: the argmax of ``ally`` then ``ty``, the test rows reordered alike;
* masks: train = the first ``len(y)`` nodes, validation the next 500, test the
  nodes of ``test.index``;
* edges: every ``(node, neighbour)`` of the adjacency lists, self loops removed,
  duplicates removed, sorted by (target, source): the same ``edge_index``.

Where the files are looked for: ``data_dir`` if given (and nowhere else), otherwise
``$NEUROVEC_DATA``, then the cache ``~/.cache/neurovec/planetoid``; inside each,
``NAME/raw/`` (PyG's layout), ``planetoid/NAME/raw/``, ``NAME/`` and the folder
itself. Only when no ``data_dir`` is given and nothing is found are the files
downloaded into the cache (a message through :mod:`logging`); offline that fails
with one line saying what to do.
"""
from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from ._common import DatasetError, find_folder, searched_roots
from .nodes import NodeDataset

__all__ = ["load_planetoid", "find_planetoid", "read_planetoid", "normalize_features", "PLANETOID_NAMES",
           "PLANETOID_URL", "DEFAULT_CACHE", "PlanetoidDownloadError"]

logger = logging.getLogger(__name__)

#: Canonical names (PyG's spelling) by lower-case name.
PLANETOID_NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"
DEFAULT_CACHE = Path.home() / ".cache" / "neurovec" / "planetoid"
SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
DOWNLOAD_TIMEOUT_S = 60
VALIDATION_NODES = 500


class PlanetoidDownloadError(DatasetError):
    """The raw files are not here and could not be downloaded."""


def _canonical(name: str) -> str:
    key = str(name).lower()
    if key not in PLANETOID_NAMES:
        raise DatasetError(f"unknown Planetoid dataset {name!r} (expected one of {', '.join(PLANETOID_NAMES.values())})")
    return PLANETOID_NAMES[key]


def _candidates(root: Path, name: str) -> list[Path]:
    return [root / name / "raw", root / "planetoid" / name / "raw", root / name, root]


def find_planetoid(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``ind.<name>.x`` (see the module doc for where it looks), or None."""
    name = _canonical(name)
    return find_folder(data_dir, DEFAULT_CACHE, lambda root: _candidates(root, name), f"ind.{name.lower()}.x")


def load_planetoid(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> NodeDataset:
    """Load Planetoid dataset ``name`` (``"Cora"``, ``"CiteSeer"``, ``"PubMed"``; any case), PyG's public split.

    With ``data_dir`` the files must be there (a mistyped folder is an error, never a
    download into it). Without it ``$NEUROVEC_DATA`` and the cache are searched, and
    if ``download`` the files are downloaded into the cache when missing.
    """
    name = _canonical(name)
    folder = find_planetoid(name, data_dir)
    if folder is not None:
        return read_planetoid(folder, name)
    if data_dir is not None:
        where = Path(data_dir).expanduser()
        looked = ", ".join(str(p) for p in _candidates(where, name))
        problem = "does not exist" if not where.exists() else f"has no ind.{name.lower()}.x"
        raise DatasetError(f"Planetoid dataset {name!r} not found: data_dir {str(where)!r} {problem} (looked in "
                           f"{looked}); leave data_dir out to use $NEUROVEC_DATA or download it into {DEFAULT_CACHE}")
    searched = searched_roots(DEFAULT_CACHE)
    if not download:
        raise DatasetError(f"Planetoid dataset {name!r} not found (looked in {searched}) and download=False")
    target = DEFAULT_CACHE / name / "raw"
    logger.warning("Planetoid dataset %r not found in %s: downloading it from %s into %s", name, searched,
                   PLANETOID_URL, target)
    _download(name, target)
    return read_planetoid(target, name)


def _download(name: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        for suffix in SUFFIXES:
            url = f"{PLANETOID_URL}/ind.{name.lower()}.{suffix}"
            path = Path(tmp) / f"ind.{name.lower()}.{suffix}"
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(path, "wb") as out:
                    shutil.copyfileobj(response, out)
            except urllib.error.HTTPError as error:
                raise PlanetoidDownloadError(f"could not download {url}: HTTP {error.code} {error.reason}") from None
            except (urllib.error.URLError, OSError) as error:
                reason = getattr(error, "reason", error)
                raise PlanetoidDownloadError(
                    f"could not download Planetoid dataset {name!r} from {url} ({reason}); offline? Put the raw "
                    f"files ind.{name.lower()}.* in {target} or pass data_dir") from None
        for path in Path(tmp).iterdir():
            path.replace(target / path.name)


# -- reading the pickles ------------------------------------------------------------------------------------
class _SparseRows:
    """What a pickled ``scipy.sparse.csr_matrix`` holds: ``data``, ``indices``, ``indptr``, ``_shape``."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def dense(self, path: Path) -> np.ndarray:
        try:
            shape = tuple(int(s) for s in self.__dict__.get("_shape", self.__dict__.get("shape")))
            data, indices, indptr = (np.asarray(self.__dict__[k]) for k in ("data", "indices", "indptr"))
        except (KeyError, TypeError) as error:
            raise DatasetError(f"{path}: not a CSR matrix as Planetoid stores it ({error})") from None
        if indptr.shape != (shape[0] + 1,) or indices.shape != data.shape or int(indptr[-1]) != data.size:
            raise DatasetError(f"{path}: inconsistent CSR matrix (shape {shape}, {data.size} values)")
        out = np.zeros(shape, dtype=np.float32)
        rows = np.repeat(np.arange(shape[0]), np.diff(indptr))
        np.add.at(out, (rows, indices), data.astype(np.float32))  # a repeated entry sums, as todense() does
        return out


try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct


class _Unpickler(pickle.Unpickler):
    """Builds numpy arrays, a CSR matrix stand-in, dicts and lists; refuses every other global."""

    def find_class(self, module: str, name: str):
        if module.startswith("scipy.sparse") and name == "csr_matrix":
            return _SparseRows
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name == "_reconstruct":
            return _reconstruct
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if module == "collections" and name in ("defaultdict", "OrderedDict"):
            import collections
            return getattr(collections, name)
        if module in ("__builtin__", "builtins") and name in ("list", "dict", "int", "set", "tuple"):
            import builtins
            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"the file names {module}.{name}, which a Planetoid file does not hold")


def _read(folder: Path, name: str, suffix: str):
    path = folder / f"ind.{name.lower()}.{suffix}"
    if not path.is_file():
        raise DatasetError(f"Planetoid dataset {name!r}: missing file {path}")
    if suffix == "test.index":
        try:
            return np.loadtxt(path, dtype=np.int64, ndmin=1)
        except ValueError as error:
            raise DatasetError(f"{path}: expected one node id per line ({error})") from None
    try:
        with open(path, "rb") as handle:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                value = _Unpickler(io.BytesIO(handle.read()), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, TypeError) as error:
        raise DatasetError(f"{path}: cannot be read as a Planetoid pickle ({error})") from None
    if suffix == "graph":
        if not isinstance(value, dict):
            raise DatasetError(f"{path}: expected a dict of adjacency lists (got {type(value).__name__})")
        return value
    if isinstance(value, _SparseRows):
        return value.dense(path)
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return value.astype(np.float32)
    raise DatasetError(f"{path}: expected a matrix (got {type(value).__name__})")


def read_planetoid(folder: str | os.PathLike, name: str) -> NodeDataset:
    """Read the raw files of ``name`` in ``folder`` (see the module doc for what PyG does alike)."""
    folder, name = Path(folder), _canonical(name)
    x, tx, allx, y, ty, ally, graph, test_index = (_read(folder, name, s) for s in SUFFIXES)
    test_file = folder / f"ind.{name.lower()}.test.index"
    if tx.shape[0] != ty.shape[0] or allx.shape[0] != ally.shape[0] or allx.shape[1] != tx.shape[1]:
        raise DatasetError(f"{folder}: ind.{name.lower()}.allx/.ally/.tx/.ty do not fit together "
                           f"(allx {allx.shape}, ally {ally.shape}, tx {tx.shape}, ty {ty.shape})")
    ordered = np.sort(test_index)
    if name == "CiteSeer":
        # Isolated test nodes are missing from tx/ty: zero rows at their places, as PyG does.
        span = int(test_index.max() - test_index.min()) + 1
        tx_full = np.zeros((span, tx.shape[1]), dtype=tx.dtype)
        ty_full = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        tx_full[ordered - test_index.min()] = tx
        ty_full[ordered - test_index.min()] = ty
        tx, ty = tx_full, ty_full
    features = np.concatenate([allx, tx])
    labels = np.concatenate([ally, ty]).argmax(axis=1).astype(np.int64)
    n = features.shape[0]
    bad = np.flatnonzero((test_index < 0) | (test_index >= n))
    if bad.size:
        raise DatasetError(f"{test_file}, line {int(bad[0]) + 1}: node {int(test_index[bad[0]])} is past the end "
                           f"({n} nodes)")
    features[test_index] = features[ordered]
    labels[test_index] = labels[ordered]
    edge_index = _edges(graph, n, folder / f"ind.{name.lower()}.graph")
    train = np.zeros(n, bool)
    train[:y.shape[0]] = True
    val = np.zeros(n, bool)
    val[y.shape[0]:y.shape[0] + VALIDATION_NODES] = True
    test = np.zeros(n, bool)
    test[test_index] = True
    return NodeDataset(name, features, edge_index, labels, train, val, test, num_classes=ally.shape[1],
                       info={"folder": str(folder)})


def _edges(graph: dict, n: int, path: Path) -> np.ndarray:
    keys = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
    lengths = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
    cols = np.fromiter((c for v in graph.values() for c in v), dtype=np.int64, count=int(lengths.sum()))
    rows = np.repeat(keys, lengths)
    for ids in (rows, cols):
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if bad.size:
            raise DatasetError(f"{path}: node {int(ids[bad[0]])} is past the end ({n} nodes)")
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    key = np.unique(cols * n + rows)           # sorted by (target, source), duplicates removed
    return np.stack([key % n, key // n])


def normalize_features(x: np.ndarray) -> np.ndarray:
    """Every row divided by its sum (rows summing to 0 stay 0): PyG's ``NormalizeFeatures``, in float64."""
    x = np.asarray(x, dtype=np.float64)
    total = x.sum(axis=1, keepdims=True)
    return np.divide(x, total, out=np.zeros_like(x), where=total != 0)
