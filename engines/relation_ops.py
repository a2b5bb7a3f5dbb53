"""The segmented product of many relation types, fused with its gather and its sum (``relation_ops.cpp``).

``compiler/passes/relation_products.py`` lowers the per-relation products of a layer (RGCN: a weight per
relation type) to rows chunked by weight and one batched GEMM; the generated forward then reads, per layer::

    xg  = x.index_select(0, idx)                                  # (k C, i): every product row's input
    lin = torch.bmm(xg.view(k, C, i), w.transpose(1, 2))          # (k C, o): one weight per chunk of C rows
    out = gather_sum(lin.view(k C, o), csr)                       # (n_out, o): the sum over each output's rows

With a million product rows the two (k C, 16) intermediates are 66 MB each (float32), written and read again
forward and backward: at 100 relation types and one thread, most of a training step moves them.
:func:`segment_product_sum` computes ``out`` without them: one chunk at a time, its rows of ``x`` gathered
into a small buffer, one GEMM with the chunk's weight, the products added into the outputs (the transposed CSR
of the sum says which, with its optional per-edge values). Backward likewise: per chunk, the rows' gradient
gathered from the outputs', one GEMM for the chunk's weight gradient, one for the input rows' (scattered back).
Threads take whole chunks, each adding into an output of its own.

It is exact: the same products and sums, in another order (float64 agrees to rounding). The C++ kernel builds
on first use (``torch.utils.cpp_extension``, cached next to ``engines/native.py``'s); where it cannot (no
compiler, ``NEUROVEC_NATIVE=0``, not CPU, under ``torch.compile``) :func:`segment_product_sum` runs the same
computation as torch ops, materialising the intermediates, differentiable any number of times. The kernel's
backward is not differentiable again: ``create_graph=True`` through it raises (torch's ``once_differentiable``
error), use the torch path (:func:`segment_product_sum_torch`) for higher derivatives.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import sys
import threading
from pathlib import Path

import torch

from . import native, runtime

__all__ = ["chunked_product_sum", "segment_product_sum", "segment_product_sum_torch", "kernel", "SOURCE",
           "MAX_THREADS"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("relation_ops.cpp")
NAME = "neurovec_relation_ops"
FLAGS = ("-O3", "-march=native", "-fopenmp")
_lock = threading.Lock()
_loaded: dict = {}
#: :func:`chunked_product_sum` calls the kernel at up to this many threads (``torch.get_num_threads()``), else the
#: three torch statements: at 2 threads it was measured slower (loaded machine), to be measured again quietly.
MAX_THREADS = 1


def kernel():
    """The built extension module, or None where it cannot be built (tried once per process)."""
    if not native.enabled():
        return None
    with _lock:
        if "module" not in _loaded:
            try:
                _loaded["module"] = _load()
            except Exception as error:  # noqa: BLE001 - any build failure means: use the torch path
                log.warning("neurovec: the relation_ops kernel could not be built (%s); using torch ops", error)
                _loaded["module"] = None
        return _loaded["module"]


def _load():
    from torch.utils import cpp_extension  # noqa: PLC0415 - only for a build

    digest = hashlib.sha256()
    for part in (SOURCE.read_text(), " ".join(FLAGS), native._cpu_signature(), torch.__version__, sys.version):
        digest.update(part.encode() + b"\0")
    folder = native.cache_dir().parent / "relation_ops" / digest.hexdigest()[:20]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # another process may be building it: wait for it
        try:
            return cpp_extension.load(NAME, [str(SOURCE)], extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"],
                                      build_directory=str(folder), verbose=False)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class _SegmentProductSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, idx, t_ptr, t_col, t_values, n_out):
        ctx.save_for_backward(x, w, idx, t_ptr, t_col, t_values)
        return kernel().segment_product_sum(x, w, idx, t_ptr, t_col, t_values, n_out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, w, idx, t_ptr, t_col, t_values = ctx.saved_tensors
        grad_w, grad_x = kernel().segment_product_sum_backward(grad.contiguous(), x, w, idx, t_ptr, t_col, t_values,
                                                               ctx.needs_input_grad[0])
        return (grad_x if ctx.needs_input_grad[0] else None), grad_w, None, None, None, None, None


def segment_product_sum(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, t_ptr: torch.Tensor,
                        t_col: torch.Tensor, t_values: torch.Tensor | None, n_out: int) -> torch.Tensor:
    """``out[t_col[e]] += t_values[e] * (w[p // C] @ x[idx[p]])`` for every product row ``p`` (``C = len(idx) //
    len(w)`` rows per weight) and every edge ``e`` in ``t_ptr[p]:t_ptr[p + 1]`` (values default to 1): an
    ``(n_out, o)`` tensor. ``x`` (n_x, i), ``w`` (k, o, i), all indices int64. Values that need a gradient take
    the torch path (the kernel differentiates ``x`` and ``w`` only)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and w.dtype == x.dtype \
            and (t_values is None or not t_values.requires_grad) and not torch.compiler.is_compiling() \
            and kernel() is not None:
        return _SegmentProductSum.apply(x.contiguous(), w.contiguous(), idx, t_ptr, t_col, t_values, n_out)
    return segment_product_sum_torch(x, w, idx, t_ptr, t_col, t_values, n_out)


def chunked_product_sum(x: torch.Tensor, rows, w: torch.Tensor, csr: runtime.CSRIndices,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the generated forward writes as three statements for a chunked relational layer::

        xg = x.index_select(0, rows)          # or gather_sum(x, rows): a CSRIndices reading one row per row,
                                              # or x itself (rows None)
        lin = torch.bmm(xg.view(k, C, i), w.transpose(1, 2)).view(k C, o)
        out = gather_sum(lin, csr, bias)

    as one call: :func:`segment_product_sum` where the kernel runs (CPU, at most :data:`MAX_THREADS` threads, a sum
    without values, ``rows`` a plain gather), else exactly those three statements."""
    k, o, i = w.shape
    b = csr._buffers
    gather = rows._buffers if isinstance(rows, runtime.CSRIndices) else None
    plain = gather is None or (gather.get("values") is None and gather["ptr"].numel() == gather["index"].numel() + 1)
    if plain and b.get("values") is None and torch.get_num_threads() <= MAX_THREADS and x.device.type == "cpu" \
            and not torch.compiler.is_compiling() and kernel() is not None \
            and (gather is None or _ones(gather["ptr"])):
        if gather is not None:
            index = gather["index"]
        elif rows is not None:
            index = rows
        else:   # x's rows in order
            index = _loaded.get(("arange", x.shape[0]))
            if index is None:
                index = _loaded[("arange", x.shape[0])] = torch.arange(x.shape[0])
        out = segment_product_sum(x, w, _long(index), _long(b["t_ptr"]), _long(b["t_col"]), None,
                                  b["ptr"].numel() - 1)
        return out if bias is None else out + bias
    xg = runtime.gather_sum(x, rows) if gather is not None else x if rows is None else x.index_select(0, rows)
    lin = torch.bmm(xg.view(k, -1, i), w.transpose(1, 2)).reshape(-1, o)
    return runtime.gather_sum(lin, csr, bias)


def _long(index: torch.Tensor) -> torch.Tensor:
    """``index`` as contiguous int64, converted once per tensor (the programs keep int32 indices; the conversion is
    kept on the tensor, which a ``.to()`` replaces)."""
    if index.dtype == torch.int64 and index.is_contiguous():
        return index
    found = getattr(index, "_neurovec_int64", None)
    if found is None:
        found = index._neurovec_int64 = index.long().contiguous()
    return found


def _ones(ptr: torch.Tensor) -> bool:
    """Whether a CSR reads one row per row (checked once per tensor)."""
    found = getattr(ptr, "_neurovec_one_row", None)
    if found is None:
        found = ptr._neurovec_one_row = bool(torch.all(ptr.diff() == 1))
    return found


def segment_product_sum_torch(x, w, idx, t_ptr, t_col, t_values, n_out: int) -> torch.Tensor:
    """:func:`segment_product_sum` as torch ops (the intermediates materialised; differentiable again)."""
    k, o, i = w.shape
    products = torch.bmm(x.index_select(0, idx).view(k, -1, i), w.transpose(1, 2)).reshape(-1, o)
    row_of_edge = torch.repeat_interleave(torch.arange(idx.numel(), device=idx.device), t_ptr.diff())
    contributions = products.index_select(0, row_of_edge)
    if t_values is not None:
        contributions = contributions * t_values.unsqueeze(1)
    return contributions.new_zeros(n_out, o).index_add(0, t_col, contributions)
