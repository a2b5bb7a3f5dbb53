"""Where the rows of a value come from: indexing chains and fixed scalar factors, traced on arrays.

Several passes need to see through the ops that only move rows around (GATHER,
SLICE, TILE, INTERLEAVE, CONCAT) and, optionally, through products with a
*fixed scalar* (a fixed weight or a static fact of shape ``()``), to the values
that are actually computed. :func:`trace_rows` answers, for every row ``r`` of a
node::

    node[r] = coef[r] * bases[which[r]][row[r]]

Example: with ``%g = GATHER(h; index=[2, 0, 2])`` and ``%p = LINEAR(c, g; kind='mul')``
where ``c`` is a gather of fixed scalars ``[0.5, 0.5, 0.25]``, ``trace_rows`` of ``%p``
gives ``bases=['h'], which=[0, 0, 0], row=[2, 0, 2], coef=[0.5, 0.5, 0.25]``.

Everything is computed on whole index arrays (one numpy op per IR node walked).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import Node, Op, Program

__all__ = ["Origins", "trace_rows", "constant_values", "layout_rows", "static_fact", "fixed_weights",
           "freeze_facts", "is_constant"]


@dataclass
class Origins:
    """``node[r] = coef[r] * bases[which[r]][row[r]]`` for every row ``r`` (see the module doc).

    ``which`` and ``coef`` may be read-only (broadcast zeros and ones): copy them to write."""

    bases: list[str]
    which: np.ndarray
    row: np.ndarray
    coef: np.ndarray
    scaled: bool = False                              # some fixed scalar factor was absorbed
    facts_used: set[str] = field(default_factory=set)  # FACT nodes whose values went into ``coef``

    def single_base(self) -> str | None:
        return self.bases[0] if len(self.bases) == 1 else None


def layout_rows(layout: str, side_count: int, count: int, rows: np.ndarray) -> np.ndarray:
    """Rows of one side of a LINEAR that its rows ``rows`` read (NOTE: [LINEAR broadcasting])."""
    if layout == "full":
        return rows
    if layout == "tile":
        return rows % side_count
    return rows // (count // side_count)  # interleave


def static_fact(node: Node, dynamic) -> bool:
    """A FACT whose values a pass may use (not replaceable at call time)."""
    return node.op is Op.FACT and node.attrs.get("fact_layer") not in dynamic


def fixed_weights(node: Node, learnable: dict[str, bool]) -> bool:
    """A WEIGHTS node whose every weight is fixed (a constant)."""
    return node.op is Op.WEIGHTS and not any(learnable[n] for n in node.attrs["names"])


def _step(node: Node, rows: np.ndarray, nodes: dict[str, Node]) -> np.ndarray:
    """Rows of the source of a SLICE, TILE or INTERLEAVE that its rows ``rows`` read."""
    a = node.attrs
    if node.op is Op.SLICE:
        return a["start"] + a["step"] * rows
    if node.op is Op.TILE:
        return rows % nodes[node.srcs[0]].count
    return rows // a["times"]  # INTERLEAVE


def constant_values(program: Program, nodes: dict[str, Node], name: str, rows: np.ndarray
                    ) -> tuple[np.ndarray, set[str]] | None:
    """The float64 values of rows ``rows`` of node ``name`` if they are compile-time constants
    reachable through indexing ops only (fixed weights, static facts), with the FACT nodes
    read; else None."""
    origins = trace_rows(program, nodes, name, rows)
    learnable = {w.name: w.learnable for w in program.weights}
    by_name = {w.name: w for w in program.weights}
    facts: set[str] = set()
    tables = []
    for base_name in origins.bases:
        base = nodes[base_name]
        if static_fact(base, program.dynamic_facts):
            tables.append(np.asarray(program.constants[base.attrs["const"]], dtype=np.float64))
            facts.add(base_name)
        elif fixed_weights(base, learnable):
            tables.append(np.stack([np.asarray(by_name[n].value, dtype=np.float64) for n in base.attrs["names"]]))
        else:
            return None
    if len(tables) == 1:  # one table: one gather, no masks (the common case, and edge-sized)
        return tables[0][origins.row], facts
    out = np.empty((rows.size,) + nodes[name].shape)
    for k, values in enumerate(tables):
        mine = origins.which == k
        out[mine] = values[origins.row[mine]]
    return out, facts


def trace_rows(program: Program, nodes: dict[str, Node], name: str, rows: np.ndarray | None = None, *,
               scalars: bool = False, see_through=None) -> Origins:
    """Trace rows ``rows`` (default: all) of node ``name`` to the nodes that compute them.

    Walks through GATHER, SLICE, TILE, INTERLEAVE and CONCAT; with ``scalars``, also
    through ``LINEAR(kind='mul')`` nodes one side of which is a fixed scalar
    (:func:`constant_values`), multiplying ``coef`` by it. ``see_through(node)``, if
    given, may refuse to walk through a node (it then becomes a base).

    ``row`` keeps the integer type of the index it came from (int32 where the program's is).
    """
    count = nodes[name].count if rows is None else len(rows)
    pieces: list[tuple[str, np.ndarray | None, np.ndarray, np.ndarray | None]] = []
    facts: set[str] = set()
    scaled = False

    # Edge-sized arrays are the cost here: ``pos is None`` stands for all rows in order,
    # ``r is None`` for every row of the current node, ``coef is None`` for factors of 1.
    def walk(current: str, pos, r, coef) -> None:
        nonlocal scaled
        node = nodes[current]
        if see_through is None or see_through(node):
            op = node.op
            if op is Op.GATHER:
                index = program.constants[node.attrs["index"]]
                return walk(node.srcs[0], pos, index if r is None else index[r], coef)
            if op in (Op.SLICE, Op.TILE, Op.INTERLEAVE):
                return walk(node.srcs[0], pos, _step(node, _rows(r, node.count), nodes), coef)
            if op is Op.CONCAT:
                r = _rows(r, node.count)
                pos = np.arange(r.size, dtype=np.int64) if pos is None else pos
                ends = np.cumsum([nodes[s].count for s in node.srcs])
                part = np.searchsorted(ends, r, side="right")
                for p in np.unique(part):
                    mine = part == p
                    walk(node.srcs[p], pos[mine], r[mine] - (ends[p] - nodes[node.srcs[p]].count),
                         None if coef is None else coef[mine])
                return None
            if op is Op.LINEAR and scalars and node.attrs["kind"] == "mul":
                step = _scalar_factor(program, nodes, node, _rows(r, node.count))
                if step is not None:
                    value_side, value_rows, factor, used = step
                    scaled = True
                    facts.update(used)
                    return walk(value_side, pos, value_rows, factor if coef is None else coef * factor)
        pieces.append((current, pos, _rows(r, node.count), coef))
        return None

    walk(name, None, None if rows is None else np.asarray(rows), None)
    # A recursive closure refers to itself (through its cell): without this, it and the edge-sized
    # pieces it saw would wait for the garbage collector (at 100x PROTEINS, over 500 MB).
    del walk
    bases = list(dict.fromkeys(p[0] for p in pieces))
    if len(pieces) == 1 and pieces[0][1] is None:  # one base, rows in order: nothing to scatter
        _, _, row, coef = pieces[0]
        # All zeros and all ones as read-only views: edge-sized arrays of them cost a memset each
        # (reduce_coefficients made six at 100x PROTEINS, 150 MB each).
        which = np.broadcast_to(np.int64(0), (count,))
        return Origins(bases, which, row, np.broadcast_to(1.0, (count,)) if coef is None else coef, scaled, facts)
    which = np.empty(count, dtype=np.int64)
    row = np.empty(count, dtype=np.result_type(*[p[2].dtype for p in pieces]) if pieces else np.int64)
    coef = np.empty(count)
    for base, pos, r, c in pieces:
        which[pos], row[pos], coef[pos] = bases.index(base), r, 1.0 if c is None else c
    return Origins(bases, which, row, coef, scaled, facts)


def _rows(r: np.ndarray | None, count: int) -> np.ndarray:
    """``r``, or all ``count`` rows where it is None."""
    return np.arange(count, dtype=np.int64) if r is None else r


def _scalar_factor(program: Program, nodes: dict[str, Node], node: Node, rows: np.ndarray):
    """For a ``LINEAR(kind='mul')`` with a fixed scalar side: (value side, its rows, factor, facts)."""
    w, x = (nodes[s] for s in node.srcs)
    layouts = (node.attrs.get("w_layout", "full"), node.attrs.get("x_layout", "full"))
    sides = [(w, layouts[0], x, layouts[1]), (x, layouts[1], w, layouts[0])]
    for scalar, s_layout, value, v_layout in sides:
        if scalar.shape != () or value.shape != node.shape:
            continue
        found = _scalar_values(program, nodes, scalar, layout_rows(s_layout, scalar.count, node.count, rows))
        if found is None:
            continue
        factor, facts = found
        return value.name, layout_rows(v_layout, value.count, node.count, rows), factor, facts
    return None


def _scalar_values(program: Program, nodes: dict[str, Node], scalar: Node, rows: np.ndarray):
    """:func:`constant_values` of rows ``rows`` of the fixed-scalar side ``scalar``. A side read
    more often than it has rows (a tiled weight gather: GCN's normalisation, 115k rows read by
    19M edges at 100x PROTEINS) is traced once per row, then indexed: one edge-sized gather fewer.
    Only over one base: its values and facts are those of any of its rows."""
    if rows.size > scalar.count and len(trace_rows(program, nodes, scalar.name).bases) == 1:
        found = constant_values(program, nodes, scalar.name, np.arange(scalar.count))
        return None if found is None else (found[0][rows], found[1])
    return constant_values(program, nodes, scalar.name, rows)


def freeze_facts(program: Program, names: set[str]) -> Program:
    """Input facts (FACT nodes ``names``) whose values a pass used are no longer replaceable at
    call time: they become plain constants of the module (as iso compression does), and are
    dropped where nothing reads them any more (they were kept only as inputs)."""
    if not names:
        return program
    read = {s for n in program.nodes for s in n.srcs} | {program.output}
    nodes = []
    for n in program.nodes:
        if n.name in names and n.attrs.get("fact_layer"):
            if n.name not in read:
                continue
            n = n.with_(attrs={**n.attrs, "fact_layer": None})
        nodes.append(n)
    used = {v for n in nodes for v in n.attrs.values() if isinstance(v, str)}
    constants = {k: v for k, v in program.constants.items() if k in used}
    return program.replace(nodes=tuple(nodes), constants=constants)


def is_constant(program: Program, nodes: dict[str, Node]) -> set[str]:
    """Names of the nodes computed from static facts and fixed weights only."""
    learnable = {w.name: w.learnable for w in program.weights}
    constant: set[str] = set()
    for node in nodes.values():
        if node.op is Op.FACT:
            if static_fact(node, program.dynamic_facts):
                constant.add(node.name)
        elif node.op is Op.WEIGHTS:
            if fixed_weights(node, learnable):
                constant.add(node.name)
        elif all(s in constant for s in node.srcs):
            constant.add(node.name)
    return constant
