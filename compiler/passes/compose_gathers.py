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
reader, so the rewrite is made only where it costs less: the edges added,
``nnz' - nnz``, must not exceed the gather's rows plus what the gather op itself
costs (``GATHER_OP_ENTRIES`` one-wide entries, a few µs: small graphs are all op
overhead). Deduplication
that saved little (PROTEINS' SAGE: 42,815 distinct means for 43,471 neurons)
is undone this way; one that saved much is kept.

Where another sparse sum has the same matrix (GCN's layers read one graph), the
module builds that matrix once for both; composing the program's output gather
would make a new matrix, so all its ``nnz'`` edges count as added. The output
gather after the last of a deduplicated GCN's sums thus stays (products-like: a
2.4M-row gather, not a second 62M-edge matrix and its transpose). Only the
output's: a gather inside the program may still let later passes join its sum with
another term into one new matrix anyway (SAGE's mean and the node's own row,
join_sums), where the composed form is the one they join.

Row-wise ops between the sum and the gather (functions of one row, additions of one
row to every row) do not stop it: a gather of ``sigmoid(s + b)`` is ``sigmoid(s' + b)``
over the picked rows ``s'``, bit for bit, so the readout of deduplicated samples picks
its outputs inside the readout's matrix instead of gathering them at the end. Those
ops then run on the gather's rows: made only where the rows they gain, times their
number, are no more than the gather's rows.
"""
from __future__ import annotations

import numpy as np

from ..grouping import expand_segments
from ..ir import Node, Op, Program, is_sparse_sum, same_sparse_matrix, sparse_matrix
from ..rewrite import Rewriter, single_use
from ..settings import Settings

__all__ = ["compose_gathers", "GATHER_OP_ENTRIES"]

#: What a gather costs besides its rows: an op and its backward (index_add_) of a few µs
#: each, about as long as the sparse sum takes for this many more one-wide entries
#: (MUTAG, 1 thread: a 188-row gather and its backward ~8 µs, 10,000 entries ~8 µs).
GATHER_OP_ENTRIES = 2048


def compose_gathers(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    rw = Rewriter(program)
    sums = [node for node in program.nodes if is_sparse_sum(node)]
    for node in program.nodes:
        chain, reduce = [], None
        if _is_gather(node, program):
            chain = _row_wise_chain(nodes[node.srcs[0]], nodes, once)
            reduce = nodes[(chain[-1] if chain else node).srcs[0]]
        if reduce is None or not is_sparse_sum(reduce) or reduce.name not in once:
            rw.keep(node)
            continue
        rows = program.constants[node.attrs["index"]].astype(np.int64)  # the gather's
        counts = program.constants[reduce.attrs["counts"]].astype(np.int64)
        picked = counts[rows]
        mine = sparse_matrix(program, reduce)
        shared = node.name == program.output and any(
            other.name != reduce.name and same_sparse_matrix(mine, sparse_matrix(program, other)) for other in sums)
        added = int(picked.sum()) - (0 if shared else int(counts.sum()))
        # Row-wise ops in between then run on the gather's rows instead of the sum's.
        saved = node.count + GATHER_OP_ENTRIES // max(1, int(np.prod(node.shape)))
        if added > saved or (node.count - reduce.count) * len(chain) > node.count:
            rw.keep(node)
            continue
        # Position of every edge of the new matrix in the old one: segment idx[r]'s edges in order.
        edges = expand_segments((np.cumsum(counts) - counts)[rows], picked)
        attrs = dict(reduce.attrs)
        attrs["counts"] = rw.const(f"counts_{node.name}", picked)
        attrs["index"] = rw.const(f"idx_{node.name}", program.constants[reduce.attrs["index"]][edges])
        if "coef" in attrs:
            attrs["coef"] = rw.const(f"coef_{node.name}", program.constants[reduce.attrs["coef"]][edges])
        if not chain:
            rw.keep(node.with_(op=Op.REDUCE, srcs=reduce.srcs, attrs=attrs))
        else:  # the sum's rows picked, then the same row-wise ops on them, the last one named as the gather
            value = rw.keep(reduce.with_(name=rw.fresh(f"{reduce.name}_rows"), count=node.count, attrs=attrs)).name
            for k, op in enumerate(reversed(chain)):
                name = node.name if k == len(chain) - 1 else rw.fresh(f"{op.name}_rows")
                value = rw.keep(op.with_(name=name, count=node.count, srcs=(value,) + op.srcs[1:])).name
    return rw.finish()


def _row_wise_chain(node: Node, nodes: dict[str, Node], once: set[str]) -> list[Node]:
    """The single-use row-wise ops from ``node`` down to what they read: functions of one
    row (TRANSFORM) and additions of one row to every row. A gather of their result is the
    same ops on the gathered rows, bit for bit; listed from ``node`` down."""
    chain = []
    while node.name in once and (node.op is Op.TRANSFORM or (
            node.op is Op.ADD and nodes[node.srcs[1]].count == 1 and node.srcs[0] != node.srcs[1])):
        chain.append(node)
        node = nodes[node.srcs[0]]
    return chain


def _is_gather(node: Node, program: Program) -> bool:
    """A GATHER, or a gather that choose_kernels wrote as a one-edge-per-row fused sum."""
    if node.op is Op.GATHER:
        return True
    return (is_sparse_sum(node) and node.attrs["aggregation"] == "sum"
            and "coef" not in node.attrs and bool(np.all(program.constants[node.attrs["counts"]] == 1)))
