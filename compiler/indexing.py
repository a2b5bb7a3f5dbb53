"""The row vocabulary below the passes: which rows of which node a value reads, and how they repeat.

Passes that move rows around (gathers, slices, tiles, interleaves, concatenations, broadcast
LINEAR sides) ask the same few questions; each is answered once, here:

* :func:`source_rows`: the rows of its source behind rows of a GATHER, SLICE, TILE or INTERLEAVE
  (the one implementation; :func:`step_through` adds a CONCAT read in one part,
  :func:`layout_rows` a broadcast LINEAR side);
* :func:`resolve_rows`: a chain of such selections composed down to a computing node, and
  :func:`trace_rows`: rows traced through every indexing op, CONCATs and (optionally) fixed scalar
  factors, to the values actually computed;
* repetition: :func:`tile_period` / :func:`tile_factor` ("dimension 1", thesis 5.2.1) and
  :func:`interleave_count` / :func:`interleave_factor` ("dimension 2"), :func:`is_regular_index`;
* :func:`best_layout`: the cheapest broadcast layout of a LINEAR's two sides (thesis 5.2.3);
* compile-time constants: :func:`constant_values`, :func:`is_constant`.

:func:`trace_rows` answers, for every row ``r`` of a node::

    node[r] = coef[r] * bases[which[r]][row[r]]

Example: with ``%g = GATHER(h; index=[2, 0, 2])`` and ``%p = LINEAR(c, g; kind='mul')``
where ``c`` is a gather of fixed scalars ``[0.5, 0.5, 0.25]``, ``trace_rows`` of ``%p``
gives ``bases=['h'], which=[0, 0, 0], row=[2, 0, 2], coef=[0.5, 0.5, 0.25]``.

Everything is computed on whole index arrays (one numpy op per IR node walked). The gather plans
built on this vocabulary (``plan_index``, ``emit_plan``) are in ``gather_plans.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .grouping import equal_arrays, is_identity, run_block
from .ir import Node, Op, Program

__all__ = ["ROW_SELECTIONS", "EXPANSION", "SPOT_ROWS", "source_rows", "step_through", "layout_rows", "Origins",
           "trace_rows", "constant_values", "static_fact", "fixed_weights", "is_constant", "SideRows",
           "resolve_rows", "k_major", "tile_period", "interleave_count", "tile_factor", "interleave_factor",
           "is_regular_index", "Layout", "gather_cost", "full_layout", "best_layout"]

#: Ops whose rows are a fixed selection of their (single) source's rows.
ROW_SELECTIONS = (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE)

#: A row movement storing more than this many times the rows it reads is not folded into a
#: constant (fold_constants, reorder_linear).
EXPANSION = 2


# -- the rows behind an indexing op -----------------------------------------------------------------

def source_rows(node: Node, index: np.ndarray | None, constants: dict) -> np.ndarray:
    """Rows of the source of a GATHER / SLICE / TILE / INTERLEAVE node behind its rows ``index``
    (None: all of its rows, in order).

    A GATHER's index comes as stored (int32 where it fits): an int64 copy of every LINEAR side's
    index was two edge-sized arrays of the padding pass's peak at 100x PROTEINS (93 MB each)."""
    if index is None:
        if node.op is Op.GATHER:
            return constants[node.attrs["index"]]
        index = np.arange(node.count)
    if node.op is Op.GATHER:
        return constants[node.attrs["index"]][index]
    if node.op is Op.SLICE:
        return node.attrs["start"] + index * node.attrs["step"]
    if node.op is Op.TILE:
        return index % (node.count // node.attrs["times"] if node.attrs["times"] else 1)
    if node.op is Op.INTERLEAVE:
        return index // node.attrs["times"]
    raise ValueError(f"{node.op} does not index rows")


def step_through(node: Node, index: np.ndarray, nodes: dict[str, Node], constants: dict
                 ) -> tuple[str, np.ndarray] | None:
    """``node[index]`` as rows of ``node``'s own source, or None if ``node`` is not see-through
    (an indexing op, or a CONCAT whose rows ``index`` all lie in one part)."""
    if node.op in ROW_SELECTIONS:
        return node.srcs[0], source_rows(node, index, constants)
    if node.op is Op.CONCAT and index.size:
        ends = np.cumsum([nodes[s].count for s in node.srcs])
        lo, hi = np.searchsorted(ends, [index.min(), index.max()], side="right")
        if lo == hi:  # every row read lies in one part
            return node.srcs[lo], index - (ends[lo] - nodes[node.srcs[lo]].count)
    return None


def k_major(rows: np.ndarray, k: int) -> np.ndarray:
    """Thesis 5.2.9, the transposition: the ``rows`` of consecutive segments of ``k`` (what a
    ``dense`` REDUCE reads) in the order a ``strided`` REDUCE reads them, element-major: element 0
    of every segment, then element 1, ...; ``rows.reshape(n, k).T``."""
    return rows.reshape(-1, k).T.reshape(-1)


def layout_rows(layout: str, side_count: int, count: int, rows: np.ndarray) -> np.ndarray:
    """Rows of one side of a LINEAR (``side_count`` rows, ``layout``) that its rows ``rows`` read
    (NOTE: [LINEAR broadcasting])."""
    if layout == "full":
        return rows
    if layout == "tile":
        return rows % side_count
    return rows // (count // side_count if side_count else 1)  # interleave


# -- tracing rows to the values that compute them ------------------------------------------------------

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


def static_fact(node: Node, dynamic) -> bool:
    """A FACT whose values a pass may use (not replaceable at call time)."""
    return node.op is Op.FACT and node.attrs.get("fact_layer") not in dynamic


def fixed_weights(node: Node, learnable: dict[str, bool]) -> bool:
    """A WEIGHTS node whose every weight is fixed (a constant)."""
    return node.op is Op.WEIGHTS and not any(learnable[n] for n in node.attrs["names"])


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
               scalars: bool = False, see_through=None, factors: list | None = None) -> Origins:
    """Trace rows ``rows`` (default: all) of node ``name`` to the nodes that compute them.

    Walks through GATHER, SLICE, TILE, INTERLEAVE and CONCAT; with ``scalars``, also
    through ``LINEAR(kind='mul')`` nodes one side of which is a fixed scalar
    (:func:`constant_values`), multiplying ``coef`` by it. ``see_through(node)``, if
    given, may refuse to walk through a node (it then becomes a base). ``factors``, a list kept
    by the caller over several traces, lets an edge-sized factor equal to an earlier one be that
    one (:func:`_scalar_values`).

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
                return walk(node.srcs[0], pos, source_rows(node, _rows(r, node.count), program.constants),
                            coef)
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
                step = _scalar_factor(program, nodes, node, _rows(r, node.count), factors)
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


def _scalar_factor(program: Program, nodes: dict[str, Node], node: Node, rows: np.ndarray, factors=None):
    """For a ``LINEAR(kind='mul')`` with a fixed scalar side: (value side, its rows, factor, facts)."""
    w, x = (nodes[s] for s in node.srcs)
    layouts = (node.attrs.get("w_layout", "full"), node.attrs.get("x_layout", "full"))
    sides = [(w, layouts[0], x, layouts[1]), (x, layouts[1], w, layouts[0])]
    for scalar, s_layout, value, v_layout in sides:
        if scalar.shape != () or value.shape != node.shape:
            continue
        found = _scalar_values(program, nodes, scalar, layout_rows(s_layout, scalar.count, node.count, rows), factors)
        if found is None:
            continue
        factor, facts = found
        return value.name, layout_rows(v_layout, value.count, node.count, rows), factor, facts
    return None


def _scalar_values(program: Program, nodes: dict[str, Node], scalar: Node, rows: np.ndarray, factors=None):
    """:func:`constant_values` of rows ``rows`` of the fixed-scalar side ``scalar``. A side read
    more often than it has rows (a tiled weight gather: GCN's normalisation, 115k rows read by
    19M edges at 100x PROTEINS) is traced once per row, then indexed: one edge-sized gather fewer.
    Only over one base: its values and facts are those of any of its rows.

    With ``factors`` (see :func:`trace_rows`), such an edge-sized result whose per-row values and
    rows equal those of one in the list is that array (read-only), compared instead of gathered
    again: GCN's layers after the first read the same edges with the same normalisation
    (products-like: a 62M-row gather of 1 CPU s each, against a comparison of 0.05 s)."""
    if rows.size > scalar.count and len(trace_rows(program, nodes, scalar.name).bases) == 1:
        found = constant_values(program, nodes, scalar.name, np.arange(scalar.count))
        if found is None:
            return None
        values, facts = found
        for seen_values, seen_rows, seen in factors or ():
            if (seen_values.shape == values.shape and np.array_equal(seen_values, values)
                    and seen_rows.dtype == rows.dtype and (seen_rows is rows or equal_arrays(seen_rows, rows))):
                return seen, facts
        gathered = values[rows]
        if factors is not None:
            gathered.flags.writeable = False
            factors.append((values, rows, gathered))
        return gathered, facts
    return constant_values(program, nodes, scalar.name, rows)


def is_constant(program: Program, nodes: dict[str, Node]) -> set[str]:
    """Names of the nodes computed from static facts and fixed weights only."""
    learnable = {w.name: w.learnable for w in program.weights}
    constant: set[str] = set()
    for node in nodes.values():
        if static_fact(node, program.dynamic_facts) or fixed_weights(node, learnable) or (
                node.op not in (Op.FACT, Op.WEIGHTS) and all(s in constant for s in node.srcs)):
            constant.add(node.name)
    return constant


# -- a LINEAR side's rows, and how they repeat -------------------------------------------------------

@dataclass(frozen=True)
class SideRows:
    """Row ``e`` of a LINEAR side is row ``index[e]`` of node ``source`` (which has ``source_count`` rows)."""

    source: str
    index: np.ndarray
    source_count: int


def resolve_rows(nodes: dict[str, Node], constants: dict, name: str) -> SideRows:
    """Follow a chain of row selections (gather of a tile of a slice ...) down to a computing node.

    Composing the chain exposes repetition that no single link shows (a gather of a tiled tensor).
    """
    node = nodes[name]
    index = None
    while node.op in ROW_SELECTIONS:
        selected = source_rows(node, None, constants)
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


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


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
    return n // interleave_factor(index)


def interleave_factor(index: np.ndarray) -> int:
    """Largest k such that every row of ``index.reshape(-1, k)`` is constant.

    Runs of equal values must start at multiples of k (and k must divide the length).
    """
    return run_block(index[1:] != index[:-1], index.size)


#: tile_factor (and plan_index, for a range) compare this many rows before a whole index.
SPOT_ROWS = 1024


def tile_factor(index: np.ndarray, n: int) -> int:
    """Largest r such that ``index`` is one sequence repeated r times (dimension-1 repetition)."""
    length = index.size
    # A repetition r divides the length and puts index[0] again at length // r: where no divisor
    # passes that spot check (the usual case), the counting below is not needed.
    # The repetitions r that pass it, and whose first rows then repeat too (a prefix of the
    # comparison below), are the only candidates: the answer is the largest r with a full match.
    prefix = min(length, SPOT_ROWS)
    if not any(index[length // r] == index[0]
               and np.array_equal(index[length // r:length // r + prefix], index[:prefix][:length - length // r])
               for r in reversed(_divisors(length)) if r > 1):
        return 1
    # Every value occurs a multiple of r times: r divides the gcd of the value counts.
    if n <= 4 * length:
        counts = np.bincount(index, minlength=n)
        counts = counts[counts > 0]
    else:
        counts = np.unique(index, return_counts=True)[1]
    g = int(np.gcd.reduce(counts))
    for times in reversed(_divisors(g)):
        if times == 1:
            break
        period = length // times
        if index[period] != index[0]:
            continue
        if np.array_equal(index.reshape(times, period), np.broadcast_to(index[:period], (times, period))):
            return times
    return 1


_PREFIX = 4096  # rows checked before a whole index is (see is_regular_index)


def is_regular_index(index: np.ndarray, count: int) -> bool:
    """Whether ``x[index]`` (x with ``count`` rows) is a slice, a tile or an interleave of x:
    ops that gather simplification (thesis 5.2.1) turns into something cheaper than a gather."""
    n = index.size
    if n <= 1 or count == 1:
        return True
    step = index[1] - index[0]
    # (A prefix and the last row first: an irregular index usually fails them, before any
    # edge-sized work.)
    if step >= 1 and int(index[-1]) == int(index[0]) + int(step) * (n - 1) \
            and np.all(np.diff(index[:_PREFIX]) == step) and np.all(np.diff(index) == step):
        return True
    if n % count == 0:
        times = n // count
        tiled = index[0] == 0 and index[count - 1] == count - 1
        if tiled and np.array_equal(index, np.tile(np.arange(count), times)):
            return True
        if index[times - 1] == 0 and np.array_equal(index, np.repeat(np.arange(count), times)):
            return True
    return False


# -- broadcast layouts of a LINEAR's sides (thesis 5.2.3) ------------------------------------------------

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
