"""Segment reductions as torch ops: C++ kernels on the CPU, torch kernels elsewhere.

Each reduction is a ``torch.library`` custom op in the ``neurovec`` namespace, with
a fake (meta) implementation and a registered autograd formula, so that
``torch.compile(module, fullgraph=True)`` traces programs that call them::

    neurovec::gather_sum(x, ptr, col, values?, t_ptr, t_col, t_values?)   y = A @ x
    neurovec::segment_sum(x, ptr, values?, divide?)                       y[j] = sum_e c[e] x[e] / d[j]
    neurovec::segment_broadcast(g, ptr, values?, divide?, n_entries)      its transpose (the backward)
    neurovec::segment_max(x, ptr) / neurovec::segment_min(x, ptr)
    neurovec::segment_extremum_backward(grad, x, y, ptr)                  ties share the gradient

An op's implementation runs the C++ kernel (:mod:`.native`) for float32/float64 CPU
tensors when the kernels are built and switched on, else an equivalent made of
torch ops (the CUDA path, half precision, no compiler). The backward of
``gather_sum`` is ``gather_sum`` on the transposed CSR (``t_ptr``, ``t_col``,
``t_values``), built once at compile time; that of ``segment_sum`` is
``segment_broadcast`` and vice versa, so double backward works too.

The programs call :func:`gather_sum` and :func:`segment_reduce`, which skip those
registered ops' Python autograd kernels (which run on every call, ~10 µs; small
graphs are mostly per-call overhead): eager, they call ``torch.ops.neurovec_cpu``,
the same C++ kernels as torch operators with their autograd in C++ (see NOTE:
[Operators in C++]), or where that library is not built, :class:`torch.autograd.Function` s
that call the implementations here directly; while dynamo traces, autograd Functions over
the autograd-free ``neurovec::kernel_*`` ops (see NOTE: [Kernels under torch.compile];
first derivatives only there, as AOTAutograd has no double backward anyway).
"""
from __future__ import annotations

import math

import torch

from . import native

__all__ = ["native_ok", "eager_operators", "gather_sum", "segment_reduce", "REDUCTIONS"]

REDUCTIONS = ("sum", "mean", "max", "min")
_NATIVE_DTYPES = (torch.float32, torch.float64)


def native_ok(x: torch.Tensor) -> bool:
    """Whether the C++ kernels compute on ``x`` (CPU float32/float64, built and switched on)."""
    return x.is_cpu and x.dtype in _NATIVE_DTYPES and native.library() is not None


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _width(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:])


def _values(values: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    if values is None or (values.dtype == like.dtype and values.is_contiguous()):
        return values  # the usual case: skip two calls into torch
    return values.to(like.dtype).contiguous()


def _per_row(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view((-1,) + (1,) * (like.dim() - 1))


def _int64(ptr: torch.Tensor) -> torch.Tensor:
    return ptr if ptr.dtype == torch.int64 else ptr.long()


# --------------------------------------------------------------------------- implementations (no autograd)

def _csr_sum_impl(x, ptr, col, values, divide):
    """``y[j] = sum_{e in ptr[j]:ptr[j+1]} values[e] * x[col[e]] / divide[j]`` (``col`` None: row e)."""
    n = ptr.shape[0] - 1
    # The C gather takes int32 indices (GatherSum's, where they fit); larger ones use torch.
    if native_ok(x) and (col is None or ptr.dtype == col.dtype == torch.int32):
        # Locals keep every temporary alive while C reads it.
        x, values, divide = x.contiguous(), _values(values, x), _values(divide, x)
        y = torch.empty((n, *x.shape[1:]), dtype=x.dtype)
        threads = torch.get_num_threads()
        if col is None:
            ptr = _int64(ptr).contiguous()
            native.function("segment_sum", x.dtype)(n, ptr.data_ptr(), _address(values), x.data_ptr(), _width(x),
                                                    y.data_ptr(), _address(divide), threads)
            return y
        ptr, col = ptr.contiguous(), col.contiguous()
        native.function("gather_sum", x.dtype)(n, ptr.data_ptr(), col.data_ptr(), _address(values), x.data_ptr(),
                                               _width(x), y.data_ptr(), threads)
        return y if divide is None else y / _per_row(divide, y)
    return _csr_sum_torch(x, ptr, col, values, divide)


def _csr_sum_torch(x, ptr, col, values, divide):
    from .kernels import _csr, _csr_index_dtype, _ones, _spmm  # noqa: PLC0415 - kernels imports this module
    n = ptr.numel() - 1
    if col is not None and x.device.type == "cpu" and x.dtype in _NATIVE_DTYPES:
        # MKL's CSR sparse-dense product (int32 indices where they fit).
        e = col.numel()
        c = _ones(e, x.dtype, x.device) if values is None else values.to(x.dtype)
        index_dtype = _csr_index_dtype(max(e, x.shape[0], 1))
        y = _spmm(_csr(ptr.to(index_dtype), col.to(index_dtype), c, (n, x.shape[0])), x)
    else:
        rows = x if col is None else x.index_select(0, col.long())
        if values is not None:
            rows = rows * _per_row(values.to(x.dtype), rows)
        y = torch.segment_reduce(rows, "sum", offsets=_int64(ptr), axis=0, unsafe=True)
    if divide is not None:
        y = y / _per_row(divide.to(y.dtype), y)
    return y


def _broadcast_impl(g, ptr, values, divide, n_entries):
    """``out[e] = values[e] * g[j] / divide[j]`` for the entries e of segment j."""
    if native_ok(g):
        g, values, divide, ptr = g.contiguous(), _values(values, g), _values(divide, g), _int64(ptr).contiguous()
        out = g.new_empty((n_entries,) + tuple(g.shape[1:]))
        native.function("segment_broadcast", g.dtype)(
            ptr.numel() - 1, ptr.data_ptr(), _address(values), g.data_ptr(), _width(g), out.data_ptr(),
            _address(divide), torch.get_num_threads())
        return out
    if divide is not None:
        g = g / _per_row(divide.to(g.dtype), g)
    out = g.repeat_interleave(ptr.diff().long(), dim=0, output_size=n_entries)
    if values is not None:
        out = out * _per_row(values.to(out.dtype), out)
    return out


def _extremum_impl(x, ptr, reduce):
    ptr = _int64(ptr)
    if native_ok(x):
        x, ptr = x.contiguous(), ptr.contiguous()
        n = ptr.numel() - 1
        y = x.new_empty((n,) + tuple(x.shape[1:]))
        native.function(f"segment_{reduce}", x.dtype)(n, ptr.data_ptr(), x.data_ptr(), _width(x), y.data_ptr(),
                                                      torch.get_num_threads())
        return y
    return torch.segment_reduce(x, reduce, offsets=ptr, axis=0, unsafe=True)


def _extremum_backward_impl(grad, x, y, ptr):
    """``mask * (grad / ties)[seg]`` with ``mask = x == y[seg]``, ``ties[j] = sum(mask[seg j])``."""
    if native_ok(x) and grad.dtype == x.dtype:
        x, y, grad, ptr = x.contiguous(), y.contiguous(), grad.contiguous(), _int64(ptr).contiguous()
        out = torch.empty_like(x)
        ties = torch.empty_like(y)  # scratch for widths without a register version
        native.function("segment_extremum_backward", x.dtype)(
            ptr.numel() - 1, ptr.data_ptr(), x.data_ptr(), y.data_ptr(), grad.data_ptr(), _width(x), out.data_ptr(),
            ties.data_ptr(), torch.get_num_threads())
        return out
    return _extremum_backward_torch(grad, x, y, ptr)


def _extremum_backward_torch(grad, x, y, ptr):
    # Differentiable in grad (double backward): the mask is a constant.
    counts = ptr.diff().long()
    n_entries = x.shape[0]
    mask = (x.detach() == y.detach().repeat_interleave(counts, dim=0, output_size=n_entries)).to(grad.dtype)
    ties = torch.segment_reduce(mask, "sum", offsets=_int64(ptr), axis=0, unsafe=True)
    return (grad / ties).repeat_interleave(counts, dim=0, output_size=n_entries) * mask


# --------------------------------------------------------------------------- registered ops

@torch.library.custom_op("neurovec::gather_sum", mutates_args=())
def _gather_sum_op(x: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor | None,
                   t_ptr: torch.Tensor, t_col: torch.Tensor, t_values: torch.Tensor | None) -> torch.Tensor:
    return _csr_sum_impl(x, ptr, col, values, None)


@_gather_sum_op.register_fake
def _(x, ptr, col, values, t_ptr, t_col, t_values):
    return x.new_empty((ptr.shape[0] - 1,) + tuple(x.shape[1:]))


def _gather_sum_setup(ctx, inputs, output):
    x, ptr, col, values, t_ptr, t_col, t_values = inputs
    ctx.save_for_backward(ptr, col, values, t_ptr, t_col, t_values)


def _gather_sum_backward(ctx, grad):
    ptr, col, values, t_ptr, t_col, t_values = ctx.saved_tensors
    grad_x = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.ops.neurovec.gather_sum(grad, t_ptr, t_col, t_values, ptr, col, values)
    return grad_x, None, None, None, None, None, None


_gather_sum_op.register_autograd(_gather_sum_backward, setup_context=_gather_sum_setup)


@torch.library.custom_op("neurovec::segment_sum", mutates_args=())
def _segment_sum_op(x: torch.Tensor, ptr: torch.Tensor, values: torch.Tensor | None,
                    divide: torch.Tensor | None) -> torch.Tensor:
    return _csr_sum_impl(x, ptr, None, values, divide)


@_segment_sum_op.register_fake
def _(x, ptr, values, divide):
    return x.new_empty((ptr.shape[0] - 1,) + tuple(x.shape[1:]))


@torch.library.custom_op("neurovec::segment_broadcast", mutates_args=())
def _segment_broadcast_op(g: torch.Tensor, ptr: torch.Tensor, values: torch.Tensor | None,
                          divide: torch.Tensor | None, n_entries: int) -> torch.Tensor:
    return _broadcast_impl(g, ptr, values, divide, n_entries)


@_segment_broadcast_op.register_fake
def _(g, ptr, values, divide, n_entries):
    return g.new_empty((n_entries,) + tuple(g.shape[1:]))


def _segment_sum_setup(ctx, inputs, output):
    x, ptr, values, divide = inputs
    ctx.save_for_backward(ptr, values, divide)
    ctx.n_entries = x.shape[0]


def _segment_sum_backward(ctx, grad):
    ptr, values, divide = ctx.saved_tensors
    grad_x = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.ops.neurovec.segment_broadcast(grad, ptr, values, divide, ctx.n_entries)
    return grad_x, None, None, None


def _broadcast_setup(ctx, inputs, output):
    g, ptr, values, divide, n_entries = inputs
    ctx.save_for_backward(ptr, values, divide)


def _broadcast_backward(ctx, grad):
    ptr, values, divide = ctx.saved_tensors
    grad_g = None
    if ctx.needs_input_grad[0]:
        grad_g = torch.ops.neurovec.segment_sum(grad, ptr, values, divide)
    return grad_g, None, None, None, None


_segment_sum_op.register_autograd(_segment_sum_backward, setup_context=_segment_sum_setup)
_segment_broadcast_op.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


@torch.library.custom_op("neurovec::segment_max", mutates_args=())
def _segment_max_op(x: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    return _extremum_impl(x, ptr, "max")


@torch.library.custom_op("neurovec::segment_min", mutates_args=())
def _segment_min_op(x: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    return _extremum_impl(x, ptr, "min")


@torch.library.custom_op("neurovec::segment_extremum_backward", mutates_args=())
def _extremum_backward_op(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    return _extremum_backward_impl(grad, x, y, ptr)


def _extremum_fake(x, ptr):
    return x.new_empty((ptr.shape[0] - 1,) + tuple(x.shape[1:]))


_segment_max_op.register_fake(_extremum_fake)
_segment_min_op.register_fake(_extremum_fake)


@_extremum_backward_op.register_fake
def _(grad, x, y, ptr):
    return torch.empty_like(x)


def _extremum_setup(ctx, inputs, output):
    x, ptr = inputs
    ctx.save_for_backward(x, output, ptr)


def _extremum_backward(ctx, grad):
    x, y, ptr = ctx.saved_tensors
    grad_x = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.ops.neurovec.segment_extremum_backward(grad, x, y, ptr)
    return grad_x, None


_segment_max_op.register_autograd(_extremum_backward, setup_context=_extremum_setup)
_segment_min_op.register_autograd(_extremum_backward, setup_context=_extremum_setup)


# --------------------------------------------------------------------------- kernels for compiled programs

# NOTE: [Kernels under torch.compile] The registered ops above carry their autograd as a
# Python kernel (torch.library's register_autograd), which runs on *every* call, also
# inside inductor's compiled forward and backward where no graph is recorded: ~10 µs
# per call, a tenth of a small graph's compiled step. So while dynamo traces, programs
# call the autograd Functions below instead: dynamo traces their forward and backward
# into the compiled graphs, and those call these ``neurovec::kernel_*`` ops, which have
# only a backend kernel and a fake (their calls cost ~1 µs over the kernel itself).
def _define_kernel_ops(lib: torch.library.Library) -> None:
    lib.define("kernel_csr_sum(Tensor x, Tensor ptr, Tensor? col, Tensor? values, Tensor? divide) -> Tensor")
    lib.define("kernel_broadcast(Tensor g, Tensor ptr, Tensor? values, Tensor? divide, SymInt n_entries) -> Tensor")
    lib.define("kernel_extremum(Tensor x, Tensor ptr, str reduce) -> Tensor")
    lib.define("kernel_extremum_backward(Tensor grad, Tensor x, Tensor y, Tensor ptr) -> Tensor")
    lib.impl("kernel_csr_sum", _csr_sum_impl, "CompositeExplicitAutograd")
    lib.impl("kernel_broadcast", _broadcast_impl, "CompositeExplicitAutograd")
    lib.impl("kernel_extremum", _extremum_impl, "CompositeExplicitAutograd")
    lib.impl("kernel_extremum_backward", _extremum_backward_impl, "CompositeExplicitAutograd")

    @torch.library.register_fake("neurovec::kernel_csr_sum", lib=lib)
    def _(x, ptr, col, values, divide):
        return x.new_empty((ptr.shape[0] - 1,) + tuple(x.shape[1:]))

    @torch.library.register_fake("neurovec::kernel_broadcast", lib=lib)
    def _(g, ptr, values, divide, n_entries):
        return g.new_empty((n_entries,) + tuple(g.shape[1:]))

    @torch.library.register_fake("neurovec::kernel_extremum", lib=lib)
    def _(x, ptr, reduce):
        return x.new_empty((ptr.shape[0] - 1,) + tuple(x.shape[1:]))

    @torch.library.register_fake("neurovec::kernel_extremum_backward", lib=lib)
    def _(grad, x, y, ptr):
        return torch.empty_like(x)


# pytest imports the checkout's __init__.py a second time, under the checkout directory's
# name (the checkout root is the package), and a second define() of an op is an error.
_kernels = torch.library.Library("neurovec", "FRAGMENT")
if not hasattr(torch.ops.neurovec, "kernel_csr_sum"):
    _define_kernel_ops(_kernels)


class _TracedGatherSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ptr, col, values, t_ptr, t_col, t_values):
        ctx.save_for_backward(t_ptr, t_col, t_values)
        return torch.ops.neurovec.kernel_csr_sum(x, ptr, col, values, None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        t_ptr, t_col, t_values = ctx.saved_tensors
        return torch.ops.neurovec.kernel_csr_sum(grad, t_ptr, t_col, t_values, None), None, None, None, None, None, None


class _TracedSegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ptr, values, divide):
        ctx.save_for_backward(ptr, values, divide)
        ctx.n_entries = x.shape[0]
        return torch.ops.neurovec.kernel_csr_sum(x, ptr, None, values, divide)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        ptr, values, divide = ctx.saved_tensors
        return torch.ops.neurovec.kernel_broadcast(grad, ptr, values, divide, ctx.n_entries), None, None, None


class _TracedSegmentExtremum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ptr, reduce):
        y = torch.ops.neurovec.kernel_extremum(x, ptr, reduce)
        ctx.save_for_backward(x, y, ptr)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, y, ptr = ctx.saved_tensors
        return torch.ops.neurovec.kernel_extremum_backward(grad, x, y, ptr), None, None


# --------------------------------------------------------------------------- eager autograd

# NOTE: [Lean eager Functions] On small graphs a training step is mostly per-call overhead,
# and these Functions run once per reduction forward and once backward. So their constant
# index tensors travel as *one* tuple argument and are kept on ``ctx`` as that tuple:
# autograd inspects every tensor argument of ``apply`` (and wants a gradient slot for
# it), and ``save_for_backward`` checks versions on unpacking -- ~5 µs a gather + sum
# forward and backward at MUTAG sizes (1 thread), for tensors that are constant buffers
# of the compiled module, never differentiated nor modified in place. Only the values
# that autograd must track (``x`` and the extremum ``y``) go through save_for_backward.

class _GatherSum(torch.autograd.Function):
    """``csr = (ptr, col, values, t_ptr, t_col, t_values)``; the backward is the same kernel
    on the transpose (differentiable again under ``create_graph``)."""

    @staticmethod
    def forward(ctx, x, csr):
        ctx.csr = csr
        return _csr_sum_impl(x, csr[0], csr[1], csr[2], None)

    @staticmethod
    def backward(ctx, grad):
        ptr, col, values, t_ptr, t_col, t_values = ctx.csr
        if torch.is_grad_enabled():  # create_graph: stay differentiable
            return _GatherSum.apply(grad, (t_ptr, t_col, t_values, ptr, col, values)), None
        return _csr_sum_impl(grad, t_ptr, t_col, t_values, None), None


class _SegmentSum(torch.autograd.Function):
    """``segments = (ptr, values, divide, n_entries)``."""

    @staticmethod
    def forward(ctx, x, segments):
        ctx.segments = segments
        ptr, values, divide, _ = segments
        return _csr_sum_impl(x, ptr, None, values, divide)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            return _SegmentBroadcast.apply(grad, ctx.segments), None
        ptr, values, divide, n_entries = ctx.segments
        return _broadcast_impl(grad, ptr, values, divide, n_entries), None


class _SegmentBroadcast(torch.autograd.Function):
    """The transpose of :class:`_SegmentSum`, with the same ``segments``."""

    @staticmethod
    def forward(ctx, g, segments):
        ctx.segments = segments
        ptr, values, divide, n_entries = segments
        return _broadcast_impl(g, ptr, values, divide, n_entries)

    @staticmethod
    def backward(ctx, grad):
        return _SegmentSum.apply(grad, ctx.segments), None


class _SegmentExtremum(torch.autograd.Function):
    """``segments = (ptr, reduce)``; ties share the gradient."""

    @staticmethod
    def forward(ctx, x, segments):
        ptr, reduce = segments
        y = _extremum_impl(x, ptr, reduce)
        ctx.save_for_backward(x, y)
        ctx.ptr = ptr
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the differentiable torch formula
            return _extremum_backward_torch(grad, x, y, ctx.ptr), None
        return _extremum_backward_impl(grad, x, y, ctx.ptr), None


# --------------------------------------------------------------------------- entry points

# NOTE: [Operators in C++] Eager, where the C++ kernels run, the entry points below call
# ``torch.ops.neurovec_cpu`` (``native_ops.cpp``, see ``engines/native.py``): the same
# kernels as torch operators whose autograd Functions are written in C++, so neither the
# forward nor the backward runs Python beyond the one call. At MUTAG sizes (1 thread, a
# loaded machine) a gather + sum takes 4.5 µs without autograd against 9.4 µs, and 60 against
# 82 µs with a bias add, sum and backward; a whole training step is 60-66 µs shorter with one
# reduction (gcn and sage, labels), 112 µs with two (gin, continuous features). The Python
# Functions remain for when that library cannot be built (the ctypes kernels), and under torch.compile.
def eager_operators(x: torch.Tensor):
    """``torch.ops.neurovec_cpu`` where its operators run on ``x`` (CPU float32/float64, built and
    switched on), eagerly (not while dynamo traces); else None."""
    if x.dtype in _NATIVE_DTYPES and x.is_cpu and not torch.compiler.is_compiling():
        return native.operators()
    return None


def gather_sum(x: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor | None,
               t_ptr: torch.Tensor, t_col: torch.Tensor, t_values: torch.Tensor | None) -> torch.Tensor:
    """``y[j] = sum_{e in ptr[j]:ptr[j+1]} values[e] * x[col[e]]``; ``t_*`` is the transposed CSR."""
    operators = eager_operators(x)
    if operators is not None:  # see NOTE: [Operators in C++]
        return operators.gather_sum(x, ptr, col, values, t_ptr, t_col, t_values)
    if torch.compiler.is_compiling():  # see NOTE: [Kernels under torch.compile]
        return _TracedGatherSum.apply(x, ptr, col, values, t_ptr, t_col, t_values)
    if not (x.requires_grad and torch.is_grad_enabled()):  # no autograd node needed: skip its overhead
        return _csr_sum_impl(x, ptr, col, values, None)
    return _GatherSum.apply(x, (ptr, col, values, t_ptr, t_col, t_values))


def segment_reduce(x: torch.Tensor, ptr: torch.Tensor, reduce: str, counts: torch.Tensor | None = None,
                   values: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce each CSR segment of ``x`` (rows sorted by segment): sum (times per-row
    ``values``), mean (divided by ``counts``), max or min (ties share the gradient)."""
    operators = eager_operators(x)
    compiling = operators is None and torch.compiler.is_compiling()
    if reduce in ("sum", "mean"):
        divide = None
        if reduce == "mean":
            if counts is None:
                raise ValueError("reduce='mean' needs counts")
            divide = counts
        if operators is not None:  # see NOTE: [Operators in C++]; it casts divide to x's dtype
            return operators.segment_sum(x, ptr, values, divide)
        if divide is not None and divide.dtype != x.dtype:
            divide = divide.to(x.dtype)
        if compiling:
            return _TracedSegmentSum.apply(x, ptr, values, divide)
        if not (x.requires_grad and torch.is_grad_enabled()):
            return _csr_sum_impl(x, ptr, None, values, divide)
        return _SegmentSum.apply(x, (ptr, values, divide, x.shape[0]))
    if reduce in ("max", "min"):
        if operators is not None:
            return operators.segment_extremum(x, ptr, reduce == "max")
        if compiling:
            return _TracedSegmentExtremum.apply(x, ptr, reduce)
        if not (x.requires_grad and torch.is_grad_enabled()):
            return _extremum_impl(x, ptr, reduce)
        return _SegmentExtremum.apply(x, (ptr, reduce))
    raise ValueError(f"unknown reduction {reduce!r} for the native segment ops; expected one of {REDUCTIONS}")
