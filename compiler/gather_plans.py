"""Gather plans: the cheapest ops that read given rows of a source (thesis 5.2.1, 5.2.9, 5.2.10).

A gather's index, seen against the rows of its source, is matched to a small *plan*
(:func:`plan_index`):

* the identity (``arange`` of the whole source): nothing to compute;
* a range with a constant positive step: a ``SLICE`` (a view, no copy);
* dimension-1 repetition ``I = I_s I_s ... I_s``: ``TILE`` of the plan of ``I_s``;
* dimension-2 repetition ``I = i1 i1 .. i2 i2 ..``: ``INTERLEAVE`` of the plan of ``I_s``;
* anything else: the (possibly shorter) ``GATHER`` itself.

Chains of indexing ops are composed into one index on a deeper source
(:func:`chain_candidates`); every candidate source along the chain is planned, and the cheapest
wins (:func:`best_candidate`): composing through an indexing op that others still read must not
recompute it. An index over a CONCAT made of a few runs that each read one part is also planned
part by part (thesis 5.2.9). :func:`emit_plan` writes a plan into a program through the editor
(:class:`compiler.rewrite.Rewriter`). The gather simplification pass and the clean-up, segment
and algebra passes share this.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np

from .indexing import ROW_SELECTIONS, SPOT_ROWS, interleave_factor, source_rows, step_through, tile_factor
from .ir import Node, Op

if TYPE_CHECKING:
    from .rewrite import Rewriter

__all__ = ["Plan", "plan_index", "plan_cost", "plan_rows", "node_cost", "chain_candidates", "best_candidate",
           "simplified", "emit_plan"]

# A plan is a nested tuple:
#   ("id",) | ("slice", start, stop, step) | ("gather", index)
#   | ("tile", times, inner plan) | ("interleave", times, inner plan)
#   | ("blocks", ((part name, part rows, plan on that part), ...))   (source: a CONCAT)
Plan = tuple


def plan_index(index: np.ndarray, n: int) -> Plan:
    """The cheapest op sequence that reads rows ``index`` of an ``n``-row source."""
    length = index.size
    if length == 0:
        return ("gather", index)
    if length == 1:
        start = int(index[0])
        return ("id",) if n == 1 else ("slice", start, start + 1, 1)
    step = int(index[1]) - int(index[0])
    # (A prefix first: most indices are no arithmetic sequence, and fail it without an edge-sized diff.)
    if np.all(np.diff(index[:SPOT_ROWS]) == step) and np.all(np.diff(index) == step):
        start = int(index[0])
        if step == 1 and start == 0 and length == n:
            return ("id",)
        if step > 0:
            return ("slice", start, int(index[-1]) + 1, step)
        if step == 0:  # one row, repeated: a tile of that row (cheaper than repeat_interleave)
            return ("tile", length, plan_index(index[:1], n))
    times = interleave_factor(index)
    if times > 1:
        return ("interleave", times, plan_index(index[::times], n))
    times = tile_factor(index, n)
    if times > 1:
        return ("tile", times, plan_index(index[:length // times], n))
    return ("gather", index)


def plan_cost(plan: Plan, n: int) -> tuple[int, int, int]:
    """(rows gathered, rows copied by TILE/INTERLEAVE, ops): compared lexicographically.

    ``n``: the rows of the plan's source. Gathers (random reads; atomic scatter-adds
    backwards) dominate, copies come next, then the number of ops.
    """
    kind = plan[0]
    if kind == "id":
        return (0, 0, 0)
    if kind == "slice":
        return (0, 0, 1)
    if kind == "blocks":  # the parts' plans, then a CONCAT copying every row
        total = (0, plan_rows(plan, n), 1)
        for _, rows, inner in plan[1]:
            total = _add(total, plan_cost(inner, rows))
        return total
    if kind == "gather":
        return (int(plan[1].size), 0, 1)
    inner = plan_cost(plan[2], n)
    return (inner[0], inner[1] + plan_rows(plan, n), inner[2] + 1)


def plan_rows(plan: Plan, n: int) -> int:
    """Rows of the result of ``plan`` on an ``n``-row source."""
    kind = plan[0]
    if kind == "id":
        return n
    if kind == "slice":
        return len(range(plan[1], plan[2], plan[3]))
    if kind == "gather":
        return int(plan[1].size)
    if kind == "blocks":
        return sum(plan_rows(inner, rows) for _, rows, inner in plan[1])
    return plan[1] * plan_rows(plan[2], n)


def node_cost(node: Node) -> tuple[int, int, int]:
    """What computing an indexing node costs, in :func:`plan_cost` units."""
    if node.op is Op.GATHER:
        return (node.count, 0, 1)
    if node.op in (Op.TILE, Op.INTERLEAVE, Op.CONCAT):
        return (0, node.count, 1)
    return (0, 0, 1)


def _add(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


def _sub(a: tuple, b: tuple) -> tuple:
    return tuple(x - y for x, y in zip(a, b))


def chain_candidates(first: str, index: np.ndarray, nodes: dict[str, Node], constants: dict
                     ) -> Iterable[tuple[str, np.ndarray]]:
    """``(source, index)`` pairs reading the same rows: ``first[index]``, then through each indexing op."""
    name = first
    while True:
        yield name, index
        step = step_through(nodes[name], index, nodes, constants)
        if step is None:
            return
        name, index = step


def best_candidate(rw: Rewriter, node: Node, users: dict[str, list[str]], transform=None
                   ) -> tuple[tuple, str, Plan] | None:
    """The cheapest ``(cost, root, plan)`` computing the rows of an indexing ``node``.

    Every source along the node's chain of indexing ops is a candidate root. Costs are
    relative to keeping the node as it is (cost :func:`node_cost` of the node): bypassing a
    chain op that only the chain reads removes it (its cost is subtracted), while one that
    others read stays anyway. ``transform`` maps each candidate's index before planning (the
    transposed reductions use it). None: the node is not an indexing op.
    """
    if node.op not in ROW_SELECTIONS:
        return None
    source, index = rw.nodes[node.srcs[0]], source_rows(node, None, rw.constants)
    best: tuple | None = None
    alive = (0, 0, 0)  # summed cost of the single-use chain ops bypassed so far
    shared = False     # passed an op that others read: it, and all beyond it, stay
    for name, idx in chain_candidates(source.name, index, rw.nodes, rw.constants):
        candidate = rw.nodes[name]
        idx = transform(idx) if transform else idx
        plans = [plan_index(idx, candidate.count)]
        if candidate.op is Op.CONCAT:
            plans.append(_blocks_plan(candidate, idx, rw.nodes))
        for plan in filter(None, plans):
            cost = _sub(plan_cost(plan, candidate.count), alive)
            if best is None or cost < best[0]:  # ties: the shallower source (no churn)
                best = (cost, name, plan)
        if len(users.get(name, ())) != 1 or name == rw.program.output:
            shared = True
        if not shared:
            alive = _add(alive, node_cost(candidate))
    return best


MAX_BLOCKS = 16


def _blocks_plan(concat: Node, index: np.ndarray, nodes: dict[str, Node]) -> Plan | None:
    """Thesis 5.2.9: an index over a CONCAT made of runs that each read one part.

    ``GATHER(CONCAT(a, b), I1 I2)`` is ``CONCAT(a[I1], b[I2])``, and the per-part indices may
    simplify where the whole does not (e.g. both are identities: a mere reordering of parts).
    """
    if index.size < 2:
        return None
    counts = np.array([nodes[s].count for s in concat.srcs])
    ends = np.cumsum(counts)
    part = np.searchsorted(ends, index, side="right")
    starts = np.flatnonzero(np.diff(part)) + 1
    if not 0 < starts.size < MAX_BLOCKS:
        return None
    bounds = np.concatenate([[0], starts, [index.size]])
    blocks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        p = int(part[a])
        local = index[a:b] - (ends[p] - counts[p])
        blocks.append((concat.srcs[p], int(counts[p]), plan_index(local, int(counts[p]))))
    return ("blocks", tuple(blocks))


def simplified(rw: Rewriter, node: Node, users: dict[str, list[str]]) -> tuple[str, Plan] | None:
    """``(root, plan)`` if planning ``node`` anew beats keeping it, else None."""
    best = best_candidate(rw, node, users)
    if best is None:
        return None
    cost, root, plan = best
    keep = node_cost(node)
    if cost > keep or (cost == keep and root == node.srcs[0]) or _same_as(node, root, plan):
        return None  # equal cost on the same source: no churn (e.g. INTERLEAVE vs TILE of one row)
    return root, plan


def _same_as(node: Node, root: str, plan: Plan) -> bool:
    """Whether ``plan`` on ``root`` is exactly ``node`` already (nothing to rewrite)."""
    if node.srcs[0] != root:
        return False
    kind = plan[0]
    if node.op is Op.GATHER:
        return kind == "gather"
    if node.op is Op.SLICE:
        return kind == "slice" and plan[1:] == (node.attrs["start"], node.attrs["stop"], node.attrs["step"])
    if node.op in (Op.TILE, Op.INTERLEAVE):
        return kind == node.op.value and plan[1] == node.attrs["times"] and plan[2] == ("id",)
    return False


def emit_plan(rw: Rewriter, name: str, plan: Plan, root: Node, layer: str = "") -> str:
    """Materialize ``plan`` on ``root`` as node ``name`` through ``rw`` (or alias ``name`` to root);
    returns the name."""
    kind = plan[0]
    if kind == "id":
        rw.alias(name, root.name)
        return root.name
    if kind == "slice":
        _, start, stop, step = plan
        rw.emit(name, Op.SLICE, [root.name], len(range(start, stop, step)), root.shape, layer,
                start=start, stop=stop, step=step)
    elif kind == "gather":
        key = rw.const(f"idx_{name}", plan[1])
        rw.emit(name, Op.GATHER, [root.name], plan[1].size, root.shape, layer, index=key)
    elif kind == "blocks":
        parts = [emit_plan(rw, rw.fresh(f"{name}_part"), inner, rw.nodes[part], layer)
                 for part, _, inner in plan[1]]
        rw.emit(name, Op.CONCAT, parts, plan_rows(plan, root.count), root.shape, layer)
    else:
        inner = emit_plan(rw, rw.fresh(f"{name}_{'rep' if kind == 'tile' else 'int'}"), plan[2], root, layer)
        op = Op.TILE if kind == "tile" else Op.INTERLEAVE
        rw.emit(name, op, [inner], rw.nodes[inner].count * plan[1], root.shape, layer, times=plan[1])
    return name
