"""Commute shared linear maps with sums, means and indexing: the cheaper order, from the widths.

A weight ``W`` (``o x i``) that every row shares commutes with everything linear in
the rows: ``sum_e c_e W x_e = W sum_e c_e x_e``, ``(W x)[idx] = W (x[idx])``,
``W (a + b) = W a + W b`` and ``W (V x) = (W V) x``. Which side of a reduction the
product sits on decides how wide the reduced rows are, and so what the sparse
aggregation (and its backward) costs. Two rewrites, each taken only where a cost
estimate (:func:`_cost`, elements touched, GEMMs as ``rows x i x o``) drops:

``pull_linear_up`` -- a *widening* product moves after the reduction (or after a
gather of its rows). GCN's first layer aggregates 16-wide products of 3-wide inputs;
it can aggregate the inputs and multiply once per node instead (and when the inputs
are constants, the whole aggregation is folded away by ``fold_constants``)::

    %l = LINEAR(w, x) : (m, 16)             %r = REDUCE(GATHER(x; idx); ...) : (n, 3)
    %r = REDUCE(GATHER(l; idx); ...)   ->   %l = LINEAR(w, r)                : (n, 16)

``push_linear_down`` -- a *narrowing* product moves towards the inputs, through
reductions, indexing, additions and other shared products (which it absorbs). A
2-layer GNN whose last convolution has no activation, read out by a mean and a
16 -> 1 linear, aggregates 1-wide rows instead of 16-wide ones::

    %z = LINEAR(w2, h)   : (n, 16)          %v = LINEAR(w2', h) : (n, 1)     w2' = LINEAR(w, w2)
    %a = REDUCE(z ...)   : (n, 16)          %a = REDUCE(v ...)  : (n, 1)
    %p = REDUCE(a ...)   : (s, 16)    ->    %p = REDUCE(a ...)  : (s, 1)
    %o = LINEAR(w, p)    : (s, 1)

Both are exact in real arithmetic; in floating point they round differently, like
any reordering of a sum. Only nodes that nothing else reads are rewritten (no work
is duplicated); shared products need a single-row weight (``count == 1``).
"""
from __future__ import annotations

import math

import numpy as np

from ..gather_plans import emit_plan, plan_index
from ..indexing import EXPANSION, is_constant, trace_rows
from ..ir import INDEXING, Node, Op, Program, is_sparse_sum, shared_product
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["pull_linear_up", "push_linear_down"]

MAX_ROUNDS = 64  # rewrites per pass; each strictly lowers the cost estimate


def _size(shape: tuple) -> int:
    return math.prod(shape) if shape else 1


def _repeat(rewrite, program: Program) -> Program:
    for _ in range(MAX_ROUNDS):
        changed = rewrite(program)
        if changed is None:
            return program
        program = changed
    return program


def emit_shared_product(rw: Rewriter, name: str, weight: str, x: str, layer: str) -> Node:
    """``%name = LINEAR(weight, x)`` for a one-row ``weight`` shared by every row of ``x``."""
    w, value = rw.nodes[weight], rw.nodes[x]
    layouts = {} if value.count == 1 else {"w_layout": "tile", "x_layout": "full"}
    return rw.emit(name, Op.LINEAR, [weight, x], value.count, (w.shape[0],) + value.shape[1:], layer,
                   kind="matmul", **layouts)


# -- pull a widening product after the reduction ------------------------------------------------------


def pull_linear_up(program: Program, settings: Settings) -> Program:
    return _repeat(_pull_once, program)


def _pull_once(program: Program) -> Program | None:
    """The first profitable pull in program order, applied; None if there is none."""
    nodes = program.by_name()
    users = program.users()
    constant = is_constant(program, nodes)
    for node in program.nodes:
        if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE) and shared_product(nodes[node.srcs[0]], nodes):
            if _pull_through_rows_pays(node, nodes, users, constant):
                return _apply_pull_through_rows(program, node)
            continue
        if node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean") \
                or is_sparse_sum(node):
            continue
        source = nodes[node.srcs[0]]
        origins = trace_rows(program, nodes, source.name)
        bases = [nodes[b] for b in origins.bases]
        if not all(shared_product(b, nodes) for b in bases) or len({b.srcs[0] for b in bases}) != 1:
            continue
        xs = [nodes[b.srcs[1]] for b in bases]
        if len({x.shape for x in xs}) != 1 or sum(x.count for x in xs) > source.count:
            continue
        w = nodes[bases[0].srcs[0]]
        i, o = _size(xs[0].shape), _size(node.shape)
        rows = source.count
        # Before: the products (where only this reduction reads them), the row movement and the
        # reduction at width o. After: at width i, then one product per output row; reductions
        # of constants are free (fold_constants computes them once).
        dying = sum(b.count for b in bases if users[b.name] == [source.name] or b.name == source.name)
        before = dying * i * o + (0 if source.name in {b.name for b in bases} else rows * o) + rows * o
        folds = all(x.name in constant for x in xs)
        after = (0 if folds else 2 * rows * i) + node.count * i * o
        if after >= before:
            continue
        return _apply_pull(program, node, source, origins, xs, w)
    return None


def _pull_through_rows_pays(node: Node, nodes: dict[str, Node], users: dict, constant: set[str]) -> bool:
    """``rows(W x)`` as ``W rows(x)``: the rows move at the input's width, the product runs on them."""
    product = nodes[node.srcs[0]]
    x = nodes[product.srcs[1]]
    i, o = _size(x.shape), _size(product.shape)
    dying = product.count if users[product.name] == [node.name] else 0
    before = dying * i * o + node.count * o
    # A row movement of constants that is no bigger than its input is folded (fold_constants).
    folds = x.name in constant and node.count <= EXPANSION * x.count
    after = (0 if folds else node.count * i) + node.count * i * o
    return after < before


def _apply_pull_through_rows(program: Program, node: Node) -> Program:
    nodes = program.by_name()
    product = nodes[node.srcs[0]]
    w, x = product.srcs
    rw = Rewriter(program)
    for current in program.nodes:
        current = rw.take(current)
        if current.name != node.name:
            rw.keep(current)
            continue
        rows = rw.emit(rw.fresh(f"{node.name}_in"), node.op, [x], node.count, nodes[x].shape, node.layer,
                       **node.attrs)
        emit_shared_product(rw, node.name, w, rows.name, node.layer)
    return rw.finish()


def _apply_pull(program: Program, reduce: Node, source: Node, origins, xs: list[Node], w: Node) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.name != reduce.name:
            rw.keep(node)
            continue
        if len(xs) == 1:
            root = xs[0]
        else:
            root = rw.emit(rw.fresh(f"{reduce.name}_inputs"), Op.CONCAT, [x.name for x in xs],
                           sum(x.count for x in xs), xs[0].shape, reduce.layer)
        offsets = np.cumsum([0] + [x.count for x in xs])[:-1]
        index = offsets[origins.which] + origins.row
        src = emit_plan(rw, rw.fresh(f"{reduce.name}_x"), plan_index(index, root.count), root, reduce.layer)
        # The reduction of the inputs, then the product under the reduction's own name.
        inner = rw.emit(rw.fresh(f"{reduce.name}_in"), Op.REDUCE, [src], reduce.count, root.shape, reduce.layer,
                        **reduce.attrs)
        rw.nodes.pop(reduce.name, None)
        emit_shared_product(rw, reduce.name, w.name, inner.name, reduce.layer)
    return rw.finish()


# -- push a narrowing product towards the inputs ----------------------------------------------------


def push_linear_down(program: Program, settings: Settings) -> Program:
    return _repeat(_push_once, program)


def _push_once(program: Program) -> Program | None:
    nodes = program.by_name()
    users = program.users()
    for node in reversed(program.nodes):
        if not shared_product(node, nodes):
            continue
        w, x = (nodes[s] for s in node.srcs)
        plan = _Region(program, nodes, users)
        if _size(node.shape) >= _size(x.shape) or not (_private(x, node, users, program) and plan.inside(x)):
            continue
        before, after = plan.measure(x.name, _size(w.shape[:1]))
        before += node.count * _size(w.shape) * _size(x.shape[1:])
        if after < before:
            return _apply_push(program, node, plan)
    return None


def _private(node: Node, reader: Node, users: dict, program: Program) -> bool:
    """Only ``reader`` reads ``node`` (once), so it may be rewritten for that reader alone."""
    return users[node.name] == [reader.name] and node.name != program.output


class _Region:
    """The single-use linear region under a pushed product, and its cost at both widths."""

    PASS = INDEXING | {Op.REDUCE, Op.ADD, Op.LINEAR}

    def __init__(self, program: Program, nodes: dict[str, Node], users: dict):
        self.program, self.nodes, self.users = program, nodes, users

    def inside(self, node: Node) -> bool:
        """Whether the product can move through ``node`` (else ``node`` is frontier)."""
        if node.op not in self.PASS or node.op is Op.FACT:
            return False
        if node.op is Op.REDUCE:
            return node.attrs["aggregation"] in ("sum", "mean")
        if node.op is Op.ADD:
            x, b = (self.nodes[s] for s in node.srcs)
            return x.shape == b.shape == node.shape and x.name != b.name
        if node.op is Op.LINEAR:
            return shared_product(node, self.nodes)
        return True

    def child_ok(self, child: str, parent: Node) -> bool:
        return _private(self.nodes[child], parent, self.users, self.program)

    def measure(self, name: str, o: int) -> tuple[int, int]:
        """(cost now, cost after pushing an o-row product into ``name``)."""
        node = self.nodes[name]
        width = _size(node.shape)
        new_width = o * _size(node.shape[1:])
        if node.op is Op.LINEAR:  # a product absorbed: its GEMM goes, the push goes on into its input
            w, x = (self.nodes[s] for s in node.srcs)
            before, after = self._below(node, x.name, o)
            return before + node.count * _size(w.shape) * _size(x.shape[1:]), after
        if node.op in (Op.ADD, Op.CONCAT, Op.REDUCE) or node.op in INDEXING:
            before = after = 0
            for s in dict.fromkeys(node.srcs):
                b, a = self._below(node, s, o)
                before, after = before + b, after + a
            rows = self.nodes[node.srcs[0]].count if node.op is Op.REDUCE else node.count
            return before + rows * width, after + rows * new_width
        raise AssertionError(node.op)  # pragma: no cover

    def _below(self, parent: Node, child: str, o: int) -> tuple[int, int]:
        node = self.nodes[child]
        if self.child_ok(child, parent) and self.inside(node):
            return self.measure(child, o)
        # Frontier: a product of o rows of ``node``'s width.
        return 0, node.count * o * _size(node.shape)

    def emit(self, rw: Rewriter, name: str, weight: str, layer: str) -> str:
        """Emit nodes computing ``LINEAR(weight, name)``; returns the new node's name.

        Region nodes are private, so each is re-emitted under its own name at the new width.
        """
        node = self.nodes[name]
        rw.nodes.pop(name)
        w = rw.nodes[weight]
        if node.op is Op.LINEAR:  # absorbed: the pushed weight times this one, on its input
            inner_w, x = node.srcs
            merged = emit_shared_product(rw, rw.fresh(f"{name}_w"), weight, inner_w, layer)
            return self._child(rw, node, x, merged.name, layer, product=name)
        srcs = [self._child(rw, node, s, weight, layer) for s in node.srcs]
        return rw.emit(name, node.op, srcs, node.count, (w.shape[0],) + node.shape[1:], node.layer,
                       **node.attrs).name

    def _child(self, rw: Rewriter, parent: Node, child: str, weight: str, layer: str,
               product: str | None = None) -> str:
        node = self.nodes[child]
        if self.child_ok(child, parent) and self.inside(node):
            return self.emit(rw, child, weight, layer)
        return emit_shared_product(rw, product or rw.fresh(f"{child}_lin"), weight, child, layer).name


def _apply_push(program: Program, top: Node, region: _Region) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.name != top.name:
            rw.keep(node)
            continue
        w, x = node.srcs
        rw.alias(top.name, region.emit(rw, x, w, top.layer))
    return rw.finish()
