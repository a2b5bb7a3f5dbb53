"""Thesis 5.2.6: isomorphic compression, layer by layer -- exact.

Within every node that ends a layer (a REDUCE, ADD or TRANSFORM that no TRANSFORM or ADD
continues), rows that are provably equal are merged: the layer is computed on one row per class,
and its readers are reindexed (``dedup.compress``). Only rows of the same node are compared, never
rows of different layers (thesis footnote 9).

"Provably equal" means equal for every value of the learnable weights, by structure
(``dedup.RowIds`` with ``fact_values``): the same op, the same weights (a learnable weight by its
identity, a fixed one by its bytes), inputs that are equal as a multiset under an aggregation
(every aggregation is commutative) and in order otherwise, and static facts that are equal
bit for bit. Nothing is evaluated, so nothing is merged because it happens to round to the same
number: near-equal facts, ``-0.0`` against ``0.0``, and neurons that agree only because one large
term dominates all stay apart (thesis 5.2.6 evaluates with random weights and a tolerance; that
merges all three, and the outputs or gradients come out wrong).

Before (two atoms with the same neighbourhood, written in another order)::

    %x = GATHER(%lin; index=[0, 1, 1, 0])
    %agg = REDUCE(%x; aggregation='sum', counts=[2, 2])      : (2, 16)
    %out = TRANSFORM(%agg; fn='relu')                        : (2, 16)
    %next = GATHER(%out; index=[0, 1, 1])

After::

    %x = GATHER(%lin; index=[0, 1])
    %agg = REDUCE(%x; aggregation='sum', counts=[2])         : (1, 16)
    %out = TRANSFORM(%agg; fn='relu')                        : (1, 16)
    %next = GATHER(%out; index=[0, 0, 0])
"""
from __future__ import annotations

from ..grouping import representatives
from ..ir import Op, Program
from ..rewrite import is_input_fact
from ..settings import Settings
from .dedup import RowIds, compress
from .upward import SHRINK, Editor, RowPlanner

__all__ = ["iso_compress", "layer_ends"]


def iso_compress(program: Program, settings: Settings) -> Program:
    ends = layer_ends(program)
    if not ends:
        return program
    editor = Editor(program)
    planner = RowPlanner(editor, settings, SHRINK)
    ids = RowIds(editor, fact_values=True, dynamic=settings.dynamic_facts)
    for name in [n.name for n in program.nodes if n.name in ends]:
        if not editor.is_live(name):
            continue
        reps, inverse = representatives(ids.first(name))
        if reps.size < editor.nodes[name].count:
            name = compress(editor, planner, name, reps, inverse, ids)  # the node with the rows `reps`
        del reps, inverse  # not kept while the next layer end is labelled
        ids.mark_distinct(name)  # for dedup, which need not label it again (NOTE: [distinct rows])
    if editor.changed:
        # The merges hold for these fact values only: the facts stop being replaceable inputs.
        dynamic = set(settings.dynamic_facts)
        for node in program.nodes:
            if is_input_fact(node) and node.attrs["fact_layer"] not in dynamic and editor.is_live(node.name):
                editor.define(editor.nodes[node.name].with_(attrs={**editor.nodes[node.name].attrs,
                                                                   "fact_layer": None}))
    result = editor.finish()
    ids.hand_over(result)
    ids.close()
    return result


def layer_ends(program: Program) -> set[str]:
    """REDUCE / ADD / TRANSFORM nodes whose value no TRANSFORM or ADD (as its main input) continues."""
    continued = set()
    for n in program.nodes:
        if n.op in (Op.TRANSFORM, Op.ADD):
            continued.add(n.srcs[0])
    values = (Op.REDUCE, Op.ADD, Op.TRANSFORM)
    return {n.name for n in program.nodes if n.op in values and n.name not in continued}
