"""Segment reductions and a fused gather + sum, with cheap, tie-exact backward passes.

The compiled programs reduce the inputs of every neuron of a layer at once: the
inputs are laid out edge by edge, *sorted by neuron*, so neuron ``j`` owns the
contiguous rows ``ptr[j]:ptr[j+1]`` (a CSR "segment", thesis 3.4.3). This module
provides those reductions as :class:`torch.autograd.Function` s whose backward is
a plain gather (``index_select``) through an index precomputed at compile time,
instead of torch-scatter's ``gather_csr`` (thesis 6.4: that backward is what made
the compiled modules only tie PyG on forward + backward) -- or, on the CPU, the
C++ kernels of :mod:`.ops`, whose backward is one more sorted pass.

Shapes: values ``x`` are ``(E, *shape)`` (``E`` edges), results are
``(S, *shape)`` (``S`` segments). Every segment is non-empty.

Contents

* :class:`Segments` -- the precomputed indices (``ptr``, ``seg_id``, ``counts``)
  of one layer, movable with ``.to(device)``.
* :func:`segment_reduce` -- the functional form on plain tensors, dispatching to
  :class:`SegmentSum`, :class:`SegmentMean`, :class:`SegmentMax`,
  :class:`SegmentMin`, :class:`SegmentProd`.
* :class:`GatherSum` / :func:`gather_segment_sum` -- ``y[j] = sum_{e in seg j}
  c[e] * x[index[e]]`` as one CSR sparse-dense matmul, with the transposed matrix
  (built once) for the backward.
* :func:`scatter_reduce_native`, :func:`dense_reduce` -- the two other ways a
  layer can reduce (plain torch autograd), and :func:`choose_kernel`, the cost
  model that picks among all of them.

Gradient semantics match the reference engine (``torch.stack(...).sum/mean/amax/
amin/prod(0)`` per neuron): in particular max/min split the gradient *evenly
among tied extrema* (like ``torch.amax`` and ``scatter_reduce(..., "amax")``),
not to a single argmax.

Which kernel? On the CPU, for float32/float64, neurovec's C++ kernels
(:mod:`.native`, called through :mod:`.ops`) compute sum, mean, max and
min and the fused gather + sum, forward and backward, whenever they are built
(``impl="cpp"``; ``"auto"`` picks them). Measured by ``benchmarks/kernels.py``
(PROTEINS GCN sizes, 205k edges, 1 thread, CPU time on a loaded machine; see
:func:`choose_kernel` for more): gather * coefficient + sum F=16 forward 0.8 ms,
backward 0.7 ms (MKL's CSR matmul 1.2 / 1.2 ms, inductor's generated loops for
index_select * c + index_add 1.3 / 0.8 ms); segment max F=16 1.1 / 2.2 ms (torch's
best 3.3 / 10 ms). Elsewhere (no compiler, ``NEUROVEC_NATIVE=0``, half precision,
CUDA) the torch kernels below are used:

* sum / mean on CPU: a CSR sparse-dense matmul ``I_csr @ x`` with the segment
  structure as the sparse matrix (columns ``0..E-1``, values 1). On 250k rows
  MKL's spmm is 1.2-4x faster than ``index_add_``/``scatter_add_`` (the gap
  shrinks as F grows: F=8 0.9 vs 3.8 ms, F=64 6.4 vs 7.9 ms) and ~3x faster
  than ``torch.segment_reduce`` or torch-scatter's ``segment_csr``. For tiny
  inputs its ~20 µs setup dominates and ``torch.segment_reduce`` wins.
* max / min / prod on CPU: ``scatter_reduce`` with an *expanded* index hits
  PyTorch's sorted, feature-vectorized path and is fastest for wide features
  (F >= 32, or F >= 16 with enough rows; 250k rows, F=64: 9.1 vs 22.8 ms); for
  narrow ones ``torch.segment_reduce`` is 2-5x faster (F=8: 2.8 vs 11.3 ms).
  torch-scatter's ``segment_csr`` max is the slowest of all on CPU (65 ms).
* CUDA: torch-scatter's ``segment_csr`` when installed (the thesis measured it
  faster than scatter on the GPU forward), else ``torch.segment_reduce``. Not
  measured here (no GPU).

While dynamo traces (``torch.compile``), the C++ kernels run as operators with fake
implementations inside autograd Functions dynamo traces (:mod:`.ops`), and the torch
kernels without sparse tensors, so programs compile with ``fullgraph=True``.

torch-scatter is optional: ``HAS_TORCH_SCATTER`` says whether it imported, and
every function takes ``impl=`` to force a forward kernel (tests force each).
"""
from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
import torch

from . import native, ops

try:  # optional: only a forward kernel, never required
    import torch_scatter as _torch_scatter
except (ImportError, OSError):  # OSError: a wheel built against another torch
    _torch_scatter = None

__all__ = [
    "HAS_TORCH_SCATTER", "REDUCTIONS", "IMPLS",
    "Segments", "segment_reduce", "segment_forward",
    "SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin", "SegmentProd",
    "GatherSum", "gather_segment_sum",
    "scatter_reduce_native", "dense_reduce", "two_row_product", "choose_kernel", "choose_gather_kernel",
]

HAS_TORCH_SCATTER: bool = _torch_scatter is not None

REDUCTIONS = ("sum", "mean", "max", "min", "prod")

#: Forward kernels ``impl=`` accepts. ``"auto"`` picks per device and size (see the
#: module docstring), ``"native"`` is ``"auto"`` restricted to plain torch.
IMPLS = ("auto", "native", "torch_scatter", "spmm", "segment_reduce", "scatter_reduce", "cpp")

# Which reductions each forward kernel computes ("mean" is always sum / counts).
_IMPL_REDUCTIONS = {
    "cpp": {"sum", "max", "min", "prod"},
    "torch_scatter": {"sum", "max", "min"},
    "spmm": {"sum"},
    "segment_reduce": {"sum", "max", "min", "prod"},
    "scatter_reduce": {"sum", "max", "min", "prod"},
}
_SCATTER_NAMES = {"sum": "sum", "max": "amax", "min": "amin", "prod": "prod"}

# Thresholds of the CPU "auto" choice, from `benchmarks/kernels.py --sweep` (2 threads):
# spmm has ~20 µs of fixed cost, so below ~16k values (E * F) torch.segment_reduce is
# faster (E=1159: F=8 14 vs 24 µs, F=16 tie, F=32 35 vs 27 µs); above, spmm is 1.5-3x
# faster than everything else. scatter_reduce's vectorized path needs F >= 16 rows
# wide *and* enough rows to pay off (F=16: E=1.1k 31 vs 21 µs, E=29k 391 vs 502 µs);
# at F <= 8 it is 4-6x slower than torch.segment_reduce.
_SPMM_MIN_ELEMENTS = 16384
_MKL_DTYPES = (torch.float32, torch.float64)  # CPU sparse CSR matmul has no half / bfloat16
_SCATTER_MIN_FEATURES = 16
_SCATTER_MIN_ELEMENTS = 65536

# Building a sparse CSR tensor warns once per process that the layout is "beta";
# swallow that one warning here rather than at every call (catch_warnings costs µs).
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.sparse_csr_tensor(torch.zeros(2, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                            torch.ones(1), (1, 1), check_invariants=False)


# --------------------------------------------------------------------------- helpers

# arange(E) and ones(E) for the spmm segment sum, per device / dtype. Kept in a
# cache that only grows (slicing a prefix is free) so that neither the functional
# API nor the compiled module has to carry them as extra buffers.
_IOTA: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
_ONES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _csr_index_dtype(n: int) -> torch.dtype:
    """int32 CSR indices where they fit: MKL's sparse matmul takes int32, and torch
    converts int64 crow/col indices to int32 copies on *every* call otherwise."""
    return torch.int32 if n < 2**31 - 1 else torch.int64


def _iota(n: int, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    t = _IOTA.get((device, dtype))
    if t is None or t.numel() < n:
        t = _IOTA[(device, dtype)] = torch.arange(max(n, 1024), device=device, dtype=dtype)
    return t[:n]


def _ones(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = _ONES.get((device, dtype))
    if t is None or t.numel() < n:
        t = _ONES[(device, dtype)] = torch.ones(max(n, 1024), dtype=dtype, device=device)
    return t[:n]


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape) -> torch.Tensor:
    # Invariants were checked once when the indices were built.
    return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _per_row(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """View a per-segment vector ``(S,)`` so it broadcasts against ``(S, *shape)``."""
    return v.view((-1,) + (1,) * (like.dim() - 1))


def _spmm(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``a @ x`` for a sparse CSR ``a`` and ``x`` of shape ``(n, *shape)``."""
    flat = x.reshape(x.shape[0], -1)
    return (a @ flat).reshape((a.shape[0],) + tuple(x.shape[1:]))


def _width(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:])


def _auto_impl(x: torch.Tensor, reduce: str, allow_torch_scatter: bool) -> str:
    """``allow_torch_scatter`` False is ``impl="native"``: plain torch kernels only
    (neither torch-scatter nor neurovec's C++ kernels)."""
    if allow_torch_scatter and reduce in _IMPL_REDUCTIONS["cpp"] and ops.native_ok(x):
        return "cpp"
    if torch.compiler.is_compiling():
        # Dynamo cannot trace sparse CSR tensors: a dense kernel keeps the graph whole.
        return "segment_reduce"
    if x.device.type != "cpu":
        # Unmeasured here; the thesis found segment_csr fastest on the GPU forward.
        if allow_torch_scatter and HAS_TORCH_SCATTER and reduce in _IMPL_REDUCTIONS["torch_scatter"]:
            return "torch_scatter"
        return "segment_reduce"
    # CPU: torch-scatter never wins here, so it is never picked (module docstring).
    width = _width(x)
    if reduce == "sum":
        big = x.shape[0] * width >= _SPMM_MIN_ELEMENTS
        return "spmm" if big and x.dtype in _MKL_DTYPES else "segment_reduce"
    wide = width >= 2 * _SCATTER_MIN_FEATURES or (
        width >= _SCATTER_MIN_FEATURES and x.shape[0] * width >= _SCATTER_MIN_ELEMENTS)
    return "scatter_reduce" if wide else "segment_reduce"


def segment_forward(x: torch.Tensor, ptr: torch.Tensor, seg_id: torch.Tensor, reduce: str,
                    impl: str = "auto") -> torch.Tensor:
    """Forward value of a segment ``sum``/``max``/``min``/``prod``, no autograd.

    ``x``: ``(E, *shape)``; ``ptr``: ``(S + 1,)`` int64 with ``ptr[0] = 0``,
    ``ptr[S] = E``; ``seg_id``: ``(E,)`` int64, the segment of each row (sorted).
    Returns ``(S, *shape)``. ``impl`` picks the kernel (see :data:`IMPLS`).
    """
    if impl in ("auto", "native"):
        impl = _auto_impl(x, reduce, allow_torch_scatter=impl == "auto")
    if reduce not in _IMPL_REDUCTIONS.get(impl, ()):
        raise ValueError(f"forward kernel {impl!r} does not compute {reduce!r}")
    n = ptr.numel() - 1
    out_shape = (n,) + tuple(x.shape[1:])
    if impl == "cpp":
        if not ops.native_ok(x):
            raise RuntimeError(f"impl='cpp' but neurovec's C++ kernels do not run here ({_cpp_problem(x)})")
        if reduce == "sum":
            return torch.ops.neurovec_cpu.csr_sum(x, ptr, None, None, None, None)
        if reduce == "prod":
            return torch.ops.neurovec_cpu.prod(x, ptr)
        return torch.ops.neurovec_cpu.extremum(x, ptr, reduce == "max")
    if impl == "torch_scatter":
        if _torch_scatter is None:
            raise RuntimeError("impl='torch_scatter' but torch_scatter is not installed")
        return _torch_scatter.segment_csr(x, ptr, reduce=reduce)
    if impl == "spmm":
        e = x.shape[0]
        index_dtype = _csr_index_dtype(e)
        a = _csr(ptr.to(index_dtype), _iota(e, x.device, index_dtype), _ones(e, x.dtype, x.device), (n, e))
        return _spmm(a, x)
    if impl == "segment_reduce":
        # unsafe=True skips re-validating offsets on every call (validated at build).
        return torch.segment_reduce(x, reduce, offsets=ptr, axis=0, unsafe=True)
    if impl == "scatter_reduce":
        # An *expanded* (stride-0) index is what selects PyTorch's fast sorted path.
        flat = x.reshape(x.shape[0], -1)
        index = seg_id.view(-1, 1).expand_as(flat)
        out = flat.new_empty((n, flat.shape[1])).scatter_reduce_(0, index, flat, _SCATTER_NAMES[reduce],
                                                                 include_self=False)
        return out.reshape(out_shape)
    raise ValueError(f"unknown forward kernel {impl!r}; expected one of {IMPLS}")


# --------------------------------------------------------------------------- autograd

def _same_family(impl: str, reduce: str) -> str:
    """The kernel a backward uses for an auxiliary ``reduce``: the forward's own one
    if it computes ``reduce`` (so a forced kernel is tested end to end), else auto."""
    if impl in ("auto", "native") or reduce in _IMPL_REDUCTIONS.get(impl, ()):
        return impl
    return "native"


class SegmentSum(torch.autograd.Function):
    """``y[j] = sum(x[ptr[j]:ptr[j+1]])``; backward ``grad_x = grad_y[seg_id]``."""

    @staticmethod
    def forward(ctx, x, ptr, seg_id, impl="auto"):
        ctx.save_for_backward(seg_id)
        return segment_forward(x, ptr, seg_id, "sum", impl)

    @staticmethod
    def backward(ctx, grad):
        (seg_id,) = ctx.saved_tensors
        return grad.index_select(0, seg_id), None, None, None


class SegmentMean(torch.autograd.Function):
    """``y[j] = sum(x[seg j]) / counts[j]``; backward ``(grad_y / counts)[seg_id]``.

    Dividing before the gather touches ``S`` rows instead of ``E`` and gives the
    same floats as ``torch.mean``'s backward (``grad / n`` per element).
    """

    @staticmethod
    def forward(ctx, x, ptr, seg_id, counts, impl="auto"):
        counts = counts.to(x.dtype)
        ctx.save_for_backward(seg_id, counts)
        total = segment_forward(x, ptr, seg_id, "sum", impl)
        return total / _per_row(counts, total)

    @staticmethod
    def backward(ctx, grad):
        seg_id, counts = ctx.saved_tensors
        return (grad / _per_row(counts, grad)).index_select(0, seg_id), None, None, None, None


def _extremum_forward(ctx, x, ptr, seg_id, reduce, impl):
    out = segment_forward(x, ptr, seg_id, reduce, impl)
    ctx.save_for_backward(x, out, ptr, seg_id)
    ctx.impl = impl
    return out


def _extremum_backward(ctx, grad):
    """Max / min's backward: ``grad_y[j]`` split evenly among the rows of segment ``j`` that equal
    the extremum (per feature), exactly as ``torch.amax``: ``grad_x = mask * (grad_y / ties)[seg_id]``
    with ``mask = x == y[seg_id]`` and ``ties[j] = sum(mask[seg j])``. A NaN extremum has no tie
    (``NaN != NaN``), so its gradient is NaN -- as with ``torch.amax``."""
    x, out, ptr, seg_id = ctx.saved_tensors
    # The mask is recomputed here, not kept from the forward: inference pays nothing.
    # It is written as 1.0 / 0.0 into the gathered extrema, in place: two (E, F)
    # allocations in all (mask, result) instead of five, which on CPU matters as
    # much as the arithmetic (every big fresh block costs page faults).
    # detach(): under create_graph the mask must stay a constant (it was a bool).
    mask = out.detach().index_select(0, seg_id)
    torch.eq(x.detach(), mask, out=mask)
    ties = segment_forward(mask, ptr, seg_id, "sum", _same_family(ctx.impl, "sum"))
    return (grad / ties).index_select(0, seg_id).mul_(mask), None, None, None


class SegmentMax(torch.autograd.Function):
    """``y[j] = amax(x[seg j], 0)``; ties share the gradient evenly (see :func:`_extremum_backward`)."""

    @staticmethod
    def forward(ctx, x, ptr, seg_id, impl="auto"):
        return _extremum_forward(ctx, x, ptr, seg_id, "max", impl)

    @staticmethod
    def backward(ctx, grad):
        return _extremum_backward(ctx, grad)


class SegmentMin(torch.autograd.Function):
    """``y[j] = amin(x[seg j], 0)``; ties share the gradient evenly (see :func:`_extremum_backward`)."""

    @staticmethod
    def forward(ctx, x, ptr, seg_id, impl="auto"):
        return _extremum_forward(ctx, x, ptr, seg_id, "min", impl)

    @staticmethod
    def backward(ctx, grad):
        return _extremum_backward(ctx, grad)


# torch.segment_reduce's own backward kernel: one fused pass, zero-exact for prod
# (checked against torch.prod in the tests); should this private op go away, or lack a
# dtype, the backward is torch.prod's own over the padded segments (slower, as exact). (Not used for
# max/min: it does not split *negative* gradients among ties -- torch 2.13.)
try:
    _fused_prod_backward = torch.ops.aten._segment_reduce_backward
except (AttributeError, RuntimeError):
    _fused_prod_backward = None


class SegmentProd(torch.autograd.Function):
    """``y[j] = prod(x[seg j], 0)``, with the exact gradient also where ``x`` has zeros.

    Per segment and feature, with ``z`` the number of zero rows:
    ``z = 0``: ``grad_x = grad_y * (y / x)`` (``torch.prod``'s own formula);
    ``z = 1``: the zero row gets ``grad_y * prod(nonzero rows)``, the others 0;
    ``z >= 2``: all 0. With infinite inputs next to zeros the gradient is unspecified
    (NaN where torch.prod may give 0). Under ``create_graph`` the backward is
    differentiable again (NOTE: [second derivatives of prod]).
    """

    @staticmethod
    def forward(ctx, x, ptr, seg_id, impl="auto"):
        if impl in ("auto", "native"):
            impl = _auto_impl(x, "prod", allow_torch_scatter=impl == "auto")
        out = segment_forward(x, ptr, seg_id, "prod", impl)
        ctx.save_for_backward(x, out, ptr, seg_id)
        ctx.impl = impl
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out, ptr, seg_id = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph
            return _prod_backward_differentiable(grad, x, ptr, seg_id), None, None, None
        if ctx.impl == "cpp":
            # One pass of prefix and suffix products per segment: no division (exact next to
            # zeros) and every row written, none zero-filled first (NOTE: [C++ segment products]).
            return torch.ops.neurovec_cpu.prod_backward(grad, x, ptr), None, None, None
        if _fused_prod_backward is not None:
            try:
                return _fused_prod_backward(grad.contiguous(), out, x, "prod", offsets=ptr, axis=0), None, None, None
            except RuntimeError:  # e.g. a dtype or device the private op lacks
                pass
        # Without torch's fused op (or for a dtype it lacks): the padded product's own gradient.
        with torch.enable_grad():
            grad_x = _prod_backward_differentiable(grad, x.detach().requires_grad_(), ptr, seg_id)
        return grad_x.detach(), None, None, None


# NOTE: [C++ segment products] Where the C++ kernels run, a segment product's forward and
# backward are neurovec_cpu::prod and ::prod_backward (native_ops.cpp): one pass over each segment
# forward, and backward a sweep of prefix products down and of suffix products (times the gradient)
# up, each row written once. torch's path (scatter_reduce forward for wide rows, the fused
# _segment_reduce_backward) zero-fills the whole (E, F) gradient first and divides where it can.
# A forward and backward step of cnf-44 (batch 128, 1 thread, loaded, interleaved with KLay's):
# 1,396 ms with torch's kernels, 1,187 ms with these (KLay 2,581 ms).

# NOTE: [second derivatives of prod] The first derivative of a product depends on the inputs
# themselves (the product of the other rows), so a Hessian-vector product differentiates the
# backward in x, not only in grad. A once_differentiable backward gets that silently wrong: torch
# refuses the second derivative only where the incoming grad needs a gradient, and where it is a
# constant (loss = (y * c).sum()) the backward's result is taken as a constant, so every term
# through the product's backward is dropped (issue 23, item 4). Under create_graph the backward
# therefore lays the segments out as a (segments, longest, ...) block padded with ones and lets
# torch differentiate its prod(1): torch.prod's own first and second derivatives, zeros included,
# as the reference engine's per-neuron prod; only the first derivative takes the fast path.

def _prod_backward_differentiable(grad: torch.Tensor, x: torch.Tensor, ptr: torch.Tensor,
                                  seg_id: torch.Tensor) -> torch.Tensor:
    """``grad``'s pull-back through the segment products of ``x``, differentiable in ``grad`` and ``x``."""
    counts = ptr.diff()
    longest = int(counts.max()) if counts.numel() else 0
    position = torch.arange(x.shape[0], device=x.device) - ptr.index_select(0, seg_id)
    padded = x.new_ones((counts.numel(), longest) + tuple(x.shape[1:])).index_put((seg_id, position), x)
    (grad_padded,) = torch.autograd.grad(padded.prod(1), padded, grad, create_graph=True)
    return grad_padded[seg_id, position]


def _cpp_problem(x: torch.Tensor) -> str:
    if not native.enabled():
        return "switched off (NEUROVEC_NATIVE=0 or native.set_enabled(False))"
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return f"{x.dtype} on {x.device.type}; they take float32/float64 CPU tensors"
    return f"not built: {native.build_info.get('error', 'unknown error')}"


def _use_ops(x: torch.Tensor, reduce: str, impl: str) -> bool:
    """Whether a reduction runs the C++ operators (:mod:`.ops`, with their own autograd): always
    for ``impl="cpp"``, for ``"auto"`` where they run."""
    if reduce not in ops.REDUCTIONS:
        return False
    if impl == "cpp":
        if not ops.native_ok(x):
            raise RuntimeError(f"impl='cpp' but neurovec's C++ kernels do not run here ({_cpp_problem(x)})")
        return True
    return impl == "auto" and ops.native_ok(x)


def segment_reduce(x: torch.Tensor, ptr: torch.Tensor, seg_id: torch.Tensor, counts: torch.Tensor | None,
                   reduce: str, *, impl: str = "auto") -> torch.Tensor:
    """Reduce the rows of each CSR segment: ``y[j] = reduce(x[ptr[j]:ptr[j+1]], 0)``.

    Args:
        x: ``(E, *shape)`` float values, rows sorted by segment.
        ptr: ``(S + 1,)`` int64 segment bounds (``ptr[0] = 0``, ``ptr[S] = E``, all
            segments non-empty).
        seg_id: ``(E,)`` int64, the segment of each row (``repeat_interleave`` of
            ``arange(S)`` by the counts) -- the backward's gather index.
        counts: ``(S,)`` float segment sizes; only ``"mean"`` reads it (may be None
            otherwise). Cast to ``x.dtype`` if needed.
        reduce: one of :data:`REDUCTIONS`.
        impl: forward kernel (:data:`IMPLS`); the backward is the same for all.
    Returns:
        ``(S, *shape)``.
    """
    if _use_ops(x, reduce, impl):
        return ops.segment_reduce(x, ptr, reduce, counts)
    if reduce == "sum":
        return SegmentSum.apply(x, ptr, seg_id, impl)
    if reduce == "mean":
        if counts is None:
            raise ValueError("reduce='mean' needs counts")
        return SegmentMean.apply(x, ptr, seg_id, counts, impl)
    if reduce == "max":
        return SegmentMax.apply(x, ptr, seg_id, impl)
    if reduce == "min":
        return SegmentMin.apply(x, ptr, seg_id, impl)
    if reduce == "prod":
        return SegmentProd.apply(x, ptr, seg_id, impl)
    raise ValueError(f"unknown reduction {reduce!r}; expected one of {REDUCTIONS}")


# --------------------------------------------------------------------------- indices

def shared_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor on the memory of ``array`` (a program's constant: read-only, ``ir.stored``), through
    a writable view of it: torch has no read-only tensors, and the module never writes its buffers.
    Copied only where the owner itself is read-only (no writable view of it can be made)."""
    view = array.view()
    try:
        view.flags.writeable = True
    except ValueError:
        view = array.copy()
    return torch.from_numpy(view)


def _as_numpy_int(a, what: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{what} must be a 1-D integer array, got shape {a.shape} dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


class Segments:
    """The precomputed indices of one segment reduction (built once, at compile time).

    Attributes (tensors; the compiled module registers them as buffers):
        ptr: ``(S + 1,)`` int64 CSR bounds.
        seg_id: ``(E,)`` int64 segment of each row, the backward's gather index.
        counts: ``(S,)`` float segment sizes (for ``mean``); being floating point it
            follows ``module.to(dtype)`` along with the weights.
    """

    __slots__ = ("ptr", "seg_id", "counts")

    def __init__(self, ptr: torch.Tensor, seg_id: torch.Tensor, counts: torch.Tensor):
        self.ptr, self.seg_id, self.counts = ptr, seg_id, counts

    @classmethod
    def from_counts(cls, counts: np.ndarray | torch.Tensor | Sequence[int], *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> "Segments":
        """Segments of the given sizes, in order: segment ``j`` owns the next ``counts[j]`` rows.

        Raises ``ValueError`` for an empty segment (no reduction has a value there).
        """
        c = _as_numpy_int(counts, "counts")
        if c.size and c.min() < 1:
            raise ValueError(f"every segment must be non-empty; segment {int(np.argmin(c))} has {int(c.min())} rows")
        ptr = np.zeros(c.size + 1, dtype=np.int64)
        np.cumsum(c, out=ptr[1:])
        seg_id = np.repeat(np.arange(c.size, dtype=np.int64), c)
        dtype = dtype or torch.get_default_dtype()
        return cls(torch.from_numpy(ptr).to(device), torch.from_numpy(seg_id).to(device),
                   shared_tensor(c).to(device=device, dtype=dtype))

    @property
    def n_segments(self) -> int:
        return self.ptr.numel() - 1

    @property
    def n_edges(self) -> int:
        return self.seg_id.numel()

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "Segments":
        """A copy on ``device``; ``dtype`` (floating) applies to ``counts`` only."""
        return Segments(self.ptr.to(device), self.seg_id.to(device), self.counts.to(device=device, dtype=dtype))

    def buffers(self) -> dict[str, torch.Tensor]:
        """``{"ptr": ..., "seg_id": ..., "counts": ...}``, e.g. to register as module buffers."""
        return {"ptr": self.ptr, "seg_id": self.seg_id, "counts": self.counts}

    def reduce(self, x: torch.Tensor, reduce: str, *, impl: str = "auto") -> torch.Tensor:
        """:func:`segment_reduce` with these indices."""
        return segment_reduce(x, self.ptr, self.seg_id, self.counts, reduce, impl=impl)

    def __repr__(self) -> str:
        return f"Segments(n_segments={self.n_segments}, n_edges={self.n_edges}, device={self.ptr.device})"


# --------------------------------------------------------------------------- gather + sum

class _GatherSumCSR(torch.autograd.Function):
    """``y = A @ x`` with ``A[j, index[e]] += c[e]`` for the edges ``e`` of segment ``j``; ``c`` is
    ``values`` (constant per-edge coefficients, e.g. GCN's normalisation), else 1. Backward:
    ``grad_x = A^T @ grad_y`` with ``A^T``'s structure and values (``t_values``) prebuilt."""

    @staticmethod
    def forward(ctx, x, ptr, index, t_ptr, t_col, values, t_values):
        e, n_src = index.numel(), x.shape[0]
        c = _ones(e, x.dtype, x.device) if values is None else values.to(x.dtype)
        ctx.save_for_backward(t_ptr, t_col, t_values)
        ctx.n_src = n_src
        return _spmm(_csr(ptr, index, c, (ptr.numel() - 1, n_src)), x)

    @staticmethod
    def backward(ctx, grad):
        t_ptr, t_col, t_values = ctx.saved_tensors
        t_c = _ones(t_col.numel(), grad.dtype, grad.device) if t_values is None else t_values.to(grad.dtype)
        return _spmm(_csr(t_ptr, t_col, t_c, (ctx.n_src, grad.shape[0])), grad), None, None, None, None, None, None


def gather_segment_sum(x: torch.Tensor, ptr: torch.Tensor, index: torch.Tensor, seg_id: torch.Tensor,
                       t_ptr: torch.Tensor, t_col: torch.Tensor,
                       *, values: torch.Tensor | None = None,
                       t_values: torch.Tensor | None = None) -> torch.Tensor:
    """``y[j] = sum_{e in ptr[j]:ptr[j+1]} c[e] * x[index[e]]`` as one sparse CSR matmul.

    Same value as ``segment_reduce(c * x.index_select(0, index), ptr, ...,
    "sum")`` without materializing the ``(E, *shape)`` gathered rows.

    Args:
        x: ``(N, *shape)`` source rows.
        ptr, index, seg_id: ``(S + 1,)``, ``(E,)``, ``(E,)`` -- the CSR of ``A`` (columns
            ``index``; int32 or int64, same dtype) and the segment of each edge.
        t_ptr, t_col: ``(N + 1,)``, ``(E,)`` -- the CSR of ``A^T`` (same dtype as ``ptr``;
            see :meth:`GatherSum.from_index`).
        values: optional ``(E,)`` constant per-edge scalars (no gradient), the CSR values
            of ``A``; ``t_values`` are those of ``A^T`` (:func:`transposed_values`,
            computed here if not given). Without them every coefficient is 1.
    Returns:
        ``(S, *shape)``.
    """
    if values is not None and values.requires_grad:
        raise ValueError("values are constant per-edge coefficients (no gradient)")
    if values is not None and t_values is None:
        t_values = transposed_values(ptr, index, t_ptr.numel() - 1, values)
    if ops.native_ok(x):  # the C++ operator
        return ops.gather_sum(x, ptr, index, values, t_ptr, t_col, t_values)
    if (torch.compiler.is_compiling() or (x.device.type == "cpu" and x.dtype not in _MKL_DTYPES)
            or (x.device.type == "cuda" and index.numel() > (ptr.numel() - 1) * x.shape[0])):
        # Same function without sparse tensors, which dynamo cannot trace, CPU sparse
        # matmul cannot compute in half precision, and cuSPARSE refuses where a CSR
        # holds more entries than its matrix has cells (repeated columns in a row).
        rows = x.index_select(0, index.long())
        if values is not None:
            rows = rows * values.to(x.dtype).view((-1,) + (1,) * (x.dim() - 1))
        return segment_reduce(rows, ptr.long(), seg_id, None, "sum")
    return _GatherSumCSR.apply(x, ptr, index, t_ptr, t_col, values, t_values)


def transposed_values(ptr: torch.Tensor, index: torch.Tensor, n_sources: int, values: torch.Tensor) -> torch.Tensor:
    """The per-edge ``values`` of the CSR ``(ptr, index)`` of ``A`` in the order of ``A^T``'s CSR: grouped by
    source, each source's in their CSR order (a stable sort by ``index``), copied bit for bit."""
    t_values = _csr_transposed(index.cpu(), ptr.cpu().long(), n_sources, values.cpu())[2]
    return t_values.to(values.device)


def _csr_transposed(index: torch.Tensor, ptr: torch.Tensor, n_sources: int, values: torch.Tensor | None):
    """``(t_ptr, t_col, t_values)``: the CSR of ``A^T`` for the CSR ``(ptr, index)`` of ``A`` (int64 ``ptr``; the
    result in ``index``'s dtype; ``t_values`` None without ``values``). Entries grouped by source, each source's
    in their CSR order (segments ascending): the permutation of a stable sort by source places ``t_col`` and
    ``t_values``. The C++ kernels' counting sort (native.csr_transpose) places them without making that
    permutation (products-like x 1/8: 0.2 s where the sort and the gathers after it took 1.7 s); without them,
    torch's stable sort of integers, a radix sort (4.5x numpy's stable argsort)."""
    from . import native  # noqa: PLC0415 - the engine's C++ kernels, built on first use
    transposed = native.csr_transpose(index, ptr, n_sources, values, index.dtype, perm=False)
    if transposed is not None:
        t_ptr, t_col, _, t_values = transposed
        return t_ptr, t_col, t_values
    perm = torch.sort(index, stable=True).indices
    t_ptr = torch.zeros(n_sources + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(index.long(), minlength=n_sources), 0, out=t_ptr[1:])
    segment = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr.diff())  # of each entry
    return t_ptr.to(index.dtype), segment[perm].to(index.dtype), None if values is None else values[perm]


class GatherSum:
    """Precomputed CSR indices of a fused gather + segment sum (and of its transpose).

    Attributes (tensors): ``ptr`` ``(S+1,)``, ``index`` ``(E,)`` (the source row of
    each edge), ``t_ptr`` ``(N+1,)``, ``t_col`` ``(E,)`` -- int32 when they fit, for
    the sparse matmuls -- and int64 ``seg_id`` ``(E,)``; ``values`` / ``t_values``
    ``(E,)`` the constant per-edge coefficients of ``A`` and ``A^T`` (floating point,
    or None for all ones); ``n_sources`` is ``N``.
    """

    __slots__ = ("ptr", "index", "seg_id", "t_ptr", "t_col", "values", "t_values", "exact_values")

    def __init__(self, ptr, index, seg_id, t_ptr, t_col, values=None, t_values=None, exact_values=None):
        self.ptr, self.index, self.seg_id = ptr, index, seg_id
        self.t_ptr, self.t_col = t_ptr, t_col
        self.values, self.t_values = values, t_values
        #: float64 numpy copy of ``values`` (None without), to re-create them exactly in another dtype.
        self.exact_values = exact_values

    @classmethod
    def from_index(cls, index: np.ndarray | torch.Tensor | Sequence[int],
                   counts: np.ndarray | torch.Tensor | Sequence[int], n_sources: int,
                   values: np.ndarray | torch.Tensor | Sequence[float] | None = None, *, mean: bool = False,
                   dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "GatherSum":
        """Edge ``e`` reads source row ``index[e]`` (times ``values[e]`` if given);
        segment ``j`` owns the next ``counts[j]`` edges (non-empty). Sources may be
        read any number of times.

        ``mean=True`` makes it a *mean* over each segment (of ``values[e] *
        x[index[e]]``): ``1 / counts[j]`` is folded into the per-edge values, so the
        kernel is the same sparse product (equal to sum-then-divide up to rounding).
        ``values`` are kept in ``dtype`` (default: torch's default dtype).
        """
        idx = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if idx.dtype not in (np.int32, np.int64):  # int32 (the IR's where it fits) and int64 are taken as they are
            idx = _as_numpy_int(idx, "index")
        elif idx.ndim != 1:
            raise ValueError(f"index must be a 1-D integer array, got shape {idx.shape} dtype {idx.dtype}")
        seg = Segments.from_counts(counts)
        if idx.size != seg.n_edges:
            raise ValueError(f"index has {idx.size} edges but counts sum to {seg.n_edges}")
        if idx.size and (idx.min() < 0 or idx.max() >= n_sources):
            raise ValueError(f"index out of range for {n_sources} sources")
        seg_id = seg.seg_id.numpy()
        coefficients = None
        if values is not None:
            v = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
            if v.shape != idx.shape or not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
                raise ValueError(f"values must be a 1-D real array of {idx.size} per-edge coefficients, "
                                 f"got shape {v.shape} dtype {v.dtype}")
            coefficients = np.asarray(v, dtype=np.float64)  # float64 ones (the IR's) are not copied
        if mean:
            per_edge = 1.0 / seg.counts.numpy().astype(np.float64)[seg_id]
            coefficients = per_edge if coefficients is None else coefficients * per_edge
        # ptr / index / t_ptr / t_col only feed the sparse matmuls: int32 where it fits
        # (see _csr_index_dtype); seg_id stays int64 for index_select.
        csr = np.int32 if _csr_index_dtype(max(idx.size, n_sources, 1)) == torch.int32 else np.int64
        vals = None
        if coefficients is not None:
            dtype = dtype or torch.get_default_dtype()
            vals = torch.tensor(coefficients, dtype=dtype)  # a copy: they may be read-only
        ptr = seg.ptr
        # The index in the CSR's dtype, on the memory of a read-only one (a program's constant, as
        # Segments' counts), else a copy: an array of the caller's may change after.
        index_t = (shared_tensor(idx) if idx.dtype == csr and not idx.flags.writeable and idx.flags.c_contiguous
                   else torch.from_numpy(np.array(idx, dtype=csr)))
        t_ptr, t_col, t_vals = _csr_transposed(index_t, ptr, n_sources, vals)
        move = lambda a: None if a is None else a.to(device)  # noqa: E731
        return cls(move(shared_tensor(np.ascontiguousarray(ptr.numpy(), dtype=csr))), index_t.to(device),
                   seg.seg_id.to(device), move(t_ptr), move(t_col), move(vals), move(t_vals), coefficients)

    @property
    def n_sources(self) -> int:
        return self.t_ptr.numel() - 1

    @property
    def n_segments(self) -> int:
        return self.ptr.numel() - 1

    def to(self, device: torch.device | str | None = None) -> "GatherSum":
        moved = (None if getattr(self, k) is None else getattr(self, k).to(device) for k in self._TENSORS)
        return GatherSum(*moved, exact_values=self.exact_values)

    _TENSORS = ("ptr", "index", "seg_id", "t_ptr", "t_col", "values", "t_values")

    def buffers(self) -> dict[str, torch.Tensor | None]:
        """Every tensor by name; ``values`` / ``t_values`` are None without coefficients."""
        return {k: getattr(self, k) for k in self._TENSORS}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`gather_segment_sum` with these indices (and constant values, if any)."""
        return gather_segment_sum(x, self.ptr, self.index, self.seg_id, self.t_ptr, self.t_col,
                                  values=self.values, t_values=self.t_values)

    def __repr__(self) -> str:
        return (f"GatherSum(n_segments={self.n_segments}, n_edges={self.index.numel()}, "
                f"n_sources={self.n_sources}, values={self.values is not None})")


# --------------------------------------------------------------------------- alternatives

def scatter_reduce_native(x: torch.Tensor, seg_id: torch.Tensor, n_segments: int, reduce: str,
                          counts: torch.Tensor | None = None) -> torch.Tensor:
    """The ``"scatter"`` kernel: PyTorch ``scatter_reduce`` with PyTorch's own backward.

    ``x`` ``(E, *shape)`` -> ``(n_segments, *shape)``; rows need not be sorted.
    ``mean`` divides the sum by ``counts`` (``(S,)`` float) like the segment version.
    """
    flat = x.reshape(x.shape[0], -1)
    index = seg_id.view(-1, 1).expand_as(flat)
    name = "sum" if reduce == "mean" else _SCATTER_NAMES[reduce]
    # The initial values are excluded from the result (include_self=False) but NOT
    # from PyTorch's amax/amin backward, which counts an initial value equal to the
    # extremum as one more tie (torch 2.13: a max of 0 over a zero-initialized output
    # gets 1/(k+1) of the gradient per tied row instead of 1/k). NaN equals nothing.
    init = float("nan") if name in ("amax", "amin") else 0.0
    out = flat.new_full((n_segments, flat.shape[1]), init).scatter_reduce(0, index, flat, name,
                                                                         include_self=False)
    out = out.reshape((n_segments,) + tuple(x.shape[1:]))
    if reduce == "mean":
        out = out / _per_row(counts.to(out.dtype), out)
    return out


def dense_reduce(x: torch.Tensor, k: int, reduce: str) -> torch.Tensor:
    """The ``"dense"`` kernel, for segments that all have ``k`` rows: reshape ``x``
    ``(S * k, *shape)`` to ``(S, k, *shape)`` and reduce axis 1 (torch's own backward,
    ties split evenly by ``amax``/``amin``)."""
    v = x.reshape((-1, k) + tuple(x.shape[1:]))
    if reduce == "sum":
        return v.sum(1)
    if reduce == "mean":
        return v.mean(1)
    if reduce == "max":
        return v.amax(1)
    if reduce == "min":
        return v.amin(1)
    if reduce == "prod":
        return two_row_product(x, strided=False) if k == 2 else v.prod(1)
    raise ValueError(f"unknown reduction {reduce!r}; expected one of {REDUCTIONS}")


def _row_pair(x: torch.Tensor, strided: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two factors of :func:`two_row_product` as views of ``x``."""
    v = x.reshape(((2, -1) if strided else (-1, 2)) + tuple(x.shape[1:]))
    return v.unbind(0 if strided else 1)


class _TwoRowProduct(torch.autograd.Function):
    """The C++ two-row product (``neurovec_cpu::pair_prod``); backward ``neurovec_cpu::pair_prod_backward``,
    or under ``create_graph`` the same formula in differentiable torch ops."""

    @staticmethod
    def forward(ctx, x, strided):
        ctx.save_for_backward(x)
        ctx.strided = strided
        return torch.ops.neurovec_cpu.pair_prod(x, strided)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiable again, in x and in grad
            a, b = _row_pair(x, ctx.strided)
            return torch.stack((grad * b, grad * a), 0 if ctx.strided else 1).reshape(x.shape), None
        return torch.ops.neurovec_cpu.pair_prod_backward(grad, x, ctx.strided), None


def two_row_product(x: torch.Tensor, strided: bool) -> torch.Tensor:
    """``a * b`` for the rows of ``x`` ``(2n, *shape)`` taken in pairs: ``a = x[:n]``, ``b = x[n:]``
    (``strided``, as :func:`engines.runtime.strided_reduce` lays them out) or ``a = x[0::2]``,
    ``b = x[1::2]`` (as :func:`dense_reduce`). Returns ``(n, *shape)``.

    One IEEE multiplication per element, and a backward of ``grad * b`` and ``grad * a`` (exact at
    zeros): a fifth of ``torch.prod``'s cost (60k products of 128 floats: 159 against 635 ms forward and
    backward, 1 thread, loaded). Written as ``v[0] * v[1]`` its backward zero-fills a whole ``(2n, F)``
    block for each factor and adds the two; with ``unbind`` torch writes each factor's gradient and
    stacks them (a copy); the C++ kernels write both gradients once into one block (``cnf-44``'s
    ``and11``: 135,956 rows of 128 floats, forward and backward, 1 thread, loaded CPU ms, interleaved:
    145 as ``v[0] * v[1]``, 106 with ``unbind``, 66 with the C++ kernels; the same floats).
    """
    if x.shape[0] % 2:
        raise ValueError(f"two_row_product needs an even number of rows, got {x.shape[0]}")
    if ops.native_ok(x):
        if x.requires_grad and torch.is_grad_enabled():
            return _TwoRowProduct.apply(x, strided)
        return torch.ops.neurovec_cpu.pair_prod(x, strided)
    a, b = _row_pair(x, strided)
    return torch.mul(a, b)


# --------------------------------------------------------------------------- cost model

#: With the C++ kernels, equal-count layers below this many values (E * F) stay
#: ``"dense"`` (a view and one torch reduction: less per-call overhead); above, the C++
#: segment kernel is faster (1 thread, fwd + bwd: S=200, k=3, F=4 sum 60 vs 69 µs dense
#: faster; S=2000, k=3, F=16 146 vs 96 µs; S=43471, k=2, F=16 2.2 vs 1.0 ms). For max /
#: min the C++ kernel wins from ~1k values (S=200, k=3, F=4: 93 vs 77 µs; S=2000,
#: F=16: 511 vs 130 µs: torch's amax backward is slow).
_DENSE_MAX_ELEMENTS = {"sum": 8192, "mean": 8192, "max": 1024, "min": 1024}


def choose_kernel(n_edges: int, n_segments: int, counts, feature_size: int, device: torch.device | str,
                  has_torch_scatter: bool = HAS_TORCH_SCATTER, *, reduce: str = "sum",
                  after_gather: bool = False, dtype: torch.dtype | None = None,
                  rows_sorted: bool = True, native_kernels: bool | None = None) -> str:
    """Pick how a layer reduces its edge values into its ``n_segments`` neurons.

    Returns one of ``"dense"`` (:func:`dense_reduce`), ``"sparse_mm"``
    (:class:`GatherSum`, only for a sum right after a gather), ``"segment"``
    (:func:`segment_reduce`, which itself picks a forward kernel per device and
    size) or ``"scatter"`` (:func:`scatter_reduce_native`).

    ``counts`` are the segment sizes (array-like, or None if unknown);
    ``feature_size`` is the number of values per row (``prod(shape)``);
    ``rows_sorted`` says whether the rows come grouped by segment (CSR); ``dtype``
    is the values' dtype if known (CPU sparse matmul has no half precision);
    ``native_kernels`` whether neurovec's C++ kernels will run (default: on the CPU,
    for float32/float64 or unknown dtypes, if they are built and switched on).

    Rules, from ``benchmarks/kernels.py`` and ``benchmarks/kernels.py --sweep``:

    0. rows not grouped by segment -> ``"scatter"``, the only kernel that does not
       need CSR order (compiled layers are always sorted).
    1. equal counts -> ``"dense"``: a view + one dense reduction over axis 1 needs no
       index at all and its backward is an ``expand`` (k = 3, F = 16, S = 2000, fwd +
       bwd: sum 144 vs 234 µs torch segment, 434 scatter). With the C++ kernels only
       below :data:`_DENSE_MAX_ELEMENTS` values (``prod``: always), else ``"segment"``.
    2. sum right after a gather -> ``"sparse_mm"``: one fused kernel (C++, else MKL's
       spmm) reads each source row instead of writing and re-reading ``E`` gathered
       rows, and its backward is the same kernel on the prebuilt transpose instead
       of an ``index_add`` into the sources. PROTEINS (E = 205k, F = 16, 1 thread,
       per-edge coefficients): C++ forward 0.8 ms, backward 0.7 ms; MKL 1.2 / 1.2 ms;
       inductor's fused loops 1.3 / 0.8 ms; ``index_select`` + segment sum 4 / 23 ms.
    3. otherwise ``"segment"``: the C++ kernels (sum, mean, max, min) or torch's best
       forward per size with a gather backward; its backward beats scatter_reduce's at
       every measured size (PROTEINS F=32/64: 2.6-5x for sum/mean, 3.2x for max, 11x
       for prod; small layers 1.2-3x).
    Measured on CPU only; on CUDA the same rules are assumed (unmeasured) with
    torch-scatter's forward inside ``"segment"`` when installed.
    """
    del n_segments, has_torch_scatter  # the per-device forward choice is made inside "segment"
    if not rows_sorted:
        return "scatter"
    cpu = torch.device(device).type == "cpu"
    if native_kernels is None:
        native_kernels = cpu and (dtype is None or dtype in ops._NATIVE_DTYPES) and native.available()
    if counts is not None:
        c = _as_numpy_int(counts, "counts")
        if c.size and (c == c[0]).all() and c[0] * c.size == n_edges:
            small = n_edges * max(feature_size, 1) < _DENSE_MAX_ELEMENTS.get(reduce, math.inf)
            if not native_kernels or small:
                return "dense"
    cpu_half = cpu and dtype is not None and dtype not in _MKL_DTYPES
    if after_gather and reduce == "sum" and feature_size > 0 and not cpu_half:
        return "sparse_mm"
    return "segment"


#: A gather whose source needs a gradient is worth the fused kernel from this many values
#: (rows * F) and this width: its backward is then a sorted sum over the prebuilt transpose
#: instead of index_select's backward, an ``index_add`` with the gather's int64 index
#: (``CompiledModule`` keeps those indices int64). Forward + backward, 1 thread, µs,
#: index_select vs fused: 43k rows from 43k sources F=16 3300 vs 1530, F=8 1950 vs 1060,
#: F=4 920 vs 670, F=2 417 vs 468; 43k from 7k F=4 670 vs 270; 10k from 10k F=4 154 vs
#: 113, F=2 109 vs 98; 3371 from 3371 F=8 104 vs 92, F=4 73 vs 73; 400 rows: index_select
#: by 13-28 µs at every width (the fused call's fixed cost).
_GATHER_MIN_ELEMENTS = 16384
_GATHER_MIN_FEATURES = 4


def choose_gather_kernel(count: int, feature_size: int, needs_grad: bool, device: torch.device | str = "cpu", *,
                         dtype: torch.dtype | None = None, native_kernels: bool | None = None) -> str:
    """How a plain gather ``x[index]`` of ``count`` rows runs: ``"index_select"`` or, where
    its backward is expensive, ``"sparse_mm"`` (a :class:`GatherSum` with one entry per
    segment, whose backward is the C++ sum over the transposed index). See
    :data:`_GATHER_MIN_ELEMENTS` for the measurements."""
    cpu = torch.device(device).type == "cpu"
    if native_kernels is None:
        native_kernels = cpu and (dtype is None or dtype in ops._NATIVE_DTYPES) and native.available()
    big = count * feature_size >= _GATHER_MIN_ELEMENTS and feature_size >= _GATHER_MIN_FEATURES
    return "sparse_mm" if native_kernels and needs_grad and big else "index_select"
