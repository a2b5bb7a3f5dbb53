"""Biases are added by broadcasting their one row, not by repeating it to every row first.

The Vectorizer gathers every neuron's bias; once the gathers are simplified, a bias
shared by a whole layer is a TILE of one row: a ``(n, 16)`` copy made (and reduced
again in the backward) every step only to be added. An ADD may read a one-row
``b`` (NOTE in ``compiler/ir.py``), so the copy goes::

    %b = TILE(w_bias; times=n)            : (n, 16)
    %y = ADD(x, b)                        : (n, 16)
  becomes
    %y = ADD(x, w_bias)                   : (n, 16)      x + w['conv1.bias']

``merge_row_adds`` (after the algebra and the compositions, which move biases past
sums and products) adds two one-row additions in a row as one: ``(x + a) + b`` is
``x + (a + b)``, one addition over all rows less, forward and backward (MUTAG GCN's
readout: the last layer's bias, moved past the mean, then the output bias). The
same numbers summed in another order; a sum of zeros keeps its sign in either.

It also gives a one-row addition after a sum of two values to the term that is a
shared-weight product: ``(x + h @ W.T) + b`` is ``x + (h @ W.T + b)``, and the code
generator writes the inner one as ``torch.addmm(b, h, W.T)`` (NOTE: [bias in the GEMM]
in ``engines/torch_module.py``): one pass over all rows less, forward and backward
(GraphSAGE's first two layers, where the neighbours' mean and the node's own product stay
apart: see ``join_sums``). A matrix product is never ``-0.0`` (a sum from ``+0.0``), so
neither ``h @ W.T + b`` nor either order of the sum is.
"""
from __future__ import annotations

from ..ir import Node, Op, Program, fact_product_sides, shared_product
from ..rewrite import Rewriter, single_use
from ..settings import Settings

__all__ = ["broadcast_adds", "merge_row_adds"]


def broadcast_adds(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.op is Op.ADD and node.count > 1:
            row = _one_row(rw, node.srcs[1])
            if row is not None:
                node = node.with_(srcs=(node.srcs[0], row))
                rw.replace(node)
                continue
        rw.keep(node)
    return rw.finish()


def _one_row(rw: Rewriter, name: str) -> str | None:
    """The one-row value that ``name`` repeats to every row, or None."""
    node = rw.nodes[name]
    while node.op in (Op.TILE, Op.INTERLEAVE) and node.count > 1:
        node = rw.nodes[node.srcs[0]]
    return node.name if node.count == 1 else None


def merge_row_adds(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    dynamic = set(program.dynamic_facts)
    rw = Rewriter(program)
    merged: set[str] = set()
    for node in program.nodes:
        inner = nodes[node.srcs[0]] if node.op is Op.ADD else None
        if inner is None or inner.op is not Op.ADD or inner.name not in once or inner.name in merged:
            rw.keep(node)
            continue
        a, b = nodes[inner.srcs[1]], nodes[node.srcs[1]]
        product = _product_term(inner, b, nodes, once, dynamic)
        if product is not None and node.name not in merged:
            other = inner.srcs[1 - inner.srcs.index(product)]
            biased = rw.emit(rw.fresh(f"{product}_biased"), Op.ADD, (product, b.name), inner.count,
                             inner.shape, node.layer)
            rw.keep(node.with_(srcs=(other, biased.name)))
            continue
        if a.count != 1 or b.count != 1 or a.shape != b.shape or a.name == node.srcs[0]:
            rw.keep(node)
            continue
        row = rw.emit(rw.fresh(f"{node.name}_row"), Op.ADD, (a.name, b.name), 1, a.shape, node.layer)
        rw.keep(node.with_(srcs=(inner.srcs[0], row.name)))
        merged.add(node.name)  # its new first operand is not an addition of a row any more
    return rw.finish()


def _product_term(inner: Node, b: Node, nodes: dict[str, Node], once: set[str], dynamic: set[str]) -> str | None:
    """The term of addition ``inner`` (of two whole values) that is a shared-weight product read by
    ``inner`` alone, to which the one-row ``b`` can be added instead; None where there is none, or
    where ``inner`` is a side-by-side product of facts (attr ``hcat``: one ``addmm`` with ``b`` already),
    or may become one (``fact_product_sides``: ``fuse_fact_products`` runs later)."""
    if b.count != 1 or inner.srcs[0] == inner.srcs[1] or "hcat" in inner.attrs \
            or fact_product_sides(inner, nodes, once, dynamic):
        return None
    terms = [nodes[s] for s in inner.srcs]
    if any(t.count != inner.count or t.shape != inner.shape for t in terms) or b.shape != inner.shape:
        return None
    for t in reversed(terms):  # the node's own product (the second term) first
        if shared_product(t, nodes) and t.name in once:
            return t.name
    return None
