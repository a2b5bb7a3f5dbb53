"""Whole-array relational algebra over int64 id columns: keys, joins, distinct rows, lookups.

Every function works on numpy arrays in bulk; none loops over rows in Python. Rows of
several columns are compared through one int64 *key* per row (:func:`row_keys`): a
mixed-radix number of the columns while it fits into 62 bits, re-densified with
``np.unique`` when it would not. Joins are sort-merge joins: the right side is sorted
once (``argsort``), each left key finds its run of equal right keys with two binary
searches, and the runs are expanded with ``repeat``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["row_keys", "stable_order", "join", "distinct", "distinct_rows", "unique_keys", "lookup", "expand_runs",
           "ColumnIndex"]

_LIMIT = 1 << 62


def row_keys(*tables: list) -> list[np.ndarray]:
    """One int64 key per row for each table (a list of equally long non-negative int columns; all tables have
    the same number of columns): two rows, of the same or different tables, get equal keys iff equal columns."""
    sizes = [(table[0].size if table else 0) for table in tables]
    n_columns = {len(table) for table in tables}
    if len(n_columns) != 1:
        raise ValueError(f"tables with different numbers of columns {sorted(n_columns)}")
    if not n_columns.pop():
        return [np.zeros(n, np.int64) for n in sizes]
    keys = [np.asarray(table[0], np.int64) for table in tables]
    bound = _bound([table[0] for table in tables])
    for c in range(1, len(tables[0])):
        columns = [np.asarray(table[c], np.int64) for table in tables]
        width = _bound(columns)
        if bound * width >= _LIMIT:
            keys, bound = _densify(keys)
            if bound * width >= _LIMIT:
                columns, width = _densify(columns)
        keys = [key * width + column for key, column in zip(keys, columns)]
        bound *= width
    return keys


def stable_order(key: np.ndarray, bound: int | None = None, dtype=np.int64) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` for integer keys, as ``dtype``. Non-negative keys below ``bound`` (below
    2**48 when no bound is given: row keys, ids) are sorted by an LSD radix sort, 16 bits a pass, each pass numpy's
    stable argsort of uint16 values (a counting sort): a few times faster than a merge sort of the int64 keys.
    Without a bound, other keys and small arrays go to numpy's merge sort. (Also ``compiler/grouping``'s sort.)"""
    key = np.asarray(key)
    if bound is None:
        if key.size < 256:
            return np.argsort(key, kind="stable").astype(dtype, copy=False)
        low, high = int(key.min()), int(key.max())
        if low < 0 or high >= 1 << 48:
            return np.argsort(key, kind="stable").astype(dtype, copy=False)
        bound = high + 1
    order = None
    shift = 0
    while True:   # by the lowest 16 bits, then stably by the next 16: ties keep the order of the bits below
        digit = np.right_shift(key, shift).astype(np.uint16)
        order = np.argsort(digit, kind="stable") if order is None else order[np.argsort(digit[order], kind="stable")]
        del digit
        order = order.astype(dtype, copy=False)
        shift += 16
        if bound <= 1 << shift:
            return order


def _bound(columns: list) -> int:
    """One more than the largest value of the columns (ids are non-negative)."""
    return max((int(c.max()) + 1 for c in columns if c.size), default=1)


def _densify(columns: list) -> tuple[list, int]:
    """The same equalities with values 0..k-1 (k = number of distinct values)."""
    distinct, inverse = np.unique(np.concatenate(columns), return_inverse=True)
    splits = np.cumsum([c.size for c in columns])[:-1]
    return np.split(inverse.reshape(-1).astype(np.int64), splits), int(distinct.size)


def expand_runs(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concat(arange(s, s + c) for s, c in zip(starts, counts))``, without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(total, dtype=np.int64)


def join(left_key: np.ndarray, right_key: np.ndarray, right_order: np.ndarray | None = None,
         right_unique: bool = False) -> tuple:
    """All pairs ``(i, j)`` with ``left_key[i] == right_key[j]``: two index arrays, grouped by ``i`` in left order
    and, within one ``i``, in right order. ``right_order`` (``argsort(right_key, kind="stable")``) may be cached;
    ``right_unique`` (no two right keys are equal) saves one binary search per left key."""
    if right_order is None:
        right_order = stable_order(right_key)
    sorted_right = right_key[right_order]
    if right_unique:
        if sorted_right.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        at = np.minimum(np.searchsorted(sorted_right, left_key, side="left"), sorted_right.size - 1)
        left = np.flatnonzero(sorted_right[at] == left_key)
        return left, right_order[at[left]]
    lo = np.searchsorted(sorted_right, left_key, side="left")
    hi = np.searchsorted(sorted_right, left_key, side="right")
    counts = hi - lo
    left = np.repeat(np.arange(left_key.size, dtype=np.int64), counts)
    right = right_order[expand_runs(lo, counts)]
    return left, right


def unique_keys(key: np.ndarray) -> np.ndarray:
    """The distinct values of ``key``, sorted. Hash-based where numpy has it (>= 2.3): then only the distinct values
    are sorted, which is much cheaper than sorting ``key`` when values repeat."""
    try:
        return np.sort(np.unique(key, sorted=False))
    except TypeError:  # numpy < 2.3: no hash-based unique
        return np.unique(key)


def distinct(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: the position of the first row of every distinct key, in increasing key order, and the
    distinct-key index of every row."""
    order = stable_order(key)
    sorted_key = key[order]
    new = np.ones(key.size, dtype=bool)
    new[1:] = sorted_key[1:] != sorted_key[:-1]
    inverse = np.empty(key.size, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


def distinct_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, inverse)``: a row (any one) of every distinct key, in increasing key order, and the distinct-key index
    of every row (keys non-negative). Where the keys are few next to the rows' number (ids, row keys of few
    constants), two scatters into a table of all values instead of a sort; else :func:`distinct`."""
    n = key.size
    high = int(key.max()) if n else -1
    if n == 0 or high >= 2 * n + 4096 or int(key.min()) < 0:
        return distinct(key)
    present = np.zeros(high + 1, bool)
    present[key] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    row = np.empty(high + 1, np.int64)
    row[key] = np.arange(n)   # where a key repeats, one of its rows stays (which one numpy does not say)
    return row[present], rank[key]


def lookup(table_key: np.ndarray, probe_key: np.ndarray, table_order: np.ndarray | None = None) -> np.ndarray:
    """For each probe, the row of ``table_key`` with that key (keys of the table are distinct), or -1."""
    if table_order is None:
        table_order = stable_order(table_key)
    sorted_table = table_key[table_order]
    if sorted_table.size == 0:
        return np.full(probe_key.size, -1, np.int64)
    k = np.minimum(np.searchsorted(sorted_table, probe_key), sorted_table.size - 1)
    found = sorted_table[k] == probe_key
    return np.where(found, table_order[k], -1)


class ColumnIndex:
    """The rows of a table grouped by one id column (values ``0 .. n_values - 1``), CSR style, for tables where each
    value occurs in one example only (a node or an atom id, typically): then a join on the example and that column
    needs no key and no binary search, just two gathers per left row (:meth:`join`).

    :meth:`build` returns None when some value occurs in two examples, or when ``n_values`` is large next to the
    table (the dense arrays would cost more than the binary searches they save)."""

    def __init__(self, ptr: np.ndarray, order: np.ndarray, example: np.ndarray, row: np.ndarray):
        self.ptr, self.order, self.example, self.row = ptr, order, example, row

    @classmethod
    def build(cls, column: np.ndarray, example: np.ndarray, n_values: int) -> "ColumnIndex | None":
        if n_values > 8 * column.size + 4096:
            return None
        if column.size < 2 or bool(np.all(column[1:] >= column[:-1])):  # often sorted already: atom ids
            order, sorted_column, sorted_example = np.arange(column.size), column, example
        else:
            order = stable_order(column)
            sorted_column, sorted_example = column[order], example[order]
        same_value = sorted_column[1:] == sorted_column[:-1]
        if np.any(same_value & (sorted_example[1:] != sorted_example[:-1])):
            return None
        ptr = np.zeros(n_values + 1, np.int64)
        np.cumsum(np.bincount(column, minlength=n_values), out=ptr[1:])
        value_example = np.full(n_values, -1, np.int64)
        value_example[sorted_column] = sorted_example
        row = np.full(n_values, -1, np.int64)   # a row of each value (its only one, for a unique join)
        row[sorted_column] = order
        return cls(ptr, order, value_example, row)

    def join(self, left_example: np.ndarray, left_value: np.ndarray, right_unique: bool = False) -> tuple:
        """All pairs ``(i, j)`` with equal example and value, ordered as :func:`join` orders them; ``i`` is None when
        it is every left row once, in order (a unique join that matched everything)."""
        if right_unique:  # a value's example is -1 when no row holds it (and examples are >= 0)
            row = self.row[left_value]
            hit = self.example[left_value] == left_example
            if hit.all():
                return None, row
            left = np.flatnonzero(hit)
            return left, row[left]
        start = self.ptr[left_value]
        counts = self.ptr[left_value + 1] - start
        counts[self.example[left_value] != left_example] = 0
        left = np.repeat(np.arange(left_value.size, dtype=np.int64), counts)
        return left, self.order[expand_runs(start, counts)]
