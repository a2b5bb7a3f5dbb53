"""The C++ operators (``torch.ops.neurovec_cpu``, see ``engines/native.py``) as programs call them.

:func:`gather_sum` and :func:`segment_reduce` run on CPU float32/float64 tensors where the
operators are built (:func:`native_ok`); callers use the torch kernels of ``engines/kernels.py``
elsewhere. Eagerly they call the operators whose autograd is C++ (NOTE: [Operators in C++]);
while dynamo traces (``torch.compile``), autograd Functions over the operators without autograd,
whose fake kernels ``engines/native.py`` registers (NOTE: [Kernels under torch.compile]).

Every backward is the transposed kernel: ``gather_sum`` on the transposed CSR (``t_ptr``,
``t_col``, ``t_values``, built once at compile time), a segment sum's is a broadcast of each
segment's gradient to its rows, a max / min's splits the gradient evenly among tied rows. Eagerly
they are differentiable again (double backward); under torch.compile AOTAutograd differentiates
once only, for any op.
"""
from __future__ import annotations

import torch

from . import native

__all__ = ["native_ok", "gather_sum", "segment_reduce", "REDUCTIONS"]

REDUCTIONS = ("sum", "mean", "max", "min")
_NATIVE_DTYPES = (torch.float32, torch.float64)


@torch.compiler.assume_constant_result
def _built() -> bool:
    return native.operators() is not None


def native_ok(x: torch.Tensor) -> bool:
    """Whether the C++ kernels compute on ``x`` (CPU float32/float64, built and switched on)."""
    return x.device.type == "cpu" and x.dtype in _NATIVE_DTYPES and _built()


# NOTE: [Operators in C++] Eagerly the entry points call operators whose autograd Functions are
# written in C++ (``native_ops.cpp``), so neither the forward nor the backward runs Python beyond the
# one call. At MUTAG sizes (1 thread, a loaded machine) a gather + sum takes 4.5 µs without autograd
# against 9.4 µs through a Python autograd.Function, and 60 against 82 µs with a bias add, sum and
# backward; a whole training step is 60-66 µs shorter with one reduction (gcn and sage, labels),
# 112 µs with two (gin, continuous features).
#
# NOTE: [Kernels under torch.compile] Dynamo cannot trace into a C++ autograd Function, and
# torch.library's Python autograd registration runs on *every* call, also inside inductor's compiled
# forward and backward where no graph is recorded (~10 µs a call, a tenth of a small graph's compiled
# step). So while dynamo traces, programs call the autograd Functions below: dynamo traces their
# forward and backward into the compiled graphs, and those call the operators without autograd
# (``csr_sum``, ``broadcast``, ``extremum``, ``extremum_backward``), which have only a CPU kernel
# and a fake.

class _TracedGatherSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ptr, col, values, t_ptr, t_col, t_values, bias):
        ctx.save_for_backward(t_ptr, t_col, t_values)
        ctx.bias = bias is not None
        return torch.ops.neurovec_cpu.csr_sum(x, ptr, col, values, None, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        t_ptr, t_col, t_values = ctx.saved_tensors
        grad_x = torch.ops.neurovec_cpu.csr_sum(grad, t_ptr, t_col, t_values, None, None)
        return grad_x, None, None, None, None, None, None, grad.sum(0) if ctx.bias else None


class _TracedSegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ptr, values, divide):
        ctx.save_for_backward(ptr, values, divide)
        ctx.n_entries = x.shape[0]
        return torch.ops.neurovec_cpu.csr_sum(x, ptr, None, values, divide, None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        ptr, values, divide = ctx.saved_tensors
        return torch.ops.neurovec_cpu.broadcast(grad, ptr, values, divide, ctx.n_entries), None, None, None


class _TracedSegmentExtremum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ptr, maximum):
        y = torch.ops.neurovec_cpu.extremum(x, ptr, maximum)
        ctx.save_for_backward(x, y, ptr)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, y, ptr = ctx.saved_tensors
        return torch.ops.neurovec_cpu.extremum_backward(grad, x, y, ptr), None, None


def gather_sum(x: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor | None,
               t_ptr: torch.Tensor, t_col: torch.Tensor, t_values: torch.Tensor | None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y[j] = sum_{e in ptr[j]:ptr[j+1]} values[e] * x[col[e]]`` (plus ``bias``, one row of ``y``'s
    row shape and dtype, added to every row last: one IEEE addition, bitwise ``y + bias``);
    ``t_*`` is the transposed CSR. Only where :func:`native_ok`."""
    if torch.compiler.is_compiling():  # see NOTE: [Kernels under torch.compile]
        return _TracedGatherSum.apply(x, ptr, col, values, t_ptr, t_col, t_values, bias)
    return torch.ops.neurovec_cpu.gather_sum(x, ptr, col, values, t_ptr, t_col, t_values, bias)


def segment_reduce(x: torch.Tensor, ptr: torch.Tensor, reduce: str, counts: torch.Tensor | None = None,
                   values: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce each CSR segment of ``x`` (rows sorted by segment): sum (times per-row ``values``),
    mean (divided by ``counts``), max or min (ties share the gradient). Only where :func:`native_ok`."""
    compiling = torch.compiler.is_compiling()
    if reduce in ("sum", "mean"):
        divide = None
        if reduce == "mean":
            if counts is None:
                raise ValueError("reduce='mean' needs counts")
            divide = counts if counts.dtype == x.dtype else counts.to(x.dtype)
        if compiling:
            return _TracedSegmentSum.apply(x, ptr, values, divide)
        return torch.ops.neurovec_cpu.segment_sum(x, ptr, values, divide)
    if reduce in ("max", "min"):
        if compiling:
            return _TracedSegmentExtremum.apply(x, ptr, reduce == "max")
        return torch.ops.neurovec_cpu.segment_extremum(x, ptr, reduce == "max")
    raise ValueError(f"unknown reduction {reduce!r} for the native segment ops; expected one of {REDUCTIONS}")
