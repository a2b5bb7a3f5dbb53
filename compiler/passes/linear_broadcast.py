"""Thesis 5.2.3 linear broadcasting: gather only the period of a repeating side, broadcast the rest.

A LINEAR node's sides are usually gathers of much shorter tensors. Where a side's row sequence
repeats -- "dimension 1" (the first ``p`` rows again and again, layout ``"tile"``) or "dimension 2"
(each of ``c`` rows repeated ``n / c`` times in a row, layout ``"interleave"``) -- it is enough to
gather the short sequence once; the product then broadcasts through reshapes (see NOTE: [LINEAR
broadcasting] in ``ir.py``; codegen turns one shared weight into a single GEMM)::

    before                                                  after
    %w = WEIGHTS(names=('conv.weight',)) : (1, 16, 7)       %w = WEIGHTS(...) : (1, 16, 7)
    %lin_w = GATHER(%w; index=[0, 0, ..., 0]) : (3371, 16, 7)
    %lin = LINEAR(%lin_w, %lin_x; kind='matmul')            %lin = LINEAR(%w, %lin_x; kind='matmul',
                                                                          w_layout='tile')

One tiled side and one interleaved side with ``l1 * l2 = n`` are applied together (an outer
product over an ``(l2, l1)`` grid). Of all the layouts that fit, the one with the smallest summed
gather length wins (a gather that would be the identity on its source costs nothing, since it is
dropped). Only row *indices* are compared, never values: the rewrite is purely structural, so it
keeps every output and gradient, also for dynamic facts.

The helpers here (resolving a side to ``(source, index)``, the periods of an index, the best
layout and its cost) are shared with the padding pass (``padding.py``), which reorders and pads
rows precisely so that this pass finds periods.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..grouping import equal_arrays, is_identity, run_block
from ..ir import Node, Op, Program, compact_index, users_of
from ..rewrite import unique_name
from ..settings import Settings

__all__ = ["broadcast_linear", "resolve_rows", "tile_period", "interleave_count", "SideRows", "Layout",
           "best_layout", "full_layout", "NodeEditor"]

# Ops whose rows are a fixed selection of their (single) source's rows.
_ROW_SELECTIONS = (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE)


# ---------------------------------------------------------------------------------------------
# Analysis: which rows of which source does a side read, and how do they repeat?
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SideRows:
    """Row ``e`` of a LINEAR side is row ``index[e]`` of node ``source`` (which has ``source_count`` rows)."""

    source: str
    index: np.ndarray
    source_count: int


def _selection_index(node: Node, constants: dict) -> np.ndarray:
    """The rows of its source that an indexing node selects, as an index array."""
    if node.op is Op.GATHER:
        # As stored (int32 where it fits): an int64 copy of every side's index was two edge-sized
        # arrays of the padding pass's peak at 100x PROTEINS (93 MB each).
        return constants[node.attrs["index"]]
    if node.op is Op.SLICE:
        return np.arange(node.attrs["start"], node.attrs["stop"], node.attrs["step"], dtype=np.int64)
    period = node.count // node.attrs["times"] if node.attrs["times"] else 0
    if node.op is Op.TILE:
        return np.tile(np.arange(period, dtype=np.int64), node.attrs["times"])
    return np.repeat(np.arange(period, dtype=np.int64), node.attrs["times"])  # INTERLEAVE


def resolve_rows(nodes: dict[str, Node], constants: dict, name: str) -> SideRows:
    """Follow a chain of row selections (gather of a tile of a slice ...) down to a computing node.

    Composing the chain exposes repetition that no single link shows (a gather of a tiled tensor).
    """
    node = nodes[name]
    index = None
    while node.op in _ROW_SELECTIONS:
        selected = _selection_index(node, constants)
        index = selected if index is None else selected[index]
        node = nodes[node.srcs[0]]
    if index is None:
        index = np.arange(node.count, dtype=np.int64)
    return SideRows(node.name, index, node.count)


def _prime_factors(n: int) -> list[int]:
    factors, f = [], 2
    while f * f <= n:
        while n % f == 0:
            factors.append(f)
            n //= f
        f += 1
    if n > 1:
        factors.append(n)
    return factors


def tile_period(index: np.ndarray) -> int:
    """The smallest ``p`` dividing ``len(index)`` with ``index[e] == index[e % p]`` ("dimension 1").

    The periods that divide n are exactly the multiples of the smallest one (two periods p, q <= n/2
    give the period gcd(p, q) by Fine and Wilf), so starting from n and dividing out one prime
    factor at a time while the result is still a period finds it in O(n log n).
    """
    n = len(index)
    period = n
    for factor in _prime_factors(n):
        candidate = period // factor
        # (The single-element test first rejects most candidates without a full comparison.)
        if index[candidate] == index[0] and equal_arrays(index[candidate:], index[:-candidate]):
            period = candidate
    return period


def interleave_count(index: np.ndarray) -> int:
    """The smallest ``c`` dividing ``len(index)`` such that ``index`` is ``c`` equal-value blocks.

    ("Dimension 2" repetition.) A block length r works iff it divides n and every position where
    the value changes, so the longest block is the gcd of those positions and n.
    """
    n = len(index)
    if n == 0:
        return 0
    return n // run_block(index[1:] != index[:-1], n)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class Layout:
    """A broadcast layout for both sides: which rows each side gathers, and the summed gather cost."""

    w_layout: str
    w_index: np.ndarray
    x_layout: str
    x_index: np.ndarray
    cost: int


def gather_cost(index: np.ndarray, source_count: int) -> int:
    """Rows a side gathers; none if the gather is the identity on its source (it will be dropped)."""
    if is_identity(index, source_count):
        return 0
    return len(index)


def full_layout(w: SideRows, x: SideRows) -> Layout:
    return Layout("full", w.index, "full", x.index,
                  gather_cost(w.index, w.source_count) + gather_cost(x.index, x.source_count))


def _short(index: np.ndarray, layout: str, count: int) -> np.ndarray:
    """The ``count`` rows a side keeps under ``layout``."""
    if layout == "tile":
        return index[:count]
    return index[::len(index) // count]  # interleave: the first row of each block


def best_layout(w: SideRows, x: SideRows) -> Layout:
    """The cheapest layout (thesis 5.2.3): ties keep the earlier one, so "full" wins when nothing helps.

    A side of ``n`` rows is always written ``"full"`` (codegen then uses a plain GEMM when the
    other side is a single row).
    """
    n = len(w.index)
    if n <= 1:
        return full_layout(w, x)
    periods = {"w": (tile_period(w.index), interleave_count(w.index)),
               "x": (tile_period(x.index), interleave_count(x.index))}
    candidates: list[tuple[str, int, str, int]] = [("full", n, "full", n)]
    for side, (tile, inter) in periods.items():
        for layout, count in (("tile", tile), ("interleave", inter)):
            if count < n:
                candidates.append((layout, count, "full", n) if side == "w" else ("full", n, layout, count))
    # One side tiled with l1 rows, the other interleaved with l2 = n / l1 rows: l1 must be a multiple
    # of the tiled side's period and l2 one of the interleaved side's block count.
    for tiled, interleaved in (("w", "x"), ("x", "w")):
        period, blocks = periods[tiled][0], periods[interleaved][1]
        if period * blocks > n or n % (period * blocks):
            continue
        for l1 in _divisors(n // (period * blocks)):
            l1 *= period
            l2 = n // l1
            if l1 == n or l2 == n:
                continue  # one side full: already a candidate above
            candidates.append(("tile", l1, "interleave", l2) if tiled == "w"
                              else ("interleave", l2, "tile", l1))
    best = None
    for w_layout, w_count, x_layout, x_count in candidates:
        w_index = w.index if w_layout == "full" else _short(w.index, w_layout, w_count)
        x_index = x.index if x_layout == "full" else _short(x.index, x_layout, x_count)
        cost = gather_cost(w_index, w.source_count) + gather_cost(x_index, x.source_count)
        if best is None or cost < best.cost:
            best = Layout(w_layout, w_index, x_layout, x_index, cost)
    return best


# ---------------------------------------------------------------------------------------------
# Editing: a small mutable view of a program for passes that rewrite node by node.
# ---------------------------------------------------------------------------------------------

class NodeEditor:
    """Nodes in order plus a constants copy, with fresh names and insertion; ``build()`` makes the Program."""

    def __init__(self, program: Program):
        self.program = program
        self.nodes: list[Node] = list(program.nodes)
        self.constants = dict(program.constants)
        self.changed = False
        self._taken = {n.name for n in program.nodes} | set(program.constants)

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def users(self) -> dict[str, list[str]]:
        return users_of(self.nodes)

    def fresh(self, base: str) -> str:
        return unique_name(base, self._taken)

    def const(self, base: str, array: np.ndarray) -> str:
        key = self.fresh(base)
        array = compact_index(array)
        # A slice of another index (split_by_runs) is copied: a view would keep all of its base alive.
        self.constants[key] = array.copy() if array.base is not None else array
        return key

    def gather(self, base: str, source: Node, index: np.ndarray, layer: str) -> Node:
        """A new GATHER node (not yet placed) of ``source`` rows ``index``."""
        key = self.const(f"idx_{base}", index)
        return Node(self.fresh(base), Op.GATHER, (source.name,), len(index), source.shape, {"index": key},
                    layer)

    def replace(self, name: str, new_nodes: list[Node]) -> None:
        """Put ``new_nodes`` where node ``name`` is (they may reuse the name)."""
        position = next(k for k, n in enumerate(self.nodes) if n.name == name)
        self.nodes[position:position + 1] = new_nodes
        self.changed = True

    def drop_unused(self, names) -> None:
        """Remove the nodes ``names`` (and the selections they read) that nothing reads any more."""
        pending = list(names)
        while pending:
            users = self.users()
            nodes = self.by_name()
            dead = {n for n in pending if n in users and not users[n] and n != self.program.output}
            if not dead:
                return
            pending = [s for n in dead for s in nodes[n].srcs if nodes[s].op in _ROW_SELECTIONS]
            self.nodes = [n for n in self.nodes if n.name not in dead]

    def build(self) -> Program:
        if not self.changed:
            return self.program
        # Drop the constants that this rewrite left unread (old gather indices); any that were
        # unread before are another pass's business.
        used = _used_constants(self.nodes, self.constants) | (set(self.program.constants)
                                                              - _used_constants(self.program.nodes,
                                                                                self.program.constants))
        constants = {k: v for k, v in self.constants.items() if k in used}
        return self.program.replace(nodes=tuple(self.nodes), constants=constants)


def _used_constants(nodes, constants: dict) -> set[str]:
    return {v for n in nodes for v in n.attrs.values() if isinstance(v, str) and v in constants}


def side_node(editor: NodeEditor, rows: SideRows, index: np.ndarray, base: str, layer: str) -> list[Node]:
    """Nodes that make the rows ``index`` of ``rows.source``: none if that is the whole source."""
    if is_identity(index, rows.source_count):
        return []
    return [editor.gather(base, editor.by_name()[rows.source], index, layer)]


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------

# A weight side made of a few long constant runs (GraphSAGE: lin_r on the roots, lin_l on the
# means) is neither periodic nor worth padding; one GEMM per run beats a per-row weight gather.
MAX_RUNS, MIN_MEAN_RUN = 8, 32


def weight_runs(index: np.ndarray) -> np.ndarray | None:
    """Start of each run of equal weight rows, if there are 2..MAX_RUNS long runs; else None."""
    starts = np.concatenate([[0], np.flatnonzero(np.diff(index) != 0) + 1])
    if not 2 <= starts.size <= MAX_RUNS or index.size < MIN_MEAN_RUN * starts.size:
        return None
    return starts


def split_by_runs(editor: NodeEditor, linear: Node, w: SideRows, x: SideRows, starts: np.ndarray) -> list[Node]:
    """One shared-weight LINEAR per run of rows, concatenated back under the LINEAR's name::

        %lin = LINEAR(GATHER(%w; [1,1,1,0,0,...]), %x)   ->   %lin_run = LINEAR(%w[1], %x[0:3]; w_layout='tile')
                                                               %lin_run_2 = LINEAR(%w[0], %x[3:]; w_layout='tile')
                                                               %lin = CONCAT(%lin_run, %lin_run_2)
    """
    ends = np.append(starts[1:], w.index.size)
    made, parts = [], []
    for start, end in zip(starts, ends):
        w_nodes = side_node(editor, w, w.index[start:start + 1], f"{linear.name}_w", linear.layer)
        x_nodes = side_node(editor, x, x.index[start:end], f"{linear.name}_x", linear.layer)
        srcs = (w_nodes[0].name if w_nodes else w.source, x_nodes[0].name if x_nodes else x.source)
        run = Node(editor.fresh(f"{linear.name}_run"), Op.LINEAR, srcs, int(end - start), linear.shape,
                   {**linear.attrs, "w_layout": "tile", "x_layout": "full"}, linear.layer)
        made += w_nodes + x_nodes + [run]
        parts.append(run.name)
    return made + [Node(linear.name, Op.CONCAT, tuple(parts), linear.count, linear.shape, {}, linear.layer)]


def broadcast_linear(program: Program, settings: Settings) -> Program:
    """Give every LINEAR node with repeating sides the cheapest broadcast layout (thesis 5.2.3)."""
    editor = NodeEditor(program)
    for name in [n.name for n in program.nodes if n.op is Op.LINEAR]:
        nodes = editor.by_name()
        linear = nodes[name]
        if linear.attrs.get("w_layout", "full") != "full" or linear.attrs.get("x_layout", "full") != "full":
            continue  # already broadcast
        w = resolve_rows(nodes, editor.constants, linear.srcs[0])
        x = resolve_rows(nodes, editor.constants, linear.srcs[1])
        layout = best_layout(w, x)
        if layout.w_layout == "full" and layout.x_layout == "full":
            runs = weight_runs(w.index)
            if runs is not None:
                editor.replace(linear.name, split_by_runs(editor, linear, w, x, runs))
                editor.drop_unused(list(linear.srcs))
            continue
        new_nodes, srcs = [], list(linear.srcs)
        for k, (rows, side_layout, index) in enumerate(((w, layout.w_layout, layout.w_index),
                                                         (x, layout.x_layout, layout.x_index))):
            if side_layout == "full":
                continue
            made = side_node(editor, rows, index, f"{linear.name}_{'wx'[k]}", linear.layer)
            new_nodes += made
            srcs[k] = made[0].name if made else rows.source
        attrs = {**linear.attrs, "w_layout": layout.w_layout, "x_layout": layout.x_layout}
        editor.replace(linear.name, new_nodes + [linear.with_(srcs=tuple(srcs), attrs=attrs)])
        editor.drop_unused([s for s in linear.srcs if s not in srcs])
    return editor.build()
