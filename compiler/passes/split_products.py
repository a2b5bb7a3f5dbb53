"""Rows that use one of a few weight matrices: one GEMM per matrix instead of per-row products.

A GraphSAGE convolution multiplies the neighbour mean by ``W_l`` and the node itself
by ``W_r`` in one layer: one LINEAR whose rows alternate between two weights. Where
the rows of each weight do not form long runs, ``linear_broadcast`` leaves a batched
product over per-row (or per-run) weights -- thousands of tiny matrix products,
slow forward and backward (ENZYMES: runs of 44 rows, 879 of them). With at most
``MAX_WEIGHTS`` distinct weights, this pass computes one shared-weight GEMM per
weight on that weight's rows, then puts the rows back in order::

    %w = GATHER(w_16x3; index=[0, 1, 0, 1, ...])         : (2n, 16, 3)
    %l = LINEAR(w, x; kind='matmul')                       : (2n, 16)
  becomes
    %l_x0 = SLICE(x; 0:2n:2)      %l_0 = LINEAR(l_w0, l_x0)   : (n, 16)   l_w0 = w_16x3[0:1]
    %l_x1 = SLICE(x; 1:2n:2)      %l_1 = LINEAR(l_w1, l_x1)   : (n, 16)   l_w1 = w_16x3[1:2]
    %l = GATHER(CONCAT(l_0, l_1); index=[0, n, 1, n + 1, ...]) : (2n, 16)

The products then have one weight each, which the other algebra passes can move
(``reorder_linear``); the gathers around them compose with their neighbours in the
gather clean-up that follows.
"""
from __future__ import annotations

import numpy as np

from ..gather_plans import emit_plan, plan_index
from ..indexing import layout_rows, trace_rows
from ..ir import Op, Program
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["split_products", "MAX_WEIGHTS"]

MAX_WEIGHTS = 8


def split_products(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.op is not Op.LINEAR or node.attrs["kind"] != "matmul" or rw.nodes[node.srcs[0]].count == 1:
            rw.keep(node)
            continue
        w, x = (rw.nodes[s] for s in node.srcs)
        rows = np.arange(node.count, dtype=np.int64)
        origins = trace_rows(program.replace(constants=rw.constants), rw.nodes, w.name,
                             layout_rows(node.attrs.get("w_layout", "full"), w.count, node.count, rows))
        bases = [rw.nodes[b] for b in origins.bases]
        if not all(b.op is Op.WEIGHTS for b in bases):
            rw.keep(node)
            continue
        keys = origins.which * max(b.count for b in bases) + origins.row
        distinct, first, weight_of_row = np.unique(keys, return_index=True, return_inverse=True)
        if distinct.size > MAX_WEIGHTS:
            rw.keep(node)
            continue
        x_rows = layout_rows(node.attrs.get("x_layout", "full"), x.count, node.count, rows)
        inputs = trace_rows(program.replace(constants=rw.constants), rw.nodes, x.name, x_rows)
        parts = []
        for d in range(distinct.size):
            mine = np.flatnonzero(weight_of_row == d)
            base = bases[origins.which[first[d]]]
            w_d = emit_plan(rw, rw.fresh(f"{node.name}_w{d}"), plan_index(origins.row[first[d]:first[d] + 1],
                                                                          base.count), base, node.layer)
            # The weight's rows, read from the value they come from where that is one value
            # (GraphSAGE: the means for W_l, the nodes for W_r), else from the product's input.
            sources = np.unique(inputs.which[mine])
            if sources.size == 1:
                root, root_rows = rw.nodes[inputs.bases[sources[0]]], inputs.row[mine]
            else:
                root, root_rows = x, x_rows[mine]
            x_d = emit_plan(rw, rw.fresh(f"{node.name}_x{d}"), plan_index(root_rows, root.count), root, node.layer)
            layouts = {"w_layout": "tile", "x_layout": "full"} if mine.size > 1 else {}
            parts.append(rw.emit(rw.fresh(f"{node.name}_{d}"), Op.LINEAR, [w_d, x_d], mine.size, node.shape,
                                 node.layer, kind="matmul", **layouts))
        joined = parts[0] if len(parts) == 1 else rw.emit(
            rw.fresh(f"{node.name}_parts"), Op.CONCAT, [p.name for p in parts], node.count, node.shape, node.layer)
        order = np.argsort(weight_of_row, kind="stable")
        position = np.empty(node.count, dtype=np.int64)
        position[order] = rows
        emit_plan(rw, node.name, plan_index(position, node.count), joined, node.layer)
    return rw.finish()
