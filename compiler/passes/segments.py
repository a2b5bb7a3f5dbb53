"""Thesis 5.2.2 and 5.2.9: reductions read their segments in the order that needs the fewest gathers.

The Vectorizer always gathers a layer's inputs into neuron order before reducing
them, so every REDUCE already reads consecutive segments: the generic
``scatter`` kernel can always become a CSR ``segment`` kernel (5.2.2), or ``dense``
for equal counts (a reduction over a ``(n, k)`` view). Which kernel finally runs is
the engine's choice (``choose_kernels`` writes ``"auto"``); the passes in between
evaluate and reason with these. Further (``Settings.transposed_reductions``):

* all counts 1: the REDUCE is the identity for every aggregation, and goes;
* equal counts k, input a single-use chain of indexing ops:
  segment j reads rows ``I[j k], ..., I[j k + k - 1]`` of the chain's source. Reading
  them in the transposed ``(k, n)`` order instead, ``B = I.reshape(n, k).T.ravel()``,
  and reducing with the ``strided`` kernel computes the same; where ``B`` simplifies
  better than ``I`` (5.2.1), the transposed form wins -- typically the gather
  vanishes: the layer only interleaved k blocks (a dimension-2 aggregation made a
  dimension-1 one, 5.2.9). The same holds through a single-use LINEAR between the
  gathers and the REDUCE: its full sides are transposed chains, its broadcast sides
  swap ``tile`` and ``interleave`` (SAGE: ``[mean_j, h_j]`` pairs gathered from
  ``CONCAT(h, mean)`` become ``CONCAT(mean, h)`` with the two weights interleaved).

Before (``f_h`` has 6 rows; each neuron sums rows j and j + 3)::

    %x = GATHER(f_h; index=[0, 3, 1, 4, 2, 5])            : (6, 4)
    %a = REDUCE(x; aggregation='sum', counts=[2, 2, 2])   : (3, 4)

After::

    %a = REDUCE(f_h; aggregation='sum', counts=[2, 2, 2], kernel='strided')  : (3, 4)

``settings.reduce_kernel`` is not consulted here: this pass produces the
structurally best form and the kernels pass picks the implementation.
"""
from __future__ import annotations

import numpy as np

from ..gather_plans import best_candidate, emit_plan, node_cost
from ..indexing import k_major
from ..ir import IRError, Op, Program, linear_grid
from ..rewrite import Rewriter, remove_unit_reductions
from ..settings import Settings

__all__ = ["scatter_to_segment"]


def scatter_to_segment(program: Program, settings: Settings) -> Program:
    program = remove_unit_reductions(program)
    rw = Rewriter(program)
    users = program.users()
    for node in program.nodes:
        node = rw.take(node)
        if node.op is not Op.REDUCE or node.attrs.get("kernel", "scatter") != "scatter":
            rw.keep(node)
            continue
        counts = rw.constants[node.attrs["counts"]]
        k = int(counts[0]) if counts.size else 0
        equal = k > 0 and bool(np.all(counts == k))
        if equal and (_transpose(rw, node, users, k) or _transpose_linear(rw, node, users, k)):
            continue
        rw.replace(node.with_(attrs={**node.attrs, "kernel": "dense" if equal else "segment"}))
    return rw.finish()


def _transpose(rw: Rewriter, node, users: dict, k: int) -> bool:
    """Try REDUCE(dense k) of an indexing chain -> REDUCE(strided k) of the transposed chain."""
    head = rw.nodes[node.srcs[0]]
    if head.op not in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE) or len(users[head.name]) != 1 \
            or head.name == rw.program.output:
        return False
    best = best_candidate(rw, head, users, transform=lambda index: k_major(index, k))
    if best is None:
        return False
    cost, root, plan = best
    if not cost < node_cost(head):
        return False
    src = emit_plan(rw, rw.fresh(f"{node.name}_t"), plan, rw.nodes[root], node.layer)
    rw.replace(node.with_(srcs=(src,), attrs={**node.attrs, "kernel": "strided"}))
    return True


def _transpose_linear(rw: Rewriter, node, users: dict, k: int) -> bool:
    """The same through a single-use LINEAR: its rows are permuted along with the reduction.

    A ``full`` side becomes its transposed indexing chain (as in :func:`_transpose`); a short
    side changes layout: ``tile`` over the k inputs of a segment becomes ``interleave`` over
    the k blocks, ``interleave`` over the n segments becomes ``tile``, a single row stays.
    Done when the full sides' gathers get cheaper in total (e.g. SAGE's ``[mean_i, h_i]``
    pairs: the gather over ``CONCAT(h, mean)`` becomes ``CONCAT(mean, h)``).
    """
    lin = rw.nodes[node.srcs[0]]
    if lin.op is not Op.LINEAR or len(users[lin.name]) != 1 or lin.name == rw.program.output \
            or lin.srcs[0] == lin.srcs[1]:
        return False
    n = node.count
    gain = (0, 0, 0)
    plans, layouts = [], []
    for side_name, key in zip(lin.srcs, ("w_layout", "x_layout")):
        side, layout = rw.nodes[side_name], lin.attrs.get(key, "full")
        if layout == "full":
            best = best_candidate(rw, side, users, transform=lambda index: k_major(index, k)) \
                if len(users[side_name]) == 1 and side_name != rw.program.output else None
            if best is None:
                return False
            cost, root, plan = best
            gain = tuple(g + c - b for g, c, b in zip(gain, node_cost(side), cost))
            plans.append((root, plan))
            layouts.append("full")
        elif side.count == 1:
            plans.append(None)
            layouts.append(layout)
        elif layout == "tile" and side.count == k:
            plans.append(None)
            layouts.append("interleave")
        elif layout == "interleave" and side.count == n:
            plans.append(None)
            layouts.append("tile")
        else:
            return False
    if not gain > (0, 0, 0):
        return False
    attrs = {**lin.attrs, "w_layout": layouts[0], "x_layout": layouts[1]}
    try:
        linear_grid(lin.with_(attrs=attrs), *(rw.nodes[s] for s in lin.srcs))
    except IRError:
        return False
    srcs = tuple(name if plan is None else emit_plan(rw, rw.fresh(f"{name}_t"), plan[1], rw.nodes[plan[0]], lin.layer)
                 for name, plan in zip(lin.srcs, plans))
    rw.replace(lin.with_(srcs=srcs, attrs=attrs))
    rw.replace(node.with_(attrs={**node.attrs, "kernel": "strided"}))
    return True
