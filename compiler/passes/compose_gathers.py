"""A gather of a fused gather-sum's rows becomes part of the fused sum.

Deduplication computes each distinct aggregation once and then gathers the
results back to the neurons that use them. When the aggregation is a fused
``sparse_mm`` sum (or mean) that nothing else reads, the gather can instead pick
the sparse matrix's rows: row ``r`` of the result is segment ``idx[r]`` of the
old matrix, summed over the same edges in the same order::

    %s = REDUCE(%h; kernel='sparse_mm', index=i, counts=c)      %g = REDUCE(%h; kernel='sparse_mm',
    %g = GATHER(%s; index=idx)                              ->         index=i', counts=c[idx])

with ``i'`` the concatenation of the segments ``idx[0], idx[1], ...`` of ``i``
(and their ``coef``). The values are bitwise the same; the gather and its
backward (an ``index_add_``) disappear. Repeated segments are summed once per
reader, so the rewrite is made only where it costs fewer row operations: the
edges added, ``nnz' - nnz``, must not exceed the gather's rows. Deduplication
that saved little (PROTEINS' SAGE: 42,815 distinct means for 43,471 neurons)
is undone this way; one that saved much is kept.
"""
from __future__ import annotations

import numpy as np

from ..grouping import expand_segments
from ..ir import Node, Op, Program
from ..rewrite import eliminate_dead_code, fresh_const, single_use
from ..settings import Settings

__all__ = ["compose_gathers"]


def compose_gathers(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    constants = dict(program.constants)
    result: list[Node] = []
    changed = False
    for node in program.nodes:
        reduce = nodes[node.srcs[0]] if _is_gather(node, program) else None
        if reduce is None or reduce.op is not Op.REDUCE or reduce.attrs.get("kernel") != "sparse_mm" \
                or reduce.name not in once:
            result.append(node)
            continue
        rows = program.constants[node.attrs["index"]].astype(np.int64)  # the gather's
        counts = program.constants[reduce.attrs["counts"]].astype(np.int64)
        picked = counts[rows]
        added = int(picked.sum()) - int(counts.sum())
        if added > node.count:
            result.append(node)
            continue
        # Position of every edge of the new matrix in the old one: segment idx[r]'s edges in order.
        edges = expand_segments((np.cumsum(counts) - counts)[rows], picked)
        attrs = dict(reduce.attrs)
        attrs["counts"] = fresh_const(program, constants, f"counts_{node.name}", picked)
        attrs["index"] = fresh_const(program, constants, f"idx_{node.name}",
                                     program.constants[reduce.attrs["index"]][edges])
        if "coef" in attrs:
            attrs["coef"] = fresh_const(program, constants, f"coef_{node.name}",
                                        program.constants[reduce.attrs["coef"]][edges])
        result.append(node.with_(op=Op.REDUCE, srcs=reduce.srcs, attrs=attrs))
        changed = True
    if not changed:
        return program
    return eliminate_dead_code(program.replace(nodes=tuple(result), constants=constants))


def _is_gather(node: Node, program: Program) -> bool:
    """A GATHER, or a gather that choose_kernels wrote as a one-edge-per-row fused sum."""
    if node.op is Op.GATHER:
        return True
    return (node.op is Op.REDUCE and node.attrs.get("kernel") == "sparse_mm" and node.attrs["aggregation"] == "sum"
            and "coef" not in node.attrs and bool(np.all(program.constants[node.attrs["counts"]] == 1)))
