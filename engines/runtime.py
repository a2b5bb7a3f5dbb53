"""Functions the generated programs call, besides plain torch and ``kernels``."""
from __future__ import annotations

import threading

import torch
from torch import nn

from . import kernels, ops

__all__ = ["strided_reduce", "CSRIndices", "gather_sum", "gather_sum_into", "gather_rows", "chunked_product", "gathered_chunked_product",
           "BufferPool", "dense", "relu_"]


class CSRIndices(nn.Module):
    """The index tensors of one fused gather + sum (a sparse matrix and its transpose),
    and its constant per-edge values if it has any (``values``/``t_values``, else None).

    A module of non-persistent buffers, so ``.to(device)`` moves them and the
    generated code can pass them as one argument. The values follow the module's
    dtype, re-created from float64 on every dtype change (``.double()`` after
    ``.float()`` gives the exact values back, not upcast roundings).
    """

    # Whether ``gather_sum`` writes this sum's output, and its source's gradient, into the program's
    # ``BufferPool`` (NOTE: [a pool of gather sums' outputs]); the engine sets them per program.
    pool_output = False
    pool_gradient = False

    def __init__(self, fused: kernels.GatherSum | dict[str, torch.Tensor | None]):
        super().__init__()
        tensors = fused.buffers() if isinstance(fused, kernels.GatherSum) else fused
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)
        # The float64 values, kept for dtype changes: a numpy array, the program's own where it can
        # be (those of A^T are taken from them then, not kept: 8 bytes an edge each)
        self._exact = getattr(fused, "exact_values", None)

    def _apply(self, fn, recurse=True):
        dtype = None if self.values is None else self.values.dtype
        super()._apply(fn, recurse)
        if self._exact is not None and self.values.dtype != dtype:  # a move alone changes no bits
            values = torch.tensor(self._exact)
            t_values = kernels.transposed_values(self.ptr, self.index, self.t_ptr.numel() - 1, values)
            for name, exact in (("values", values), ("t_values", t_values)):
                current = getattr(self, name)
                setattr(self, name, exact.to(device=current.device, dtype=current.dtype))
        return self

    def forward(self):  # pragma: no cover - a container
        raise RuntimeError("CSRIndices is a container")


def gather_sum(x: torch.Tensor, csr: CSRIndices, bias: torch.Tensor | None = None,
               pool: BufferPool | None = None) -> torch.Tensor:
    """``y[j] = sum of values[e] * x[index[e]]`` over the edges e of segment j (values
    default to 1), as one sparse matmul; plus ``bias`` (one row, of ``y``'s row shape and
    dtype) added to every row last, if given.

    The C++ operator adds the bias inside the same call, one op and one autograd node
    fewer than a separate ``y + bias``, and bit-identical to it (each element is the same
    sum plus the same bias, one IEEE addition); the other paths add it separately.
    With a ``pool``, where ``csr.pool_output`` says so, the output (and, where
    ``csr.pool_gradient`` says so, ``x``'s gradient) is written into the pool's memory
    (NOTE: [a pool of gather sums' outputs]).
    """
    # The buffers as dict entries: nn.Module's attribute lookup costs ~0.5 µs each, and on
    # small graphs these calls are mostly such overhead.
    b = csr._buffers
    values, t_values = b.get("values"), b.get("t_values")
    if (values is None) == (t_values is None) and ops.native_ok(x) and (bias is None or bias.dtype == x.dtype):
        if not torch.compiler.is_compiling():  # the fused backwards read autograd nodes: eager only
            product = _constant_chunked_product(x)
            if product is not None:
                return _ChunkedProductSum.apply(product[1], x.detach(), product[0], product[2], b["ptr"], b["index"],
                                                values, b["t_ptr"], b["t_col"], t_values, bias)
            if pool is not None and (csr.pool_output or csr.pool_gradient) and torch.is_grad_enabled():
                return _PooledGatherSum.apply(x, bias, b["ptr"], b["index"], values, b["t_ptr"], b["t_col"], t_values,
                                              pool if csr.pool_output else None, pool if csr.pool_gradient else None)
        return ops.gather_sum(x, b["ptr"], b["index"], values, b["t_ptr"], b["t_col"], t_values, bias)
    y = kernels.gather_segment_sum(x, b["ptr"], b["index"], b["seg_id"], b["t_ptr"], b["t_col"],
                                   values=values, t_values=t_values)
    return y if bias is None else y + bias


def strided_reduce(x: torch.Tensor, k: int, aggregation: str) -> torch.Tensor:
    """Segment j is rows ``j, j + n, ..., j + (k - 1) n``: reduce a ``(k, n, ...)`` view over axis 0.

    The transposed dense reduction of thesis 5.2.9; ties in max/min split the
    gradient evenly, like ``torch.amax``.
    """
    v = x.reshape((k, -1) + tuple(x.shape[1:]))
    if aggregation == "sum":
        return v.sum(0)
    if aggregation == "mean":
        return v.mean(0)
    if aggregation == "max":
        return v.amax(0)
    if aggregation == "min":
        return v.amin(0)
    if aggregation == "prod":
        return kernels.two_row_product(x, strided=True) if k == 2 else v.prod(0)  # as dense_reduce does
    raise ValueError(f"unknown aggregation {aggregation!r}")


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, index)`` for a gather from a constant: the C++ row copy where it runs
    (``neurovec_cpu::rows``, no autograd: half of index_select's time on a million rows of 16 floats),
    else index_select itself (also for a source that needs a gradient, and under torch.compile)."""
    if ops.native_ok(x) and not (x.requires_grad and torch.is_grad_enabled()) and not torch.compiler.is_compiling():
        return torch.ops.neurovec_cpu.rows(x, index)
    return x.index_select(0, index)


class _ChunkedProduct(torch.autograd.Function):
    """``W_k x_e`` for the rows ``x_e`` of chunk ``k``: one batched GEMM (NOTE: [chunked product's
    weight gradient]). Its backward is written in differentiable torch ops: differentiable again."""

    @staticmethod
    def forward(ctx, x, w, chunks):
        ctx.save_for_backward(x, w)
        ctx.chunks = chunks
        if ops.native_ok(x) and w.dtype == x.dtype and not torch.compiler.is_compiling():
            return torch.ops.neurovec_cpu.chunk_product(x, w, chunks)  # NOTE: [a chunked product in C++]
        return torch.bmm(x.view(chunks, -1, w.shape[2]), w.transpose(1, 2)).view(x.shape[0], w.shape[1])

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        g = grad.reshape(ctx.chunks, -1, w.shape[1])
        grad_x = torch.bmm(g, w).view(x.shape) if ctx.needs_input_grad[0] else None
        grad_w = torch.bmm(g.transpose(1, 2), x.view(ctx.chunks, -1, w.shape[2])) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None


# NOTE: [chunked product's weight gradient] A layer whose rows are chunks with one weight each
# (compiler/passes/relation_products.py) is ``torch.bmm(x.view(c, r, i), W.transpose(1, 2))``.
# autograd computes W's gradient from that as the transposed product ``x^T g`` (c, i, o), which MKL
# runs 3.5x slower than ``g^T x`` (c, o, i) where o is narrow: hetero-100's second layer (223 chunks of
# 4,642 rows, i = 16, o = 4; 1 thread, loaded, CPU ms) 21.9 against 6.3; at o = i = 16 both 14.9.
# So the product is an autograd Function whose backward asks for ``g^T x``: the same sums of products,
# added in another order.

def chunked_product(x: torch.Tensor, w: torch.Tensor, chunks: int) -> torch.Tensor:
    """``x`` (rows, i) in ``chunks`` equal chunks times ``w`` (chunks, o, i): row e of chunk k is
    ``w[k] @ x[e]``; returns (rows, o) (NOTE: [chunked product's weight gradient]; where ``x`` is a
    gather sum that nothing else reads, the code generator writes ``gathered_chunked_product`` instead)."""
    return _ChunkedProduct.apply(x, w, chunks)


# NOTE: [a chunked product's weights' gradient from its readers] A relational layer whose inputs are
# constant (hetero-100's first layer: 1,035,166 product rows of 16, folded) is
# ``y = gather_sum(chunked_product(x, w, chunks), csr, bias)``, and its only gradient is the weights':
# ``g_k^T x_k`` per chunk k, where g (rows, o) is the transposed gather sum of y's gradient. Through
# the two ops' own backwards, g is a (rows, o) tensor (66 MB at hetero-100, the step's largest single
# op) written once and read once by the batched GEMM. So ``gather_sum`` recognises such a product
# (its input is the output of ``chunked_product`` with a constant x, unchanged: the autograd node
# is ``_ChunkedProduct``'s) and sums it through ``_ChunkedProductSum``, whose backward computes the
# weights' gradient chunk by chunk from y's gradient (``neurovec_cpu::chunk_weight_grad``: the
# chunk's rows of g into a buffer that stays in cache, then one GEMM). The forward values are those
# of gather_sum, bit for bit; the product itself keeps its own autograd node, so any other reader of
# it still gets its gradient through it.

def _constant_chunked_product(x: torch.Tensor):
    """(x, w, chunks) of the ``chunked_product`` whose unchanged output is ``x``, if its x is constant
    and a graph is recorded; else None (NOTE: [a chunked product's weights' gradient from its readers])."""
    node = x.grad_fn
    if not isinstance(node, _ChunkedProduct._backward_cls) or node.needs_input_grad[0] or not torch.is_grad_enabled():
        return None
    product_x, w = node.saved_tensors
    return product_x, w, node.chunks


class _ChunkedProductSum(torch.autograd.Function):
    """``gather_sum(products, csr) + bias`` of ``products = chunked_product(x, w, chunks)`` with a constant
    ``x``, differentiated in ``w`` (and ``bias``) directly (NOTE: [a chunked product's weights' gradient
    from its readers]). Its backward is the C++ kernel, or, where a graph of the backward is asked for
    (``create_graph``), differentiable torch ops: differentiable again."""

    @staticmethod
    def forward(ctx, w, products, x, chunks, ptr, col, values, t_ptr, t_col, t_values, bias):
        ctx.save_for_backward(w, x, ptr, col, values, t_ptr, t_col, t_values)
        ctx.chunks, ctx.bias = chunks, bias is not None
        return torch.ops.neurovec_cpu.csr_sum(products, ptr, col, values, None, bias)

    @staticmethod
    def backward(ctx, grad):
        w, x, ptr, col, values, t_ptr, t_col, t_values = ctx.saved_tensors
        grad_w = grad_bias = None
        if ctx.needs_input_grad[0]:
            if torch.is_grad_enabled():  # create_graph: the two ops' own differentiable backwards
                g = ops.gather_sum(grad, t_ptr, t_col, t_values, ptr, col, values)
                grad_w = torch.bmm(g.view(ctx.chunks, -1, w.shape[1]).transpose(1, 2), x.view(ctx.chunks, -1, w.shape[2]))
            else:
                grad_w = torch.ops.neurovec_cpu.chunk_weight_grad(grad.contiguous(), t_ptr, t_col, t_values, x, ctx.chunks)
        if ctx.bias and ctx.needs_input_grad[10]:
            grad_bias = grad.sum(0)
        return grad_w, None, None, None, None, None, None, None, None, None, grad_bias


# NOTE: [a chunked product of gathered rows, compiled] A relational layer whose inputs have a gradient
# (hetero-100's second layer) is ``chunked_product(gather_sum(source, csr), w, chunks)`` where nothing else
# reads the gathered rows: the code generator writes it as one call, ``gathered_chunked_product(source, csr,
# w, chunks)`` (engines/torch_module.py). Eagerly, with the C++ kernels, it is ``_GatheredProduct``: the
# forward sums the rows of one chunk at a time into a buffer that stays in cache and multiplies them there
# (``neurovec_cpu::gathered_chunk_product``, NOTE: [a chunked product of gathered rows] in native_ops.cpp),
# so the (rows, i) gathered rows (66 MB at hetero-100) are never written; the backward
# (``gathered_chunk_backward``) walks the transposed CSR once, source row by source row, and adds both
# gradients there: the source's, ``w_k^T g_p`` summed into each source row (each product's o-wide gradient read
# where it is needed, never a (rows, i) tensor of ``g w_k``), and the weights', the outer products of each
# product's gradient and its source row. The sums
# run in other orders than bmm's: equal to the two ops to rounding, not bit for bit. Elsewhere (no C++ kernels, another
# device or dtype, torch.compile) it is the two ops themselves.

def gathered_chunked_product(source: torch.Tensor, csr: CSRIndices, w: torch.Tensor, chunks: int) -> torch.Tensor:
    """``chunked_product(gather_sum(source, csr), w, chunks)`` without the gathered rows (NOTE: [a chunked
    product of gathered rows, compiled])."""
    b = csr._buffers
    values, t_values = b.get("values"), b.get("t_values")
    if (values is None) == (t_values is None) and ops.native_ok(source) and w.dtype == source.dtype \
            and not torch.compiler.is_compiling():
        return _GatheredProduct.apply(source, w, chunks, b["ptr"], b["index"], values, b["t_ptr"], b["t_col"],
                                      t_values)
    return chunked_product(gather_sum(source, csr), w, chunks)


class _GatheredProduct(torch.autograd.Function):
    """``gathered_chunked_product`` in the C++ kernels (NOTE: [a chunked product of gathered rows, compiled]).
    Where a graph of the backward is asked for (``create_graph``), the backward is the two ops'
    differentiable backwards instead: differentiable again."""

    @staticmethod
    def forward(ctx, source, w, chunks, ptr, col, values, t_ptr, t_col, t_values):
        ctx.save_for_backward(source, w, ptr, col, t_ptr, t_col, t_values)
        ctx.values, ctx.chunks = values, chunks
        return torch.ops.neurovec_cpu.gathered_chunk_product(source, ptr, col, values, w, chunks)

    @staticmethod
    def backward(ctx, grad):
        source, w, ptr, col, t_ptr, t_col, t_values = ctx.saved_tensors
        values, chunks = ctx.values, ctx.chunks
        grad_source = grad_w = None
        if torch.is_grad_enabled():  # create_graph: the gathered rows and the products' backward as torch ops
            x = ops.gather_sum(source, ptr, col, values, t_ptr, t_col, t_values)
            g = grad.reshape(chunks, -1, w.shape[1])
            if ctx.needs_input_grad[0]:
                grad_x = torch.bmm(g, w).view(x.shape)
                grad_source = ops.gather_sum(grad_x, t_ptr, t_col, t_values, ptr, col, values)
            if ctx.needs_input_grad[1]:
                grad_w = torch.bmm(g.transpose(1, 2), x.view(chunks, -1, w.shape[2]))
        elif ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_source, grad_w = torch.ops.neurovec_cpu.gathered_chunk_backward(
                grad, source, w, t_ptr, t_col, t_values, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
            grad_source = grad_source if ctx.needs_input_grad[0] else None
            grad_w = grad_w if ctx.needs_input_grad[1] else None
        return grad_source, grad_w, None, None, None, None, None, None, None


# NOTE: [a pool of large outputs] A full-batch step on one large graph (arxiv-like: 169,343 rows of
# 128 floats, 87 MB a value) makes several such values per step in torch's own ops: the GEMMs'
# outputs, their inputs' gradients and ReLU's gradient. Each is a fresh block (glibc maps blocks over
# 32 MiB anew on every allocation and unmaps them when freed), and the first write to each 4 KiB page
# is a page fault: at arxiv-like 128k faults a step, a quarter of its CPU time in the kernel (GCN, 1
# thread; SAGE 209k). (Transparent huge pages for them, as the C++ kernels ask for their own outputs,
# cut the faults to 5k, but on a loaded machine the kernel then compacts memory to find huge pages,
# and the step took more system time than before.) So ``dense`` and ``relu_`` are autograd Functions
# that compute the same torch ops (``out=``: the same kernels, the same values bit for bit) into
# memory of the program's own ``BufferPool``, which keeps the blocks it handed out and hands a block
# out again only when nothing else holds it: the storage's use count is 1, the pool's own reference
# (a tensor the caller kept, a view of it, a tensor autograd saved for a backward, a gradient a leaf
# kept as its ``.grad``: each holds the storage). A block handed out again is a new tensor on it, with
# its own version counter; no tensor that still exists ever shares memory with it. A pool belongs to
# one generated program (its class, engines/torch_module.py) and lives as long as it,
# but lets go of its blocks as soon as its module is freed (``_releasing_pool``); it keeps at most
# ``BufferPool.per_shape`` blocks of each shape and dtype. The code generator writes ``dense`` and
# ``relu_`` only for values of at least ``_LARGE_VALUES`` elements, so small programs keep their
# plain ops. Under torch.compile, on other devices than the CPU, or with no graph to record, they are
# the plain ops themselves. Their backwards are the plain ops' backwards, in differentiable ops where
# a graph of the backward is asked for (``create_graph``): differentiable again.

# A storage's use count (the tensors that share it), private in torch 2.13: without it the pool
# keeps no block (each output fresh, as the plain ops).
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


class BufferPool:
    """Blocks of memory for large outputs, each handed out again only once nothing else holds it
    (NOTE: [a pool of large outputs])."""

    per_shape = 8

    def __init__(self):
        self._blocks: dict[tuple, list[torch.UntypedStorage]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` and ``like``'s dtype and device, on a block
        no other tensor shares."""
        shape = tuple(int(n) for n in shape)
        key = (shape, like.dtype, like.device)
        with self._lock:  # one caller at a time may find a block free and take it
            blocks = self._blocks.setdefault(key, [])
            for block in blocks:
                if _STORAGE_USE_COUNT(block._cdata) == 1:  # its key is its shape and dtype: its size
                    return torch.empty(0, dtype=like.dtype, device=like.device).set_(block, 0, shape)
            y = torch.empty(shape, dtype=like.dtype, device=like.device)
            if len(blocks) < self.per_shape and _STORAGE_USE_COUNT is not None:
                blocks.append(y.untyped_storage())
            return y

    def __len__(self) -> int:
        return sum(len(blocks) for blocks in self._blocks.values())

    def clear(self) -> None:
        """Let go of every block (a block some tensor still holds stays with that tensor)."""
        with self._lock:
            self._blocks.clear()


def _plain(x: torch.Tensor) -> bool:
    """Whether ``dense`` / ``relu_`` are the plain torch ops for ``x`` (NOTE: [a pool of large outputs])."""
    return x.device.type != "cpu" or torch.compiler.is_compiling() or not torch.is_grad_enabled()


def _row_sum(grad: torch.Tensor) -> torch.Tensor:
    """``grad.sum(0)`` of a large gradient (a bias's gradient), as the product of its transpose and a
    vector of ones: MKL's GEMV, 1.5x torch's sum over rows (169,343 x 128 float32, 1 thread, loaded:
    10.0 against 15.4 ms); the same sums, added in another order. Differentiable again. Half
    precision keeps torch's sum, whose float accumulator cannot overflow where a GEMV's might."""
    if grad.dtype not in (torch.float32, torch.float64):
        return grad.sum(0)
    flat = grad.reshape(grad.shape[0], -1)
    return torch.mv(flat.T, flat.new_ones(flat.shape[0])).view(grad.shape[1:])


class _Dense(torch.autograd.Function):
    """``x @ w_t`` (plus ``bias``, as ``torch.addmm``) into memory of a ``BufferPool``."""

    @staticmethod
    def forward(ctx, x, w_t, bias, pool):
        ctx.save_for_backward(x, w_t)
        ctx.bias, ctx.pool = bias is not None, pool
        y = pool.empty((x.shape[0], w_t.shape[1]), x)
        return torch.mm(x, w_t, out=y) if bias is None else torch.addmm(bias, x, w_t, out=y)

    @staticmethod
    def backward(ctx, grad):
        x, w_t = ctx.saved_tensors
        grad_x = grad_w = grad_bias = None
        if ctx.needs_input_grad[0]:
            if torch.is_grad_enabled():  # create_graph: a differentiable product
                grad_x = grad @ w_t.T
            else:
                grad_x = torch.mm(grad, w_t.T, out=ctx.pool.empty(x.shape, grad))
        if ctx.needs_input_grad[1]:
            grad_w = x.T @ grad
        if ctx.bias and ctx.needs_input_grad[2]:
            grad_bias = _row_sum(grad)
        return grad_x, grad_w, grad_bias, None


def dense(x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None = None,
          pool: BufferPool | None = None) -> torch.Tensor:
    """``x @ w_t`` (``torch.addmm(bias, x, w_t)`` with a bias) for a large ``x`` (rows, i) and a
    (i, o) ``w_t``: the same values, its large outputs in ``pool``'s memory (NOTE: [a pool of large
    outputs])."""
    if pool is None or _plain(x) or x.dim() != 2 or w_t.dim() != 2 or (bias is not None and bias.dim() != 1):
        return x @ w_t if bias is None else torch.addmm(bias, x, w_t)
    return _Dense.apply(x, w_t, bias, pool)


class _ReluInPlace(torch.autograd.Function):
    """``torch.relu_(x)``, its gradient into memory of a ``BufferPool``."""

    @staticmethod
    def forward(ctx, x, pool):
        torch.relu_(x)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        ctx.pool = pool
        return x

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: ReLU's own backward, differentiable in grad
            return torch.ops.aten.threshold_backward(grad, y, 0), None
        out = ctx.pool.empty(y.shape, grad)
        return torch.ops.aten.threshold_backward.grad_input(grad, y, 0, grad_input=out), None


def relu_(x: torch.Tensor, pool: BufferPool | None = None) -> torch.Tensor:
    """``torch.relu_(x)`` of a large ``x``: the same values, its gradient in ``pool``'s memory (NOTE:
    [a pool of large outputs])."""
    if pool is None or _plain(x) or not x.requires_grad:
        return torch.relu_(x)
    return _ReluInPlace.apply(x, pool)


# NOTE: [a pool of gather sums' outputs] A large gather sum (arxiv-like SAGE: the neighbours' mean of
# 169,343 rows of 128 floats, 87 MB) makes a fresh block for its output every forward and one for its
# source's gradient every backward: the C++ operator's outputs are on huge pages (NOTE: [huge pages
# for large outputs] in native_ops.cpp), but the kernel still zeroes every page it maps, and a loaded
# machine compacts memory to find them. So where the engine marks a sum's output large
# (``CSRIndices.pool_output``: at least ``torch_module._LARGE_VALUES`` elements), ``gather_sum`` with
# the program's pool (bound in its namespace, as ``dense``; the generated code is unchanged) is
# ``_PooledGatherSum``: the same C++ kernel (``neurovec_cpu::csr_sum_out``: the same sums, bit for
# bit) into a block of the pool, and backward the transposed kernel, into a block of the pool too
# where ``CSRIndices.pool_gradient`` says so. That is only where the source is large and the sum is
# its only reader (at every call of that matrix): autograd adds a value's gradients into the first
# one to arrive, in place, only if nothing else holds it, and a pooled block is held by the pool, so
# a pooled first gradient would make the addition a fresh block of its own (NOTE: [a shared value's
# GEMM first] in engines/torch_module.py). Eager only, with a graph recorded (as ``dense``); with no
# graph, under torch.compile or off the C++ kernels the sum is what it was. Where a graph of the
# backward is asked for (``create_graph``) the backward is the differentiable C++ ``gather_sum``.

def _source_gradient(grad: torch.Tensor, csr: tuple, pool: BufferPool | None) -> torch.Tensor:
    """The gradient of a pooled gather sum's source: the transposed sum of ``grad`` (``csr`` is ``(ptr,
    col, values, t_ptr, t_col, t_values)``), into a block of ``pool`` where given; under ``create_graph``
    the operator with its C++ autograd, differentiable again."""
    ptr, col, values, t_ptr, t_col, t_values = csr
    if torch.is_grad_enabled():
        return ops.gather_sum(grad, t_ptr, t_col, t_values, ptr, col, values)
    if pool is None:
        return torch.ops.neurovec_cpu.csr_sum(grad, t_ptr, t_col, t_values, None, None)
    out = pool.empty((t_ptr.shape[0] - 1,) + tuple(grad.shape[1:]), grad)
    torch.ops.neurovec_cpu.csr_sum_out(grad, t_ptr, t_col, t_values, None, None, out)
    return out


class _PooledGatherSum(torch.autograd.Function):
    """``ops.gather_sum(x, ...)`` into memory of a ``BufferPool`` (NOTE: [a pool of gather sums' outputs])."""

    @staticmethod
    def forward(ctx, x, bias, ptr, col, values, t_ptr, t_col, t_values, output_pool, gradient_pool):
        # The indices are the program's constants: kept as they are, no version counter to check.
        ctx.csr = ptr, col, values, t_ptr, t_col, t_values
        ctx.pool, ctx.bias = gradient_pool, bias is not None
        if output_pool is None:
            return torch.ops.neurovec_cpu.csr_sum(x, ptr, col, values, None, bias)
        y = output_pool.empty((ptr.shape[0] - 1,) + tuple(x.shape[1:]), x)
        torch.ops.neurovec_cpu.csr_sum_out(x, ptr, col, values, None, bias, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        grad_x = _source_gradient(grad, ctx.csr, ctx.pool) if ctx.needs_input_grad[0] else None
        grad_bias = None
        if ctx.bias and ctx.needs_input_grad[1]:
            grad_bias = _row_sum(grad)
        return grad_x, grad_bias, None, None, None, None, None, None, None, None


# NOTE: [a sum added into a pooled output] ``into.add_(gather_sum(x, csr))``, where ``into`` is a
# ``dense`` output nothing else reads and the sum is read by the addition alone (SAGE's middle layer:
# the neighbours' term, 169,343 rows of 128 floats, added to the root term's ``addmm``), is written
# ``gather_sum_into(into, x, csr)`` (engines/torch_module.py, NOTE: [additions into a pooled output]):
# the C++ kernel adds each row's sum into ``into`` (``csr_sum_out(..., add=True)``: the sum in a row
# of its own, then one IEEE addition per element, as ``add_``: the same values bit for bit), so the
# sum is never written as a value of its own (87 MB written and read again per step at arxiv-like).
# Its backward passes the gradient to ``into`` as the addition's does, and the transposed sum to
# ``x`` (into the pool where ``csr.pool_gradient`` says so; differentiable under ``create_graph``).
# Where the kernels do not run (no graph, torch.compile, another device) it is the two ops.

class _GatherSumInto(torch.autograd.Function):
    """``into.add_(gather_sum(x, csr))`` in one C++ pass (NOTE: [a sum added into a pooled output])."""

    @staticmethod
    def forward(ctx, into, x, ptr, col, values, t_ptr, t_col, t_values, gradient_pool):
        ctx.csr = ptr, col, values, t_ptr, t_col, t_values
        ctx.pool = gradient_pool
        torch.ops.neurovec_cpu.csr_sum_out(x, ptr, col, values, None, None, into, True)
        ctx.mark_dirty(into)
        return into

    @staticmethod
    def backward(ctx, grad):
        grad_x = _source_gradient(grad, ctx.csr, ctx.pool) if ctx.needs_input_grad[1] else None
        return grad if ctx.needs_input_grad[0] else None, grad_x, None, None, None, None, None, None, None


def gather_sum_into(into: torch.Tensor, x: torch.Tensor, csr: CSRIndices, pool: BufferPool | None = None) -> torch.Tensor:
    """``into.add_(gather_sum(x, csr))``, the sum added row by row in one pass where the C++ kernels run
    (NOTE: [a sum added into a pooled output])."""
    b = csr._buffers
    values, t_values = b.get("values"), b.get("t_values")
    if (values is None) == (t_values is None) and ops.native_ok(x) and into.dtype == x.dtype and not _plain(x) \
            and into.is_contiguous() and into.device == x.device \
            and into.shape == (b["ptr"].shape[0] - 1,) + tuple(x.shape[1:]) and _constant_chunked_product(x) is None:
        return _GatherSumInto.apply(into, x, b["ptr"], b["index"], values, b["t_ptr"], b["t_col"], t_values,
                                    pool if csr.pool_gradient else None)
    return into.add_(gather_sum(x, csr, pool=pool))
