"""Constants and examples as int64 ids, and the data's relations as encoded fact tables.

Ids keep the order of the values (ints first, as themselves shifted to start at 0, then
strings in sorted order, as SQLite sorts them), so atoms numbered by their ids come out in
the same order whichever way the data arrived (numpy arrays, DataFrames or SQL).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import Relation
from .joins import distinct, row_keys
from .template import Constant, TemplateError

__all__ = ["Vocabulary", "FactTable", "encode_relation"]


@dataclass(frozen=True)
class Vocabulary:
    """Constants -> ids: an int ``v`` is ``v - int_min``; the k-th smallest string is ``n_ints + k``."""

    int_min: int
    n_ints: int
    strings: np.ndarray

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
            ids = column - self.int_min
            return np.where((ids >= 0) & (ids < self.n_ints), ids, -1)
        if column.dtype.kind != "U":
            raise TemplateError(f"constants must be ints or strings (got dtype {column.dtype})")
        if not self.strings.size:
            return np.full(column.size, -1, np.int64)
        k = np.minimum(np.searchsorted(self.strings, column), self.strings.size - 1)
        return np.where(self.strings[k] == column, self.n_ints + k, -1).astype(np.int64)

    def encode_one(self, value) -> int:
        column = np.asarray([value.value if isinstance(value, Constant) else value])
        if column.dtype.kind not in "iU":
            return -1
        return int(self.encode(column.astype(np.int64) if column.dtype.kind == "i" else column)[0])

    def decode(self, ids) -> list:
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            out.append(i + self.int_min if i < self.n_ints else str(self.strings[i - self.n_ints]))
        return out


@dataclass(eq=False)
class FactTable:
    """The encoded facts of one predicate: per row its example, its argument ids and the row of its value."""

    predicate: str
    example: np.ndarray
    args: list
    value_row: np.ndarray
    values: np.ndarray | None            # (n_values, *shape); None: unit facts
    weights: list | None = None          # template facts: per value row, a weight name (None: a unit fact)
    order: np.ndarray | None = None      # the rows sorted by (example, args): also sorted by any prefix of them

    @property
    def size(self) -> int:
        return int(self.example.size)


def encode_relation(name: str, relation: Relation, constants: Vocabulary, examples: Vocabulary,
                    scope: np.ndarray) -> FactTable:
    """``relation`` in ids, restricted to the examples in ``scope`` (sorted example ids); a relation without an
    example column is repeated in every example of the scope (its copies share their value rows)."""
    args = [constants.encode(c) for c in relation.args]
    value_row = np.arange(relation.size, dtype=np.int64)
    if relation.example is None:
        n = relation.size
        example = np.repeat(scope, n)
        args = [np.tile(a, scope.size) for a in args]
        value_row = np.tile(value_row, scope.size)
    else:
        example = examples.encode(relation.example)
        keep = np.isin(example, scope) if scope.size < examples.size else np.ones(example.size, bool)
        if not keep.all():
            example, value_row = example[keep], value_row[keep]
            args = [a[keep] for a in args]
    table = FactTable(name, example, args, value_row, relation.values)
    check_duplicates(table, constants, examples)
    return table


def check_duplicates(table: FactTable, constants: Vocabulary, examples: Vocabulary) -> None:
    """A ground atom given twice (in one example) is an error: NeuraLogic would silently keep the first value."""
    if table.size < 2:
        return
    (key,) = row_keys([table.example] + table.args)
    table.order = np.argsort(key, kind="stable")
    ordered = key[table.order]
    if bool(np.all(ordered[1:] != ordered[:-1])):
        return
    first, inverse = distinct(key)
    counts = np.bincount(inverse)
    row = int(np.flatnonzero(counts[inverse] > 1)[0])
    atom = ", ".join(map(str, constants.decode([a[row] for a in table.args])))
    name = table.predicate.rsplit("/", 1)[0]
    raise TemplateError(f"relation {table.predicate}: the fact {name}({atom}) is given twice in example "
                        f"{examples.decode([table.example[row]])[0]!r}")
