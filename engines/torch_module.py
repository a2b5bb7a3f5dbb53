"""IR to ``torch.nn.Module``: generate readable Python for ``forward`` and run it.

One statement per IR node, with the value's shape in a trailing comment, in
the spirit of torch.fx's code generation and thesis Fig. 6.8::

    def forward(self, facts=None):
        self.fact_inputs(facts)  # checks facts: this program reads no dynamic fact layer
        w = self.weights
        f_atoms = self.facts_f_atoms                               # (7, 7)
        w_8x7 = torch.stack([w['conv1'], w['conv2']])            # (2, 8, 7)
        h_x = f_atoms.index_select(0, self.idx_h_x)                # (7442, 7)
        ...

The source is registered with ``linecache`` so tracebacks and
``inspect.getsource`` show the generated lines. Each program's ``forward``
belongs to a class of its own (see NOTE: [A class per program]).
"""
from __future__ import annotations

import functools
import itertools
import linecache
import re
import types
import weakref
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from ..compiler.ir import Node, Op, Program, compact_index, linear_grid, same_sparse_matrix, sparse_matrix
from ..compiler.rewrite import zero_sign_matters
from ..sources.graph import GraphError
from . import kernels, native, runtime
from .functions import TRANSFORM_FUNCTIONS, order_signed_zeros, preferred_zeros
from .weights import WeightStore

__all__ = ["CompiledModule", "generate_source"]

_READABLE_TRANSFORMS = {
    "sigmoid": "torch.sigmoid", "tanh": "torch.tanh", "relu": "torch.relu", "exp": "torch.exp",
    "log": "torch.log", "sqrt": "torch.sqrt", "sign": "torch.sign", "inverse": "torch.reciprocal",
    "reverse": "torch.neg",
}
_file_counter = itertools.count()


def _rows(shape: tuple) -> str:
    """A view that lets a per-row scalar broadcast over a value of ``shape``."""
    return f".view(-1{', 1' * len(shape)})"


def _single_element(node: Node) -> bool:
    """One row of one value. Gathers from such a node are written as ``expand``: inductor
    (torch 2.13, CPU) fails to compile the backward of ``index_select`` from a
    one-element tensor (``InductorError`` in its vectorized atomic add)."""
    return node.count == 1 and int(np.prod(node.shape)) == 1


def _expression(node: Node, nodes: dict[str, Node], rows: dict[str, str] | None = None,
                in_place: set[str] = frozenset(), biased: dict[str, str] | None = None,
                stacked: dict[str, tuple[str, list[str], bool]] | None = None,
                reductions: dict[str, str] | None = None, copied: set[str] = frozenset(),
                gathered: dict[str, str] | None = None, large: set[str] = frozenset()) -> str:
    rows = rows or {}
    srcs = [nodes[s] for s in node.srcs]
    if biased and node.name in biased:  # NOTE: [bias in the GEMM]
        product, bias = nodes[biased[node.name]], rows[node.srcs[1]]
        if product.op is Op.REDUCE:  # NOTE: [bias in the sparse sum]
            return f"gather_sum({product.srcs[0]}, self.csr_{product.name}, {bias})"
        if node.name in rows:  # two rows: a matrix times a vector, plus a vector
            m, v = (rows[s] for s in product.srcs)
            return f"torch.addmv({bias}, {m}, {v})"
        if product.op is Op.ADD:  # a side-by-side product
            if node.name in large:  # NOTE: [a pool of large outputs]
                return f"dense(self.{product.attrs['hcat']}, {_side_by_side_weight(product, rows)}, {bias})"
            return f"torch.addmm({bias}, self.{product.attrs['hcat']}, {_side_by_side_weight(product, rows)})"
        w, x = (nodes[s] for s in product.srcs)
        if product.attrs["kind"] != "matmul":  # a per-row scale (_row_scale)
            return f"torch.addcmul({bias}, {w.name}[:, None], {x.name})"
        if node.name in large:
            return f"dense({x.name}, {rows[w.name]}.T{_contiguous(w.shape, x.count)}, {bias})"
        return f"torch.addmm({bias}, {x.name}, {rows[w.name]}.T{_contiguous(w.shape, x.count)})"
    if _side_by_side(node, rows):  # see compiler/passes/fuse_fact_products.py
        if node.name in large:
            return f"dense(self.{node.attrs['hcat']}, {_side_by_side_weight(node, rows)})"
        return f"self.{node.attrs['hcat']} @ {_side_by_side_weight(node, rows)}"
    if node.name in rows:  # a one-row value kept as that row (see _row_values)
        return _row_expression(node, srcs, rows)
    if node.op is Op.TRANSFORM and node.srcs[0] in in_place:
        if node.attrs["fn"] == "relu" and node.name in large:
            return f"relu_({node.srcs[0]})"
        return f"{_READABLE_TRANSFORMS[node.attrs['fn']]}_({node.srcs[0]})"
    if node.op is Op.LINEAR and any(s.name in rows for s in srcs):
        return _linear_with_row(node, *srcs, rows, nodes, node.name in large)
    if node.op is Op.ADD and srcs[1].name in rows:
        return f"{srcs[0].name} + {rows[srcs[1].name]}"
    names = list(node.srcs)
    if node.op is Op.FACT:
        return f"self.{node.attrs['const']}"
    if node.op is Op.WEIGHTS:
        names_ = node.attrs["names"]
        distinct = list(dict.fromkeys(names_))
        parts = ", ".join(f"w[{n!r}]" for n in distinct)
        if len(distinct) == 1 < len(names_) and _single_element(node.with_(count=1)):
            return f"torch.stack([{parts}]).expand({', '.join(map(str, (node.count,) + node.shape))})"
        if len(distinct) < len(names_):
            # Upward propagation repeats weights row by row: stack each once, then gather.
            return f"torch.stack([{parts}]).index_select(0, self.wsel_{node.name})"
        return f"torch.stack([{parts}])"
    if node.op is Op.CONCAT:
        if stacked and node.name in stacked:  # NOTE: [one product of stacked rows]
            left, rights, flat = stacked[node.name]
            product = f"{left} @ torch.cat([{', '.join(rights)}], 1)"
            return product if flat else f"({product}).view({node.count}, 1, {node.shape[-1]})"
        if all(s in rows for s in names):  # one-row values (weights): stacked as rows
            return f"torch.stack([{', '.join(rows[s] for s in names)}])"
        return f"torch.cat([{', '.join(names)}])"
    if node.op is Op.GATHER:
        if _single_element(srcs[0]):
            return f"{names[0]}.expand({', '.join(map(str, (node.count,) + node.shape))})"
        if node.name in copied:  # NOTE: [gathers from constants]
            return f"gather_rows({names[0]}, self.{node.attrs['index']})"
        return f"{names[0]}.index_select(0, self.{node.attrs['index']})"
    if node.op is Op.SLICE:
        a = node.attrs
        step = "" if a["step"] == 1 else f":{a['step']}"
        return f"{names[0]}[{a['start']}:{a['stop']}{step}]"
    if node.op is Op.TILE:
        ones = ", 1" * len(node.shape)
        return f"{names[0]}.repeat({node.attrs['times']}{ones})"
    if node.op is Op.INTERLEAVE:
        return f"{names[0]}.repeat_interleave({node.attrs['times']}, dim=0)"
    if gathered and node.name in gathered:  # NOTE: [a chunked product of gathered rows, compiled]
        reduction, (w, _) = nodes[gathered[node.name]], srcs
        return f"gathered_chunked_product({reduction.srcs[0]}, self.csr_{reduction.name}, {w.name}, {w.count})"
    if node.op is Op.LINEAR:
        return _linear(node, *srcs, node.name in large)
    if node.op is Op.REDUCE:  # written by _reduction, with the kernel choose_kernels gave it
        return reductions[node.name]
    if node.op is Op.ADD:
        x, b = srcs
        if b.shape == () and x.shape != ():
            return f"{x.name} + {b.name}{_rows(x.shape)}"
        return f"{x.name} + {b.name}"
    if node.op is Op.TRANSPOSE:  # a weight's columns, read by a sparse sum (compiler/passes/sparse_facts.py)
        return f"{rows[names[0]] if names[0] in rows else names[0] + '[0]'}.T"
    if node.op is Op.TRANSFORM:
        fn = node.attrs["fn"]
        if fn in _READABLE_TRANSFORMS:
            return f"{_READABLE_TRANSFORMS[fn]}({names[0]})"
        return f"T[{fn!r}]({names[0]})"
    raise NotImplementedError(f"no code generation for {node.op}")


def _product(kind: str, w: str, w_shape: tuple, x: str, x_shape: tuple, lead: int) -> str:
    """``W . x`` on tensors with ``lead`` leading batch axes before the value shapes."""
    if kind == "matmul":
        if len(x_shape) == 1:
            return f"torch.matmul({w}, {x}.unsqueeze(-1)).squeeze(-1)"
        return f"torch.matmul({w}, {x})"
    if w_shape == () and x_shape != ():
        return f"{w}{_trailing(lead, len(x_shape))} * {x}"
    if x_shape == () and w_shape != ():
        return f"{w} * {x}{_trailing(lead, len(w_shape))}"
    return f"{w} * {x}"


#: From this many input values on, a chunked product is runtime.chunked_product (below, torch.bmm:
#: autograd's own backward, one Python autograd Function fewer per step).
_CHUNKED_FROM = 1 << 20


def _trailing(lead: int, extra: int) -> str:
    return "" if extra == 0 else f"[{', '.join([':'] * lead + ['None'] * extra)}]"


def _side_by_side(node: Node, rows: dict[str, str]) -> bool:
    """An ADD of two products of static facts, written as one product over the facts side by
    side (attr ``hcat``), where both weights are single weights kept as their row."""
    return node.op is Op.ADD and "hcat" in node.attrs and all(w in rows for w in node.attrs["hcat_weights"])


def _side_by_side_weight(node: Node, rows: dict[str, str]) -> str:
    """The weights of a side-by-side product as one matrix: their transposes stacked, a
    row-major right side (NOTE: [weight gradient layout]); below a thousand rows, where the
    layout costs nothing, the weights side by side and transposed once (one op fewer)."""
    weights = [rows[w] for w in node.attrs["hcat_weights"]]
    if node.count < _ROW_MAJOR_ROWS:
        return f"torch.cat([{', '.join(weights)}], 1).T"
    return f"torch.cat([{', '.join(f'{w}.T' for w in weights)}])"


def _side_by_side_replaces(node: Node, nodes: dict[str, Node]) -> dict[str, str]:
    """``{name: its weight}`` of the products (and gathers of them) a side-by-side product replaces."""
    replaced = {}
    for side, weight in zip(node.srcs, node.attrs["hcat_weights"]):
        replaced[side] = weight
        if nodes[side].op is Op.GATHER:
            replaced[nodes[side].srcs[0]] = weight
    return replaced


def _linear(node: Node, w: Node, x: Node, large: bool = False) -> str:
    kind, out = node.attrs["kind"], node.count
    w_layout, x_layout = node.attrs.get("w_layout", "full"), node.attrs.get("x_layout", "full")
    if w_layout == x_layout == "full":
        if kind == "matmul":
            if len(x.shape) == 1:
                return f"torch.bmm({w.name}, {x.name}.unsqueeze(-1)).squeeze(-1)"
            return f"torch.bmm({w.name}, {x.name})"
        return _product(kind, w.name, w.shape, x.name, x.shape, 1)
    # One shared weight (the common GNN case): a single GEMM against all rows.
    # A single row on one side broadcasts along axis 0 by itself.
    if w.count == 1 and x_layout == "full":
        if kind == "matmul":
            if len(x.shape) == 1:
                return f"{x.name} @ {w.name}[0].T{_contiguous(w.shape, x.count)}"
            return f"torch.matmul({w.name}[0], {x.name})"
        return _product(kind, w.name, w.shape, x.name, x.shape, 1)
    if x.count == 1 and w_layout == "full":
        if kind == "matmul" and len(x.shape) == 1:
            return f"{w.name} @ {x.name}[0]"
        return _product(kind, w.name, w.shape, x.name, x.shape, 1)
    if kind == "matmul" and w_layout == "interleave" and x_layout == "full" and w.count > 1 and len(w.shape) == 2 \
            and len(x.shape) == 1:
        # Chunks of rows, one weight per chunk (compiler/passes/relation_products.py): one batched GEMM.
        (o, i), c = w.shape, w.count
        if _chunked(node, w, x):  # NOTE: [chunked product's weight gradient]
            return f"chunked_product({x.name}, {w.name}, {c})"
        return f"torch.bmm({x.name}.view({c}, {out // c}, {i}), {w.name}.transpose(1, 2)).view({out}, {o})"
    if kind == "matmul" and w_layout == "tile" and x_layout == "interleave" and len(w.shape) == 2 \
            and len(x.shape) == 1:
        # Row e * c + k is W_k x_e: the (n, c * o) product read row-major (compiler/passes/stack_products.py).
        (c, (o, i)), n = (w.count, w.shape), x.count
        weight_t = f"{w.name}.view({c * o}, {i}).T{_contiguous((c * o, i), n)}"
        if large:  # NOTE: [a pool of large outputs]
            return f"dense({x.name}, {weight_t}).view({c * n}, {o})"
        return f"({x.name} @ {weight_t}).view({c * n}, {o})"
    g1, g2 = linear_grid(node, w, x)
    views = {"full": f"{g1}, {g2}", "tile": f"1, {g2}", "interleave": f"{g1}, 1"}

    def view(side: Node, layout: str) -> str:
        rest = "".join(f", {d}" for d in side.shape)
        return f"{side.name}.view({views[layout]}{rest})"

    product = _product(kind, view(w, w_layout), w.shape, view(x, x_layout), x.shape, 2)
    shape = "".join(f", {d}" for d in node.shape)
    return f"({product}).reshape({out}{shape})"


def _chunked(node: Node, w: Node, x: Node) -> bool:
    """Whether ``node`` is written as ``chunked_product`` (chunks of rows, one weight per chunk, from
    _CHUNKED_FROM input values on: NOTE: [chunked product's weight gradient])."""
    return node.op is Op.LINEAR and node.attrs["kind"] == "matmul" and node.attrs.get("w_layout") == "interleave" \
        and node.attrs.get("x_layout", "full") == "full" and w.count > 1 and len(w.shape) == 2 \
        and len(x.shape) == 1 and node.count * w.shape[1] >= _CHUNKED_FROM


def _gathered_products(program: Program, nodes: dict[str, Node], rows: dict[str, str],
                       chosen: dict[str, str]) -> dict[str, str]:
    """``{product: reduction}`` for the chunked products of a sparse sum that nothing else reads, written as
    one ``gathered_chunked_product`` (NOTE: [a chunked product of gathered rows, compiled] in runtime.py)."""
    readers = program.users()
    result = {}
    for node in program.nodes:
        if node.op is not Op.LINEAR or len(node.srcs) != 2 or node.name in rows:
            continue
        w, x = (nodes[s] for s in node.srcs)
        if not _chunked(node, w, x) or w.name in rows or x.op is not Op.REDUCE or chosen.get(x.name) != "sparse_mm":
            continue
        if readers[x.name] != [node.name] or x.name in rows or x.name == program.output or x.count != node.count:
            continue
        result[node.name] = x.name
    return result


# NOTE: [row-stored values] A value with one row that every reader can take without its
# leading axis is kept as that row: a single weight is ``w['conv1.bias']`` itself, not
# ``torch.stack([w['conv1.bias']])`` and then ``[0]``; a product of such weights (the
# algebra passes' merged weights) is one ``@``. Readers that can: a shared product's weight
# side (``x @ W.T``), an addition's second operand (``x + b`` broadcasts over the rows),
# a product of two such values and a concatenation of only such values (``torch.stack``).
# A value with any other reader keeps its axis.


# NOTE: [weight gradient layout] ``x @ W.T`` hands the GEMM a column-major right side, and
# autograd then computes W's gradient in that layout, as ``g.T @ x``. With few input
# columns (W of shape (out, in), 2 <= in < 16) MKL is 2-6x slower at that than at the
# same product as ``x.T @ g``, which autograd picks for a row-major right side: 1 thread,
# g (N, 16), x (N, 7): N = 3371 86 vs 20 µs, N = 40000 1.0 vs 0.23 ms; in = 16 and wider,
# or out = 1, both are alike. So a narrow weight is transposed into a row-major copy
# first (``W.T.contiguous()``, a few µs): the same products, summed in another order.
# MUTAG GCN/GIN (3371 nodes, 7 features) spend 60-70 µs a step less; the copy is left out
# below a thousand rows, where both products cost a few µs.

def _contiguous(w_shape: tuple, rows: int) -> str:
    """``.contiguous()`` where a product ``x @ W.T`` of ``rows`` rows and a weight of shape
    ``w_shape`` gets its weight gradient faster from a row-major copy of ``W.T``."""
    if len(w_shape) != 2:
        return ""
    out, inputs = w_shape
    return ".contiguous()" if 2 <= inputs < 16 and out >= 2 and rows >= _ROW_MAJOR_ROWS else ""


#: From this many rows on, a product's weight gradient is faster from a row-major right side.
_ROW_MAJOR_ROWS = 1000


def _row_values(program: Program, nodes: dict[str, Node]) -> dict[str, str]:
    """``{name: expression of its row}`` for the values kept as their single row."""
    readers = program.users()
    rows: dict[str, str] = {}
    for node in program.nodes:
        if node.count != 1 or node.name == program.output:
            continue
        if node.op is Op.WEIGHTS and len(node.attrs["names"]) == 1:
            rows[node.name] = f"w[{node.attrs['names'][0]!r}]"
        elif node.op is Op.SLICE and nodes[node.srcs[0]].op is Op.WEIGHTS \
                and len(set(nodes[node.srcs[0]].attrs["names"])) == len(nodes[node.srcs[0]].attrs["names"]):
            rows[node.name] = f"w[{nodes[node.srcs[0]].attrs['names'][node.attrs['start']]!r}]"
        elif node.op is Op.LINEAR and all(s in rows for s in node.srcs) and _row_product(node, nodes) is not None:
            rows[node.name] = node.name  # computed by its own statement
        elif node.op is Op.ADD and all(s in rows for s in node.srcs) and nodes[node.srcs[0]].shape == node.shape:
            rows[node.name] = node.name  # two biases added (compiler/passes/broadcast_adds.merge_row_adds)
    # Keep only values every reader takes as a row; dropping one may disqualify others.
    while True:
        bad = {name for name in rows
               if not readers[name] or not all(_takes_row(nodes[r], nodes[name], rows) for r in readers[name])}
        bad |= {name for name in rows if rows[name] == name and not all(s in rows for s in nodes[name].srcs)}
        if not bad:
            return rows
        for name in bad:
            del rows[name]


def _row_product(node: Node, nodes: dict[str, Node]) -> str | None:
    """The operator of a product of two rows: ``@`` for matrix products, ``*`` for scalar ones."""
    w, x = (nodes[s] for s in node.srcs)
    if node.attrs["kind"] == "matmul":
        return "@"
    if w.shape == () or x.shape == () or w.shape == x.shape:
        return "*"
    return None


def _takes_row(reader: Node, value: Node, rows: dict[str, str]) -> bool:
    if reader.name in rows:  # a product of two rows, itself kept as a row
        return True
    if reader.op is Op.TRANSPOSE:  # W.T: a weight's columns
        return True
    if reader.op is Op.CONCAT:  # a stack of rows (all of them kept as rows)
        return all(s in rows for s in reader.srcs)
    if reader.op is Op.ADD:
        x, b = reader.srcs
        return b == value.name and x != value.name and value.shape in ((), reader.shape)
    if reader.op is Op.LINEAR:
        w, x = reader.srcs
        if w == value.name and x != value.name and x not in rows:
            return reader.attrs["kind"] == "matmul" or value.shape == ()
    return False


def _row_expression(node: Node, srcs: list[Node], rows: dict[str, str]) -> str:
    w, x = srcs
    if node.op is Op.ADD:
        return f"{rows[w.name]} + {rows[x.name]}"
    return f"{rows[w.name]} {_row_product(node, {w.name: w, x.name: x})} {rows[x.name]}"


def _linear_with_row(node: Node, w: Node, x: Node, rows: dict[str, str], nodes: dict[str, Node],
                     large: bool = False) -> str:
    """A product whose weight side is a row-stored value (one weight for all rows)."""
    weight, value = rows[w.name], x.name
    if node.attrs["kind"] == "matmul":
        if len(x.shape) == 1:
            learnable = w.op is Op.WEIGHTS or (w.op is Op.SLICE and nodes[w.srcs[0]].op is Op.WEIGHTS)
            weight_t = f"{weight}.T{_contiguous(w.shape, x.count) if learnable else ''}"
            return f"dense({value}, {weight_t})" if large else f"{value} @ {weight_t}"
        return f"torch.matmul({weight}, {value})"
    return f"{weight} * {value}"  # a 0-d weight broadcasts over everything


# NOTE: [in-place functions] A ReLU-like function of a value that nothing else reads,
# made by an op whose backward does not need its own output, runs in place: no fresh
# block of memory (and its page faults) per step.

_IN_PLACE = {"relu", "sigmoid", "tanh", "exp"}   # torch.relu_, torch.sigmoid_, ...


def _in_place(program: Program, nodes: dict[str, Node], rows: dict[str, str]) -> set[str]:
    """Values that their one reader, an elementwise function, may overwrite."""
    readers = program.users()
    result = set()
    for node in program.nodes:
        if node.op is not Op.TRANSFORM or node.attrs["fn"] not in _IN_PLACE:
            continue
        (name,) = node.srcs
        made_by = nodes[name]
        # Plain torch ops whose backward keeps only their inputs, never their own output (the
        # reductions are custom autograd Functions, whose outputs may not be modified in place).
        if made_by.op in (Op.ADD, Op.LINEAR) and readers[name] == [node.name] and name != program.output and name not in rows:
            result.add(name)
    return result


# NOTE: [bias in the GEMM] A shared product plus its shared bias, ``x @ W.T + b``, is one
# ``torch.addmm(b, x, W.T)``: one op and one autograd node less, and one pass less over
# the rows (MUTAG GIN, three such layers over 3371 rows: ~40 µs of a 1.4 ms step). Likewise a
# per-row scale plus a bias, ``s[:, None] * x + b`` (GCN's normalisation after its sparse sum), is
# one ``torch.addcmul(b, s[:, None], x)``: one (rows, F) block fewer to write and page in
# (products-like at 1/8, 306k rows of 128, with the ReLU after it, forward and backward: 401 ->
# 325 ms, 1 thread, loaded CPU time). addcmul may fuse its multiply-add (one rounding, not two). addmm
# may start its sums from ``b`` instead of adding ``b`` to them, which differs only in the
# sign of an exact zero (``b = -0.0`` and a sum of ``-0.0`` products: ``-0.0`` instead of
# ``+0.0``). Only a division by the value can tell those apart, so this is done only in
# programs without an ``inverse`` function; every other function, aggregation and
# gradient gives equal numbers for both zeros. Likewise a row product plus a row (two
# biases, one moved past a linear map: ``lin.W @ conv2.b + lin.b``) is one ``torch.addmv``.

_ZERO_SIGN_SENSITIVE = {"inverse"}


def _row_scale(product: Node, w: Node, x: Node, rows: dict[str, str]) -> bool:
    """Whether ``product`` is ``w[:, None] * x``: one scalar per row of a computed value (GCN's
    per-node normalisation after an aggregation), written as ``torch.addcmul`` with its bias."""
    return w.shape == () and len(x.shape) == 1 and w.count == x.count == product.count > 1 \
        and w.name not in rows and x.name not in rows \
        and product.attrs.get("w_layout", "full") == product.attrs.get("x_layout", "full") == "full"


def _biased_products(program: Program, nodes: dict[str, Node], rows: dict[str, str]) -> dict[str, str]:
    """``{addition: product}`` for the additions of a row-stored bias to a shared-weight GEMM
    that nothing else reads, written as one ``torch.addmm`` (NOTE: [bias in the GEMM])."""
    if any(n.op is Op.TRANSFORM and n.attrs["fn"] in _ZERO_SIGN_SENSITIVE for n in program.nodes):
        return {}
    readers = program.users()
    result = {}
    for node in program.nodes:
        if node.op is Op.ADD and rows.get(node.name) == node.name:  # a row: M @ v + b as torch.addmv(b, M, v)
            product = nodes[node.srcs[0]]
            if product.op is Op.LINEAR and rows.get(product.name) == product.name \
                    and readers[product.name] == [node.name] \
                    and product.attrs["kind"] == "matmul" and _row_product(product, nodes) == "@" \
                    and [len(nodes[s].shape) for s in product.srcs] == [2, 1] and product.shape == node.shape:
                result[node.name] = product.name
            continue
        if node.op is not Op.ADD or "hcat" in node.attrs or node.name in rows:
            continue
        product, bias = (nodes[s] for s in node.srcs)
        if bias.name not in rows or bias.shape != node.shape or len(node.shape) != 1:
            continue
        if readers[product.name] != [node.name] or product.name in rows or product.name == program.output:
            continue
        if _side_by_side(product, rows):
            result[node.name] = product.name
            continue
        if product.op is not Op.LINEAR:
            continue
        w, x = (nodes[s] for s in product.srcs)
        if product.attrs["kind"] != "matmul":  # a per-row scale plus a bias: torch.addcmul
            if _row_scale(product, w, x, rows) and x.count == node.count and x.shape == node.shape:
                result[node.name] = product.name
            continue
        if w.name in rows and x.name not in rows and len(x.shape) == 1 and len(w.shape) == 2 \
                and x.count == product.count == node.count:
            result[node.name] = product.name
    return result


# NOTE: [bias in the sparse sum] A sparse sum plus a row-stored bias, ``A @ x + b`` (MUTAG's
# readout: the pooled sums plus the output bias), is one ``gather_sum(x, csr, b)``: the C++
# operator adds ``b`` to each row after summing it, one op and one autograd node fewer. Each
# element is the same sum plus the same ``b``, one IEEE addition as in ``y + b``, so the numbers
# are bitwise those of the separate add (no zero-sign caveat as for addmm); where the operator
# does not run (C++ kernels off, no compiler, torch.compile, CUDA) runtime.gather_sum adds it separately.
# The function after it may still overwrite the sum in place (``torch.sigmoid_``): the operator's
# autograd node saves no output, and the fallbacks' separate add is a plain add.

def _biased_sums(program: Program, nodes: dict[str, Node], rows: dict[str, str],
                 chosen: dict[str, str]) -> dict[str, str]:
    """``{addition: reduction}`` for the additions of a row-stored bias of the result's row shape
    to a sparse-matmul sum that nothing else reads (NOTE: [bias in the sparse sum])."""
    readers = program.users()
    result = {}
    for node in program.nodes:
        if node.op is not Op.ADD or "hcat" in node.attrs or node.name in rows:
            continue
        reduction, bias = (nodes[s] for s in node.srcs)
        if reduction.op is not Op.REDUCE or chosen[reduction.name] != "sparse_mm" \
                or reduction.attrs["aggregation"] not in ("sum", "mean"):
            continue
        if bias.name not in rows or bias.shape != node.shape or reduction.shape != node.shape \
                or reduction.count != node.count:
            continue
        if readers[reduction.name] != [node.name] or reduction.name in rows or reduction.name == program.output:
            continue
        result[node.name] = reduction.name
    return result


# NOTE: [one product of stacked rows] Row products of one row and several matrices, stacked
# (``torch.stack([v @ A, v @ B])``: the readout's ``lin.weight`` moved into GraphSAGE's last
# two products by push_linear_down) are one product with the matrices side by side,
# ``(v @ torch.cat([A, B], 1)).view(2, 1, o)``: every element is the same dot product of
# the same numbers, and the step has one product and, backward, two GEMMs fewer. Where the
# stack's only readers view it as a ``(2, o)`` matrix (stack_products' GEMM), the ``(1, 2 o)``
# row is kept as it is: one view (and its backward node) fewer.

def _stacked_row_products(program: Program, nodes: dict[str, Node], rows: dict[str, str]
                          ) -> dict[str, tuple[str, list[str], bool]]:
    """``{concatenation: (row, [matrices], flat)}`` for the CONCATs written as one product of
    ``row`` and the matrices side by side (NOTE: [one product of stacked rows]); ``flat``
    where every reader views the stack as a matrix anyway (a side-by-side GEMM, see
    compiler/passes/stack_products.py), so the product's ``(1, c * o)`` row needs no view."""
    readers = program.users()
    result = {}
    for node in program.nodes:
        if node.op is not Op.CONCAT or len(node.srcs) < 2 or node.name in rows or len(set(node.srcs)) < len(node.srcs):
            continue
        products = [nodes[s] for s in node.srcs]
        if not all(p.op is Op.LINEAR and rows.get(p.name) == p.name and p.attrs["kind"] == "matmul"
                   and readers[p.name] == [node.name] and p.shape == node.shape for p in products):
            continue
        lefts = {p.srcs[0] for p in products}
        matrices = [nodes[p.srcs[1]] for p in products]
        if len(lefts) != 1 or nodes[products[0].srcs[0]].shape[:1] != (1,) or len(node.shape) != 2 \
                or node.shape[0] != 1 or any(len(m.shape) != 2 or m.shape != matrices[0].shape for m in matrices):
            continue
        flat = all(_reads_stack_as_matrix(nodes[r], node, nodes) for r in readers[node.name])
        result[node.name] = (rows[products[0].srcs[0]], [rows[m.name] for m in matrices], flat)
    return result


def _reads_stack_as_matrix(reader: Node, stack: Node, nodes: dict[str, Node]) -> bool:
    """Whether ``reader`` is a product that _linear writes with ``stack.view(c * o, i)``."""
    return reader.op is Op.LINEAR and reader.srcs[0] == stack.name != reader.srcs[1] \
        and reader.attrs["kind"] == "matmul" and reader.attrs.get("w_layout") == "tile" \
        and reader.attrs.get("x_layout") == "interleave" and len(stack.shape) == 2 \
        and len(nodes[reader.srcs[1]].shape) == 1


def input_facts(program: Program) -> list[Node]:
    """FACT nodes that read a fact layer declared in ``Settings.dynamic_facts``: the
    values a call may replace. Every other fact is a constant of the program."""
    dynamic = set(program.dynamic_facts)
    return [n for n in program.nodes if n.op is Op.FACT and n.attrs.get("fact_layer") in dynamic]


# NOTE: [kernels chosen by the engine] Every REDUCE runs one kernel: ``sparse_mm`` (the fused
# gather + sum of a REDUCE with an ``index``: a sparse matrix times a value, neurovec's C++
# operator or its torch fallback), ``segment`` (CSR segments: C++ or torch), ``dense`` (equal
# counts: a view and one torch reduction), ``strided`` (segment j is rows j, j + n, ...: a
# layout), ``scatter`` (torch's scatter_reduce) or ``gather`` (a one-row sum or mean without
# coefficients, which is just its rows: ``index_select``). Where the program names the kernel
# (``Settings.reduce_kernel``, or the compiler's cost model), the module runs that one. Where
# it says ``kernel="auto"``, this engine picks when the module is built, by the cost model
# of ``engines/kernels.choose_kernel`` and whether its C++ kernels run here: with them, what
# the compiler picks on a machine with g++ (a sparse sum stays one, other reductions are
# dense below a size, else segment); without them, a sparse sum over one row each is a gather,
# one over equal counts a dense reduction of the gathered rows (what the compiler picks on a
# machine without g++), any other stays a sparse sum (on torch's kernels). So a program
# whose kernels are "auto" does not depend on the machine that compiled it.
#
# NOTE: [standard ops] ``generate_source(program, standard_ops=True)`` writes every reduction
# that would call a neurovec kernel (C++ operators, registered ``torch.ops.neurovec`` ops) with
# standard torch ops instead: ``scatter`` for sparse sums (over their gathered rows) and CSR
# segments, ``gather`` where that is exact. Dense and strided reductions are standard already,
# and scatter is one of the kernels the equivalence suites check under every preset. The
# program, its constants and weights stay the same. Such a forward exports anywhere torch does
# (torch.export without neurovec's ops, ONNX) at the cost of the kernels' speed;
# engines/export.py builds it for exporting.

_NEUROVEC_KERNELS = ("segment", "sparse_mm")


def choose_kernels(program: Program, standard_ops: bool = False) -> dict[str, str]:
    """``{reduction: kernel}`` for every REDUCE of ``program`` (NOTE: [kernels chosen by the
    engine]); with ``standard_ops``, none calls a neurovec kernel (NOTE: [standard ops])."""
    result: dict[str, str] = {}
    asked: dict[str, object] = {}  # whether the C++ kernels run here, and zero_sign_matters: asked once if needed

    def gather(node: Node) -> bool:
        if "sign" not in asked:
            asked["sign"] = zero_sign_matters(program)
        return _is_gather(node, program.constants) and node.name not in asked["sign"]

    for node in program.nodes:
        if node.op is not Op.REDUCE:
            continue
        kernel = node.attrs.get("kernel", "scatter")
        if kernel == "auto":
            if "native" not in asked:
                asked["native"] = native.available()
            kernel = _engine_kernel(node, program, asked["native"], gather(node))
        if standard_ops and kernel in _NEUROVEC_KERNELS:
            kernel = "gather" if gather(node) else "scatter"
        result[node.name] = kernel
    return result


def _is_gather(node: Node, constants: dict[str, np.ndarray]) -> bool:
    """A sparse sum (or mean) over one row per segment, without coefficients: its rows."""
    return "index" in node.attrs and node.attrs.get("coef") is None \
        and node.attrs["aggregation"] in ("sum", "mean") and bool(np.all(constants[node.attrs["counts"]] == 1))


def _engine_kernel(node: Node, program: Program, native_here: bool, gather: bool) -> str:
    """The kernel this engine runs a ``kernel="auto"`` reduction with (NOTE: [kernels chosen by
    the engine])."""
    counts = program.constants[node.attrs["counts"]]
    if "index" in node.attrs:  # a sparse sum
        if native_here:
            return "sparse_mm"
        if gather:
            return "gather"
        return "dense" if counts.size and bool(np.all(counts == counts[0])) else "sparse_mm"
    agg = node.attrs["aggregation"]
    return kernels.choose_kernel(program.node(node.srcs[0]).count, node.count, counts, _feature_size(node.shape),
                                 "cpu", reduce="sum" if agg == "mean" else agg, native_kernels=native_here)


def _verifiable(program: Program) -> Program:
    """``program`` as ``Program.verify`` knows it: the IR names no "auto" kernel yet, so an "auto"
    reduction is checked as what it means, a sparse sum where it has an ``index`` (its rows are
    gathered), else a plain segment reduction (NOTE: [kernels chosen by the engine])."""
    if not any(n.op is Op.REDUCE and n.attrs.get("kernel") == "auto" for n in program.nodes):
        return program
    return program.replace(nodes=tuple(
        n.with_(attrs={**n.attrs, "kernel": "sparse_mm" if "index" in n.attrs else "scatter"})
        if n.op is Op.REDUCE and n.attrs.get("kernel") == "auto" else n for n in program.nodes))


def _feature_size(shape: tuple) -> int:
    return int(np.prod(shape)) if shape else 1


def _reduction(node: Node, kernel: str, rows: int) -> str:
    """A REDUCE written with ``kernel`` (NOTE: [kernels chosen by the engine]); ``rows`` are its
    input rows (the gathered rows of a sparse sum)."""
    x, key, agg, coef = node.srcs[0], node.attrs["counts"], node.attrs["aggregation"], node.attrs.get("coef")
    if kernel == "sparse_mm":
        # Per-edge coefficients (and a mean's 1/count) are the values of the sparse matrix.
        return f"gather_sum({x}, self.csr_{node.name})"
    if "index" in node.attrs:  # the other kernels reduce the gathered rows
        x = f"{x}.index_select(0, self.{node.attrs['index']})"
    if kernel == "gather":
        return x
    if coef:  # the other kernels multiply first
        x = f"{x} * self.{coef}{_rows(node.shape)}"
    if kernel == "segment":
        return f"segment_reduce({x}, self.ptr_{key}, self.seg_{key}, self.cnt_{key}, {agg!r})"
    if kernel == "dense":
        return f"dense_reduce({x}, {int(rows // max(node.count, 1))}, {agg!r})"
    if kernel == "strided":
        return f"strided_reduce({x}, {int(rows // max(node.count, 1))}, {agg!r})"
    return f"scatter_reduce({x}, self.seg_{key}, {node.count}, {agg!r}, self.cnt_{key})"


def _reductions(program: Program, chosen: dict[str, str]) -> dict[str, str]:
    """``{reduction: its expression}`` with the kernels ``chosen``."""
    nodes = program.by_name()
    return {node.name: _reduction(node, chosen[node.name], _input_rows(node, nodes, program.constants))
            for node in program.nodes if node.op is Op.REDUCE}


def _input_rows(node: Node, nodes: dict[str, Node], constants: dict[str, np.ndarray]) -> int:
    return len(constants[node.attrs["index"]]) if "index" in node.attrs else nodes[node.srcs[0]].count


def generate_source(program: Program, standard_ops: bool = False, chosen: dict[str, str] | None = None) -> str:
    """The Python source of ``forward(self, facts=None)`` for ``program``, its reductions run with
    the kernels ``chosen`` (default: :func:`choose_kernels`); with ``standard_ops``, in standard
    torch ops only (NOTE: [standard ops])."""
    nodes = program.by_name()
    chosen = choose_kernels(program, standard_ops) if chosen is None else chosen
    reductions = _reductions(program, chosen)
    inputs = {n.name for n in input_facts(program)}
    lines = ["def forward(self, facts=None):"]
    if inputs:
        lines.append("    inputs = self.fact_inputs(facts)  # the dynamic fact layers: stored, or this call's")
    else:
        lines.append("    self.fact_inputs(facts)  # checks facts: this program reads no dynamic fact layer")
    lines.append("    w = self.weights")
    rows = _row_values(program, nodes)
    in_place = _in_place(program, nodes, rows)
    biased = {**_biased_products(program, nodes, rows), **_biased_sums(program, nodes, rows, chosen)}
    stacked = _stacked_row_products(program, nodes, rows)
    copied = _copied_gathers(program, nodes, chosen)
    gathered = _gathered_products(program, nodes, rows, chosen)
    large = _large_values(program, rows)
    inline = {name for name, expression in rows.items() if expression != name}
    # A weight used in place (NOTE: [row-stored values]) needs no statement, nor does a value
    # (a stack) that only such weights, or other values left out this way, read.
    readers = dict(program.users())
    left_out = set(inline)
    for node in program.nodes:  # the products a side-by-side product replaces; it reads their weights
        if _side_by_side(node, rows):
            replaced = _side_by_side_replaces(node, nodes)
            left_out.update(replaced)
            for product, weight in replaced.items():
                readers[weight] = [node.name if r == product else r for r in readers[weight]]
    # Values another statement computes inside its own: a stacked product inside its concatenation,
    # a biased product inside its addition. That statement reads what they read.
    computed_by = {product: concatenation for concatenation in stacked for product in program.node(concatenation).srcs}
    computed_by.update({product: addition for addition, product in biased.items()})
    computed_by.update({reduction: product for product, reduction in gathered.items()})
    left_out.update(computed_by)
    for name, names in readers.items():
        readers[name] = [computed_by.get(r, r) for r in names]
    for node in reversed(program.nodes):
        if readers[node.name] and all(r in left_out for r in readers[node.name]) and node.name != program.output:
            left_out.add(node.name)
    matters = zero_sign_matters(program)
    signed_zeros = {node.name for node in program.nodes if node.op is Op.REDUCE and node.name in matters
                    and node.attrs["aggregation"] in ("max", "min")}
    statements = []  # (value, its lines)
    as_dense: set[str] = set()  # the values written as ``dense(...)`` so far
    as_sum: dict[str, str] = {}  # those written as ``gather_sum(x, self.csr_...)``: their arguments
    users = program.users()  # NOTE: [additions into a pooled output]
    for node in program.nodes:
        if node.name in left_out:
            continue
        if node.name in inputs:
            code = f"    {node.name} = inputs[{node.attrs['fact_layer']!r}]"
        elif (into := _added_into(node, nodes, program.output, users, large, as_dense)) is not None:
            other = next(s for s in node.srcs if s != into)
            if other in as_sum and users[other] == [node.name] and other != program.output:
                # NOTE: [a sum added into a pooled output] in runtime.py: the sum's own statement goes
                statements = [(n, block) for n, block in statements if n.name != other]
                code = f"    {node.name} = gather_sum_into({into}, {as_sum[other]})"
            else:
                code = f"    {node.name} = {into}.add_({other})"
        else:
            code = f"    {node.name} = {_expression(node, nodes, rows, in_place, biased, stacked, reductions, copied, gathered, large)}"
        if code.startswith(f"    {node.name} = dense("):
            as_dense.add(node.name)
        elif node.name in large and (sum_of := _PLAIN_SUM.fullmatch(code)) and sum_of.group(1) == node.name:
            as_sum[node.name] = sum_of.group(2)
        shape = ", ".join(map(str, node.shape if node.name in rows else (node.count,) + node.shape))
        if node.name in stacked and stacked[node.name][2]:  # stored as its one row
            shape += f") as (1, {node.count * node.shape[-1]}"
        block = [f"{code:<72}  # ({shape}{',' if len(node.shape) == 1 and node.name in rows else ''})"]
        if node.name in signed_zeros:
            rows_in = _input_rows(node, nodes, program.constants)
            block.extend(_order_signed_zeros(node, nodes, chosen[node.name], rows_in))
        statements.append((node, block))
    lines += _freeing_dead_values(_shared_products_first(statements), program.output)
    lines.append(f"    return {program.output}")
    return "\n".join(lines) + "\n"


# The values (from this many elements on) whose GEMMs and ReLUs are written as ``dense`` and ``relu_``
# (NOTE: [a pool of large outputs] in runtime.py): 2M elements, 8 MiB in float32, above which fresh
# memory is a mapping of its own with its page faults; below it the plain ops (one Python autograd
# Function fewer per op).
_LARGE_VALUES = 1 << 21


def _large_values(program: Program, rows: dict[str, str]) -> set[str]:
    """The values of at least ``_LARGE_VALUES`` elements, not stored as one row."""
    return {node.name for node in program.nodes
            if node.name not in rows and node.count * int(np.prod(node.shape)) >= _LARGE_VALUES}


# NOTE: [additions into a pooled output] The sum of two large values of the same shape, one of them
# a ``dense`` output that nothing else reads (SAGE: the neighbours' term plus the root's ``addmm``),
# is written as an in-place ``add_`` into that output: no fresh block (87 MB at arxiv-like) and its
# page faults per step. ``dense`` saves no output for its backward, and the addition's backward
# needs neither operand; ``a + b`` and ``b + a`` are the same IEEE addition, so the values are
# bitwise those of the separate add. Where the other operand is a sparse sum without a bias that
# only the addition reads, the two are one ``gather_sum_into`` (NOTE: [a sum added into a pooled
# output] in runtime.py), and the sum's own statement is left out.

# A sparse sum without a bias, as _expression writes it: the value, then its arguments.
_PLAIN_SUM = re.compile(r"    (\w+) = gather_sum\((\w+, self\.csr_\w+)\)")


def _added_into(node: Node, nodes: dict[str, Node], output: str, readers: dict[str, list[str]], large: set[str],
                as_dense: set[str]) -> str | None:
    """The operand that the addition ``node`` is written into, if any (NOTE: [additions into a pooled
    output]); ``as_dense`` names the values written as ``dense(...)`` before it."""
    if node.op is not Op.ADD or node.name not in large or len(set(node.srcs)) != 2:
        return None
    if any((nodes[s].count, nodes[s].shape) != (node.count, node.shape) for s in node.srcs):
        return None  # a broadcast
    for src in node.srcs:
        if readers[src] == [node.name] and src != output and src in as_dense:
            return src
    return None


# NOTE: [gathers from constants] A large gather from a constant (a fact no call replaces, such as
# the folded inputs of a first layer), whose source has no gradient, is ``gather_rows``, a
# plain copy of the rows in C++ where the kernels run (runtime.gather_rows): hetero-100's first
# layer gathers a million rows of 16 floats from its folded inputs every step, 9 ms against
# index_select's 19 (1 thread, loaded, CPU time). Below _COPIED_FROM values index_select stays (one
# Python call fewer, and the small programs' code as it was).

_COPIED_FROM = 1 << 20


def _copied_gathers(program: Program, nodes: dict[str, Node], chosen: dict[str, str]) -> set[str]:
    """The GATHERs written as ``gather_rows`` (NOTE: [gathers from constants])."""
    with_backward = _backward_indices(program, chosen)
    return {node.name for node in program.nodes
            if node.op is Op.GATHER and node.attrs["index"] not in with_backward
            and node.count * _feature_size(node.shape) >= _COPIED_FROM and not _single_element(nodes[node.srcs[0]])}


# NOTE: [dead values deleted] A local variable keeps its tensor alive until ``forward`` returns,
# so without a ``del`` every intermediate of a forward is alive at its end at once: at
# products-like size (2.4M nodes, 3 GCN layers of 128) some ten (n, 128) float32 tensors, 12 GB,
# where autograd keeps only the two ReLU outputs. A value computed per row (not a stored row or
# buffer) is deleted after the statement that last names it; autograd keeps what its backward
# needs. Names are matched as whole words in the statements' text, strings included: a false
# match can only delay a ``del``, never move it before a use. Only values of at least
# _DELETED_FROM numbers (4 MB in float32) are deleted: below, a ``del`` frees little and is one
# more line to read (MUTAG's, ENZYMES' and Cora's programs have none).

_DELETED_FROM = 1 << 20

_WORD = re.compile(r"[A-Za-z_]\w*")


# NOTE: [a shared value's GEMM first] A value that several statements read gets one gradient from
# each, and autograd sums them: into the first one to arrive, in place, if nothing else holds it, else
# into a fresh block (87 MB at arxiv-like, with its page faults). A ``dense`` gradient lives in the
# program's pool (NOTE: [a pool of large outputs]), which holds it, so it must not arrive first. The
# backwards run in the reverse order of the forward's ops, so a ``dense`` that reads such a value is
# written as early as its inputs allow, before the value's other readers (SAGE: the root term's
# ``addmm`` before the neighbours' mean): its gradient then arrives last and is added into the
# others'. Statements only move past statements that do not name what they define, and the value
# it reads has several readers, so no in-place op (whose operand has one reader) runs in between.

def _shared_products_first(statements: list[tuple[Node, list[str]]]) -> list[tuple[Node, list[str]]]:
    """``statements`` with each ``dense`` of a value several statements read moved up to just after
    the last statement it needs (NOTE: [a shared value's GEMM first])."""
    named = [set(_WORD.findall("\n".join(block))) for _, block in statements]
    defined = {node.name for node, _ in statements}
    order = list(range(len(statements)))  # statement indices, in the order written
    for k, (node, block) in enumerate(statements):
        match = re.match(rf"\s*{re.escape(node.name)} = dense\((\w+),", block[0])
        if match is None or sum(match.group(1) in words for words in named) < 3:  # its own and 2+ readers
            continue
        needs = (named[k] & defined) - {node.name}
        position = order.index(k)
        earliest = 1 + max((p for p in range(position) if statements[order[p]][0].name in needs), default=-1)
        if earliest < position and not any(node.name in named[order[p]] for p in range(earliest, position)):
            order.insert(earliest, order.pop(position))
    return [statements[k] for k in order]


def _freeing_dead_values(statements: list[tuple[Node, list[str]]], output: str) -> list[str]:
    """The statements' lines, each followed by a ``del`` of the per-row values it was the last to read."""
    made = {node.name for node, _ in statements
            if node.count > 1 and node.name != output and node.op not in (Op.FACT, Op.WEIGHTS)
            and node.count * int(np.prod(node.shape, dtype=np.int64)) >= _DELETED_FROM}
    last: dict[str, int] = {}  # value -> the last statement that names it
    for k, (node, block) in enumerate(statements):
        for word in _WORD.findall("\n".join(block)):
            if word in made and word != node.name:
                last[word] = k
    dead: dict[int, list[str]] = {}
    for node, _ in statements:  # in the order they were made
        if node.name in last:
            dead.setdefault(last[node.name], []).append(node.name)
    lines = []
    for k, (node, block) in enumerate(statements):
        lines += block
        if k in dead:
            lines.append(f"    del {', '.join(dead[k])}")
    return lines


def _order_signed_zeros(node: Node, nodes: dict[str, Node], kernel: str, rows: int) -> list[str]:
    """Statements that give the ties of 0.0 and -0.0 in max or min ``node`` the zero IEEE 754
    chooses (NOTE: [signed zeros in max and min]): the same reduction of the indicator of that
    zero among the inputs says which segments have it."""
    agg, x = node.attrs["aggregation"], nodes[node.srcs[0]]
    zeros = x.with_(name=f"{node.name}_zeros")
    while zeros.name in nodes:
        zeros = zeros.with_(name=f"{zeros.name}_")
    reduced = _reduction(node.with_(srcs=(zeros.name,) + node.srcs[1:]), kernel, rows)
    return [f"    {zeros.name} = preferred_zeros({x.name}, {agg!r})",
            f"    {node.name} = order_signed_zeros({node.name}, {reduced}, {agg!r})"]


class CompiledModule(nn.Module):
    """A compiled neuron graph.

    ``module()`` returns the graph's outputs in declared order, one tensor of
    shape ``(n_outputs, *output_shape)``. ``module(facts={"layer": tensor})``
    replaces the values of a fact layer for this call; only layers declared in
    ``Settings.dynamic_facts`` can be replaced (the passes treat every other fact
    as a constant and may have folded it into others), and a replacement must
    have the layer's shape.
    ``module.weights[name]`` is the parameter (or fixed buffer) of a graph weight.
    ``print(module.code)`` shows the generated ``forward``. The module takes no input
    tensor (the graph and its facts are compiled in): ``module(x)``, a keyword other than
    ``facts`` or facts that are not a dict get a ``TypeError`` that says how it is called.

    NOTE: [A class per program] As with torch.fx's ``GraphModule``, every compiled
    program gets its own subclass of ``CompiledModule`` whose ``forward`` is the
    generated code. Each module thus has its own ``forward`` code object, which is
    what ``torch.compile`` caches compiled code on: twenty modules compile twenty
    times instead of sharing one cache entry (and its recompile limit). ``__call__``,
    which checks the arguments and is where ``torch.compile(module)`` starts tracing, is
    likewise a copy per class. Pickling (``torch.save``, ``copy.deepcopy``) stores the
    generated source with the module's state and rebuilds the class on load (see
    ``__reduce__``).
    """

    code: str = ""  # the generated forward's source, set on each program's class
    buffer_pool: runtime.BufferPool | None = None  # its large outputs (NOTE: [a pool of large outputs]), per class
    # {reduction: the kernel it runs} (NOTE: [kernels chosen by the engine]); chosen with the
    # code, kept on the module by __init__
    reduce_kernels: dict[str, str] = {}

    def __new__(cls, program: Program, dtype: torch.dtype | None = None):
        if cls is CompiledModule:
            chosen = choose_kernels(program)
            cls = _program_class(generate_source(program, chosen=chosen))
            cls.reduce_kernels = chosen
        return _releasing_pool(super().__new__(cls))

    def __init__(self, program: Program, dtype: torch.dtype | None = None):
        super().__init__()
        _verifiable(program).verify()
        dtype = dtype or torch.get_default_dtype()
        self.program = program = _sharing_equal_constants(program)
        self.weights = WeightStore(program.weights, dtype)
        chosen = self.reduce_kernels = type(self).reduce_kernels or choose_kernels(program)
        add_buffers(self, type(self).code, chosen, dtype)
        matrices: dict[tuple, list] = {}
        for node in program.nodes:
            if node.op is Op.WEIGHTS and len(set(node.attrs["names"])) < len(node.attrs["names"]):
                distinct = {n: k for k, n in enumerate(dict.fromkeys(node.attrs["names"]))}
                rows = torch.tensor([distinct[n] for n in node.attrs["names"]], dtype=torch.int64)
                self.register_buffer(f"wsel_{node.name}", rows, persistent=False)
            if node.op is Op.REDUCE and chosen[node.name] == "sparse_mm":
                self.add_module(f"csr_{node.name}", _sparse_matrix(program, node, dtype, matrices))
        _pooled_sums(self, program, chosen)
        # Dynamic fact layer -> the constant holding its stored values.
        self._inputs = {n.attrs["fact_layer"]: n.attrs["const"] for n in input_facts(program)}

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            # A constant that no code of the module reads is not kept as a buffer (add_buffers):
            # asked for by name, it is made from the program, as a buffer would hold it.
            program = self.__dict__.get("program")
            if program is None or name not in program.constants:
                raise
            like = _float_like(self)
            tensor = _tensor(program.constants[name], like.dtype if like is not None else torch.get_default_dtype())
            return tensor.long() if name in _backward_indices(program, self.reduce_kernels) else tensor

    def __reduce__(self):
        # The class is generated, so pickle cannot find it by name: rebuild it from the
        # source, then restore the whole state (parameters, buffers, hooks, training flag).
        return _rebuild_module, (type(self).code, self.__getstate__())

    def __call__(self, *args, **kwargs):
        # The one argument is ``facts``; anything else gets an error that says how a compiled
        # module is called (a positional tensor, the PyG habit, or a misspelled keyword).
        # Each program's class has its own copy of this code (NOTE: [A class per program]).
        if args and (len(args) > 1 or kwargs or not (args[0] is None or isinstance(args[0], Mapping))) \
                or kwargs and (len(kwargs) > 1 or "facts" not in kwargs):
            raise self._call_error(args, kwargs)
        return nn.Module.__call__(self, *args, **kwargs)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: say what works instead of failing inside the generated code.
        raise TypeError("torch.jit.script cannot compile a neurovec CompiledModule: its forward reads weights by "
                        "their names (any string) and checks facts in Python, which TorchScript cannot express, "
                        "and torch 2.13 deprecates TorchScript. Use neurovec.engines.export.export(module) "
                        "(torch.export) or export_onnx(module, path); torch.jit.trace(standard_ops(module), "
                        "example_kwarg_inputs={'facts': {...}}, check_trace=False) works too (docs/export.md)")

    def _call_error(self, args: tuple, kwargs: dict) -> Exception:
        unknown = [k for k in kwargs if k != "facts"]
        if unknown:
            return TypeError(f"CompiledModule got unexpected keyword argument{'s' * (len(unknown) > 1)} "
                             f"{', '.join(map(repr, unknown))}: the only keyword it takes is facts={{fact layer: "
                             "tensor}. " + self._how_to_call())
        if len(args) + len(kwargs) > 1:
            return TypeError(f"CompiledModule takes at most one argument, facts={{fact layer: tensor}} "
                             f"(got {len(args)} positional{' and facts=' if kwargs else ''}). " + self._how_to_call())
        return self._facts_error(args[0])

    def _facts_error(self, facts) -> Exception:
        if isinstance(facts, (torch.Tensor, np.ndarray)):
            return TypeError(f"CompiledModule takes no input tensor (got a {type(facts).__name__} of shape "
                             f"{tuple(facts.shape)}). " + self._how_to_call())
        return TypeError(f"facts must be a dict {{fact layer name: tensor}} (got {type(facts).__name__}). "
                         + self._how_to_call())

    def _how_to_call(self) -> str:
        """How a compiled module is called, with this module's own fact layers."""
        program = self.program
        text = ("The graph and its facts are compiled into the module: call it as module()")
        declared = [layer for layer in program.dynamic_facts if layer in program.fact_shapes]
        if declared:
            text += ", or module(facts={" + ", ".join(f"{layer!r}: tensor of shape {tuple(program.fact_shapes[layer])}"
                                                      for layer in declared[:4]) + "}) to replace features for one call"
        else:
            shown = ", ".join(f"{layer!r} {tuple(shape)}" for layer, shape in list(program.fact_shapes.items())[:6])
            if len(program.fact_shapes) > 6:
                shown += f" and {len(program.fact_shapes) - 6} more"
            text += (". To replace features per call, compile with Settings(dynamic_facts=(<layer>,)) and call "
                     f"module(facts={{<layer>: tensor}}) (fact layers: {shown})")
        return text + (". New graphs are compiled anew, then load_state_dict gives them the trained weights "
                       "(docs/export.md).")

    def fact_inputs(self, facts: dict | None = None) -> dict[str, torch.Tensor]:
        """The values of the dynamic fact layers for one call: the stored ones, or ``facts[layer]``.

        Raises :class:`GraphError` for a layer that is not declared in
        ``Settings.dynamic_facts`` (or is not a fact layer) and for a replacement of
        the wrong shape or kind. A declared layer that no pass left in the program is
        still checked, then ignored.
        """
        values = {layer: getattr(self, const) for layer, const in self._inputs.items()}
        if facts is None:
            return values
        if not isinstance(facts, Mapping):
            raise self._facts_error(facts)
        for layer, value in facts.items():
            if layer not in self.program.dynamic_facts:
                known = layer in self.program.fact_shapes
                raise GraphError(
                    f"fact layer {layer!r} cannot be replaced at call time: "
                    + ("it is not declared dynamic; compile with Settings(dynamic_facts=(..., "
                       f"{layer!r})) so that no pass folds its values into constants" if known else
                       f"the graph has no such fact layer (fact layers: {sorted(self.program.fact_shapes)}); "
                       "only layers listed in Settings.dynamic_facts can be replaced"))
            value = torch.as_tensor(value)
            if value.is_complex() or value.dtype == torch.bool:
                raise GraphError(f"fact layer {layer!r}: replacement has dtype {value.dtype}, "
                                 "expected real (floating point or integer) values")
            expected = self.program.fact_shapes[layer]
            if tuple(value.shape) != tuple(expected):
                raise GraphError(f"fact layer {layer!r}: replacement has shape {tuple(value.shape)}, "
                                 f"expected {tuple(expected)}")
            if layer in values:
                current = values[layer]
                values[layer] = value.to(dtype=current.dtype, device=current.device)
        return values

    def _apply(self, fn, recurse=True):
        # Constants are kept exact: after a dtype change (e.g. `.double()`), re-create
        # them from the program's float64 arrays instead of upcasting rounded values.
        super()._apply(fn, recurse)
        for key, array in self.program.constants.items():
            current = self._buffers.get(key)  # None: no code of this module reads it
            if current is not None and current.is_floating_point():
                setattr(self, key, _tensor(array, current.dtype).to(current.device))
        return self

    def extra_repr(self) -> str:
        n_ops = sum(1 for n in self.program.nodes if n.op not in (Op.FACT, Op.WEIGHTS))
        return f"{n_ops} ops, {len(self.weights)} weights, {len(self._inputs)} dynamic fact inputs"


def add_buffers(module: CompiledModule, code: str, chosen: dict[str, str], dtype: torch.dtype | None = None) -> None:
    """Register on ``module`` the constants and segment indices that ``code`` (a forward generated
    with the kernels ``chosen``) reads and ``module`` lacks (in ``dtype``, else the module's own, on its
    device). Only those: a sparse sum's indices and coefficients live in its CSR (runtime.CSRIndices),
    and a second copy as buffers took 12 bytes per edge and layer, its unused segment ids 8 more."""
    program = module.program
    read = set(_SELF_NAME.findall(code)) | {n.attrs["const"] for n in input_facts(program)}
    like = _float_like(module)
    dtype = dtype or (like.dtype if like is not None else torch.get_default_dtype())
    device = like.device if like is not None else None
    backward_indices = _backward_indices(program, chosen)
    for key, array in program.constants.items():
        if key in read and key not in module._buffers:
            tensor = _tensor(array, dtype)
            _add_buffer(module, key, (tensor.long() if key in backward_indices else tensor).to(device))
    for node in program.nodes:
        key = node.attrs.get("counts") if node.op is Op.REDUCE else None
        if key is None or f"seg_{key}" in module._buffers or not read & {f"seg_{key}", f"ptr_{key}", f"cnt_{key}"}:
            continue
        counts = torch.from_numpy(np.array(program.constants[key], dtype=np.int64))
        # np.repeat: torch.repeat_interleave took 6x its CPU time (4M rows: 53 vs 8.5 ms).
        segments = np.repeat(np.arange(counts.numel()), counts.numpy())
        _add_buffer(module, f"seg_{key}", torch.from_numpy(segments).to(device))
        _add_buffer(module, f"ptr_{key}", torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device))
        _add_buffer(module, f"cnt_{key}", counts.to(device=device, dtype=dtype))


#: Constants of at least this many values are compared with the others (_sharing_equal_constants).
_SHARED_FROM = 4096


def _sharing_equal_constants(program: Program) -> Program:
    """``program`` with every large constant that equals an earlier one (dtype, shape and values)
    replaced by that one (``program`` itself where none does). The module keeps its program (for
    dtype changes, export and pickling), and the passes leave equal arrays under several names:
    the three GCN layers' edge indices and coefficients over one adjacency, at products-like size
    0.77 GB a copy (int32 indices and float64 coefficients of 64M edges)."""
    seen: dict[tuple, list[np.ndarray]] = {}
    shared = {}
    for key, array in program.constants.items():
        if array.size < _SHARED_FROM:
            continue
        flat = array.reshape(-1)
        sample = flat[:: max(1, flat.size // 256)].tobytes()  # equal arrays have equal samples
        candidates = seen.setdefault((array.dtype.str, array.shape, sample), [])
        first = next((other for other in candidates if other is array or np.array_equal(other, array)), None)
        if first is None:
            candidates.append(array)
        elif first is not array:
            shared[key] = first
    return program.replace(constants={**program.constants, **shared}) if shared else program


def _float_like(module: nn.Module) -> torch.Tensor | None:
    """A floating-point parameter or buffer of ``module`` (its dtype and device are the module's), or None."""
    return next((t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point()), None)


def _add_buffer(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """``register_buffer(name, tensor, persistent=False)`` without its check that no attribute has the
    name: a constant's is one already (``CompiledModule.__getattr__`` makes it on request)."""
    module._buffers[name] = tensor
    module._non_persistent_buffers_set.add(name)


def _sparse_matrix(program: Program, node: Node, dtype: torch.dtype, made: dict[tuple, list]) -> nn.Module:
    """The CSR indices of sparse sum ``node``: those of an earlier one in ``made`` where its matrix is
    the same (GCN's layers share one: one copy, not one per layer), else new ones, added to ``made``."""
    matrix = sparse_matrix(program, node)
    mean, n_sources, index, counts, coef = matrix
    same = made.setdefault((index.size, counts.size, coef is None, mean, n_sources), [])
    for other, indices in same:
        if same_sparse_matrix(matrix, other):
            return indices
    indices = runtime.CSRIndices(kernels.GatherSum.from_index(index, counts, n_sources, coef, mean=mean, dtype=dtype))
    same.append((matrix, indices))
    return indices


def _pooled_sums(module: nn.Module, program: Program, chosen: dict[str, str]) -> None:
    """Mark the sparse sums whose outputs, and sources' gradients, ``gather_sum`` writes into the
    program's pool (NOTE: [a pool of gather sums' outputs] in runtime.py): an output of at least
    ``_LARGE_VALUES`` elements; a gradient where the source is that large and every call of the
    matrix is its source's only reader."""
    users, nodes = program.users(), program.by_name()
    sums = [node for node in program.nodes if node.op is Op.REDUCE and chosen[node.name] == "sparse_mm"]
    gradient_ok: dict[int, bool] = {}
    for node in sums:
        csr, source = getattr(module, f"csr_{node.name}"), nodes[node.srcs[0]]
        if node.count * int(np.prod(node.shape)) >= _LARGE_VALUES:
            csr.pool_output = True
        alone = users[source.name] == [node.name] and source.count * int(np.prod(source.shape)) >= _LARGE_VALUES
        gradient_ok[id(csr)] = gradient_ok.get(id(csr), True) and alone
    for node in sums:
        csr = getattr(module, f"csr_{node.name}")
        csr.pool_gradient = gradient_ok[id(csr)]


_SELF_NAME = re.compile(r"self\.(\w+)")


def _tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if np.issubdtype(array.dtype, np.integer):
        # Indices keep the IR's dtype (int32 where it fits): index_select takes int32 as it is.
        return kernels.shared_tensor(compact_index(array))
    if dtype in _NUMPY_FLOATS:
        # numpy's copy (and float64 -> float32 rounding, the same IEEE round to nearest) took a fifth
        # of torch.tensor's CPU time: 13 vs 76 ms for 16.7M float64 values (a piece of a folded
        # aggregation: NOTE: [folding in chunks]), 13 vs 41 ms rounded to float32.
        return torch.from_numpy(np.array(array, dtype=_NUMPY_FLOATS[dtype], copy=True, order="C"))
    return torch.tensor(array, dtype=dtype)


_NUMPY_FLOATS = {torch.float64: np.float64, torch.float32: np.float32}


def _backward_indices(program: Program, chosen: dict[str, str] | None = None) -> set[str]:
    """The gather indices whose gather has a backward: those of gathers (and of sparse sums run
    by another kernel than sparse_mm, which gathers their rows: NOTE: [kernels chosen by the
    engine]) from computed values (or from dynamic facts, which a caller may pass with
    ``requires_grad``). They are kept as
    int64: the backward of ``index_select`` is ``index_add_``, which torch 2.13 runs ~20x
    slower on CPU with an int32 index (2.3 vs 0.11 ms for 43k rows, 1 thread) - the step of
    PROTEINS' SAGE spent a quarter of its time there. Gathers from constant facts keep
    int32 (half the memory; their forward is as fast)."""
    chosen = choose_kernels(program) if chosen is None else chosen
    nodes = program.by_name()
    dynamic = set(program.dynamic_facts)
    return {node.attrs["index"] for node in program.nodes
            if (node.op is Op.GATHER or (node.op is Op.REDUCE and "index" in node.attrs
                                         and chosen[node.name] != "sparse_mm"))
            and not (nodes[node.srcs[0]].op is Op.FACT and nodes[node.srcs[0]].attrs.get("fact_layer") not in dynamic)}


def _load(source: str):
    """Run the generated source under a fake file name registered with ``linecache``
    (so tracebacks and ``inspect`` show the generated lines); returns its ``forward`` and the
    program's ``BufferPool``."""
    filename = f"<neurovec-program-{next(_file_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    pool = runtime.BufferPool()  # NOTE: [a pool of large outputs]: one per program
    namespace = {"torch": torch, "T": TRANSFORM_FUNCTIONS, "segment_reduce": kernels.segment_reduce,
                 "scatter_reduce": kernels.scatter_reduce_native, "dense_reduce": kernels.dense_reduce,
                 "strided_reduce": runtime.strided_reduce,
                 "gather_rows": runtime.gather_rows, "chunked_product": runtime.chunked_product,
                 "gathered_chunked_product": runtime.gathered_chunked_product,
                 "dense": functools.partial(runtime.dense, pool=pool), "relu_": functools.partial(runtime.relu_, pool=pool),
                 "gather_sum": functools.partial(runtime.gather_sum, pool=pool),
                 "gather_sum_into": functools.partial(runtime.gather_sum_into, pool=pool),
                 "preferred_zeros": preferred_zeros, "order_signed_zeros": order_signed_zeros}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["forward"], pool


def _program_class(source: str) -> type:
    """A new subclass of :class:`CompiledModule` whose ``forward`` is ``source`` (see
    NOTE: [A class per program])."""
    forward, pool = _load(source)
    # torch.compile(module) starts tracing at __call__ (ours, not nn.Module's, which dynamo
    # skips): a copy of its code object per class, so that no two programs share a cache entry.
    call = CompiledModule.__call__
    call = types.FunctionType(call.__code__.replace(), call.__globals__, call.__name__, call.__defaults__,
                              call.__closure__)
    call.__qualname__ = CompiledModule.__call__.__qualname__
    return type(CompiledModule.__name__, (CompiledModule,),
                {"forward": forward, "__call__": call, "code": source, "__module__": CompiledModule.__module__,
                 "buffer_pool": pool})


def _releasing_pool(module: CompiledModule) -> CompiledModule:
    """``module``, whose program's ``BufferPool`` lets go of its blocks when ``module`` is freed: a class,
    and so its pool, lives until the garbage collector finds its reference cycles, which could keep
    gigabytes of a large graph's blocks after ``del module`` (autotune compiles and drops many). Dropping
    the pool's references is always safe: a block a tensor still holds stays with that tensor."""
    if type(module).buffer_pool is not None:  # None on a subclass of CompiledModule itself
        weakref.finalize(module, type(module).buffer_pool.clear)
    return module


def _rebuild_module(source: str, state: dict) -> CompiledModule:
    """Unpickle a :class:`CompiledModule` (see ``CompiledModule.__reduce__``)."""
    module = _releasing_pool(nn.Module.__new__(_program_class(source)))
    module.__setstate__(state)
    return module
