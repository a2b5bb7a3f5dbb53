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

The analysis (resolving a side to ``(source, index)``, the periods of an index, the best layout
and its cost) is the row vocabulary in ``compiler/indexing.py``, shared with the padding pass
(``padding.py``), which reorders and pads rows precisely so that this pass finds periods.
"""
from __future__ import annotations

import numpy as np

from ..indexing import SideRows, best_layout, resolve_rows
from ..ir import Node, Op, Program
from ..rewrite import Rewriter, side_node
from ..settings import Settings

__all__ = ["broadcast_linear", "weight_runs", "split_by_runs"]

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


def split_by_runs(editor: Rewriter, linear: Node, w: SideRows, x: SideRows, starts: np.ndarray) -> list[Node]:
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
    editor = Rewriter(program, in_place=True)
    for name in [n.name for n in program.nodes if n.op is Op.LINEAR]:
        nodes = editor.nodes
        linear = nodes[name]
        if linear.attrs.get("w_layout", "full") != "full" or linear.attrs.get("x_layout", "full") != "full":
            continue  # already broadcast
        w = resolve_rows(nodes, editor.constants, linear.srcs[0])
        x = resolve_rows(nodes, editor.constants, linear.srcs[1])
        layout = best_layout(w, x)
        if layout.w_layout == "full" and layout.x_layout == "full":
            runs = weight_runs(w.index)
            if runs is not None:
                editor.place(linear.name, split_by_runs(editor, linear, w, x, runs))
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
        editor.place(linear.name, new_nodes + [linear.with_(srcs=tuple(srcs), attrs=attrs)])
        editor.drop_unused([s for s in linear.srcs if s not in srcs])
    return editor.finish()
