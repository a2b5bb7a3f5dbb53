"""Shared helpers for the dataset loaders and templates.

* :class:`DatasetError`: every malformed-input error of this package.
* :class:`Groups`: items (nodes, edges, bonds) grouped by the sample they belong
  to, and the vectorized selection of a sample list from them.
* :func:`csr`: turn a flat (owner, input...) edge list into the CSR order that
  :class:`neurovec.NeuronLayer` expects.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

__all__ = ["DatasetError", "Groups", "as_samples", "csr", "glorot", "WeightTable", "find_folder", "searched_roots"]


class DatasetError(ValueError):
    """A dataset file, database or sample list is malformed; the message says what and where."""


def find_folder(data_dir, cache: Path, candidates: Callable[[Path], list[Path]], marker: str) -> Path | None:
    """The first of ``candidates(root)`` that holds the file ``marker``, or None. The roots: ``data_dir``
    alone when given (a mistyped folder is never silently replaced), else ``$NEUROVEC_DATA``, then ``cache``."""
    if data_dir is not None:
        roots = [Path(data_dir).expanduser()]
    else:
        roots = [Path(p).expanduser() for p in [os.environ.get("NEUROVEC_DATA")] if p] + [cache]
    for root in roots:
        for folder in candidates(root):
            if (folder / marker).is_file():
                return folder
    return None


def searched_roots(cache: Path) -> str:
    """Where :func:`find_folder` looked without a ``data_dir``, for error messages."""
    return " and ".join(filter(None, [os.environ.get("NEUROVEC_DATA"), str(cache)]))


def as_samples(samples, n_samples: int, ids: Sequence[str] | None = None) -> np.ndarray:
    """Validate a sample list (``None`` = all samples in dataset order) as an int64 array.

    ``ids`` optionally names the samples, so that ``samples`` may be given by name.
    Repeats are allowed (the sample is then evaluated twice).
    """
    if samples is None:
        return np.arange(n_samples, dtype=np.int64)
    items = list(samples) if not isinstance(samples, np.ndarray) else samples
    if ids is not None and any(isinstance(s, str) for s in items):
        index = {name: i for i, name in enumerate(ids)}
        unknown = [s for s in items if isinstance(s, str) and s not in index]
        if unknown:
            raise DatasetError(f"unknown sample id {unknown[0]!r}")
        items = [index[s] if isinstance(s, str) else s for s in items]
    array = np.asarray(items)
    if array.ndim != 1 or array.size == 0:
        raise DatasetError(f"samples must be a non-empty 1-D list of sample indices (got shape {array.shape})")
    if not np.issubdtype(array.dtype, np.integer):
        raise DatasetError(f"samples must be integer indices (got dtype {array.dtype})")
    bad = np.flatnonzero((array < 0) | (array >= n_samples))
    if bad.size:
        raise DatasetError(f"sample {int(array[bad[0]])} (position {int(bad[0])}) is out of range: "
                           f"the dataset has {n_samples} samples")
    return array.astype(np.int64)


@dataclass(frozen=True)
class Groups:
    """Items grouped by sample: ``order[ptr[g]:ptr[g+1]]`` are the items of sample ``g``.

    ``local[i]`` is item ``i``'s position inside its sample, so that in a selection
    the k-th chosen sample's copy of item ``i`` sits at ``start[k] + local[i]``.
    """

    order: np.ndarray
    ptr: np.ndarray
    local: np.ndarray

    @classmethod
    def of(cls, group_of_item: np.ndarray, n_groups: int) -> "Groups":
        group_of_item = np.asarray(group_of_item, dtype=np.int64)
        order = np.argsort(group_of_item, kind="stable")
        ptr = np.zeros(n_groups + 1, dtype=np.int64)
        np.cumsum(np.bincount(group_of_item, minlength=n_groups), out=ptr[1:])
        local = np.empty_like(order)
        local[order] = np.arange(order.size) - ptr[group_of_item[order]]
        return cls(order, ptr, local)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.ptr)

    def take(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Items of ``samples`` concatenated in sample-list order.

        Returns ``(items, copy, start)``: the old item ids in the new order, for each
        the position ``k`` in ``samples`` it was selected for, and the new offset
        ``start[k]`` of every sample's first item.
        """
        sizes = self.sizes[samples]
        start = np.zeros(samples.size, dtype=np.int64)
        np.cumsum(sizes[:-1], out=start[1:])
        copy = np.repeat(np.arange(samples.size), sizes)
        # position within the sample, then shifted to the sample's block of `order`
        within = np.arange(copy.size) - start[copy]
        items = self.order[self.ptr[samples][copy] + within]
        return items, copy, start


def csr(owner: np.ndarray, n_owners: int, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sort edge columns by owning neuron (stable, so input order is kept).

    Returns ``(counts, *sorted columns)`` ready for :class:`neurovec.NeuronLayer`.
    """
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=n_owners)
    return (counts, *(np.asarray(c)[order] for c in columns))


def glorot(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Glorot-uniform matrix (a vector or scalar gets fan 1 on the missing side)."""
    fan_out, fan_in = (shape + (1, 1))[:2] if len(shape) < 2 else shape
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


class WeightTable:
    """Collects :class:`neurovec.Weight` objects and hands out their indices."""

    def __init__(self):
        from ..sources.graph import Weight
        self._weight_cls = Weight
        self.weights: list = []
        self._index: dict[str, int] = {}

    def add(self, name: str, value, learnable: bool = True) -> int:
        if name in self._index:
            raise DatasetError(f"weight {name!r} is defined twice")
        self._index[name] = len(self.weights)
        self.weights.append(self._weight_cls(name, np.asarray(value, dtype=np.float64), learnable))
        return self._index[name]

    def fixed_scalars(self, prefix: str, keys: np.ndarray, value_of) -> np.ndarray:
        """One fixed scalar weight per distinct key; returns the weight index of every key.

        ``value_of(distinct_keys)`` gives the values. Used for constants such as GCN's
        1/sqrt(deg_i deg_j): few distinct values, many edges.
        """
        distinct, inverse = np.unique(keys, return_inverse=True)
        values = np.asarray(value_of(distinct), dtype=np.float64)
        ids = np.array([self.add(f"{prefix}{k}", v, learnable=False)
                        for k, v in zip(distinct.tolist(), values.tolist())], dtype=np.int64)
        return ids[inverse.reshape(-1)]
