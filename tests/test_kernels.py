"""Segment reductions and fused gather + sum (``neurovec.engines.kernels``).

The oracle is what the reference engine does per neuron: stack the neuron's inputs
and reduce with ``sum/mean/amax/amin/prod`` over axis 0 -- so gradients of tied
maxima are split evenly. Every forward kernel is checked against it, in float64
to ~1e-12, including ties, zeros (prod) and trailing feature shapes.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.engines import kernels as K
from neurovec.engines import native, runtime

F64 = torch.float64
_STACK_REDUCE = {
    "sum": lambda t: t.sum(0),
    "mean": lambda t: t.mean(0),
    "max": lambda t: t.amax(0),
    "min": lambda t: t.amin(0),
    "prod": lambda t: t.prod(0),
}


def reference(x: torch.Tensor, counts, reduce: str) -> torch.Tensor:
    """Per-segment stack + dense reduce, as the reference engine does it."""
    return torch.stack([_STACK_REDUCE[reduce](part) for part in torch.split(x, list(counts))])


def impls_for(reduce: str) -> list[str]:
    base = "sum" if reduce == "mean" else reduce
    out = ["auto", "native"]
    for impl, reductions in K._IMPL_REDUCTIONS.items():
        if impl == "cpp" and not native.available():
            continue
        if base in reductions and (impl != "torch_scatter" or K.HAS_TORCH_SCATTER):
            out.append(impl)
    return out


CASES = [(r, impl) for r in K.REDUCTIONS for impl in impls_for(r)]


def forward_backward(fn, x: torch.Tensor, grad: torch.Tensor | None = None, seed: int = 0):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    if grad is None:
        grad = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(seed))
    (gx,) = torch.autograd.grad(y, x, grad)
    return y.detach(), gx, grad


def check_against_reference(x, counts, reduce, impl, atol=1e-12, rtol=1e-12):
    seg = K.Segments.from_counts(counts, dtype=x.dtype)
    y, gx, g = forward_backward(lambda t: seg.reduce(t, reduce, impl=impl), x)
    y_ref, gx_ref, _ = forward_backward(lambda t: reference(t, counts, reduce), x, g)
    torch.testing.assert_close(y, y_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(gx, gx_ref, atol=atol, rtol=rtol)


# --------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("reduce,impl", CASES)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_matches_reference(reduce, impl, shape):
    gen = torch.Generator().manual_seed(1)
    counts = [3, 1, 2, 5, 1, 4]
    x = torch.randn((sum(counts),) + shape, dtype=F64, generator=gen)
    check_against_reference(x, counts, reduce, impl)


@pytest.mark.parametrize("reduce,impl", CASES)
def test_ties_split_evenly(reduce, impl):
    """Repeated inputs (x, x), whole segments of equal values, and per-feature ties."""
    counts = [2, 3, 1, 4]
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0],                 # x, x
                      [5.0, -1.0], [5.0, 3.0], [5.0, 3.0],    # three-way tie / two-way min tie
                      [7.0, 7.0],
                      [0.5, 2.0], [0.5, 2.0], [-3.0, 2.0], [0.5, 2.0]], dtype=F64)
    # Dyadic values: sums and extrema (and their gradients) are exact, bit for bit.
    exact = reduce in ("max", "min", "sum")
    check_against_reference(x, counts, reduce, impl, atol=0 if exact else 1e-12, rtol=0 if exact else 1e-12)


@pytest.mark.parametrize("impl", impls_for("max"))
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_extremum_backward_equals_scatter_reduce(reduce, impl):
    """Same tie rule as PyTorch's scatter_reduce(amax/amin, include_self=False) backward."""
    gen = torch.Generator().manual_seed(2)
    counts = np.array([4, 2, 6, 1, 3])
    x = torch.randint(0, 3, (int(counts.sum()), 5), generator=gen).to(F64)  # many ties
    seg = K.Segments.from_counts(counts, dtype=F64)
    y, gx, g = forward_backward(lambda t: seg.reduce(t, reduce, impl=impl), x)
    y2, gx2, _ = forward_backward(lambda t: K.scatter_reduce_native(t, seg.seg_id, seg.n_segments, reduce), x, g)
    assert torch.equal(y, y2)
    torch.testing.assert_close(gx, gx2, atol=0, rtol=0)


@pytest.fixture(params=["fused", "formula"])
def prod_backward(request, monkeypatch):
    """Run a test with torch's fused prod backward and with the fallback (torch.prod over padded segments)."""
    if request.param == "formula":
        monkeypatch.setattr(K, "_fused_prod_backward", None)
    elif K._fused_prod_backward is None:
        pytest.skip("torch lacks aten::_segment_reduce_backward")
    return request.param


@pytest.mark.parametrize("impl", impls_for("prod"))
def test_prod_with_zeros(impl, prod_backward):
    """Segments with no, one and several zeros (per feature): torch.prod's gradient."""
    counts = [3, 3, 3, 1, 2]
    x = torch.tensor([[2.0, 0.0], [3.0, 4.0], [0.5, 0.0],    # feature 1: two zeros
                      [0.0, 1.5], [2.0, -2.0], [3.0, 0.5],   # feature 0: one zero
                      [1.5, 2.0], [-1.0, 3.0], [2.0, 0.25],  # no zeros
                      [0.0, 0.0],
                      [0.0, 2.0], [4.0, 0.0]], dtype=F64)
    check_against_reference(x, counts, "prod", impl)


@settings(max_examples=30)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=12), width=st.sampled_from([(), (2,), (2, 2)]),
       seed=st.integers(0, 2**16), formula=st.booleans())
def test_prod_random_zeros(counts, width, seed, formula):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (sum(counts),) + width, generator=gen).to(F64)  # ~1 in 5 is zero
    saved = K._fused_prod_backward
    try:
        if formula:
            K._fused_prod_backward = None
        check_against_reference(x, counts, "prod", "auto")  # the C++ kernels where built
        check_against_reference(x, counts, "prod", "native")  # torch's fused backward, or the formula
    finally:
        K._fused_prod_backward = saved


@settings(max_examples=40)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=12),
       width=st.sampled_from([(), (1,), (3,), (2, 2)]),
       reduce=st.sampled_from(K.REDUCTIONS),
       native=st.booleans(),
       seed=st.integers(0, 2**16),
       small_ints=st.booleans())
def test_random_counts_and_values(counts, width, reduce, native, seed, small_ints):
    gen = torch.Generator().manual_seed(seed)
    shape = (sum(counts),) + width
    # Small integers give ties (and zeros for prod); gaussians give the generic case.
    x = (torch.randint(-2, 3, shape, generator=gen).to(F64) if small_ints
         else torch.randn(shape, dtype=F64, generator=gen))
    check_against_reference(x, counts, reduce, "native" if native else "auto")


@pytest.mark.parametrize("reduce,impl", CASES)
def test_float32(reduce, impl):
    gen = torch.Generator().manual_seed(3)
    counts = [2, 7, 1, 3]
    x = (torch.rand((sum(counts), 4), generator=gen) + 0.5).float()
    check_against_reference(x, counts, reduce, impl, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- gradcheck

def test_prod_gradcheck_formula(monkeypatch):
    monkeypatch.setattr(K, "_fused_prod_backward", None)
    seg = K.Segments.from_counts([2, 1, 3], dtype=F64)
    x = ((torch.arange(12, dtype=F64).view(6, 2) + 1) / 7).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: seg.reduce(t, "prod"), (x,))


@pytest.mark.parametrize("reduce,impl", CASES)
def test_gradcheck(reduce, impl):
    gen = torch.Generator().manual_seed(4)
    counts = [2, 1, 3]
    seg = K.Segments.from_counts(counts, dtype=F64)
    # Distinct, non-zero values: max/min and prod are differentiable there.
    x = (torch.randperm(12, generator=gen).to(F64).view(6, 2) + 1) / 7
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: seg.reduce(t, reduce, impl=impl), (x,))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_gradgradcheck(reduce):
    """sum/mean/max/min backwards are built from differentiable ops (double backward)."""
    seg = K.Segments.from_counts([2, 1, 3], dtype=F64)
    x = (torch.arange(12, dtype=F64).view(6, 2) * 0.37 % 1.3).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: seg.reduce(t, reduce), (x,))


# --------------------------------------------------------------------------- Segments

def test_segments_from_counts():
    seg = K.Segments.from_counts(np.array([2, 1, 3]))
    assert seg.ptr.tolist() == [0, 2, 3, 6]
    assert seg.seg_id.tolist() == [0, 0, 1, 2, 2, 2]
    assert seg.counts.dtype == torch.get_default_dtype() and seg.counts.tolist() == [2, 1, 3]
    assert (seg.n_segments, seg.n_edges) == (3, 6)
    assert set(seg.buffers()) == {"ptr", "seg_id", "counts"}


def test_segments_rejects_empty_segment():
    with pytest.raises(ValueError, match="non-empty"):
        K.Segments.from_counts([2, 0, 1])
    with pytest.raises(ValueError):
        K.Segments.from_counts([[1, 2]])


def test_segments_to():
    seg = K.Segments.from_counts(torch.tensor([3, 3, 3]))
    moved = seg.to(dtype=F64)
    assert moved.counts.dtype == F64 and moved.ptr.dtype == torch.long


def test_mean_casts_counts_to_values_dtype():
    seg = K.Segments.from_counts([2, 2], dtype=F64)
    y = seg.reduce(torch.ones(4, 2), "mean")
    assert y.dtype == torch.float32 and torch.equal(y, torch.ones(2, 2))


def test_noncontiguous_input():
    counts = [2, 3]
    base = torch.randn(3, 5, dtype=F64)
    for reduce in K.REDUCTIONS:
        for impl in impls_for(reduce):
            check_against_reference(base.t(), counts, reduce, impl)


def test_unsupported_and_missing_kernels(monkeypatch):
    seg = K.Segments.from_counts([1, 2])
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="does not compute"):
        seg.reduce(x, "max", impl="spmm")
    with pytest.raises(ValueError, match="unknown reduction"):
        seg.reduce(x, "median")
    monkeypatch.setattr(K, "_torch_scatter", None)
    with pytest.raises(RuntimeError, match="not installed"):
        seg.reduce(x, "sum", impl="torch_scatter")


def test_auto_choice(monkeypatch):
    """CPU never picks torch-scatter; other devices use it if (and only if) installed.
    With the C++ kernels built, the CPU picks them for sum / max / min / prod (float32/64 only)."""
    if native.available():
        assert K._auto_impl(torch.empty(10, 1), "sum", True) == "cpp"
        assert K._auto_impl(torch.empty(10, 1, dtype=torch.float64), "max", True) == "cpp"
        assert K._auto_impl(torch.empty(10, 1), "prod", True) == "cpp"
        assert K._auto_impl(torch.empty(10, 1, dtype=torch.bfloat16), "sum", True) == "segment_reduce"
        assert K._auto_impl(torch.empty(10, 1), "sum", False) == "segment_reduce"  # "native": plain torch
    monkeypatch.setattr(native, "_enabled", False)
    cpu_wide, cpu_narrow = torch.empty(100_000, 32), torch.empty(10, 1)
    assert K._auto_impl(torch.empty(10_000, 16), "max", True) == "scatter_reduce"
    assert K._auto_impl(torch.empty(1_000, 16), "max", True) == "segment_reduce"
    assert K._auto_impl(cpu_wide, "sum", True) == "spmm"
    assert K._auto_impl(cpu_narrow, "sum", True) == "segment_reduce"
    assert K._auto_impl(cpu_wide, "max", True) == "scatter_reduce"
    assert K._auto_impl(cpu_narrow, "max", True) == "segment_reduce"
    gpu_like = torch.empty(10, 4, device="meta")
    monkeypatch.setattr(K, "HAS_TORCH_SCATTER", True)
    assert K._auto_impl(gpu_like, "max", True) == "torch_scatter"
    assert K._auto_impl(gpu_like, "max", False) == "segment_reduce"
    assert K._auto_impl(gpu_like, "prod", True) == "segment_reduce"
    monkeypatch.setattr(K, "HAS_TORCH_SCATTER", False)
    assert K._auto_impl(gpu_like, "sum", True) == "segment_reduce"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("reduce", K.REDUCTIONS)
def test_cuda_matches_cpu(reduce):
    counts = [3, 1, 4, 2]
    x = torch.randint(-2, 3, (10, 3)).to(F64)
    seg = K.Segments.from_counts(counts, dtype=F64)
    y, gx, g = forward_backward(lambda t: seg.reduce(t, reduce), x)
    segc = seg.to("cuda")
    yc, gxc, _ = forward_backward(lambda t: segc.reduce(t, reduce), x.cuda(), g.cuda())
    torch.testing.assert_close(yc.cpu(), y, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gxc.cpu(), gx, atol=1e-12, rtol=1e-12)


# --------------------------------------------------------------------------- gather + sum

def _gather_case(seed=5, n_sources=7, counts=(2, 4, 1, 3), shape=(3,), with_values=False):
    gen = torch.Generator().manual_seed(seed)
    e = sum(counts)
    index = torch.randint(0, n_sources - 1, (e,), generator=gen)  # last source never read
    index[1] = index[0]                                              # a source read twice by one segment
    x = torch.randn((n_sources,) + shape, dtype=F64, generator=gen)
    values = torch.rand(e, dtype=F64, generator=gen) + 0.1 if with_values else None
    return K.GatherSum.from_index(index, counts, n_sources, values, dtype=F64), x, values, list(counts)


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)])
@pytest.mark.parametrize("with_values", [False, True])
def test_gather_sum_matches_index_select_segment_sum(shape, with_values):
    gs, x, values, counts = _gather_case(shape=shape, with_values=with_values)
    seg = K.Segments.from_counts(counts, dtype=F64)
    c = values.view((-1,) + (1,) * len(shape)) if with_values else 1

    def unfused(t):
        return reference(t.index_select(0, gs.index) * c, counts, "sum")

    y, gx, g = forward_backward(gs, x)
    y_ref, gx_ref, _ = forward_backward(unfused, x, g)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12)
    assert gx[-1].abs().max() == 0  # the unread source gets no gradient
    y2, _, _ = forward_backward(lambda t: seg.reduce(t.index_select(0, gs.index) * c, "sum"), x, g)
    torch.testing.assert_close(y, y2, atol=1e-12, rtol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("with_values", [False, True])
@pytest.mark.parametrize("index, counts, n_sources", [
    ([0, 0, 1, 0, 0], [3, 2], 2),           # more entries than cells: cuSPARSE refuses this CSR
    ([0, 0, 1, 2, 2, 3, 1], [3, 4], 5),     # repeated columns in a row, fewer entries than cells
])
def test_gather_sum_cuda_matches_cpu_with_repeated_sources(index, counts, n_sources, with_values):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n_sources, 4, dtype=F64, generator=gen)
    values = torch.rand(len(index), dtype=F64, generator=gen) + 0.1 if with_values else None
    gs = K.GatherSum.from_index(index, counts, n_sources, values, dtype=F64)
    y, gx, g = forward_backward(gs, x)
    yc, gxc, _ = forward_backward(gs.to("cuda"), x.cuda(), g.cuda())
    torch.testing.assert_close(yc.cpu(), y, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gxc.cpu(), gx, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("with_values", [False, True])
def test_gather_sum_gradcheck(with_values):
    gs, x, _, _ = _gather_case(shape=(2,), with_values=with_values)
    assert torch.autograd.gradcheck(gs, (x.requires_grad_(),))


def test_gather_sum_float32_values_float64():
    gs, x, values, counts = _gather_case(with_values=True)
    y = K.GatherSum.from_index(gs.index, counts, x.shape[0], values, dtype=torch.float32)(x.float())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), gs(x), atol=1e-5, rtol=1e-5)


def test_gather_sum_validation():
    with pytest.raises(ValueError, match="edges"):
        K.GatherSum.from_index([0, 1], [3], 2)
    with pytest.raises(ValueError, match="out of range"):
        K.GatherSum.from_index([0, 5], [2], 2)
    gs = K.GatherSum.from_index([1, 0, 1], [2, 1], 3).to("cpu")
    assert (gs.n_segments, gs.n_sources) == (2, 3)
    assert gs.t_ptr.tolist() == [0, 1, 3, 3] and gs.t_col.tolist() == [0, 0, 1]
    assert not hasattr(gs, "t_perm")  # the modules keep A^T's values, not the permutation that places them


def _dense_matrix(index, counts, n_sources, values=None, mean=False) -> torch.Tensor:
    """``A`` with ``A[j, index[e]] += c[e]`` over the edges of segment j, built edge by edge."""
    a = torch.zeros(len(counts), n_sources, dtype=F64)
    e = 0
    for j, k in enumerate(counts):
        for _ in range(k):
            c = 1.0 if values is None else float(values[e])
            a[j, int(index[e])] += c / k if mean else c
            e += 1
    return a


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=10), n_sources=st.integers(1, 6),
       width=st.sampled_from([(), (1,), (3,), (2, 2)]), with_values=st.booleans(), mean=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_gather_sum_with_values_matches_dense(counts, n_sources, width, with_values, mean, seed, data):
    """Constant per-edge values (and mean): output and gradient equal ``A @ x`` / ``A^T @ g``."""
    e = sum(counts)
    # Repeated sources, also within one segment; single-edge segments come from counts.
    index = data.draw(st.lists(st.integers(0, n_sources - 1), min_size=e, max_size=e))
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(e, dtype=F64, generator=gen) if with_values else None)
    gs = K.GatherSum.from_index(index, counts, n_sources, values, mean=mean, dtype=F64)
    a = _dense_matrix(index, counts, n_sources, values, mean)
    x = torch.randn((n_sources,) + width, dtype=F64, generator=gen)
    y, gx, g = forward_backward(gs, x, seed=seed)
    flat = x.reshape(n_sources, -1)
    torch.testing.assert_close(y, (a @ flat).reshape(y.shape), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, (a.T @ g.reshape(len(counts), -1)).reshape(x.shape), atol=1e-12, rtol=1e-12)


def test_gather_sum_values_follow_dtype_exactly():
    """``values`` are stored in the requested dtype; CSRIndices re-creates them exactly on .double()."""
    from neurovec.engines import runtime

    values = np.array([0.1, 1 / 3, 2.0])
    gs = K.GatherSum.from_index([1, 0, 1], [2, 1], 2, values, dtype=torch.float32)
    assert gs.values.dtype == torch.float32 and gs.t_values.tolist() == pytest.approx([1 / 3, 0.1, 2.0])
    assert np.shares_memory(gs.exact_values, values)  # float64 values are kept as given, not copied
    csr = runtime.CSRIndices(gs).double()
    assert csr.values.tolist() == values.tolist()  # exact, not float32 rounded and upcast
    assert csr.t_values.tolist() == values[[1, 0, 2]].tolist()  # A^T's: grouped by source, each in edge order
    x = torch.randn(2, 3, dtype=F64, requires_grad=True)
    y = runtime.gather_sum(x, csr)
    torch.testing.assert_close(y, torch.stack([0.1 * x[1] + (1 / 3) * x[0], 2.0 * x[1]]), atol=1e-15, rtol=1e-15)
    g = torch.randn(2, 3, dtype=F64)
    (grad,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(grad, torch.stack([(1 / 3) * g[0], 0.1 * g[0] + 2.0 * g[1]]), atol=1e-15, rtol=1e-15)
    assert csr.float().values.dtype == csr.t_values.dtype == torch.float32
    assert csr.to("cpu").t_values.dtype == torch.float32  # a move alone keeps them


@pytest.mark.parametrize("kernels_on", [True, False])
def test_transposed_values_are_a_stable_sort_by_source(kernels_on, monkeypatch):
    """With the C++ kernels and without them: A^T's values are A's, grouped by source, each in edge order."""
    from neurovec.engines import native

    if not kernels_on:
        monkeypatch.setattr(native, "operators", lambda: None)
    rng = np.random.default_rng(3)
    index = torch.from_numpy(rng.integers(0, 7, 50).astype(np.int32))
    ptr = torch.tensor([0, 10, 10, 31, 50])
    values = torch.from_numpy(rng.standard_normal(50))
    expected = values.numpy()[np.argsort(index.numpy(), kind="stable")]
    assert np.array_equal(K.transposed_values(ptr, index, 7, values).numpy(), expected)
    with pytest.raises(ValueError, match="per-edge"):
        K.GatherSum.from_index([0, 1], [2], 2, [1.0])


# --------------------------------------------------------------------------- other kernels

@pytest.mark.parametrize("reduce", K.REDUCTIONS)
def test_dense_and_scatter_kernels(reduce):
    gen = torch.Generator().manual_seed(6)
    counts = [3] * 4
    x = torch.randint(-2, 3, (12, 2), generator=gen).to(F64)
    seg = K.Segments.from_counts(counts, dtype=F64)
    y_ref, gx_ref, g = forward_backward(lambda t: reference(t, counts, reduce), x)
    for fn in (lambda t: K.dense_reduce(t, 3, reduce),
               lambda t: K.scatter_reduce_native(t, seg.seg_id, 4, reduce, seg.counts)):
        y, gx, _ = forward_backward(fn, x, g)
        torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12)


def test_choose_kernel_rules():
    cpu = torch.device("cpu")
    assert K.choose_kernel(12, 4, [3, 3, 3, 3], 8, cpu, False) == "dense"
    assert K.choose_kernel(12, 4, [3, 3, 3, 3], 8, cpu, False, reduce="max") == "dense"
    assert K.choose_kernel(10, 4, [3, 3, 3, 1], 8, cpu, False, reduce="sum", after_gather=True) == "sparse_mm"
    assert K.choose_kernel(10, 4, [3, 3, 3, 1], 8, cpu, False, reduce="max", after_gather=True) == "segment"
    assert K.choose_kernel(10, 4, None, 8, cpu, True) == "segment"
    assert K.choose_kernel(10, 4, [3, 3, 3, 1], 8, cpu, True, rows_sorted=False) == "scatter"


def test_choose_kernel_equal_counts_with_native_kernels():
    """Large equal-count layers go to the C++ segment kernels, small ones (and prod) stay dense."""
    big, small = np.full(10_000, 3), np.full(10, 3)
    for reduce in ("sum", "max"):
        assert K.choose_kernel(30_000, 10_000, big, 16, "cpu", reduce=reduce, native_kernels=True) == "segment"
        assert K.choose_kernel(30_000, 10_000, big, 16, "cpu", reduce=reduce, native_kernels=False) == "dense"
        assert K.choose_kernel(30, 10, small, 4, "cpu", reduce=reduce, native_kernels=True) == "dense"
    assert K.choose_kernel(30_000, 10_000, big, 16, "cpu", reduce="prod", native_kernels=True) == "dense"
    # Half precision never runs the C++ kernels: the default follows the dtype.
    assert K.choose_kernel(30_000, 10_000, big, 16, "cpu", dtype=torch.bfloat16) == "dense"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_avoids_spmm_on_cpu(dtype):
    seg = K.Segments.from_counts([3, 2] * 5000)
    x = torch.randn(seg.n_edges, 4).to(dtype)
    assert K._auto_impl(x, "sum", True) == "segment_reduce"
    torch.testing.assert_close(seg.reduce(x, "mean"), seg.reduce(x.double(), "mean").to(dtype), atol=1e-2, rtol=1e-2)
    assert K.choose_kernel(10, 4, None, 8, "cpu", False, after_gather=True, dtype=dtype) == "segment"


# --------------------------------------------------------------------------- second derivatives
#
# Every reduction's backward is differentiable again (or refuses with a clear error). gradgradcheck
# feeds the first backward incoming gradients that need a gradient themselves, where a
# once_differentiable backward raises; the Hessian-vector products below feed it a constant, where
# such a backward silently drops every term through it (NOTE: [second derivatives of prod]).

MODES = {"cpp": contextlib.nullcontext, "torch": native.disabled}
_COUNTS = [2, 1, 3, 4]


def _mode(mode: str):
    if mode == "cpp" and not native.available():
        pytest.skip(f"C++ kernels not built: {native.build_info}")
    return MODES[mode]()


def _with_zeros(rows: int = 10) -> torch.Tensor:
    """Values in [0.5, 1.5) with one zero in the first segment (of _COUNTS) and two in the last."""
    x = torch.rand(rows, 3, generator=torch.Generator().manual_seed(8), dtype=F64) + 0.5
    x[1, 0] = x[7, 2] = x[8, 2] = 0.0
    return x


def _distinct(rows: int = 10) -> torch.Tensor:
    """Distinct non-zero values: max / min and prod are smooth there (gradgradcheck's finite differences)."""
    return (torch.randperm(rows * 3, generator=torch.Generator().manual_seed(9)).to(F64).view(rows, 3) + 1) / 9


def hessian_vector(fn, x0: torch.Tensor, composite: bool) -> torch.Tensor | None:
    """The Hessian-vector product of ``(fn(x) * c).sum()`` (or of ``(fn(tanh x) ** 2 * c).sum()``)
    with a constant ``c``; None where the gradient does not depend on ``x``."""
    x = x0.clone().requires_grad_()
    y = fn(x.tanh()) ** 2 if composite else fn(x)
    c = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    (g,) = torch.autograd.grad((y * c).sum(), x, create_graph=True)
    if not g.requires_grad:
        return None
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    (h,) = torch.autograd.grad((g * v).sum(), x, allow_unused=True)
    return torch.zeros_like(x) if h is None else h


def assert_second_derivatives(fn, reference_fn, x0: torch.Tensor) -> None:
    for composite in (False, True):
        expected, actual = hessian_vector(reference_fn, x0, composite), hessian_vector(fn, x0, composite)
        if expected is None or actual is None:
            assert actual is None or not actual.any(), f"composite={composite}: the reference's gradient is constant"
            assert expected is None or not expected.any(), f"composite={composite}: a term is missing"
            continue
        torch.testing.assert_close(actual, expected, atol=1e-10, rtol=1e-10, msg=lambda m: f"composite={composite}: {m}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reduce,impl", CASES)
def test_second_derivatives_of_segment_kernels(mode, reduce, impl):
    if mode == "torch" and impl == "cpp":
        pytest.skip("impl='cpp' with the C++ kernels off is an error")
    seg = K.Segments.from_counts(_COUNTS, dtype=F64)
    with _mode(mode):
        fn = lambda t: seg.reduce(t, reduce, impl=impl)  # noqa: E731
        assert_second_derivatives(fn, lambda t: reference(t, _COUNTS, reduce), _with_zeros())
        assert torch.autograd.gradgradcheck(lambda t: fn(t.tanh()), (_distinct().requires_grad_(),))


@pytest.mark.parametrize("reduce", K.REDUCTIONS)
@pytest.mark.parametrize("kernel", ["dense", "strided", "scatter"])
def test_second_derivatives_of_torch_kernels(kernel, reduce):
    """dense, strided and scatter are torch's own reductions and backwards: differentiable again,
    except that torch refuses a second derivative of a scatter prod over two zeros, with its own error."""
    seg = K.Segments.from_counts(_COUNTS, dtype=F64)
    counts, x0, fn = {
        "dense": ([3, 3, 3], _with_zeros(9), lambda t: K.dense_reduce(t, 3, reduce)),
        # strided: segment j is rows j, j + 3, j + 6; the reference reads them in that order.
        "strided": ([3, 3, 3], _with_zeros(9), lambda t: runtime.strided_reduce(t, 3, reduce)),
        "scatter": (_COUNTS, _with_zeros(), lambda t: K.scatter_reduce_native(t, seg.seg_id, 4, reduce, seg.counts)),
    }[kernel]
    order = torch.arange(9).view(3, 3).T.reshape(-1) if kernel == "strided" else torch.arange(x0.shape[0])
    reference_fn = lambda t: reference(t[order], counts, reduce)  # noqa: E731
    if kernel == "scatter" and reduce == "prod":
        with pytest.raises(RuntimeError, match="Double backward is unsupported for src when >1 zeros"):
            hessian_vector(fn, x0, composite=False)
        x0[8, 2] = 0.5  # one zero per segment: differentiable again
    assert_second_derivatives(fn, reference_fn, x0)
    assert torch.autograd.gradgradcheck(lambda t: fn(t.tanh()), (_distinct(x0.shape[0]).requires_grad_(),))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_values", [False, True])
def test_second_derivatives_of_the_fused_gather(mode, with_values):
    """sparse_mm: the C++ operator (with and without its bias), MKL / torch."""
    index = [0, 2, 2, 1, 0, 3, 3, 1, 0, 2]
    values = np.linspace(0.5, 2.0, 10) if with_values else None
    csr = runtime.CSRIndices(K.GatherSum.from_index(index, _COUNTS, 4, values, dtype=F64))
    scale = torch.ones(10, 1, dtype=F64) if values is None else torch.tensor(values).view(-1, 1)
    bias = torch.rand(3, generator=torch.Generator().manual_seed(3), dtype=F64)
    x0 = torch.rand(4, 3, generator=torch.Generator().manual_seed(4), dtype=F64)
    with _mode(mode):
        for b in (None, bias):
            def fn(t, b=b):
                return runtime.gather_sum(t, csr, b)

            def reference_fn(t, b=b):
                y = reference(t[torch.tensor(index)] * scale, _COUNTS, "sum")
                return y if b is None else y + b

            assert_second_derivatives(fn, reference_fn, x0)
            assert torch.autograd.gradgradcheck(lambda t: fn(t.tanh()), (x0.clone().requires_grad_(),))


def _layer_graph(aggregation: str) -> neurovec.Graph:
    """Two layers of ``aggregation`` neurons over weighted inputs (3 each in the first, 1-4 in the
    second). Zero weights make products vanish where their second derivatives do not: in feature 0
    every first-layer product has two zero factors (``w0``, ``w1``), in feature 1 one (``w2``)."""
    rng = np.random.default_rng(0)
    b = neurovec.GraphBuilder()
    x = b.facts("x", rng.uniform(0.5, 1.5, (6, 2)))
    w = [b.weight(f"w{i}", value) for i, value in enumerate(
        ([0.0, rng.uniform(0.5, 1.5)], [0.0, rng.uniform(0.5, 1.5)], [rng.uniform(0.5, 1.5), 0.0]))]
    h = b.layer("h", aggregation=aggregation, transformation="tanh")
    hs = [h.neuron([(x[(i + k) % 6], w[k]) for k in range(3)]) for i in range(6)]
    o = b.layer("o", aggregation=aggregation)
    v = b.weight("v", rng.uniform(0.5, 1.5, 2))
    b.output(*(o.neuron([(hs[i], v) for i in idx]) for idx in ([0], [1, 2], [3, 4, 5, 0], [2, 5])))
    return b.build()


def _weight_hessian_vector(module, seed: int = 0) -> dict[str, torch.Tensor]:
    out = module()
    c = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    names = sorted(n for n, p in module.weights.items() if isinstance(p, torch.nn.Parameter))
    params = [module.weights[n] for n in names]
    grads = torch.autograd.grad((out * c).sum(), params, create_graph=True)
    vs = [torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 1 + i), dtype=F64)
          for i, p in enumerate(params)]
    dot = sum((g * v).sum() for g, v in zip(grads, vs) if g.requires_grad)
    hvp = torch.autograd.grad(dot, params, allow_unused=True) if torch.is_tensor(dot) else [None] * len(params)
    return {n: torch.zeros_like(p) if h is None else h for n, p, h in zip(names, params, hvp)}


@pytest.mark.parametrize("kernel", ["auto", "scatter", "segment", "dense", "sparse_mm"])
@pytest.mark.parametrize("aggregation", K.REDUCTIONS)
def test_compiled_second_derivatives_equal_the_reference(aggregation, kernel):
    """A compiled module's Hessian-vector product in its weights equals the reference engine's, for
    every aggregation and forced kernel (the C++ kernels on, where built)."""
    graph = _layer_graph(aggregation)
    module = neurovec.compile(graph, neurovec.Settings(reduce_kernel=kernel), dtype=F64)
    expected = _weight_hessian_vector(neurovec.ReferenceModule(graph, F64))
    assert any(h.any() for h in expected.values())
    if kernel == "scatter" and aggregation == "prod":  # two zeros in one neuron (see above)
        with pytest.raises(RuntimeError, match="Double backward is unsupported"):
            _weight_hessian_vector(module)
        return
    actual = _weight_hessian_vector(module)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-9, rtol=1e-9,
                                   msg=lambda m: f"{name}: {m}\n{module.code}")


def test_second_derivatives_under_torch_compile_are_refused():
    """Under torch.compile (AOTAutograd) torch itself does not differentiate a compiled backward: the
    second derivative fails loudly, for neurovec's kernels as for torch's own ops, never silently."""
    seg = K.Segments.from_counts(_COUNTS, dtype=F64)
    compiled = torch.compile(lambda t: seg.reduce(t.tanh(), "prod") ** 2, backend="aot_eager", fullgraph=True)
    x = _distinct().requires_grad_()
    try:
        (g,) = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError):
            torch.autograd.grad(g.sum(), x)
    finally:
        torch._dynamo.reset()
