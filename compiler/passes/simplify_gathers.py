"""Thesis 5.2.1 gather simplification: gathers with a regular index become cheaper ops.

A gather's index, seen against the rows of its source, is matched to a small *plan*:

* the identity (``arange`` of the whole source): the gather disappears;
* a range with a constant positive step: a ``SLICE`` (a view, no copy);
* dimension-1 repetition ``I = I_s I_s ... I_s``: ``TILE`` of the plan of ``I_s``;
* dimension-2 repetition ``I = i1 i1 .. i2 i2 ..``: ``INTERLEAVE`` of the plan of ``I_s``;
* anything else: the (possibly shorter) ``GATHER`` itself.

Before matching, chains of indexing ops are composed into one index on a deeper
source: GATHER of GATHER, SLICE, TILE or INTERLEAVE, and GATHER of a CONCAT whose
index reads one part only (thesis 5.2.10 step 16). Every candidate source along the
chain is planned, and the cheapest wins (:func:`best_candidate`): composing
through an indexing op that others still read must not recompute it. An index
over a CONCAT made of a few runs that each read one part is also planned part by
part (thesis 5.2.9): ``GATHER(CONCAT(a, b), I1 I2)`` is ``CONCAT(a[I1], b[I2])``,
which wins where the parts' plans need no gather (e.g. a reordering of whole
parts). Single-input CONCATs disappear.

Before::

    %x_cat = CONCAT(f_a, f_b)                      : (6, 3)
    %x = GATHER(x_cat; index=[3, 4, 5, 3, 4, 5])   : (6, 3)

After (``f_b`` has 3 rows)::

    %x = TILE(f_b; times=2)                        : (6, 3)

The plan machinery (``plan_index``, ``emit_plan``) lives in ``compiler/gather_plans.py``,
shared with the clean-up, segment and algebra passes.
"""
from __future__ import annotations

from ..gather_plans import emit_plan, simplified
from ..indexing import ROW_SELECTIONS
from ..ir import Op, Program
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["simplify_gathers"]


def simplify_gathers(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    users = program.users()
    for node in program.nodes:
        node = rw.take(node)
        if node.op is Op.CONCAT and len(node.srcs) == 1:
            rw.alias(node.name, node.srcs[0])
        elif node.op in ROW_SELECTIONS:
            best = simplified(rw, node, users)
            if best is None:
                rw.keep(node)
            else:
                root, plan = best
                emit_plan(rw, node.name, plan, rw.nodes[root], node.layer)
        else:
            rw.keep(node)
    return rw.finish()
