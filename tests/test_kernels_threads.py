"""The C++ kernels at 1, 2 and 4 threads write every output row, whatever the segment layout.

Threads own disjoint ranges of segments. A CSR may start or end with empty segments, or hold runs
of them: the backward of a fused gather + sum is a sum over the *transposed* CSR, whose segments
are the sources, and a source nothing reads is an empty segment there. Every such row must still be
written (a zero sum), under any thread count, or the output keeps whatever the allocator left in
that memory (issue 23, item 1: ``gather_sum``'s backward gave wrong, changing gradients at 2
threads to the rows of ``x`` that nothing reads).

The tests run with ``torch.use_deterministic_algorithms(True)``, under which torch fills fresh
memory with NaN: a row no thread writes is NaN, on every run, instead of a stale value that may
happen to be 0. Sizes exceed the kernels' parallel threshold, so that 2 and 4 threads really split
the work. Each kernel is compared with an independent torch formula (outputs and gradients, float64,
1e-12), across thread counts bit for bit, and with ``gradcheck``; a compiled module whose last rows
are read by no gather equals the reference engine at every thread count.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.engines import native, ops


F64 = torch.float64
THREADS = (1, 2, 4)
#: Values (entries x width) above which the kernels split the work among threads, with a margin.
PARALLEL_WORK = 2 * 32768

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C++ kernels not built: {native.build_info}")


@pytest.fixture(autouse=True, scope="module")
def _poisoned_memory():
    """Fresh tensors (``torch.empty``, ``at::empty``) come filled with NaN."""
    before = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]


@contextlib.contextmanager
def num_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: How programs call the kernels: eagerly the operators with their autograd in C++, under torch.compile
#: the operators without autograd inside the autograd Functions dynamo traces (engines/ops.py).
BINDINGS = ("eager", "traced")


def gather_fn(binding: str, a):
    if binding == "traced":
        return lambda t: ops._TracedGatherSum.apply(t, *a, None)
    return lambda t: ops.gather_sum(t, *a)


def segment_fn(binding: str, ptr, reduce: str, counts, values):
    if binding == "eager":
        return lambda t: ops.segment_reduce(t, ptr, reduce, counts, values)
    if reduce in ("sum", "mean"):
        return lambda t: ops._TracedSegmentSum.apply(t, ptr, values, counts if reduce == "mean" else None)
    return lambda t: ops._TracedSegmentExtremum.apply(t, ptr, reduce == "max")


# --------------------------------------------------------------------------- layouts

def _empty_runs(rng: np.random.Generator, counts: np.ndarray, lead: int, trail: int, runs: int,
                run_length: int) -> np.ndarray:
    """``counts`` with ``runs`` runs of ``run_length`` empty segments inside, ``lead`` empty
    segments before and ``trail`` after."""
    counts = counts.copy()
    for start in rng.integers(0, counts.size, runs):
        counts[start:start + run_length] = 0
    return np.concatenate([np.zeros(lead, np.int64), counts, np.zeros(trail, np.int64)])


@st.composite
def segment_layouts(draw, min_work: int = PARALLEL_WORK):
    """``(counts, width)``: segment sizes with empty segments first, last and in runs (each
    possibly absent), and a row width, with entries x width >= ``min_work``."""
    width = draw(st.sampled_from([1, 3, 5, 16, 32]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    max_count = draw(st.sampled_from([1, 4, 12]))
    n = -(-min_work // (width * (max_count + 1) // 2))  # segments for min_work values on average
    counts = rng.integers(1, max_count + 1, n)
    counts = _empty_runs(rng, counts, lead=draw(st.sampled_from([0, 1, 5])), trail=draw(st.sampled_from([0, 1, 7, n])),
                         runs=draw(st.integers(0, 4)), run_length=draw(st.integers(1, 30)))
    while counts.sum() * width < min_work:  # runs may have emptied too much: top up the first non-empty part
        counts = np.concatenate([rng.integers(1, max_count + 1, n), counts])
    return counts.astype(np.int64), width


@st.composite
def gather_layouts(draw, min_work: int = PARALLEL_WORK):
    """``(counts, index, n_sources, width)`` of a fused gather + sum whose sources are read by no
    edge first, last and in runs: empty segments of the transposed CSR, which its backward sums
    over. The segments themselves may be empty too."""
    counts, width = draw(segment_layouts(min_work))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_sources = int(draw(st.sampled_from([0.5, 1.0, 2.0])) * counts.size) + 1
    read = _empty_runs(rng, np.ones(n_sources, np.int64), lead=draw(st.sampled_from([0, 1, 9])),
                       trail=draw(st.sampled_from([0, 1, 9, n_sources])), runs=draw(st.integers(0, 4)),
                       run_length=draw(st.integers(1, 30)))
    readable = np.flatnonzero(read)
    if readable.size == 0:
        readable = np.array([read.size - 1])
    index = rng.choice(readable, int(counts.sum()))
    return counts, index, read.size, width


def csr(counts: np.ndarray, index: np.ndarray, n_sources: int, values: np.ndarray | None):
    """``ptr, col, values`` of ``A`` and ``t_ptr, t_col, t_values`` of its transpose (int32)."""
    ptr = np.concatenate([[0], np.cumsum(counts)])
    seg_id = np.repeat(np.arange(counts.size), counts)
    t_perm = np.argsort(index, kind="stable")
    t_ptr = np.concatenate([[0], np.cumsum(np.bincount(index, minlength=n_sources))])
    i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
    v = None if values is None else torch.from_numpy(values)
    tv = None if values is None else torch.from_numpy(np.ascontiguousarray(values[t_perm]))
    return (i32(ptr), i32(index), v, i32(t_ptr), i32(seg_id[t_perm]), tv)


def _values(rng, n):
    return rng.normal(size=n)


def distinct(shape, seed: int) -> torch.Tensor:
    """Values at least 1e-3 apart (max / min differentiable under gradcheck's perturbations)."""
    n = int(np.prod(shape))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(F64)
    return (perm * (100.0 / n) - 50.0).reshape(shape)


# --------------------------------------------------------------------------- references (plain torch)

def reference_segments(x, counts, reduce, values=None):
    """Per-segment reductions by scatter (empty segments: 0 for sums, -inf / inf for max / min,
    NaN for means), autograd by torch."""
    seg_id = torch.from_numpy(np.repeat(np.arange(counts.size), counts))
    rows = x if values is None else x * values.view(-1, 1)
    if reduce in ("sum", "mean"):
        y = rows.new_zeros((counts.size, x.shape[1])).index_add(0, seg_id, rows)
        return y / torch.from_numpy(counts).to(F64).view(-1, 1) if reduce == "mean" else y
    init = -np.inf if reduce == "max" else np.inf
    index = seg_id.view(-1, 1).expand_as(rows)
    return rows.new_full((counts.size, x.shape[1]), init).scatter_reduce(0, index, rows, "a" + reduce,
                                                                         include_self=False)


def run(fn, x, g):
    """``fn(x)`` and the gradient ``g`` pulls back to ``x``."""
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    (gx,) = torch.autograd.grad(y, x, g)
    return y.detach(), gx


def assert_all_threads(fn, x, g, y_ref, gx_ref):
    """At 1, 2 and 4 threads: the reference's numbers (1e-12), and bitwise the same at each."""
    results = []
    for n in THREADS:
        with num_threads(n):
            results.append(run(fn, x, g))
    for n, (y, gx) in zip(THREADS, results):
        torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12, equal_nan=True, msg=lambda m: f"{n} threads: {m}")
        torch.testing.assert_close(gx, gx_ref, atol=1e-12, rtol=1e-12, msg=lambda m: f"{n} threads, grad: {m}")
        assert torch.equal(y.nan_to_num(), results[0][0].nan_to_num()) and torch.equal(gx, results[0][1])


# --------------------------------------------------------------------------- kernels

@pytest.mark.parametrize("binding", BINDINGS)
@settings(max_examples=15, deadline=None)
@given(layout=gather_layouts(), with_values=st.booleans(), seed=st.integers(0, 2**16))
def test_gather_sum_writes_every_row(binding, layout, with_values, seed):
    counts, index, n_sources, width = layout
    rng = np.random.default_rng(seed)
    values = _values(rng, index.size) if with_values else None
    a = csr(counts, index, n_sources, values)
    x = torch.from_numpy(rng.normal(size=(n_sources, width)))
    g = torch.from_numpy(rng.normal(size=(counts.size, width)))
    rows = lambda t: t[torch.from_numpy(index)]  # noqa: E731
    y_ref, gx_ref = run(lambda t: reference_segments(rows(t), counts, "sum", a[2]), x, g)
    assert_all_threads(gather_fn(binding, a), x, g, y_ref, gx_ref)


@pytest.mark.parametrize("binding", BINDINGS)
@settings(max_examples=15, deadline=None)
@given(layout=segment_layouts(), reduce=st.sampled_from(ops.REDUCTIONS), with_values=st.booleans(),
       seed=st.integers(0, 2**16))
def test_segment_reductions_write_every_row(binding, layout, reduce, with_values, seed):
    counts, width = layout
    rng = np.random.default_rng(seed)
    entries = int(counts.sum())
    values = torch.from_numpy(_values(rng, entries)) if with_values and reduce == "sum" else None
    ptr = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]))
    cnt = torch.from_numpy(counts).to(F64)
    x = distinct((entries, width), seed)
    g = torch.from_numpy(rng.normal(size=(counts.size, width)))
    y_ref, gx_ref = run(lambda t: reference_segments(t, counts, reduce, values), x, g)
    assert_all_threads(segment_fn(binding, ptr, reduce, cnt, values), x, g, y_ref, gx_ref)


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize("kernel", ["gather", "sum", "mean", "max", "min"])
def test_gradcheck_with_empty_segments(binding, threads, kernel):
    """gradcheck (fast mode: random projections) at 2 and 4 threads, on a layout with empty segments
    first, last and in a run, and sources read by nothing first, last and in a run."""
    rng = np.random.default_rng(7)
    counts = _empty_runs(rng, rng.integers(1, 8, 1200), lead=3, trail=40, runs=2, run_length=15)
    width = 16
    if kernel == "gather":
        n_sources = 1500
        readable = np.r_[5:600, 700:1400]
        a = csr(counts, rng.choice(readable, counts.sum()), n_sources, _values(rng, counts.sum()))
        fn = gather_fn(binding, a)
        x = torch.from_numpy(rng.normal(size=(n_sources, width)))
    else:
        ptr = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]))
        cnt = torch.from_numpy(np.maximum(counts, 1)).to(F64)
        # The extrema of empty segments are -inf / inf, which finite differences cannot take.
        nonempty = torch.from_numpy(counts > 0)
        reduce = segment_fn(binding, ptr, kernel, cnt, None)
        fn = lambda t: reduce(t)[nonempty]  # noqa: E731
        x = distinct((int(counts.sum()), width), 3)
    assert int(counts.sum()) * width >= PARALLEL_WORK
    with num_threads(threads):
        assert torch.autograd.gradcheck(fn, (x.requires_grad_(),), fast_mode=True)


# --------------------------------------------------------------------------- a compiled module

def unread_last_rows(n: int = 2000, unread: int = 300, width: int = 16, seed: int = 0) -> neurovec.Graph:
    """Layer ``h`` (``n`` neurons ``tanh(W x_i)``) whose last ``unread`` neurons are read by no
    neuron of the summing layer ``o`` (only by the output): the compiled module's fused gather
    reads the first rows of ``h``, and its backward sums nothing into the last ones."""
    rng = np.random.default_rng(seed)
    b = neurovec.GraphBuilder()
    x = b.facts("x", rng.normal(size=(n, width)))
    w = b.weight("W", rng.normal(size=(width, width)) / 4)
    h = b.layer("h", transformation="tanh")
    hs = [h.neuron([(x[i], w)]) for i in range(n)]
    o = b.layer("o")
    sums = [o.neuron([hs[i] for i in rng.integers(0, n - unread, rng.integers(1, 4))]) for _ in range(n // 2)]
    b.output(*sums, *hs[n - unread:])
    return b.build()


@pytest.fixture(scope="module")
def unread_graph():
    graph = unread_last_rows()
    return graph, outputs_and_grads(neurovec.ReferenceModule(graph, F64))


@pytest.mark.parametrize("binding", BINDINGS)
def test_compiled_module_with_unread_rows_equals_reference(unread_graph, binding):
    """Eagerly, and under torch.compile (aot_eager: dynamo and AOTAutograd, no code generation)."""
    graph, (out_ref, grads_ref) = unread_graph
    module = neurovec.compile(graph, "default", dtype=F64)
    assert "gather_sum(" in module.code, module.code
    run_module = torch.compile(module, backend="aot_eager", fullgraph=True) if binding == "traced" else module
    try:
        for n in THREADS:
            with num_threads(n):
                out, grads = outputs_and_grads(module, run_module)
            torch.testing.assert_close(out, out_ref, atol=1e-9, rtol=1e-9)
            torch.testing.assert_close(grads["W"], grads_ref["W"], atol=1e-9, rtol=1e-9,
                                       msg=lambda m: f"{n} threads, {binding}: {m}")
    finally:
        torch._dynamo.reset()


def outputs_and_grads(module, run_module=None):
    """``equivalence.outputs_and_grads``, with the outputs from ``run_module`` (e.g. compiled)."""
    out = (module if run_module is None else run_module)()
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    names = [n for n, p in module.weights.items() if isinstance(p, torch.nn.Parameter)]
    grads = torch.autograd.grad((out * projection).sum(), [module.weights[n] for n in names])
    return out.detach(), dict(zip(names, grads))
