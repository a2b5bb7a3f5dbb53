"""Functions the generated programs call, besides plain torch and ``kernels``."""
from __future__ import annotations

import torch
from torch import nn

from . import kernels, ops

__all__ = ["strided_reduce", "CSRIndices", "gather_sum", "gather_rows", "chunked_product"]


class CSRIndices(nn.Module):
    """The index tensors of one fused gather + sum (a sparse matrix and its transpose),
    and its constant per-edge values if it has any (``values``/``t_values``, else None).

    A module of non-persistent buffers, so ``.to(device)`` moves them and the
    generated code can pass them as one argument. The values follow the module's
    dtype, re-created from float64 on every dtype change (``.double()`` after
    ``.float()`` gives the exact values back, not upcast roundings).
    """

    def __init__(self, fused: kernels.GatherSum | dict[str, torch.Tensor | None]):
        super().__init__()
        tensors = fused.buffers() if isinstance(fused, kernels.GatherSum) else fused
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)
        # The float64 values, kept for dtype changes: a numpy array, the program's own where it can
        # be (those of A^T are taken from them then, not kept: 8 bytes an edge each)
        self._exact = getattr(fused, "exact_values", None)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self._exact is not None:
            values = torch.tensor(self._exact)
            for name, exact in (("values", values), ("t_values", values[self.t_perm.cpu()])):
                current = getattr(self, name)
                setattr(self, name, exact.to(device=current.device, dtype=current.dtype))
        return self

    def forward(self):  # pragma: no cover - a container
        raise RuntimeError("CSRIndices is a container")


def gather_sum(x: torch.Tensor, csr: CSRIndices, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y[j] = sum of values[e] * x[index[e]]`` over the edges e of segment j (values
    default to 1), as one sparse matmul; plus ``bias`` (one row, of ``y``'s row shape and
    dtype) added to every row last, if given.

    The C++ operator adds the bias inside the same call, one op and one autograd node
    fewer than a separate ``y + bias``, and bit-identical to it (each element is the same
    sum plus the same bias, one IEEE addition); the other paths add it separately.
    """
    # The buffers as dict entries: nn.Module's attribute lookup costs ~0.5 µs each, and on
    # small graphs these calls are mostly such overhead.
    b = csr._buffers
    values, t_values = b.get("values"), b.get("t_values")
    if (values is None) == (t_values is None) and ops.native_ok(x) and (bias is None or bias.dtype == x.dtype):
        return ops.gather_sum(x, b["ptr"], b["index"], values, b["t_ptr"], b["t_col"], t_values, bias)
    y = kernels.gather_segment_sum(x, b["ptr"], b["index"], b["seg_id"], b["t_ptr"], b["t_col"], b["t_perm"],
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
    ``w[k] @ x[e]``; returns (rows, o) (NOTE: [chunked product's weight gradient])."""
    return _ChunkedProduct.apply(x, w, chunks)
