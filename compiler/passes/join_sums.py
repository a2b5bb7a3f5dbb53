"""An addition of a fused sparse sum and another sum or value is one sparse sum over both sources.

GraphSAGE's layer adds a mean over each node's neighbours to the node's own value
(``mean_j(x W_l) + x W_r``); after deduplication the second term is often a gather of
the distinct rows. That is a sparse sum, a gather (or a plain value), an addition, and
their three backwards. A sparse sum reads any rows of one source, so both terms are
one sparse sum over the two sources side by side::

    %a = REDUCE(%p; kernel='sparse_mm', index=i, counts=c)       %pq = CONCAT(%p, %q)
    %b = GATHER(%q; index=k)                               ->     %s = REDUCE(%pq; kernel='sparse_mm',
    %s = ADD(%a, %b)                                                  index=i' , counts=c + 1, coef=...)

Row ``j`` of the new matrix lists the entries of ``a``'s row ``j`` (a mean's as
``1/count``), then those of ``b``'s row ``j`` (its columns shifted past ``%p``'s rows).
A term may be a fused sum or mean, a gather, or a value of the addition's rows (one
entry per row: itself); at least one is a fused sum. Both sources are the same value
when both terms read it (then nothing is concatenated). The same real numbers are
summed, in another order (a mean's division becomes a factor per entry); no value is
merged or dropped. The new matrix has the entries of both, and ``compose_sums`` can then
compose a readout over it (GraphSAGE's last layer and its mean per sample are then one
sparse sum).

Not where the join only concatenates: when the two terms read different values and the
fused term sums one row per output row without a factor (a gather as a sum, which
``choose_kernels`` makes of a large gather), the joined sum reads the same rows as the
gather and the addition, but the CONCAT first copies both sources (GraphSAGE's first two
layers on arxiv-like: ``mean @ W_l.T`` and ``h @ W_r.T`` concatenated into 324,886 x 128
rows, ~163 ms a step). The addition stays, and ``merge_row_adds`` can give the bias to the
product (one ``addmm``). Two products of one value (``stack_products`` stacks them into one
GEMM, no copy) are still joined.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Op, Program, is_sparse_sum, shared_product
from ..rewrite import Rewriter, single_use
from ..settings import Settings

__all__ = ["join_sums"]


def join_sums(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    rw = Rewriter(program)
    for node in program.nodes:
        terms = _terms(node, nodes, once, program) if node.op is Op.ADD else None
        if terms is None:
            rw.keep(node)
            continue
        ((p, index_p, counts_p, coef_p), (q, index_q, counts_q, coef_q)), kernel = terms
        source = p.name
        if q.name != p.name:
            source = rw.emit(rw.fresh(f"{node.name}_sources"), Op.CONCAT, (p.name, q.name), p.count + q.count,
                             p.shape, node.layer).name
            index_q = index_q + p.count
        # Each row's entries: p's, then q's (a stable sort of the two runs by row is a merge).
        rows = np.concatenate([np.repeat(np.arange(node.count), counts_p), np.repeat(np.arange(node.count), counts_q)])
        order = np.argsort(rows, kind="stable")
        index, coef = np.concatenate([index_p, index_q])[order], np.concatenate([coef_p, coef_q])[order]
        attrs = {"aggregation": "sum", "kernel": kernel,
                 "counts": rw.const(f"counts_{node.name}", counts_p + counts_q),
                 "index": rw.const(f"idx_{node.name}", index)}
        if not np.all(coef == 1.0):
            attrs["coef"] = rw.const(f"coef_{node.name}", coef)
        rw.keep(node.with_(op=Op.REDUCE, srcs=(source,), attrs=attrs))
    return rw.finish()


def _terms(node: Node, nodes: dict[str, Node], once: set[str], program: Program) -> tuple | None:
    """Both terms of addition ``node`` as ``(source, index, counts, coef)``, or None where it
    is not an addition of a fused sum and another term of its rows."""
    a, b = (nodes[s] for s in node.srcs)
    if a.name == b.name or a.count != node.count or b.count != node.count or not a.shape == b.shape == node.shape:
        return None
    terms = [_term(a, nodes, once, program), _term(b, nodes, once, program)]
    if any(t is None for t in terms) or not any(t[1] for t in terms):
        return None
    if _only_concatenates([t[0] for t in terms], [t[1] for t in terms], nodes):
        return None
    fused = next(nodes[s] for s, t in zip(node.srcs, terms) if t[1])
    return tuple(t[0] for t in terms), fused.attrs["kernel"]  # the joined sum runs as the fused one


def _only_concatenates(terms: list[tuple], fused: list[bool], nodes: dict[str, Node]) -> bool:
    """Whether joining ``terms`` would only copy two different sources side by side: each
    fused term sums one row per output row without a factor, and the sources are not two
    shared-weight products of one value (which ``stack_products`` makes one GEMM)."""
    (p, _, counts_p, coef_p), (q, _, counts_q, coef_q) = terms
    if p.name == q.name:
        return False
    if shared_product(p, nodes) and shared_product(q, nodes) and p.srcs[1] == q.srcs[1]:
        return False
    return all(np.all(counts == 1) and np.all(coef == 1.0)
               for (_, _, counts, coef), is_fused in zip(terms, fused) if is_fused)


def _term(node: Node, nodes: dict[str, Node], once: set[str], program: Program) -> tuple | None:
    """``((source, index, counts, coef), fused)`` of one term: a fused sum or mean, a gather
    (both read by the addition only), or else the value itself (``fused`` False but for
    a fused sum); None for a mean with an empty segment."""
    c = program.constants
    if node.name in once and is_sparse_sum(node) and node.attrs["aggregation"] in ("sum", "mean"):
        counts = c[node.attrs["counts"]].astype(np.int64)
        index = c[node.attrs["index"]].astype(np.int64)
        coef = c[node.attrs["coef"]].astype(np.float64) if "coef" in node.attrs else np.ones(index.size)
        if node.attrs["aggregation"] == "mean":
            if not np.all(counts > 0):
                return None
            coef = coef / np.repeat(counts, counts)
        return (nodes[node.srcs[0]], index, counts, coef), True
    if node.name in once and node.op is Op.GATHER:
        index = c[node.attrs["index"]].astype(np.int64)
        return (nodes[node.srcs[0]], index, np.ones(node.count, np.int64), np.ones(node.count)), False
    return (node, np.arange(node.count), np.ones(node.count, np.int64), np.ones(node.count)), False
