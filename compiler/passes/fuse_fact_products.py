"""A sum of two shared-weight products of static facts becomes one product (GraphSAGE's first layer).

GraphSAGE's first layer adds ``x @ W_r.T`` and ``mean(x) @ W_l.T``; once the mean of
the static features is folded into a constant, both products read constant facts.
One GEMM over the two facts side by side does both::

    %a = LINEAR(%Wa, %Fa)                          %s = ADD(%a, %b; hcat=Fab, hcat_weights=(Wa, Wb))
    %b = LINEAR(%Wb, %Fb)          ->              with Fab = [Fa | Fb], a constant, and the code
    %s = ADD(%a, %b)                               s = Fab @ torch.cat([Wa, Wb], 1).T

Where deduplication computed a side on its distinct rows and gathers it back
(``%a = GATHER(LINEAR(%Wa, %Fa); index=i)``), the constant holds the gathered facts
``Fa[i]``: one GEMM over every row instead of two GEMMs, two gathers and an addition,
made where it moves fewer values, per-op overhead included (estimated below).

The pass only records the side-by-side constant on the ADD (attrs ``hcat``, and
``hcat_weights``: the two weight nodes); the code generator emits the one product
where both weights are single shared weights kept as their row, and the nodes as
they are otherwise (the attrs are a hint; the nodes are unchanged). Exact in real
arithmetic; the inner sum is rounded as one sum instead of two. Not where a
``-0.0`` could reach an ``inverse``, ``log`` or ``sqrt`` (``zero_sign_matters``), nor for facts declared
dynamic.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Program, fact_product_sides
from ..rewrite import Rewriter, single_use, zero_sign_matters
from ..settings import Settings

__all__ = ["fuse_fact_products"]


def fuse_fact_products(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    matters = zero_sign_matters(program)
    dynamic = set(program.dynamic_facts)
    rw = Rewriter(program)
    for node in program.nodes:
        sides = fact_product_sides(node, nodes, once, dynamic) if node.name not in matters else None
        if sides and _cheaper(program, node, nodes, sides):
            facts = []
            for product, index in sides:
                values = program.constants[nodes[product.srcs[1]].attrs["const"]]
                facts.append(values if index is None else values[program.constants[index]])
            key = rw.const(f"hcat_{node.name}", np.hstack(facts))
            node = node.with_(attrs=dict(node.attrs, hcat=key, hcat_weights=tuple(p.srcs[0] for p, _ in sides)))
        rw.keep(node)
    return rw.finish()


#: The fixed cost of one more op (and its backward), in values read or written: a few
#: microseconds of dispatch and autograd per op, at ~20 GB/s.
OP_COST = 20_000


def _cheaper(program: Program, add: Node, nodes: dict[str, Node], sides) -> bool:
    """Values read and written by the side-by-side GEMM against the products on their own rows,
    their gathers and the addition (narrow GEMMs like these are bound by memory, not arithmetic),
    each op also counted as :data:`OP_COST`."""
    out = int(np.prod(add.shape))
    width = sum(nodes[p.srcs[1]].shape[0] for p, _ in sides)
    fused = add.count * (width + out) + OP_COST
    apart = 3 * add.count * out + OP_COST  # the addition
    for product, index in sides:
        apart += product.count * (nodes[product.srcs[1]].shape[0] + out) + OP_COST
        if index is not None:
            apart += 2 * add.count * out + OP_COST
    return fused <= apart
