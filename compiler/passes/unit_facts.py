"""Thesis 5.2.8 unit facts: one shared unit row, and products with units dropped.

A unit fact multiplied by a weight yields the weight. Two passes:

``merge_unit_facts`` (5.2.10 step 1): every static unit FACT becomes one FACT
``unit`` of a single row (1.0). Gathers from a unit fact read row 0 of it; a
CONCAT that joins unit facts with other values keeps one ``unit`` row in their
place, and the gathers that read the CONCAT are re-indexed (when all its readers
are gathers; any other reader sees ``TILE(unit)`` with the old row count)::

    %f_u = FACT(const=ones[3], fact_layer='u', unit=True)  : (3)
    %x_cat = CONCAT(f_u, f_a)                              : (7)
    %x = GATHER(x_cat; index=[0, 2, 3, 6])                 : (4)
  becomes
    %unit = FACT(const=[1.0], unit=True)                   : (1)
    %x_cat = CONCAT(unit, f_a)                             : (5)
    %x = GATHER(x_cat; index=[0, 0, 1, 4])                 : (4)

``simplify_unit_linear`` (5.2.8 B): a LINEAR whose value side is all units (every
row read traces back to unit facts) is its weight side, broadcast to the
LINEAR's rows by its layout (``W . 1 = W``; W gets the same gradient)::

    %lin = LINEAR(w, x; kind='mul', w_layout='tile')       : (6, 3)   (w: 2 rows, x all units)
  becomes
    %lin = TILE(w; times=3)                                : (6, 3)

A side that mixes units and other values is left as it is: units are scalar
ones, which every product broadcasts (``product_shape``), so the mixed product
is computed exactly.

Thesis 5.2.8 A (materializing units) has nothing to build in this IR: units are
stored as scalar ones from the start, and the Vectorizer never mixes values of
different shapes on one side of a LINEAR (it splits them into shape groups,
5.2.10 step 7), so no unit ever needs to become a vector of ones or an identity
matrix; nor can a LINEAR of units on both sides have an unknown shape. That every
unit FACT still holds scalar ones is one of ``Program.verify``'s checks.
"""
from __future__ import annotations

import numpy as np

from ..indexing import static_fact
from ..ir import Node, Op, Program
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["merge_unit_facts", "simplify_unit_linear"]


def _static_units(program: Program, settings: Settings) -> list[Node]:
    return [n for n in program.nodes if static_fact(n, settings.dynamic_facts) and n.attrs.get("unit")]


def merge_unit_facts(program: Program, settings: Settings) -> Program:
    units = {n.name for n in _static_units(program, settings)}
    if not units or (len(units) == 1 and program.node(next(iter(units))).count == 1
                     and not program.node(next(iter(units))).attrs.get("fact_layer")):
        return program  # nothing to merge (or merged already)
    users = program.users()
    by_name = program.by_name()
    rw = Rewriter(program)
    unit = rw.emit(rw.fresh("unit"), Op.FACT, [], 1, (), "unit", const=rw.const("ones_unit", np.ones(1)),
                   fact_layer=None, unit=True)
    # CONCATs with unit parts that only gathers read: shrink them, remembering how rows move.
    remaps: dict[str, np.ndarray] = {}
    for node in program.nodes:
        if node.op is Op.CONCAT and any(s in units for s in node.srcs) \
                and all(by_name[u].op is Op.GATHER for u in users[node.name]) and node.name != program.output:
            remaps[node.name] = None
    for node in program.nodes:
        node = rw.take(node)
        if node.name in units:
            # Readers we do not re-index see the same rows: the unit row, repeated.
            if node.count == 1:
                rw.alias(node.name, unit.name)
            else:
                rw.emit(node.name, Op.TILE, [unit.name], node.count, (), node.layer, times=node.count)
        elif node.name in remaps:
            srcs, remap = _shrink_concat([by_name[s] for s in program.node(node.name).srcs], units,
                                         unit.name)
            remaps[node.name] = remap
            if len(srcs) == 1:
                rw.alias(node.name, srcs[0])
            else:
                rw.replace(node.with_(srcs=tuple(srcs), count=sum(1 if s == unit.name else by_name[s].count
                                                                   for s in srcs)))
        elif node.op is Op.GATHER and (program.node(node.name).srcs[0] in remaps
                                       or program.node(node.name).srcs[0] in units):
            old_src = program.node(node.name).srcs[0]
            index = rw.constants[node.attrs["index"]]
            index = remaps[old_src][index] if old_src in remaps else np.zeros_like(index)
            src = rw.resolve(old_src) if old_src in remaps else unit.name
            key = rw.const(node.attrs["index"], index)
            rw.replace(node.with_(srcs=(src,), attrs={**node.attrs, "index": key}))
        else:
            rw.keep(node)
    return rw.finish(keep_inputs=False)


def _shrink_concat(parts: list[Node], units: set[str], unit: str) -> tuple[list[str], np.ndarray]:
    """New parts of a CONCAT (all unit parts -> one unit row) and where each old row went."""
    srcs: list[str] = []
    pieces = []
    unit_row = None
    offset = 0
    for part in parts:
        if part.name in units:
            if unit_row is None:
                unit_row = offset
                srcs.append(unit)
                offset += 1
            pieces.append(np.full(part.count, unit_row, dtype=np.int64))
        else:
            srcs.append(part.name)
            pieces.append(np.arange(offset, offset + part.count, dtype=np.int64))
            offset += part.count
    return srcs, np.concatenate(pieces)


def simplify_unit_linear(program: Program, settings: Settings) -> Program:
    all_unit = _UnitRows(program, settings)
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.op is not Op.LINEAR:
            rw.keep(node)
            continue
        w, x = (rw.nodes[s] for s in node.srcs)
        layouts = node.attrs.get("w_layout", "full"), node.attrs.get("x_layout", "full")
        if x.shape == () and all_unit(x.name) and w.shape == node.shape:
            side, layout = w, layouts[0]
        elif w.shape == () and all_unit(w.name) and x.shape == node.shape:
            side, layout = x, layouts[1]
        else:
            rw.keep(node)
            continue
        times = node.count // side.count if side.count else 1
        if layout == "full" or times == 1:
            rw.alias(node.name, side.name)
        else:
            rw.emit(node.name, Op.TILE if layout == "tile" else Op.INTERLEAVE, [side.name], node.count, node.shape,
                    node.layer, times=times)
    return rw.finish()


class _UnitRows:
    """Whether every row of a node is a static unit (traced through indexing ops); memoized."""

    def __init__(self, program: Program, settings: Settings):
        self.nodes = program.by_name()
        self.constants = program.constants
        self.units = {n.name for n in _static_units(program, settings)}
        self.memo: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        if name not in self.memo:
            self.memo[name] = self._compute(self.nodes[name])
        return self.memo[name]

    def _compute(self, node: Node) -> bool:
        if node.op is Op.FACT:
            return node.name in self.units
        if node.op in (Op.SLICE, Op.TILE, Op.INTERLEAVE):
            return self(node.srcs[0])
        if node.op is Op.CONCAT:
            return all(self(s) for s in node.srcs)
        if node.op is Op.GATHER:
            src = self.nodes[node.srcs[0]]
            if self(src.name):
                return True
            if src.op is Op.CONCAT:  # only the unit parts read?
                flags = np.array([self(s) for s in src.srcs])
                if not flags.any():
                    return False
                ends = np.cumsum([self.nodes[s].count for s in src.srcs])
                part = np.searchsorted(ends, self.constants[node.attrs["index"]], side="right")
                return bool(np.all(flags[part]))
        return False
