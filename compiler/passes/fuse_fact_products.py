"""A sum of two shared-weight products of constant facts becomes one product (GraphSAGE's first layer).

GraphSAGE's first layer adds ``x @ W_r.T`` and ``mean(x) @ W_l.T``; once the mean of
the static features is folded into a constant, both products read constant facts of
the same rows. One GEMM over the two facts side by side does both::

    %a = LINEAR(%Wa, %Fa)                          %s = ADD(%a, %b; hcat=Fab)
    %b = LINEAR(%Wb, %Fb)          ->              with Fab = [Fa | Fb], a constant, and the code
    %s = ADD(%a, %b)                               s = Fab @ torch.cat([Wa, Wb], 1).T

The pass only records the side-by-side constant ``Fab`` on the ADD (attr ``hcat``);
the code generator emits the one product where both weights are single shared
weights, and the two products otherwise (the attr is a hint, the nodes are unchanged).
One GEMM of width ``da + db`` instead of two, no addition of two ``(n, out)`` values,
and in the backward no gradient passed through that addition. Exact in real
arithmetic; the inner sum is rounded as one sum instead of two. Not where a ``-0.0``
could reach an ``inverse`` (``zero_sign_matters``), nor for facts declared dynamic.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Op, Program
from ..rewrite import fresh_const, single_use, zero_sign_matters
from ..settings import Settings

__all__ = ["fuse_fact_products"]


def fuse_fact_products(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    matters = zero_sign_matters(program)
    dynamic = set(program.dynamic_facts)
    constants = dict(program.constants)
    result: list[Node] = []
    changed = False
    for node in program.nodes:
        if node.op is Op.ADD and node.name not in matters and node.srcs[0] != node.srcs[1] \
                and all(_fact_product(nodes[s], node, nodes, once, dynamic) for s in node.srcs):
            facts = [program.constants[nodes[nodes[s].srcs[1]].attrs["const"]] for s in node.srcs]
            key = fresh_const(program, constants, f"hcat_{node.name}", np.hstack(facts))
            node = node.with_(attrs=dict(node.attrs, hcat=key))
            changed = True
        result.append(node)
    return program.replace(nodes=tuple(result), constants=constants) if changed else program


def _fact_product(product: Node, add: Node, nodes: dict[str, Node], once: set[str], dynamic: set[str]) -> bool:
    """``product`` is a one-weight GEMM over a static fact, read only by ``add``, of ``add``'s rows."""
    if product.op is not Op.LINEAR or product.attrs["kind"] != "matmul" or product.name not in once:
        return False
    w, x = (nodes[s] for s in product.srcs)
    return (w.count == 1 and len(w.shape) == 2 and product.attrs.get("x_layout", "full") == "full"
            and x.op is Op.FACT and x.attrs.get("fact_layer") not in dynamic and len(x.shape) == 1
            and x.count == add.count and product.shape == add.shape)
