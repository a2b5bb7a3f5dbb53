"""neurovec's intermediate representation: a straight-line program of tensor ops.

Every value is a tensor of shape ``(count, *shape)``: ``count`` neurons (or
edges) of one value shape. A :class:`Program` is a list of :class:`Node` in
topological order; nodes name their inputs by node name. Large arrays (gather
indices, segment counts, fact values) live in ``Program.constants`` and nodes
refer to them by key, so nodes stay small and printable (the torch.fx
``get_attr`` idea).

Ops (``Node.attrs`` in brackets):

==============  =====================================================================
``FACT``        constant values [``const``; ``fact_layer``: the graph fact layer, if any]
``WEIGHTS``     weights stacked along axis 0 [``names``: graph weight names]
``CONCAT``      concatenation of ``srcs`` along axis 0
``GATHER``      ``x[index]`` along axis 0 [``index``: const key]
``SLICE``       ``x[start:stop:step]`` [``start``, ``stop``, ``step``]
``TILE``        the whole of ``x`` repeated ``times`` times: ``[a, b, a, b]`` [``times``]
``INTERLEAVE``  every row of ``x`` repeated ``times`` times: ``[a, a, b, b]`` [``times``]
``LINEAR``      per-row product ``W_e . x_e`` [``kind``: ``"matmul"`` or ``"mul"``;
                ``w_layout``, ``x_layout``: see below]
``REDUCE``      segment reduction of consecutive rows [``aggregation``, ``counts``: const key,
                ``kernel``: ``"scatter"``, ``"segment"``, ``"dense"``, ``"strided"``, ``"sparse_mm"``
                or ``"auto"`` (the engine's choice); ``index``: a fused gather, see below;
                optional ``coef``: const key of float64 per-row factors, sum and mean only:
                row e counts as ``coef[e] * x[e]`` (a weighted sparse matrix)]
``ADD``         ``x + b`` row by row (``b`` broadcasts over the value shape; a ``b`` of one
                row is added to every row)
``TRANSFORM``   elementwise / per-row function [``fn``]
``TRANSPOSE``   the columns of a one-row matrix value as rows: ``x[0].T``, ``(1, o, i)`` to ``(i, o)``
                (a weight's columns, which a sparse sum over a constant fact matrix gathers)
==============  =====================================================================

The attributes that name a constant, by op, are ``CONST_ATTRS`` (a node's ``consts``): the one way
to find what constants a node reads (never a guess from which string values are constant keys).

``Program.output`` names the node whose rows are the graph's outputs, in order. Nodes and programs
are frozen dataclasses, and a node's ``attrs`` are read-only (:class:`Attrs`): a pass makes new ones.

NOTE: [LINEAR broadcasting] A LINEAR node has ``count`` rows; each side has a
layout. ``"full"``: the side has ``count`` rows, row e pairs with row e.
``"tile"``: the side has ``c`` rows and row e uses row ``e % c`` (a repeated
sequence, thesis 5.2.3 "dimension 1"). ``"interleave"``: the side has ``c`` rows
and row e uses row ``e // (count / c)`` ("dimension 2"). Both sides may be
short at once (one tiled, one interleaved, ``c_w * c_x == count``): then the
product is an outer product over a ``(G1, G2)`` grid, ``count = G1 * G2``.

NOTE: [REDUCE kernels] ``scatter`` and ``segment`` reduce consecutive segments
of ``counts[j]`` rows (scatter_reduce vs. CSR kernels with a gather backward);
``dense`` needs equal counts ``k`` and reduces a ``(n, k, ...)`` view;
``strided`` also needs equal counts but its segment j is rows ``j, j + n,
j + 2n, ...``: a ``(k, n, ...)`` view reduced over axis 0 (thesis 5.2.9).
``sparse_mm`` fuses a gather into a sum or mean: the REDUCE reads rows
``index[e]`` of its source, as one sparse CSR matrix product (thesis 3.4). Any REDUCE with an
``index`` is such a sparse sum (``is_sparse_sum``). ``auto`` leaves the kernel to the engine that
runs the program (NOTE: [kernels chosen by the engine] in ``engines/torch_module.py``): a sparse
sum where it has an ``index``, else a reduction of consecutive segments.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

__all__ = ["Op", "Node", "Program", "IRError", "INDEXING", "REDUCE_KERNELS", "LAYOUTS", "CONST_ATTRS", "linear_grid",
           "users_of", "compact_index", "stored", "read_only", "is_sparse_sum", "shared_product", "fact_product_sides"]

REDUCE_KERNELS = ("scatter", "segment", "dense", "strided", "sparse_mm", "auto")
LAYOUTS = ("full", "tile", "interleave")


class Op(enum.Enum):
    FACT = "fact"
    WEIGHTS = "weights"
    CONCAT = "concat"
    GATHER = "gather"
    SLICE = "slice"
    TILE = "tile"
    INTERLEAVE = "interleave"
    LINEAR = "linear"
    REDUCE = "reduce"
    ADD = "add"
    TRANSFORM = "transform"
    TRANSPOSE = "transpose"


# Ops that only move rows around (no arithmetic).
INDEXING = frozenset({Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE, Op.CONCAT})


#: The attributes that name a constant (a key of ``Program.constants``), by op (``Node.consts``).
#: ``hcat``: the side-by-side fact matrix that ``fuse_fact_products`` records on an ADD.
CONST_ATTRS = {Op.FACT: ("const",), Op.GATHER: ("index",), Op.REDUCE: ("counts", "index", "coef"),
               Op.ADD: ("hcat",)}
_CONST_ATTRS = {op.name: attrs for op, attrs in CONST_ATTRS.items()}  # by name: no Python-level Enum hash


class IRError(RuntimeError):
    """An internal inconsistency in a program (a compiler bug, not a user error)."""


class Attrs(dict):
    """A node's attributes: a dict that cannot be changed once made. A pass that needs other
    attributes makes a new node: ``node.with_(attrs={**node.attrs, "kernel": "dense"})``."""

    def _frozen(self, *args, **kwargs):
        raise TypeError("a node's attrs cannot be changed: make a new node with node.with_(attrs=...)")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _frozen

    def __reduce__(self):  # pickle and copy build it whole, not key by key
        return (Attrs, (dict(self),))


@dataclass(frozen=True)
class Node:
    name: str
    op: Op
    srcs: tuple[str, ...]
    count: int
    shape: tuple[int, ...]
    # Compared (two GATHERs with different indices are different nodes), not hashed (a dict);
    # read-only (``Attrs``).
    attrs: Mapping = field(default_factory=dict, hash=False)
    layer: str = ""  # the graph layer this node was built for (for messages and printing)

    def __post_init__(self):
        if type(self.attrs) is not Attrs:
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        # The keys of the constants this node reads (``CONST_ATTRS``), in attribute order: made once
        # (passes ask for them per node and per constant made), in a loop (no generator calls).
        consts = ()
        for a in _CONST_ATTRS.get(self.op._name_, ()):
            if a in self.attrs:
                consts += (self.attrs[a],)
        object.__setattr__(self, "consts", consts)

    def with_(self, **changes) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True)
class Program:
    nodes: tuple[Node, ...]
    constants: dict[str, np.ndarray]
    weights: tuple  # the graph's Weight objects (values are the initial values)
    output: str
    # Every graph fact layer's value shape (rows included), and the layers declared
    # replaceable at call time: a dynamic layer may be dead code and still be passed.
    fact_shapes: dict = field(default_factory=dict, compare=False)
    dynamic_facts: tuple = ()

    def __post_init__(self):
        # Stored arrays are read-only (``read_only``): whoever made a writable one, and a program
        # unpickled or deep-copied (``__setstate__``), gets read-only views of it here.
        for array in self.constants.values():  # (a loop, not a generator: a program is made per pass)
            if array.flags.writeable:
                object.__setattr__(self, "constants", {k: read_only(a) for k, a in self.constants.items()})
                break

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__post_init__()

    def replace(self, **changes) -> "Program":
        return replace(self, **changes)

    def node(self, name: str) -> Node:
        return self.by_name()[name]

    def by_name(self) -> Mapping[str, Node]:
        """Every node by name, read-only: made once per program (a frozen program never changes;
        ``replace`` makes a new one), then a lookup, not a pass over all nodes, per call."""
        nodes = self.__dict__.get("_by_name")
        if nodes is None:  # (a plain dict in the cache: a program still pickles and deep-copies)
            nodes = self.__dict__["_by_name"] = {n.name: n for n in self.nodes}
        return MappingProxyType(nodes)

    def users(self) -> dict[str, list[str]]:
        """For every node, the names of the nodes that read it."""
        return users_of(self.nodes)

    def __str__(self) -> str:
        lines = []
        for n in self.nodes:
            consts = CONST_ATTRS.get(n.op, ())
            attrs = ", ".join(f"{k}={_short(v, self.constants.get(v) if k in consts else None)}"
                              for k, v in n.attrs.items())
            srcs = ", ".join(n.srcs)
            lines.append(f"%{n.name} = {n.op.name}({srcs}{'; ' if srcs and attrs else ''}{attrs})"
                         f" : ({n.count}, {', '.join(map(str, n.shape))})")
        lines.append(f"return %{self.output}")
        return "\n".join(lines)

    def verify(self, unchanged_since: "Program | None" = None) -> None:
        """Check shapes, ordering and index ranges; raises :class:`IRError`.

        ``unchanged_since``, an earlier program that verified: a node that is the same object
        there, reading the same node objects and the same constant arrays, is not checked again.
        Passes never change a node or a constant in place (they make new ones), so its checks
        would give the same answer. They scan its index arrays: after each of the 34 passes of
        a 100x PROTEINS compile that cost 0.8 s in all, though most passes change few nodes.
        """
        before = unchanged_since.by_name() if unchanged_since is not None else {}
        seen: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in seen:
                raise IRError(f"%{n.name} defined twice")
            for s in n.srcs:
                if s not in seen:
                    raise IRError(f"%{n.name} {n.op.name} reads %{s}, which is not defined before it")
            srcs = [seen[s] for s in n.srcs]
            if before.get(n.name) is not n or not self._reads_as_before(n, srcs, before, unchanged_since):
                self._check_node(n, srcs)
            seen[n.name] = n
        if self.output not in seen:
            raise IRError(f"output %{self.output} is not defined")

    def _reads_as_before(self, n: Node, srcs: list[Node], before: dict[str, Node], earlier: "Program") -> bool:
        """Does ``n`` read the same node objects and constant arrays here as in ``earlier``?"""
        return all(before.get(s.name) is s for s in srcs) and all(
            self.constants.get(k) is earlier.constants.get(k) for k in n.consts)

    def _check_node(self, n: Node, srcs: list[Node]) -> None:
        """One node's checks (its inputs ``srcs`` are defined before it)."""
        missing = [k for k in n.consts if k not in self.constants]
        if missing:
            raise IRError(f"%{n.name} {n.op.name} reads constant {missing[0]!r}, which the program lacks")
        if n.op is Op.CONCAT:
            if any(s.shape != n.shape for s in srcs) or sum(s.count for s in srcs) != n.count:
                raise IRError(f"%{n.name} CONCAT of mismatched inputs")
        elif n.op is Op.GATHER:
            index = self.constants[n.attrs["index"]]
            if index.shape != (n.count,) or (index.size and (index.min() < 0 or index.max() >= srcs[0].count)):
                raise IRError(f"%{n.name} GATHER index out of range for %{srcs[0].name} ({srcs[0].count} rows)")
        elif n.op is Op.SLICE:
            length = len(range(n.attrs["start"], n.attrs["stop"], n.attrs["step"]))
            if length != n.count or n.attrs["stop"] > srcs[0].count or n.attrs["start"] < 0:
                raise IRError(f"%{n.name} SLICE out of range for %{srcs[0].name}")
        elif n.op in (Op.TILE, Op.INTERLEAVE):
            if srcs[0].count * n.attrs["times"] != n.count:
                raise IRError(f"%{n.name} {n.op.name} count mismatch")
        elif n.op is Op.REDUCE:
            counts = self.constants[n.attrs["counts"]]
            kernel = n.attrs.get("kernel", "scatter")
            rows = srcs[0].count
            if kernel == "sparse_mm" and "index" not in n.attrs:
                raise IRError(f"%{n.name} REDUCE sparse_mm has no index")
            if "index" in n.attrs:
                if kernel not in ("sparse_mm", "auto"):
                    raise IRError(f"%{n.name} REDUCE with an index runs {kernel!r}, not a sparse sum")
                index = self.constants[n.attrs["index"]]
                if n.attrs["aggregation"] not in ("sum", "mean"):
                    raise IRError(f"%{n.name} REDUCE with an index (a sparse sum) only sums or averages")
                if index.size and (index.min() < 0 or index.max() >= rows):
                    raise IRError(f"%{n.name} REDUCE index out of range for %{srcs[0].name}")
                rows = index.size
            if counts.shape != (n.count,) or int(counts.sum()) != rows:
                raise IRError(f"%{n.name} REDUCE counts do not cover %{srcs[0].name}")
            if kernel not in REDUCE_KERNELS:
                raise IRError(f"%{n.name} REDUCE has unknown kernel {kernel!r}")
            if kernel in ("dense", "strided") and np.any(counts != counts[0]):
                raise IRError(f"%{n.name} REDUCE kernel {kernel!r} needs equal counts")
            if "coef" in n.attrs:
                coef = self.constants[n.attrs["coef"]]
                if n.attrs["aggregation"] not in ("sum", "mean") or coef.shape != (rows,) \
                        or not np.issubdtype(coef.dtype, np.floating):
                    raise IRError(f"%{n.name} REDUCE coef must be {rows} floats on a sum or mean")
        elif n.op is Op.LINEAR:
            linear_grid(n, srcs[0], srcs[1])  # raises on inconsistent layouts
        elif n.op is Op.TRANSPOSE:
            if srcs[0].count != 1 or len(srcs[0].shape) != 2 or (n.count, *n.shape) != srcs[0].shape[::-1]:
                raise IRError(f"%{n.name} TRANSPOSE of %{srcs[0].name} {(srcs[0].count, *srcs[0].shape)} "
                              f"is not ({n.count}, {', '.join(map(str, n.shape))})")
        elif n.op is Op.FACT and n.attrs.get("unit"):
            if n.shape != () or not np.all(self.constants[n.attrs["const"]] == 1.0):
                raise IRError(f"unit fact %{n.name} does not hold scalar ones")  # (thesis 5.2.8 A: nothing to build)
        elif n.op in (Op.ADD, Op.TRANSFORM):
            if srcs[0].count != n.count or (n.op is Op.ADD and srcs[1].count not in (1, n.count)):
                raise IRError(f"%{n.name} {n.op.name} inputs have row counts "
                              f"{[s.count for s in srcs]}, expected {n.count}")


def is_sparse_sum(node: Node) -> bool:
    """A REDUCE that reads the rows ``index[e]`` of its source: a fused gather and sum (or mean)."""
    return node.op is Op.REDUCE and "index" in node.attrs


def sparse_matrix(program: "Program", node: Node) -> tuple:
    """What defines the matrix of sparse sum ``node``: ``(mean, source rows, index, counts, coef or None)``.
    Two sums with equal such tuples (:func:`same_sparse_matrix`) read their sources through one matrix,
    which the module builds once."""
    return (node.attrs["aggregation"] == "mean", program.node(node.srcs[0]).count,
            *(None if node.attrs.get(key) is None else program.constants[node.attrs[key]]
              for key in ("index", "counts", "coef")))


def same_sparse_matrix(a: tuple, b: tuple) -> bool:
    """Whether two :func:`sparse_matrix` tuples define one matrix (arrays compared by value)."""
    return a[:2] == b[:2] and all(x is y or (x is not None and y is not None and x.shape == y.shape
                                             and np.array_equal(x, y)) for x, y in zip(a[2:], b[2:]))


def users_of(nodes) -> dict[str, list[str]]:
    """For every node of ``nodes``, the names of the nodes that read it (a reader reading twice twice)."""
    result: dict[str, list[str]] = {n.name: [] for n in nodes}
    for n in nodes:
        for s in n.srcs:
            result[s].append(n.name)
    return result


def compact_index(array) -> np.ndarray:
    """An integer array (gather index, counts) as the IR stores it: int32 where every value fits,
    else int64 -- half the memory, and torch's index_select and CSR kernels take int32 as is."""
    array = np.asarray(array)
    if array.dtype == np.int32:
        return np.ascontiguousarray(array)
    if array.size == 0 or (int(array.min()) >= -2**31 and int(array.max()) < 2**31):
        return np.ascontiguousarray(array, dtype=np.int32)
    return np.ascontiguousarray(array, dtype=np.int64)


def stored(array) -> np.ndarray:
    """A constant as a program stores it: integer arrays compacted (``compact_index``), others as
    given; read-only (``read_only``)."""
    array = np.asarray(array)
    return read_only(compact_index(array) if np.issubdtype(array.dtype, np.integer) else array)


def read_only(array: np.ndarray) -> np.ndarray:
    """``array`` itself if it is read-only, else a read-only view of it (its owner is left as it
    is: an engine may make a writable view again for a tensor it never writes)."""
    if not array.flags.writeable:
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def linear_grid(node: Node, w: Node, x: Node) -> tuple[int, int]:
    """The ``(G1, G2)`` grid of a LINEAR node (see NOTE: [LINEAR broadcasting])."""
    n = node.count
    layouts = {"w": (node.attrs.get("w_layout", "full"), w.count), "x": (node.attrs.get("x_layout", "full"), x.count)}
    g1 = g2 = None
    for layout, count in layouts.values():
        if layout not in LAYOUTS:
            raise IRError(f"%{node.name} LINEAR has unknown layout {layout!r}")
        if layout == "interleave":
            g1 = count
        elif layout == "tile":
            g2 = count
    if g1 is None and g2 is None:
        g1, g2 = n, 1
    elif g1 is None:
        g1 = n // g2 if g2 else 0
    elif g2 is None:
        g2 = n // g1 if g1 else 0
    for side, (layout, count) in layouts.items():
        expected = {"full": n, "tile": g2, "interleave": g1}[layout]
        if count != expected or g1 * g2 != n:
            raise IRError(f"%{node.name} LINEAR {side} side ({layout}, {count} rows) does not fit {n} rows")
    return g1, g2


def _short(value, array: np.ndarray | None) -> str:
    """An attribute's value for printing (``array``: the constant it names, if any)."""
    if array is not None:
        if array.size <= 8:
            return f"{value}={array.tolist()}"
        return f"{value}[{array.size}]"
    if isinstance(value, tuple) and len(value) > 4:
        return f"({value[0]!r}, ... {len(value)} names)"
    return repr(value)


def shared_product(node: Node, nodes: dict[str, Node]) -> bool:
    """A matrix product whose weight side is one row, shared by all rows (``x @ W.T``)."""
    if node.op is not Op.LINEAR or node.attrs["kind"] != "matmul":
        return False
    w, x = (nodes[s] for s in node.srcs)
    return w.count == 1 and x.count == node.count and len(w.shape) == 2


def fact_product_sides(add: Node, nodes: Mapping[str, Node], once: set[str], dynamic
                       ) -> list[tuple[Node, str | None]] | None:
    """Each side of ``add`` as ``(product, gather index key or None)`` where ``add`` is an ADD of two
    different values, each a shared-weight product over a whole static fact (``x @ W.T``, ``x`` a
    vector fact not in ``dynamic``), or a gather of one, with the ADD's rows and shape, each node
    read once (``once``); else None. ``fuse_fact_products`` makes such an addition one product over
    the facts side by side (GraphSAGE's first layer), which ``choose_kernels`` and ``merge_row_adds``
    leave in this form."""
    if add.op is not Op.ADD or add.srcs[0] == add.srcs[1]:
        return None
    sides = []
    for name in add.srcs:
        side, index = nodes[name], None
        if side.op is Op.GATHER and name in once:
            side, index = nodes[side.srcs[0]], side.attrs["index"]
        if side.name not in once or not shared_product(side, nodes) or side.attrs.get("x_layout", "full") != "full":
            return None
        x = nodes[side.srcs[1]]
        if (x.op is not Op.FACT or x.attrs.get("fact_layer") in dynamic or len(x.shape) != 1
                or (index is None and x.count != add.count) or side.shape != add.shape):
            return None
        sides.append((side, index))
    return sides
