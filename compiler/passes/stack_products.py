"""Several shared-weight products of one value, concatenated: one GEMM against the stacked weights.

GraphSAGE's last layer multiplies the hidden rows ``h`` by two one-row weights (``W_l`` and
``W_r``, with the readout's linear map folded in by ``push_linear_down``), and once
``join_sums`` and ``compose_sums`` have made the layer and its readout one sparse sum, that
sum reads the two products side by side::

    %a = LINEAR(wa, h; tile, full) : (n, o)         %s_weights = CONCAT(wa, wb)                  : (2, o, i)
    %b = LINEAR(wb, h; tile, full) : (n, o)   ->    %s = LINEAR(s_weights, h; w_layout='tile',
    %s = CONCAT(a, b)              : (2n, o)                    x_layout='interleave')            : (2n, o)
    %r = REDUCE(s; sparse_mm, index=i)              %r = REDUCE(s; sparse_mm, index=i')

Row ``e * 2 + k`` of the new ``%s`` is ``W_k h_e`` (NOTE: [LINEAR broadcasting]); it was row
``k * n + e``, so the readers' indices are renumbered: ``i' = (i % n) * 2 + i // n``. The
generated code is one GEMM, ``h @ [W_a; W_b].T``, whose ``(n, 2 o)`` result read row-major
*is* the ``(2n, o)`` rows: no concatenation of ``n``-row values, one product fewer forward,
and in the backward one GEMM for ``h``'s gradient instead of two and the sum of their results.
Every value is the same product of the same numbers; only where it is stored changes.

Made where the concatenation holds only such products of one value, each read by the
concatenation alone, and every reader of the concatenation picks its rows by index (a fused
sparse sum or a gather): those readers can be renumbered.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Op, Program, is_sparse_sum, shared_product
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["stack_products"]


def stack_products(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    users = program.users()
    rw = Rewriter(program)
    renumber: dict[str, np.ndarray] = {}  # CONCAT name -> new row of each old row
    for node in program.nodes:
        if node.srcs and node.srcs[0] in renumber and node.op in (Op.GATHER, Op.REDUCE):  # a reader of one
            index = renumber[node.srcs[0]][program.constants[node.attrs["index"]].astype(np.int64)]
            rw.keep(node.with_(attrs=dict(node.attrs, index=rw.const(f"idx_{node.name}", index))))
            continue
        products = _stackable(node, nodes, users, program)
        if products is None:
            rw.keep(node)
            continue
        x = nodes[products[0].srcs[1]]
        weights = [nodes[p.srcs[0]] for p in products]
        c, n = len(products), x.count
        stacked = rw.emit(rw.fresh(f"{node.name}_weights"), Op.CONCAT, [w.name for w in weights], c,
                          weights[0].shape, node.layer)
        rw.emit(node.name, Op.LINEAR, (stacked.name, x.name), c * n, node.shape, node.layer, kind="matmul",
                w_layout="tile", x_layout="interleave")
        old = np.arange(c * n)
        renumber[node.name] = (old % n) * c + old // n
    return rw.finish()


def _stackable(node: Node, nodes: dict[str, Node], users: dict[str, list[str]], program: Program
               ) -> list[Node] | None:
    """The products a CONCAT ``node`` stacks, in order, or None where the rewrite does not apply."""
    if node.op is not Op.CONCAT or len(node.srcs) < 2 or len(set(node.srcs)) != len(node.srcs) \
            or node.name == program.output:
        return None
    products = [nodes[s] for s in node.srcs]
    if not all(shared_product(p, nodes) and users[p.name] == [node.name] for p in products):
        return None
    if len({p.srcs[1] for p in products}) != 1 or len({nodes[p.srcs[0]].shape for p in products}) != 1:
        return None
    if len(nodes[products[0].srcs[1]].shape) != 1:
        return None  # h @ W.T needs vector rows
    readers = [nodes[r] for r in users[node.name]]
    if not readers or not all(_reads_by_index(r) for r in readers):
        return None
    return products


def _reads_by_index(node: Node) -> bool:
    """A reader that picks its source's rows through an index constant (which can be renumbered)."""
    return node.op is Op.GATHER or is_sparse_sum(node)
