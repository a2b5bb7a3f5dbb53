"""neurovec's C++ kernels (``engines/native.py``) and the entry points around them (``engines/ops.py``).

Every op is checked against a per-segment reference (the reference engine's
``stack + sum/mean/amax/amin``), outputs and gradients in float64, with the C++
kernels on and off (the torch fallback), eagerly (the operators with their autograd
in C++) and as under torch.compile (the operators without autograd, inside the traced
autograd Functions); and the build: cache, lock, switch, and a compiler that fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.engines import kernels as K
from neurovec.engines import native, ops

from .equivalence import assert_equivalent
from .strategies import gnn_graphs, graphs
from .test_equivalence import all_finite

F64 = torch.float64
ROOT = Path(neurovec.__file__).absolute().parent.parent  # the folder holding the neurovec package, as imported here

needs_native = pytest.mark.skipif(not native.available(), reason=f"C++ kernels not built: {native.build_info}")


@pytest.fixture(params=["cpp", "torch"])
def backend(request, monkeypatch):
    """Run a test with the C++ kernels and with their pure-torch fallback."""
    if request.param == "cpp":
        if not native.available():
            pytest.skip(f"C++ kernels not built: {native.build_info}")
    else:
        monkeypatch.setattr(native, "_enabled", False)
    return request.param


def reference_reduce(x: torch.Tensor, counts, reduce: str, values=None) -> torch.Tensor:
    if values is not None:
        x = x * values.view((-1,) + (1,) * (x.dim() - 1))
    fn = {"sum": lambda t: t.sum(0), "mean": lambda t: t.mean(0), "max": lambda t: t.amax(0),
          "min": lambda t: t.amin(0)}[reduce]
    return torch.stack([fn(part) for part in torch.split(x, list(counts))])


def grads(fn, x: torch.Tensor, seed: int):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    g = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(seed))
    (gx,) = torch.autograd.grad(y, x, g)
    return y.detach(), gx


def ptr_of(counts, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=dtype)


def segment_fn(backend: str, traced: bool, ptr, reduce: str, counts, values):
    """The reduction as programs run it: the C++ operators eagerly, the autograd Functions over the
    operators without autograd that torch.compile traces, or (backend torch) the torch kernels."""
    if backend == "torch":
        seg_id = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr.diff().long())
        return lambda t: K.segment_reduce(t if values is None else t * values.view((-1,) + (1,) * (t.dim() - 1)),
                                          ptr.long(), seg_id, counts, reduce)
    if not traced:
        return lambda t: ops.segment_reduce(t, ptr, reduce, counts, values)
    if reduce in ("sum", "mean"):
        return lambda t: ops._TracedSegmentSum.apply(t, ptr, values, counts if reduce == "mean" else None)
    return lambda t: ops._TracedSegmentExtremum.apply(t, ptr, reduce == "max")


# --------------------------------------------------------------------------- segment reductions

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=10),
       width=st.sampled_from([(), (1,), (3,), (16,), (5,), (2, 3)]),
       reduce=st.sampled_from(ops.REDUCTIONS), with_values=st.booleans(), ties=st.booleans(),
       index_dtype=st.sampled_from([torch.int32, torch.int64]), traced=st.booleans(),
       seed=st.integers(0, 2**16))
def test_segment_ops_match_reference(backend, counts, width, reduce, with_values, ties, index_dtype, traced, seed):
    """Outputs and gradients of sum (with per-row values) / mean / max / min, ties split evenly."""
    gen = torch.Generator().manual_seed(seed)
    shape = (sum(counts),) + width
    # Small integers: many ties (also whole tied segments); gaussians: the generic case.
    x = torch.randint(-2, 3, shape, generator=gen).to(F64) if ties else torch.randn(shape, dtype=F64, generator=gen)
    values = torch.randn(shape[0], dtype=F64, generator=gen) if with_values and reduce == "sum" else None
    ptr, cnt = ptr_of(counts, index_dtype), torch.tensor(counts, dtype=F64)
    y, gx = grads(segment_fn(backend, traced, ptr, reduce, cnt, values), x, seed)
    y_ref, gx_ref = grads(lambda t: reference_reduce(t, counts, reduce, values), x, seed)
    exact = ties and reduce in ("max", "min")  # integer extrema and their gradients are exact
    tol = 0 if exact else 1e-12
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12)


@needs_native
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_extremum_bitwise_equal_to_torch_fallback(reduce):
    """Forward and backward floats identical to the torch kernels', ties, -0.0, NaN and inf included."""
    x = torch.tensor([[1.0, -0.0, float("nan"), 3.0], [1.0, 0.0, 2.0, float("inf")], [0.5, -0.0, 1.0, 3.0],
                      [2.0, 5.0, -1.0, float("-inf")], [2.0, 5.0, -1.0, float("-inf")]], dtype=F64)
    ptr = torch.tensor([0, 3, 5])
    g = torch.tensor([[1.0, -2.0, 3.0, -0.5], [-1.0, 4.0, 0.0, 2.0]], dtype=F64)
    x_cpp, x_torch = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = ops.segment_reduce(x_cpp, ptr, reduce)
    (gx,) = torch.autograd.grad(y, x_cpp, g)
    y_t = K.segment_reduce(x_torch, ptr, torch.tensor([0, 0, 0, 1, 1]), None, reduce, impl="segment_reduce")
    (gx_t,) = torch.autograd.grad(y_t, x_torch, g)
    np.testing.assert_array_equal(y.detach().numpy(), y_t.detach().numpy())
    np.testing.assert_array_equal(gx.numpy(), gx_t.numpy())  # NaN where NaN, and signed zeros...
    assert (torch.signbit(gx) == torch.signbit(gx_t)).all()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_double_backward(backend, reduce):
    ptr, cnt = ptr_of([2, 1, 3]), torch.tensor([2.0, 1.0, 3.0], dtype=F64)
    x = (torch.arange(12, dtype=F64).view(6, 2) * 0.37 % 1.3).requires_grad_()
    values = torch.linspace(0.5, 2.0, 6, dtype=F64)
    assert torch.autograd.gradgradcheck(segment_fn(backend, False, ptr, reduce, cnt, None), (x,))
    assert torch.autograd.gradgradcheck(segment_fn(backend, False, ptr, "sum", None, values), (x,))


# --------------------------------------------------------------------------- segment products

def _prod_reference(x: torch.Tensor, counts) -> torch.Tensor:
    return torch.stack([part.prod(0) for part in torch.split(x, list(counts))])


@needs_native
@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 6), min_size=1, max_size=10),
       width=st.sampled_from([(), (1,), (3,), (16,), (37,), (128,), (2, 3)]),
       zeros=st.booleans(), index_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_segment_prod_matches_torch_prod(counts, width, zeros, index_dtype, seed):
    """neurovec_cpu::prod and ::prod_backward (NOTE: [C++ segment products]) against torch.prod per
    segment: fixed widths, widths in chunks of 32, 8 and 1 (37, 128), no, one and several zeros in a
    segment (the gradient of a lone zero is the product of the others; two zeros give 0)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (sum(counts),) + width
    x = torch.randint(-2, 3, shape, generator=gen).to(F64) if zeros else torch.randn(shape, dtype=F64, generator=gen)
    ptr = ptr_of(counts, index_dtype)
    y = torch.ops.neurovec_cpu.prod(x, ptr)
    g = torch.randn(y.shape, dtype=F64, generator=gen)
    gx = torch.ops.neurovec_cpu.prod_backward(g, x, ptr)
    xr = x.clone().requires_grad_()
    y_ref = _prod_reference(xr, counts)
    (gx_ref,) = torch.autograd.grad(y_ref, xr, g)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12)


@needs_native
def test_segment_prod_runs_the_cpp_kernels():
    """Where the C++ kernels run, a segment product computes with them forward and backward, also
    through a fused torch.prod backward's zero case, and stays differentiable twice."""
    counts = [2, 1, 3]
    x = torch.tensor([[0.0, 2.0], [3.0, 0.0], [-1.5, 0.5], [0.0, 4.0], [0.0, 0.5], [2.0, 3.0]], dtype=F64,
                     requires_grad=True)
    seg = K.Segments.from_counts(counts, dtype=F64)
    assert K._auto_impl(x, "prod", True) == "cpp"
    y = seg.reduce(x, "prod")
    assert y.grad_fn is not None and y.grad_fn.name() == "SegmentProdBackward"
    g = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, -1.0]], dtype=F64)
    (gx,) = torch.autograd.grad(y, x, g)
    xr = x.detach().clone().requires_grad_()
    (gx_ref,) = torch.autograd.grad(_prod_reference(xr, counts), xr, g)
    torch.testing.assert_close(gx, gx_ref, atol=0, rtol=0)
    assert torch.autograd.gradgradcheck(lambda t: seg.reduce(t, "prod"), (torch.randn(6, 2, dtype=F64,
                                                                                         requires_grad=True),))


@pytest.mark.parametrize("strided", [True, False])
@pytest.mark.parametrize("width", [(), (3,), (37,), (2, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_two_row_product_is_bitwise_the_multiplication(backend, strided, width, dtype):
    """kernels.two_row_product (C++ pair_prod / pair_prod_backward, or torch's unbind) gives the floats
    of ``a * b`` forward and of ``g * b``, ``g * a`` backward, zeros and signed zeros included (torch's
    ``v[0] * v[1]`` backward adds a zero-filled block, which turns a -0.0 gradient into 0.0), and
    differentiates twice."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (10,) + width, generator=gen).to(dtype)
    x.view(-1)[::7] = -0.0
    x = torch.where(torch.rand(x.shape, generator=gen) < 0.5, x, torch.randn(x.shape, generator=gen, dtype=dtype))
    g = torch.randn((5,) + width, generator=gen, dtype=dtype)
    g.view(-1)[::3] = -0.0
    v = x.reshape(((2, -1) if strided else (-1, 2)) + width)
    a, b = v.unbind(0 if strided else 1)
    expected_grad = torch.stack((g * b, g * a), 0 if strided else 1).reshape(x.shape)
    t = x.clone().requires_grad_()
    y = K.two_row_product(t, strided)
    (gx,) = torch.autograd.grad(y, t, g)
    for got, expected in ((y.detach(), a * b), (gx, expected_grad)):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        assert (torch.signbit(got) == torch.signbit(expected)).all()
    xd = torch.randn((6,) + width, dtype=F64, generator=gen, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: K.two_row_product(t, strided), (xd,))
    with pytest.raises(ValueError, match="even number of rows"):
        K.two_row_product(x[:3], strided)


# --------------------------------------------------------------------------- gather + sum

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=10), n_sources=st.integers(1, 6),
       width=st.sampled_from([(), (3,), (16,), (2, 3), (47,)]), with_values=st.booleans(), traced=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_gather_sum_matches_reference(backend, counts, n_sources, width, with_values, traced, seed, data):
    """Repeated sources (also within a segment), unread sources, single-edge segments."""
    e = sum(counts)
    index = data.draw(st.lists(st.integers(0, n_sources - 1), min_size=e, max_size=e))
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(e, dtype=F64, generator=gen) if with_values else None
    gs = K.GatherSum.from_index(index, counts, n_sources, values, dtype=F64)
    x = torch.randn((n_sources,) + width, dtype=F64, generator=gen)

    def fused(t):
        if traced and backend == "cpp":
            return ops._TracedGatherSum.apply(t, gs.ptr, gs.index, gs.values, gs.t_ptr, gs.t_col, gs.t_values, None)
        return gs(t)

    y, gx = grads(fused, x, seed)
    y_ref, gx_ref = grads(lambda t: reference_reduce(t[torch.tensor(index)], counts, "sum", values), x, seed)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12)


def test_gather_sum_double_backward(backend):
    gs = K.GatherSum.from_index([0, 2, 2, 1, 0], [2, 3], 3, [0.5, 1.5, -1.0, 2.0, 0.25], dtype=F64)
    x = torch.randn(3, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(gs, (x,))


@pytest.mark.parametrize("width", [16, 47, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_equals_fallback_at_scale(dtype, width):
    """A PROTEINS-sized random layer: the C++ kernels give the torch fallback's numbers (rows of every
    width: one register chunk, and accumulated in the output row with prefetching)."""
    if not native.available():
        pytest.skip("C++ kernels not built")
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 9, 5000)
    index = rng.integers(0, 3000, int(counts.sum()))
    gs = K.GatherSum.from_index(index, counts, 3000, rng.normal(size=index.size), dtype=dtype)
    x = torch.randn(3000, width, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    rows = rng.multinomial(3000 - 500, np.full(500, 1 / 500)) + 1  # 500 segments over the 3000 rows of x
    seg = K.Segments.from_counts(rows, dtype=dtype)
    for fn in (gs, lambda t: seg.reduce(t, "max"), lambda t: seg.reduce(t, "mean")):
        y, gx = grads(fn, x, 0)
        with native.disabled():
            y_t, gx_t = grads(fn, x, 0)
        torch.testing.assert_close(y, y_t, atol=tol, rtol=tol)
        torch.testing.assert_close(gx, gx_t, atol=tol, rtol=tol)


@pytest.mark.parametrize("reduce", ["gather", *ops.REDUCTIONS])
def test_inputs_without_gradient_skip_autograd(backend, reduce):
    """A value that needs no gradient (inference, or constant facts) gets the same floats
    and no autograd node."""
    gs = K.GatherSum.from_index([0, 2, 2, 1, 0], [2, 3], 3, [0.5, 1.5, -1.0, 2.0, 0.25], dtype=F64)
    seg = K.Segments.from_counts([2, 1], dtype=F64)
    fn = gs if reduce == "gather" else (lambda t: seg.reduce(t, reduce))
    x = torch.randn(3, 2, dtype=F64)
    y_grad = fn(x.clone().requires_grad_())
    y_plain = fn(x)
    with torch.no_grad():
        y_no_grad = fn(x.clone().requires_grad_())
    assert y_grad.grad_fn is not None and y_plain.grad_fn is None and y_no_grad.grad_fn is None
    np.testing.assert_array_equal(y_plain.numpy(), y_grad.detach().numpy())
    np.testing.assert_array_equal(y_no_grad.numpy(), y_grad.detach().numpy())


# --------------------------------------------------------------------------- the operators

@needs_native
@pytest.mark.parametrize("case", ["csr_sum", "csr_gather", "csr_bias", "broadcast", "extremum", "extremum_backward",
                                  "prod", "prod_backward", "pair_prod", "pair_prod_backward",
                                  "gather_sum", "segment_sum", "segment_extremum"])
def test_opcheck(case):
    """Schemas, and the fake kernels of the operators without autograd (those torch.compile traces);
    the autograd registration of the others (eager only)."""
    ptr = torch.tensor([0, 2, 3, 6])
    x = torch.randn(6, 2, dtype=F64)
    gs = K.GatherSum.from_index([0, 2, 2, 1, 0, 3], [2, 1, 3], 4, np.linspace(0.5, 1.5, 6), dtype=F64)
    cnt = torch.tensor([2.0, 1.0, 3.0], dtype=F64)
    source = torch.randn(4, 2, dtype=F64)
    op = {"csr_gather": "csr_sum", "csr_bias": "csr_sum"}.get(case, case)
    args = {
        "csr_sum": (x, ptr, None, torch.rand(6, dtype=F64), cnt, None),
        "csr_gather": (source, gs.ptr, gs.index, gs.values, None, None),
        "csr_bias": (source, gs.ptr, gs.index, None, None, torch.randn(2, dtype=F64)),
        "broadcast": (torch.randn(3, 2, dtype=F64), ptr, None, cnt, 6),
        "extremum": (x, ptr, False),
        "extremum_backward": (torch.randn(3, 2, dtype=F64), x, torch.ops.neurovec_cpu.extremum(x, ptr, True), ptr),
        "prod": (x, ptr),
        "prod_backward": (torch.randn(3, 2, dtype=F64), x, ptr),
        "pair_prod": (x, True),
        "pair_prod_backward": (torch.randn(3, 2, dtype=F64), x, False),
        "gather_sum": (source.requires_grad_(), gs.ptr, gs.index, gs.values, gs.t_ptr, gs.t_col, gs.t_values, None),
        "segment_sum": (x.requires_grad_(), ptr, torch.rand(6, dtype=F64), cnt),
        "segment_extremum": (x.requires_grad_(), ptr, True),
    }[case]
    eager = case in ("gather_sum", "segment_sum", "segment_extremum")
    checks = ("test_schema", "test_autograd_registration") if eager else ("test_schema", "test_faketensor")
    torch.library.opcheck(getattr(torch.ops.neurovec_cpu, op), args, test_utils=checks)


@needs_native
def test_compiled_programs_call_the_autograd_free_kernels():
    """Under torch.compile the reductions trace to the operators without autograd (no Python
    autograd kernel per call; NOTE: [Kernels under torch.compile]), and their gradients
    equal eager ones."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    ptr, cnt = ptr_of([2, 1, 3]), torch.tensor([2.0, 1.0, 3.0], dtype=F64)
    gs = K.GatherSum.from_index([0, 2, 2, 1, 0, 3], [2, 1, 3], 4, np.linspace(0.5, 1.5, 6), dtype=F64)

    def program(x):
        h = gs(x)  # (3, 2)
        rows = torch.cat([h, h]).tanh()  # (6, 2)
        return ops.segment_reduce(rows, ptr, "mean", cnt) + ops.segment_reduce(rows, ptr, "max")

    backend = AotEagerAndRecordGraphs()
    x = torch.randn(4, 2, dtype=F64)
    try:
        y, gx = grads(torch.compile(program, backend=backend, fullgraph=True), x, 0)
    finally:
        torch._dynamo.reset()
    y_ref, gx_ref = grads(program, x, 0)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12)
    code = "".join(g.code for g in backend.fw_graphs + backend.bw_graphs)
    assert "neurovec_cpu.csr_sum" in code and "neurovec_cpu.broadcast" in code
    assert "neurovec_cpu.extremum_backward" in code
    assert "neurovec_cpu.gather_sum" not in code and "neurovec_cpu.segment_" not in code


# --------------------------------------------------------------------------- build, cache, switch

def _python(code: str, **env) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, timeout=900)


_REPORT = """
    import json, torch
    from neurovec.engines import native, kernels
    ok = native.available()
    y = kernels.Segments.from_counts([2, 1]).reduce(torch.tensor([1.0, 2.0, 3.0]), "sum")
    print(json.dumps({"available": ok, "built": native.build_info.get("built"), "y": y.tolist(),
                      "error": native.build_info.get("error")}))
"""


def _report(result: subprocess.CompletedProcess) -> dict:
    import json
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_switched_off_by_environment(tmp_path):
    report = _report(_python(_REPORT, NEUROVEC_NATIVE="0", NEUROVEC_CACHE_DIR=str(tmp_path)))
    assert report["available"] is False and report["y"] == [3.0, 3.0]
    assert not (tmp_path / "native").exists()  # nothing was built


def test_failing_compiler_falls_back_with_a_warning(tmp_path):
    result = _python(_REPORT, CXX="false", NEUROVEC_CACHE_DIR=str(tmp_path), PATH="/nonexistent")
    report = _report(result)
    assert report["available"] is False and report["y"] == [3.0, 3.0]
    assert "no C++ compiler" in report["error"] and "C++ kernels unavailable, using torch kernels" in result.stderr
    assert result.stderr.count("unavailable") == 1  # said once


def _warm_up(cache: Path, **env) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), NEUROVEC_CACHE_DIR=str(cache), **env)
    return subprocess.run([sys.executable, "-m", "neurovec.engines.native_build"], capture_output=True, text=True,
                          env=environment, timeout=900)


def test_warm_up_command_says_why_there_are_no_kernels(tmp_path):
    result = _warm_up(tmp_path, NEUROVEC_NATIVE="0")
    assert result.returncode != 0 and "switched off (NEUROVEC_NATIVE=0)" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")
def test_first_build_says_what_it_does(tmp_path):
    """With an empty cache, the first use says that it builds the C++ kernels, where, and how to build
    them ahead of time, before the build starts (a warning: shown without any logging set up), and
    shows the build as a step of its own; the warm-up command then finds them built."""
    result = _python(_REPORT, NEUROVEC_CACHE_DIR=str(tmp_path))
    report = _report(result)
    assert report["available"] and report["built"], report
    lines = result.stderr.splitlines()
    said = [i for i, line in enumerate(lines) if "building its C++ kernels" in line]
    assert len(said) == 1 and str(tmp_path / "native") in lines[said[0]], result.stderr
    assert "python -m neurovec.engines.native_build" in lines[said[0]]
    assert any("neurovec: building C++ kernels" in line for line in lines[said[0] + 1:]), result.stderr
    warm = _warm_up(tmp_path)
    assert warm.returncode == 0 and "already built" in warm.stdout and "building" not in warm.stderr, warm


@pytest.mark.slow
@pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")
def test_concurrent_first_use_builds_once(tmp_path):
    """Two processes start on an empty cache at once: one builds, the other waits and loads it;
    a later process loads the cached library without building."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), NEUROVEC_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_REPORT)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=environment) for _ in range(2)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        reports.append(_report(subprocess.CompletedProcess(p.args, p.returncode, out, err)))
    assert all(r["available"] and r["y"] == [3.0, 3.0] for r in reports), reports
    assert sorted(r["built"] for r in reports) == [False, True]
    assert len(list((tmp_path / "native").glob("*/*.so"))) == 1
    assert _report(_python(_REPORT, NEUROVEC_CACHE_DIR=str(tmp_path)))["built"] is False


# --------------------------------------------------------------------------- compiled modules, kernels off

@pytest.mark.parametrize("preset", ["default", "unoptimized", "upward-06-rel-1", "upward-17-aggressive"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=st.one_of(graphs(), gnn_graphs()))
def test_compiled_modules_equal_reference_with_kernels_off(preset, graph):
    """The generated programs' torch fallbacks (no C++ kernels): outputs and gradients
    equal the reference engine's, as with the kernels on (tests/test_presets.py)."""
    assume(all_finite(graph))
    with native.disabled():
        assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


@needs_native
@pytest.mark.parametrize("reduce", ["gather", *ops.REDUCTIONS])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_operators_record_one_cpp_node(reduce, index_dtype):
    """Where the C++ operators are built, the eager entry points call them (NOTE: [Operators in
    C++]): the autograd node is C++ (no Python Function), only ``x`` needs a gradient, no node at
    all when ``x`` needs none; outputs and gradients (second order too) pass gradcheck."""
    gs = K.GatherSum.from_index([0, 2, 2, 1, 0], [2, 3], 3, [0.5, 1.5, -1.0, 2.0, 0.25], dtype=F64)
    ptr, cnt = ptr_of([2, 1], index_dtype), torch.tensor([2.0, 1.0], dtype=F64)
    if reduce == "gather":
        csr = [t.to(index_dtype) for t in (gs.ptr, gs.index, gs.t_ptr, gs.t_col)]
        fn = lambda t: ops.gather_sum(t, csr[0], csr[1], gs.values, csr[2], csr[3], gs.t_values)  # noqa: E731
    else:
        fn = lambda t: ops.segment_reduce(t, ptr, reduce, cnt)  # noqa: E731
    x = torch.randn(3, 2, dtype=F64, requires_grad=True)
    y = fn(x)
    assert type(y.grad_fn).__name__ == "CppFunction", type(y.grad_fn)
    assert [f is not None for f, _ in y.grad_fn.next_functions][0]
    assert not any(f is not None for f, _ in y.grad_fn.next_functions[1:])
    assert fn(x.detach()).grad_fn is None
    with torch.no_grad():
        assert fn(x).grad_fn is None and torch.equal(fn(x), y.detach())
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def vm_flags(address: int) -> list[str] | None:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps), None if none does."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
THP_AVAILABLE = THP.exists() and "[never]" not in THP.read_text()  # Linux's transparent huge pages, on advice or always


@needs_native
@pytest.mark.skipif(not THP_AVAILABLE, reason="no transparent huge pages here")
def test_large_outputs_ask_for_huge_pages():
    """A large output of the C++ kernels (here a 1-entry-per-segment sum, 10 MiB, and its backward's gradient)
    is madvised for transparent huge pages before it is written (NOTE: [huge pages for large outputs] in
    native_ops.cpp): its mapping carries VmFlags ``hg``; the values are those of the small-page sum."""
    rows, width = 40_000, 64
    x = torch.randn(rows, width, dtype=torch.float32, requires_grad=True)
    ptr = torch.arange(rows + 1, dtype=torch.int64)
    col = torch.arange(rows, dtype=torch.int64)
    y = ops.gather_sum(x, ptr, col, None, ptr, col, None)
    y.backward(torch.ones_like(y))
    for tensor in (y, x.grad):
        assert "hg" in vm_flags(tensor.data_ptr() + tensor.numel() * tensor.element_size() // 2)
    assert torch.equal(y.detach(), x.detach())
    assert torch.equal(x.grad, torch.ones_like(x))
