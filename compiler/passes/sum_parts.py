"""A sum of k inputs per neuron, each from its own value in order: k - 1 additions, no gather.

GraphSAGE's convolution adds two products per node, ``W_l mean_i`` and ``W_r h_i``:
a REDUCE with counts all 2 over rows gathered (or concatenated) from the two
products. When every neuron's t-th input comes from the same value for each t, the
sum is ``term_0 + term_1 + ...``, where each term reads its value directly or
through a smaller gather; the ``k n`` rows are never materialized::

    %rows = GATHER(CONCAT(a, b); index=[0, n, 1, n + 1, ...])   : (2n, 16)
    %s = REDUCE(rows; aggregation='sum', counts=[2, 2, ...])     : (n, 16)
  becomes
    %s = ADD(a, b)                                               : (n, 16)

Taken for sums with equal counts ``k <= MAX_TERMS`` (the gathers move at most the
rows they moved before, and a term that reads its value in order moves none); each
term is then one value's rows, through which ``reorder_linear`` can move products.
One term must be a matrix product: a neuron's sum starts from +0.0 and is never -0.0,
but ``-0.0 + -0.0`` is -0.0 (and ``1 / x`` tells them apart); a matrix product is a sum
from +0.0 itself, so an addition with it is never -0.0 either.
"""
from __future__ import annotations

import numpy as np

from ..gather_plans import emit_plan, plan_index
from ..indexing import trace_rows
from ..ir import Op, Program, is_sparse_sum
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["sum_parts", "MAX_TERMS"]

MAX_TERMS = 4


def sum_parts(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        terms = _terms(program, rw, node)
        if terms is None:
            rw.keep(node)
            continue
        names = [emit_plan(rw, rw.fresh(f"{node.name}_term{t}"), plan, rw.nodes[base], node.layer)
                 for t, (base, plan) in enumerate(terms)]
        total = names[0]
        for t, name in enumerate(names[1:], start=1):
            last = t == len(names) - 1
            total = rw.emit(node.name if last else rw.fresh(f"{node.name}_sum{t}"), Op.ADD, [total, name],
                            node.count, node.shape, node.layer).name
    return rw.finish()


def _terms(program: Program, rw: Rewriter, node) -> list[tuple[str, tuple]] | None:
    """``[(value, plan of its rows)]`` per input position, or None where the pass does not apply."""
    if node.op is not Op.REDUCE or node.attrs["aggregation"] != "sum" or "coef" in node.attrs \
            or is_sparse_sum(node) or node.count == 0:
        return None
    counts = rw.constants[node.attrs["counts"]]
    k = int(counts[0])
    if not 2 <= k <= MAX_TERMS or np.any(counts != k):
        return None
    n = node.count
    source = rw.nodes[node.srcs[0]]
    terms = []
    for t in range(k):
        rows = t * n + np.arange(n) if node.attrs.get("kernel") == "strided" else np.arange(n) * k + t
        origins = trace_rows(program.replace(constants=rw.constants), rw.nodes, source.name, rows)
        if len(origins.bases) != 1:
            return None
        base = rw.nodes[origins.bases[0]]
        if base.shape != node.shape:
            return None
        terms.append((base.name, plan_index(origins.row, base.count)))
    # The neuron's sum starts from +0.0, so it is never -0.0; an addition of two -0.0 is.
    # A matrix product (also a sum from +0.0) among the terms keeps the additions exact.
    if not any(_never_negative_zero(rw.nodes[base]) for base, _ in terms):
        return None
    return terms


def _never_negative_zero(node) -> bool:
    return node.op is Op.LINEAR and node.attrs["kind"] == "matmul"
