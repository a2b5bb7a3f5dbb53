"""Thesis 5.2.7: upward propagation of gathers, and the row-moving machinery of the 5.2.6 passes.

A gather ``%g = GATHER(%p; index)`` can move into the node ``%p`` that produces its input:
``%p`` computes the rows ``index`` itself (reordering or duplicating its rows) and ``%g``
disappears. Computing "``%p`` at rows ``index``" asks ``%p``'s own inputs for the rows it needs,
so the gather keeps travelling up:

* elementwise ops (TRANSFORM) and ADD: both inputs at the same rows;
* LINEAR: each side at its rows (a one-row broadcast side stays as it is; other broadcast
  layouts become full sides);
* REDUCE: whole segments (new counts, and the input rows of the chosen segments); segments of
  equal length may instead be read element-major (a ``strided`` reduction, thesis 5.2.9), which
  is also tried on its own for every such REDUCE: it turns GraphSAGE's alternating reads of
  ``CONCAT(h, mean)`` into one run per part;
* GATHER / SLICE / TILE / INTERLEAVE: composed into one index (the existing gather is absorbed);
* CONCAT: the index split into runs that read one part each (a CONCAT of the parts' rows) --
  beyond the thesis implementation, which stopped at nodes with a single input;
* FACT (static) and WEIGHTS: folded into a new constant, or a stack naming weights repeatedly
  (gradients add up over the repeats); a regular repetition of a few weights stays a gather
  for gather simplification to turn into a tile.

Before (the output gather reorders a sigmoid layer)::

    %h = FACT(const=[[0, 1], [2, 3], [4, 5], [6, 7]])    : (4, 2)
    %x = GATHER(%h; index=[0, 3, 3])                      : (3, 2)
    %s = REDUCE(%x; aggregation='sum', counts=[2, 1])     : (2, 2)
    %t = TRANSFORM(%s; fn='sigmoid')                      : (2, 2)
    %output = GATHER(%t; index=[1, 0])                    : (2, 2)
    return %output

After (preset ``upward-00-free``: no node grows, so the reordering travels through the
segments, composes with ``%x``, and ends up in the constant)::

    %h = FACT(const=[[6, 7], [0, 1], [6, 7]])             : (3, 2)
    %s = REDUCE(%h; aggregation='sum', counts=[1, 2])     : (2, 2)
    %t = TRANSFORM(%s; fn='sigmoid')                      : (2, 2)
    return %t

Knobs (``Settings``): a node may grow from ``old`` to at most ``old * (1 + upward_growth_rel) +
upward_growth_abs`` rows (either None: unlimited); a node that is also read elsewhere is copied,
and then all of its new rows count as growth. ``upward_max_depth`` limits how many graph layers
(``Node.layer``) one gather crosses; folding into facts and weights is free. A move is made only
if it lowers the number of irregular gathers (gathers that the later gather simplification
cannot turn into a slice, tile or interleave), or keeps it and shrinks the program. With no
growth allowed only reordering (or dropping) rows moves up; with unlimited growth every gather
ends up folded into constants and weight stacks (thesis Fig. 6.10), except gathers of dynamic
facts and a gather whose rows a contiguous-segment REDUCE would need from a CONCAT in more than
``MAX_CONCAT_RUNS`` runs. Works before or after linear broadcasting: a one-row broadcast side
stays broadcast, other broadcast sides become full sides (if the cost rule says so).

The planner (``compiler/row_planner.py``), with the "shrink" policy, is what deduplication uses
to compute a node on a subset of its rows (``dedup.compress``): it pushes the selection into
single-use producers and composes it into gathers, never copying or growing anything.
"""
from __future__ import annotations

from ..indexing import is_regular_index
from ..ir import Op, Program
from ..rewrite import Rewriter
from ..row_planner import UPWARD, RowPlanner
from ..settings import Settings

__all__ = ["propagate_gathers_up"]


def propagate_gathers_up(program: Program, settings: Settings) -> Program:
    """Move gathers into the nodes before them, latest gathers first (thesis 5.2.7)."""
    editor = Rewriter(program, in_place=True, keep_inputs=False)
    planner = RowPlanner(editor, settings, UPWARD)
    for name in reversed([n.name for n in program.nodes if n.op in (Op.GATHER, Op.REDUCE)]):
        if not editor.is_live(name) or name in planner.left:
            continue
        node = editor.nodes[name]
        if node.op is Op.REDUCE:
            # No gather above to push, but reading the segments k-major may absorb gathers below.
            plan = planner.transposed(node)
            if plan is not None and plan.cost < 0:
                plan.build()
            continue
        if node.op is not Op.GATHER:
            continue
        src = node.srcs[0]
        index = editor.index(node)
        stay = 0 if is_regular_index(index, editor.nodes[src].count) else 1
        plan = planner.rows(src, index, name, depth=0, layer=node.layer or node.name)
        if plan.cost < stay or (plan.cost == stay and plan.growth < 0):
            editor.redirect(name, plan.build())
    planner.close()  # NOTE in RowPlanner.close: no cycle left for the cyclic collector
    return editor.finish()
