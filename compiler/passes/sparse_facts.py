"""A product of a sparse static fact matrix by a weight becomes a sparse sum of the weight's columns.

Cora's 1,433 bag-of-words features are 98.7% zeros; once ``fold_constants`` has folded GCN's
first aggregation ``A X`` into a constant, 4.75% of it is nonzero, and the first layer is a
dense ``(2575, 1433) @ (1433, 16)`` GEMM, forward and for the weight's gradient. Row ``j`` of
``F @ W.T`` is ``sum_k F[j, k] W[:, k]``: a sum over the nonzeros of row ``j`` of the weight's
columns, each times its value. That is a sparse sum (a REDUCE with an ``index``: the column ids,
``coef``: the values) over the rows of ``W.T``, which the new op ``TRANSPOSE`` provides::

    %w = WEIGHTS(names=('conv1.lin.weight',))                 : (1, 16, 1433)
    %f = FACT(const=folded_a)                                  : (2575, 1433)
    %l = LINEAR(w, f; kind='matmul', w_layout='tile')          : (2575, 16)
  becomes
    %w = WEIGHTS(names=('conv1.lin.weight',))                 : (1, 16, 1433)
    %w_columns = TRANSPOSE(w)                                  : (1433, 16)
    %l = REDUCE(w_columns; aggregation='sum', index=cols, coef=values, counts=row_nonzeros)

The engine runs it as its fused gather + sum (the C++ CSR kernel), forward and backward (the
weight's gradient is the transposed CSR times the output's gradient): work in proportion to the
nonzeros, not to the whole matrix. A side-by-side product of two facts (``fuse_fact_products``'s
``hcat``, GraphSAGE) becomes one sparse sum over both weights' columns, stacked.

Where: the fact is static (not in ``Settings.dynamic_facts``), the weight one matrix for all rows,
the product has at least :data:`MIN_WORK` multiply-adds, and the fact's density (nonzeros /
entries) is at most ``Settings.sparse_fact_density`` for products up to :data:`WIDE` values wide,
proportionally less for wider ones. Measured (1 thread,
float32, forward + backward, loaded machine, so indicative): 2708 rows x 1433 by 16 outputs, the
sparse sum is 40x faster at 1% density, 20x at 5%, 8x at 10%, 3x at 20% and even at 50%; at 64
outputs (5%) 2.2x; at 128 outputs (20000 x 256) 1.4x faster at 5% and 4x slower at 20%, where
MKL's GEMM is at its most efficient and the backward gathers 128-wide rows of the gradient.

A row without nonzeros gets one explicit zero entry (column 0), since the kernels' segments are
never empty. Exact in real arithmetic: the products that are left out are zeros times weights,
so the sums differ from the GEMM's only in rounding order; a zero row's ``+0.0`` may come out
``-0.0``, so nothing whose zero sign an ``inverse``, ``log`` or ``sqrt`` could see is rewritten
(``zero_sign_matters``); and a non-finite weight no longer meets those zeros (``0 * inf``).
Runs last, after ``choose_kernels``: its sums are ``kernel="auto"``, the engine's choice.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Op, Program
from ..rewrite import Rewriter, zero_sign_matters
from ..settings import Settings

__all__ = ["sparse_facts", "WIDE", "MIN_WORK", "fact_csr"]

#: Products of fewer multiply-adds (rows x inputs x outputs) stay GEMMs: there the sparse sum's fixed
#: cost (one more op and backward) decides. Measured with the bias (1 thread, float32, forward +
#: backward, loaded): 100 x 100 by 16 at 5%, 56 us as ``addmm`` against 69 us; 300 x 300 by 16,
#: 133 against 76 us; 1000 x 500 by 16, 525 against 159 us.
MIN_WORK = 1 << 19

#: Products up to this many values wide take ``Settings.sparse_fact_density`` as it is; wider ones
#: proportionally less (see the module doc: the crossover density falls as the product widens).
WIDE = 32


def sparse_facts(program: Program, settings: Settings) -> Program:
    density = settings.sparse_fact_density
    if density <= 0:
        return program
    nodes = program.by_name()
    matters = zero_sign_matters(program)
    dynamic = set(program.dynamic_facts)
    plans: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    sides: set[str] = set()  # products inside a side-by-side product: decided with it
    for node in program.nodes:
        if node.op is Op.ADD and "hcat" in node.attrs:
            sides.update(_hcat_sides(node, nodes))
            weights = node.attrs["hcat_weights"]
            if node.name not in matters and all(_one_matrix(nodes[w]) for w in weights):
                plans[node.name] = (tuple(weights), program.constants[node.attrs["hcat"]])
    for node in program.nodes:
        if node.op is Op.LINEAR and node.name not in sides and node.name not in matters:
            fact = _fact_product(node, nodes, dynamic)
            if fact is not None:
                plans[node.name] = ((node.srcs[0],), program.constants[fact.attrs["const"]])
    plans = {name: plan for name, plan in plans.items() if _sparse_enough(plan[1], nodes[name], density)}
    if not plans:
        return program
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.name in plans:
            weights, matrix = plans[node.name]
            rw.replace(_sparse_sum(rw, node, [rw.resolve(w) for w in weights], nodes, matrix))
        else:
            rw.keep(node)
    return rw.finish()


def _one_matrix(node: Node) -> bool:
    return node.count == 1 and len(node.shape) == 2


def _fact_product(node: Node, nodes: dict[str, Node], dynamic: set[str]) -> Node | None:
    """The static FACT that LINEAR ``node`` multiplies by one weight matrix for all its rows, or None."""
    w, x = (nodes[s] for s in node.srcs)
    if node.attrs["kind"] != "matmul" or not _one_matrix(w) or w.name == x.name:
        return None
    if x.op is not Op.FACT or x.attrs.get("fact_layer") in dynamic or len(x.shape) != 1:
        return None
    if node.attrs.get("x_layout", "full") != "full" or x.count != node.count or node.shape != w.shape[:1]:
        return None
    return x


def _hcat_sides(add: Node, nodes: dict[str, Node]) -> list[str]:
    """The products (and gathers of them) that a side-by-side product ``add`` stands for."""
    names = []
    for side in add.srcs:
        names.append(side)
        if nodes[side].op is Op.GATHER:
            names.append(nodes[side].srcs[0])
    return names


def _sparse_enough(matrix: np.ndarray, node: Node, density: float) -> bool:
    width = int(np.prod(node.shape))
    if matrix.size * width < MIN_WORK:
        return False
    limit = density * min(1.0, WIDE / max(width, 1))
    return np.count_nonzero(matrix) <= limit * matrix.size


def fact_csr(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(counts, columns, values)``: the nonzeros of ``matrix`` (2-D) row by row, every row with
    at least one entry (an explicit zero in column 0 for a row without nonzeros)."""
    n = matrix.shape[0]
    rows, cols = np.nonzero(matrix)
    values = matrix[rows, cols].astype(np.float64)
    empty = np.flatnonzero(np.bincount(rows, minlength=n) == 0)
    if empty.size:
        rows = np.concatenate([rows, empty])
        cols = np.concatenate([cols, np.zeros(empty.size, dtype=cols.dtype)])
        values = np.concatenate([values, np.zeros(empty.size)])
        order = np.argsort(rows, kind="stable")
        rows, cols, values = rows[order], cols[order], values[order]
    return np.bincount(rows, minlength=n), cols, values


def _sparse_sum(rw: Rewriter, node: Node, weights: list[str], nodes: dict[str, Node], matrix: np.ndarray) -> Node:
    """``node`` (a product, or a side-by-side product) as a sparse sum of the weights' columns."""
    columns = []
    for w in weights:
        o, i = nodes[w].shape
        columns.append(rw.emit(rw.fresh(f"{w}_columns"), Op.TRANSPOSE, [w], i, (o,), node.layer).name)
    source = columns[0]
    if len(columns) > 1:
        rows = sum(nodes[w].shape[1] for w in weights)
        source = rw.emit(rw.fresh(f"{node.name}_columns"), Op.CONCAT, columns, rows, node.shape, node.layer).name
    counts, cols, values = fact_csr(matrix.reshape(matrix.shape[0], -1))
    attrs = {"aggregation": "sum", "kernel": "auto", "counts": rw.const(f"counts_{node.name}", counts),
             "index": rw.const(f"idx_{node.name}", cols)}
    if not np.all(values == 1.0):  # 0/1 facts (one-hot labels) need no coefficients
        attrs["coef"] = rw.const(f"coef_{node.name}", values)
    return Node(node.name, Op.REDUCE, (source,), node.count, node.shape, attrs, node.layer)
