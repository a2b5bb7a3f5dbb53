"""The data a template is grounded on: relations of ground facts, and the queries.

A :class:`Relation` holds the facts of one predicate as columns: one array per argument
(ints or strings: the constants), optionally an ``example`` column (the facts of different
examples never join; a relation without it holds in every example) and optionally
``values`` (one value per fact: a scalar, a vector or a matrix; without values every fact
has the value 1, a *unit* fact, so ``W . fact = W``: an embedding)::

    edge = Relation(args=(src, dst), example=graph_of_src)            # edge(J, I), unit facts
    feature = Relation(args=nodes, values=x, example=graph_of_node)    # feature(I) = x[i], a vector
    Relation.from_frame(df, args=["atom1", "atom2"], example="molecule", values="charge")

:class:`Query` lists the atoms whose values become the graph's outputs, in order.
SQL tables are described by :class:`~neurovec.sources.relational.sql.SQLRelation` instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .template import Constant, Literal, TemplateError, Variable

__all__ = ["Relation", "Query", "as_column"]


def as_column(values, what: str) -> np.ndarray:
    """A 1-D array of constants: integers (any int dtype) or strings; anything else is refused."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise TemplateError(f"{what}: expected a 1-D column (got shape {array.shape})")
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind in "US":
        return array.astype(str)
    if array.dtype.kind == "O":
        kinds = {type(v) for v in array.tolist()}
        if kinds <= {str}:
            return array.astype(str)
        if all(issubclass(k, (int, np.integer)) and not issubclass(k, bool) for k in kinds):
            return array.astype(np.int64)
        raise TemplateError(f"{what}: constants must all be ints or all strings (got {sorted(k.__name__ for k in kinds)})")
    if array.size == 0:
        return np.zeros(0, np.int64)
    raise TemplateError(f"{what}: constants must be ints or strings (got dtype {array.dtype})")


@dataclass(frozen=True, eq=False, init=False)
class Relation:
    """Ground facts of one predicate: ``args`` (one column per argument), ``values``, ``example``."""

    args: tuple
    values: np.ndarray | None
    example: np.ndarray | None
    size: int

    def __init__(self, args=(), values=None, example=None, *, size: int | None = None):
        """``args``: a ``(n, k)`` int array, a sequence of ``k`` columns, or one column (arity 1); ``()`` for a
        proposition (arity 0: then ``size``, ``example`` or ``values`` gives the number of facts)."""
        if isinstance(args, np.ndarray) and args.ndim == 2:
            columns = tuple(args[:, k] for k in range(args.shape[1]))
        elif isinstance(args, np.ndarray) and args.ndim == 1:
            columns = (args,)
        elif isinstance(args, (list, tuple)) and args and np.ndim(args[0]) == 0:
            columns = (args,)  # a list of constants: one column
        else:
            columns = tuple(args)
        columns = tuple(as_column(c, f"relation argument {k}") for k, c in enumerate(columns))
        lengths = {f"argument {k}": c.size for k, c in enumerate(columns)}
        if example is not None:
            example = as_column(example, "relation example column")
            lengths["example"] = example.size
        if values is not None:
            try:
                values = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError) as error:
                raise TemplateError(f"relation values must be numbers ({error})") from None
            if values.ndim == 0 or values.ndim > 3:
                raise TemplateError(f"relation values must have shape (n,), (n, d) or (n, r, c) (got {values.shape})")
            bad = ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                atom = ", ".join(str(c[k]) for c in columns if c.size > k)
                raise TemplateError(f"relation values: row {k} (the fact ({atom})) has a NaN or inf value "
                                    f"({values[k].tolist()}), and {int(bad.sum())} row(s) in all; a missing value "
                                    "is not a number a model can compute with: drop those facts or fill them in")
            lengths["values"] = values.shape[0]
        if size is not None:
            lengths["size"] = int(size)
        sizes = set(lengths.values())
        if len(sizes) > 1:
            listed = ", ".join(f"{name} {n}" for name, n in lengths.items())
            raise TemplateError(f"relation columns have different lengths ({listed}): every column holds one entry "
                                "per fact")
        if not sizes:
            raise TemplateError("a relation of arity 0 needs size=, example= or values= to say how many facts")
        object.__setattr__(self, "args", columns)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "example", example)
        object.__setattr__(self, "size", sizes.pop())

    @classmethod
    def from_frame(cls, frame, args=(), values=None, example: str | None = None) -> "Relation":
        """A relation from a pandas DataFrame: ``args`` column names, ``values`` a column name or a list of them (a
        vector per fact), ``example`` a column name."""
        if isinstance(args, str):
            args = [args]
        columns = [frame[name].to_numpy() for name in args]
        if values is not None:
            values = frame[values].to_numpy(dtype=np.float64) if isinstance(values, str) else \
                frame[list(values)].to_numpy(dtype=np.float64)
        return cls(columns, values, None if example is None else frame[example].to_numpy(), size=len(frame))

    @property
    def arity(self) -> int:
        return len(self.args)

    @property
    def value_shape(self) -> tuple:
        return () if self.values is None else tuple(self.values.shape[1:])

    def __repr__(self) -> str:
        kind = "unit" if self.values is None else f"values {self.value_shape}"
        return f"Relation({self.size} facts, arity {self.arity}, {kind}, " \
               f"{'per example' if self.example is not None else 'in every example'})"


@dataclass(frozen=True, eq=False)
class Query:
    """Output atoms of ``predicate``: one per row of ``args`` (a sequence of columns) in ``example``.

    ``example=None`` asks in every example (sorted by example id). A query literal with variables,
    ``R.h(V.X)``, asks for all atoms of ``h`` that the template derives, per example in constant order.
    """

    predicate: str
    args: tuple | None = None
    example: object = None
    pattern: tuple | None = None  # terms of a literal query (variables and constants)

    @classmethod
    def create(cls, item) -> "Query":
        if isinstance(item, Query):
            return item
        if isinstance(item, str):
            return cls(item, pattern=())
        if isinstance(item, Literal):
            if item.weight is not None or item.function is not None or item.hidden or item.special:
                raise TemplateError(f"query {item}: a query is a plain literal")
            return cls(item.name, pattern=item.terms)
        raise TemplateError(f"cannot read {item!r} as a query (expected R.name(...), a predicate name or Query)")

    @property
    def key(self) -> str:
        return f"{self.predicate}/{self.arity}"

    @property
    def arity(self) -> int:
        if self.pattern is not None:
            return len(self.pattern)
        return len(self.args or ())

    def describe(self) -> str:
        if self.pattern is not None:
            terms = ", ".join(str(t) for t in self.pattern)
            return f"{self.predicate}({terms})" if self.pattern else self.predicate
        return f"{self.predicate}/{self.arity}" if self.args else self.predicate

    @property
    def has_variables(self) -> bool:
        return self.pattern is not None and any(isinstance(t, Variable) for t in self.pattern)

    def constants(self) -> list:
        return [t.value for t in (self.pattern or ()) if isinstance(t, Constant)]
