"""Constants and examples as int64 ids, and the data's relations as encoded fact tables.

Ids keep the order of the values (ints first, as themselves shifted to start at 0, then
strings in sorted order, as SQLite sorts them), so atoms numbered by their ids come out in
the same order whichever way the data arrived (numpy arrays, DataFrames or SQL).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .data import Relation
from .joins import row_keys, stable_order
from .template import Constant, TemplateError

__all__ = ["Vocabulary", "FactTable", "encode_relation"]


@dataclass(frozen=True)
class Vocabulary:
    """Constants -> ids: an int ``v`` is ``v - int_min``; the k-th smallest string is ``n_ints + k``."""

    int_min: int
    n_ints: int
    strings: np.ndarray
    _ids: dict = field(default_factory=dict, compare=False, repr=False)   # encode_one's answers

    @classmethod
    def of(cls, columns: list) -> "Vocabulary":
        ints = [c for c in columns if c.dtype.kind == "i" and c.size]
        strings = [c for c in columns if c.dtype.kind == "U" and c.size]
        lo = min((int(c.min()) for c in ints), default=0)
        hi = max((int(c.max()) for c in ints), default=-1)
        text = np.unique(np.concatenate(strings)) if strings else np.zeros(0, dtype=str)
        return cls(lo, hi - lo + 1, text)

    @property
    def size(self) -> int:
        return self.n_ints + int(self.strings.size)

    def encode(self, column: np.ndarray) -> np.ndarray:
        """Ids of the values of ``column``; -1 for a value the vocabulary does not hold."""
        if column.dtype.kind == "i":
            if column.size and self.int_min <= int(column.min()) and int(column.max()) - self.int_min < self.n_ints:
                return column - self.int_min   # all held (as a column of the data always is): no -1 to write
            ids = column - self.int_min
            return np.where((ids >= 0) & (ids < self.n_ints), ids, -1)
        if column.dtype.kind != "U":
            raise TemplateError(f"constants must be ints or strings (got dtype {column.dtype})")
        if not self.strings.size:
            return np.full(column.size, -1, np.int64)
        k = np.minimum(np.searchsorted(self.strings, column), self.strings.size - 1)
        return np.where(self.strings[k] == column, self.n_ints + k, -1).astype(np.int64)

    def encode_constants(self, values: list) -> None:
        """Encode the constants ``values`` (a template's, say) in two whole-array calls, one for the ints and one for
        the strings, so that :meth:`encode_one` finds them ready (a value of another type is left to it)."""
        ints = [v for v in values if type(v) is int and -(1 << 63) <= v < (1 << 63)]
        strings = [v for v in values if type(v) is str]
        for kind, group in ((int, ints), (str, strings)):
            if group:
                ids = self.encode(np.asarray(group, np.int64) if kind is int else np.asarray(group, str))
                self._ids.update(zip(((kind, v) for v in group), ids.tolist()))

    def encode_one(self, value) -> int:
        value = value.value if isinstance(value, Constant) else value
        key = (type(value), value)   # 1 and "1" (and True) are other constants
        if key not in self._ids:
            column = np.asarray([value])
            self._ids[key] = -1 if column.dtype.kind not in "iU" else \
                int(self.encode(column.astype(np.int64) if column.dtype.kind == "i" else column)[0])
        return self._ids[key]

    def decode(self, ids) -> list:
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            out.append(i + self.int_min if i < self.n_ints else str(self.strings[i - self.n_ints]))
        return out


@dataclass(eq=False)
class FactTable:
    """The encoded facts of one predicate, sorted by example, then arguments (in id order: the order SQL's
    ``ORDER BY`` gives too): per row its example, its argument ids and the row of its value."""

    predicate: str
    example: np.ndarray | None           # None in the SQL grounder: the facts stay in the database ...
    args: list | None
    value_row: np.ndarray
    values: np.ndarray | None            # (n_values, *shape); None: unit facts
    weights: list | None = None          # template facts: per value row, a weight name (None: a unit fact)
    sql: object = None                   # ... in this temporary table (an sa.table)

    @property
    def size(self) -> int:
        return int(self.value_row.size)


def encode_relation(name: str, relation: Relation, constants: Vocabulary, examples: Vocabulary,
                    scope: np.ndarray, weights: list | None = None) -> FactTable:
    """``relation`` in ids, restricted to the examples in ``scope`` (sorted example ids) and sorted.

    A relation without an example column holds in every example of the scope: its rows, sorted by arguments, are
    repeated in each, and the copies share their value rows (one fact neuron per row, not per copy).
    ``weights``: for template facts, the weight name of each row.
    """
    args = [constants.encode(c) for c in relation.args]
    values = relation.values
    if relation.example is None:
        n = relation.size
        key = row_keys([np.asarray(a, np.int64) for a in args])[0] if args else None
        order = _sorted_rows(key) if args else np.arange(n)
        args = [a[order] for a in args]
        values = values[order] if values is not None else None
        weights = [weights[k] for k in order.tolist()] if weights is not None else None
        example = np.repeat(scope, n)
        args = [np.tile(a, scope.size) for a in args]
        value_row = np.tile(np.arange(n, dtype=np.int64), scope.size)
        # Every example holds the same rows: a duplicate is one in the first copy, rows 0..n-1, found by their sorted
        # keys (check_duplicates names the first, as with the keys of all copies).
        key = key[order] if key is not None else None
    else:
        example = examples.encode(relation.example)
        if scope.size < examples.size:
            rows = np.flatnonzero(np.isin(example, scope))
            example, args = example[rows], [a[rows] for a in args]
            values = values[rows] if values is not None else None
        (key,) = row_keys([example] + args)
        distinct_in_order = key.size < 2 or bool(np.all(key[1:] > key[:-1]))   # often: nothing to sort or check
        if not distinct_in_order and not bool(np.all(key[1:] >= key[:-1])):
            order = stable_order(key)
            example, args, key = example[order], [a[order] for a in args], key[order]
            values = values[order] if values is not None else None
        value_row = np.arange(key.size, dtype=np.int64)
        if distinct_in_order:
            return FactTable(name, example, args, value_row, values, weights)
    table = FactTable(name, example, args, value_row, values, weights)
    check_duplicates(table, constants, examples, key)
    return table


def _sorted_rows(key: np.ndarray) -> np.ndarray:
    """The order that sorts the rows' keys (stable); the identity when already sorted."""
    if key.size < 2 or bool(np.all(key[1:] >= key[:-1])):
        return np.arange(key.size)
    return stable_order(key)


def check_duplicates(table: FactTable, constants: Vocabulary, examples: Vocabulary,
                     key: np.ndarray | None = None) -> None:
    """A ground atom given twice (in one example) is an error: NeuraLogic would silently keep the first value.
    The table is sorted, so a duplicate is next to its twin. ``key``: the rows' keys (:func:`row_keys` of the
    example and the arguments), when known, or those of its first rows when they hold every twin first found."""
    if table.size < 2:
        return
    if key is None:
        (key,) = row_keys([table.example] + table.args)
    twins = np.flatnonzero(key[1:] == key[:-1])
    if not twins.size:
        return
    row = int(twins[0])
    atom = ", ".join(map(str, constants.decode([a[row] for a in table.args])))
    name = table.predicate.rsplit("/", 1)[0]
    raise TemplateError(f"relation {table.predicate}: the fact {name}({atom}) is given twice in example "
                        f"{examples.decode([table.example[row]])[0]!r}")
