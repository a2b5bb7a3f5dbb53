"""Thesis 5.2.6: fact deduplication -- a fact layer keeps one row per distinct value.

Facts are constants (unless listed in ``Settings.dynamic_facts``), so equal rows are the same
value everywhere: the FACT keeps the distinct rows that something reads, in order of first
appearance, and every gather reading it (directly or through CONCATs) gets the composed index.
The deduplicated FACT is no longer a replaceable input of the module (it was optimized using its
values); dynamic facts are left alone.

Before (MUTAG: 3371 one-hot atom features, 7 distinct)::

    %f_x = FACT(const=facts_x, fact_layer='x')          : (3371, 7)
    %conv1_lin_x = GATHER(%f_x; index=idx[3371])        : (3371, 7)

After::

    %f_x = FACT(const=facts_f_x, fact_layer=None)       : (7, 7)
    %conv1_lin_x = GATHER(%f_x; index=idx[3371])        : (3371, 7)
"""
from __future__ import annotations

import numpy as np

from ..grouping import first_equal_rows, first_rows, representatives
from ..ir import Op, Program
from ..rewrite import is_input_fact
from ..settings import Settings
from .dedup import compress, hand_over_distinct_facts
from .upward import SHRINK, Editor, RowPlanner

__all__ = ["dedup_facts"]


def dedup_facts(program: Program, settings: Settings) -> Program:
    editor = Editor(program)
    planner = RowPlanner(editor, settings, SHRINK)
    dynamic = set(settings.dynamic_facts)
    distinct = []  # facts left as they were, their rows pairwise distinct: for iso_compression
    for node in program.nodes:
        if not is_input_fact(node) or node.attrs["fact_layer"] in dynamic or not editor.is_live(node.name):
            continue
        first = first_equal_rows(editor.constants[node.attrs["const"]])  # bitwise: -0.0 is not 0.0
        readers = [editor.nodes[r] for r in editor.readers(node.name)]
        if readers and node.name != editor.output and all(r.op is Op.GATHER for r in readers):
            # Only the rows that some gather reads are kept: classes among the read rows.
            read = np.zeros(node.count, dtype=bool)
            for r in readers:
                read[editor.index(r)] = True
            rows = np.flatnonzero(read)
            local_reps, local_inverse = representatives(first_rows(first[rows], node.count))
            reps = rows[local_reps]
            inverse = np.zeros(node.count, dtype=np.int64)  # unread rows may map anywhere
            inverse[rows] = local_inverse
        else:
            reps, inverse = representatives(first)
        if reps.size < node.count:
            compress(editor, planner, node.name, reps, inverse)
        else:  # every row read, and no two alike
            distinct.append(node.name)
    result = editor.finish()
    hand_over_distinct_facts(result, distinct, dynamic)
    return result
