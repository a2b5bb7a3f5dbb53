"""The chunked products' fused kernels (issue 27, hetero-100): a chunked product in C++ (NOTE: [a chunked
product in C++]); a chunked product of constant inputs summed by a gather sum takes its weights' gradient
chunk by chunk from the sum's gradient (NOTE: [a chunked product's weights' gradient from its readers]); a
chunked product of a gather sum that nothing else reads is one compiled op that never writes the gathered
rows, and sums both gradients in one pass over the source (NOTE: [a chunked product of gathered rows,
compiled]). Each is checked against the same
ops without the fusion (float64, 1, 2 and 4 threads), differentiable again, and, in a compiled RGCN, against
the reference engine."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec.datasets import kg as kgmod
from neurovec.datasets import rgcn
from neurovec.engines import kernels, native, runtime, torch_module
from neurovec.engines.reference import ReferenceModule

from .equivalence import assert_equivalent

pytestmark = pytest.mark.skipif(not native.available(), reason="C++ kernels not built")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _csr(n_rows: int, n_sources: int, weighted: bool, dtype, seed: int, unread: int = 0) -> runtime.CSRIndices:
    """A random gather sum into ``n_rows`` rows from the first ``n_sources - unread`` sources."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 4, size=n_rows)
    index = rng.integers(0, n_sources - unread, size=int(counts.sum()))
    values = rng.standard_normal(index.size) if weighted else None
    return runtime.CSRIndices(kernels.GatherSum.from_index(index, counts, n_sources, values, dtype=dtype))


def _grads(y, inputs, seed=1):
    """y's outputs, first gradients (with a graph) and second gradients (of their squares, in ``gy``)."""
    gy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    first = torch.autograd.grad(y, inputs, gy, create_graph=True)
    second = torch.autograd.grad(sum((g * g).sum() for g in first), [gy])
    plain = torch.autograd.grad(y, inputs, gy.detach(), retain_graph=True)  # the C++ kernels (no graph)
    return [y, *first, *second, *plain]


def _close(a, b, dtype):
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    for u, v in zip(a, b):
        torch.testing.assert_close(u.detach(), v.detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(7, 13, 5, 3), (9, 24, 16, 16), (4, 10, 16, 4), (3, 8, 32, 8)])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_chunk_product_equals_bmm(dtype, shape, n_threads, threads):
    """neurovec_cpu::chunk_product (fixed widths: rows_times_weight; else one at::mm a chunk) is what
    chunked_product runs eagerly, equal to the batched GEMM it replaces; its backward is autograd's."""
    threads(n_threads)
    chunks, size, i, o = shape
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(chunks * size, i, generator=gen, dtype=dtype, requires_grad=True)
    w = torch.randn(chunks, o, i, generator=gen, dtype=dtype, requires_grad=True)
    y = runtime.chunked_product(x, w, chunks)
    assert torch.equal(y, torch.ops.neurovec_cpu.chunk_product(x, w, chunks))
    plain = torch.bmm(x.view(chunks, size, i), w.transpose(1, 2)).reshape(chunks * size, o)
    _close(_grads(y, [x, w]), _grads(plain, [x, w]), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(7, 13, 5, 3), (9, 24, 16, 16), (4, 10, 16, 4)])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_weights_gradient_from_the_sums_gradient(dtype, weighted, shape, n_threads, threads):
    threads(n_threads)
    chunks, size, i, o = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(chunks * size, i, generator=gen, dtype=dtype)  # constant: no gradient
    w = torch.randn(chunks, o, i, generator=gen, dtype=dtype, requires_grad=True)
    bias = torch.randn(o, generator=gen, dtype=dtype, requires_grad=True)
    csr = _csr(31, chunks * size, weighted, dtype, seed=size, unread=3)  # the last rows (padding) unread
    fused = runtime.gather_sum(runtime.chunked_product(x, w, chunks), csr, bias)
    assert type(fused.grad_fn).__name__ == "_ChunkedProductSumBackward"
    plain = runtime.gather_sum(runtime.chunked_product(x, w, chunks) * 1, csr, bias)  # `* 1`: not recognised
    assert type(plain.grad_fn).__name__ != "_ChunkedProductSumBackward"
    _close(_grads(fused, [w, bias]), _grads(plain, [w, bias]), dtype)
    assert torch.equal(fused, plain)  # the forward is the same sum, bit for bit


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(7, 13, 5, 3), (9, 24, 16, 4), (4, 10, 16, 16), (3, 8, 32, 8)])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_chunked_product_of_gathered_rows(dtype, weighted, shape, n_threads, threads):
    """gathered_chunked_product (the C++ forward: fixed widths and at::mm; one backward for both gradients)
    against the gather sum and the chunked product it replaces."""
    threads(n_threads)
    chunks, size, i, o = shape
    gen = torch.Generator().manual_seed(3)
    source = torch.randn(30, i, generator=gen, dtype=dtype, requires_grad=True)
    w = torch.randn(chunks, o, i, generator=gen, dtype=dtype, requires_grad=True)
    csr = _csr(chunks * size, 30, weighted, dtype, seed=i + o, unread=2)  # sources nobody reads get 0
    fused = runtime.gathered_chunked_product(source * 1, csr, w, chunks)
    assert type(fused.grad_fn).__name__ == "_GatheredProductBackward"
    plain = runtime.chunked_product(runtime.gather_sum(source * 1, csr) * 1, w, chunks)
    assert type(plain.grad_fn).__name__ == "_ChunkedProductBackward"
    _close(_grads(fused, [source, w]), _grads(plain, [source, w]), dtype)
    with torch.no_grad():  # either gradient alone
        gy = torch.randn(fused.shape, generator=gen, dtype=dtype)
    for wanted in ([source], [w]):
        _close(torch.autograd.grad(runtime.gathered_chunked_product(source, csr, w, chunks), wanted, gy),
               torch.autograd.grad(plain, wanted, gy, retain_graph=True), dtype)


def test_chunked_product_of_gathered_rows_elsewhere_is_the_two_ops(monkeypatch):
    """Where the C++ kernels do not run, the op is the gather sum and the chunked product themselves."""
    source = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    csr = _csr(12, 12, True, torch.float64, seed=0)
    fused = runtime.gathered_chunked_product(source, csr, w, 3)
    monkeypatch.setattr(runtime.ops, "native_ok", lambda x: False)
    plain = runtime.gathered_chunked_product(source, csr, w, 3)
    assert type(plain.grad_fn).__name__ == "_ChunkedProductBackward"
    _close(_grads(fused, [source, w]), _grads(plain, [source, w]), torch.float64)


def test_other_readers_of_the_fused_product_keep_their_gradients():
    """The product read by something else too: that reader's gradient still flows."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    csr = _csr(5, 12, False, torch.float64, seed=0)
    torch.autograd.gradcheck(lambda w: runtime.gather_sum(runtime.chunked_product(x, w, 3), csr).sum()
                             + runtime.chunked_product(x, w, 3).pow(2).sum(), (w,))


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_rgcn_with_the_fused_backwards_equals_the_reference(monkeypatch, threads, n_threads):
    """A small RGCN with the thresholds at 0: the fused backward of layer 1 and the gathered product of layer 2 in
    its graph, outputs and weight
    gradients equal to the reference engine's (float64, 1e-9), differentiable again."""
    monkeypatch.setattr(torch_module, "_CHUNKED_FROM", 0)
    monkeypatch.setattr(kernels, "_GATHER_MIN_ELEMENTS", 0)  # layer 2's gather as a gather sum, as at scale
    monkeypatch.setattr(kernels, "_GATHER_MIN_FEATURES", 0)
    threads(n_threads)
    data = kgmod.synthetic_hetero(300, 3000, 12, n_features=4, n_classes=3, seed=5)
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, rgcn.RGCNSpec.create(4, 12, hidden=[5, 3]), seed=1)
    module = neurovec.compile(graph, dtype=torch.float64)
    assert module.code.count("chunked_product(") == 2 and "index_select(0, self.idx_conv2_lin_x" not in module.code
    assert "gathered_chunked_product(conv2_x_cat, self.csr_conv2_lin_x" in module.code
    seen, pending = set(), [module().grad_fn]
    while pending:
        node = pending.pop()
        if node is not None and node not in seen:
            seen.add(node)
            pending.extend(n for n, _ in node.next_functions)
    kinds = {type(n).__name__ for n in seen}
    assert {"_ChunkedProductSumBackward", "_GatheredProductBackward"} <= kinds, kinds
    assert_equivalent(graph, module)  # outputs and every weight's gradient
    reference = ReferenceModule(graph, torch.float64)
    projection = torch.randn(module().shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    weights = list(module.parameters())
    grads = torch.autograd.grad((module() * projection).sum(), weights, create_graph=True)
    ref_grads = torch.autograd.grad((reference() * projection).sum(), list(reference.weights.parameters()),
                                    create_graph=True)
    second = torch.autograd.grad(sum((g * g).sum() for g in grads), weights, allow_unused=True)
    ref_second = torch.autograd.grad(sum((g * g).sum() for g in ref_grads), list(reference.weights.parameters()),
                                     allow_unused=True)
    names = [n for n, _ in reference.weights.named_parameters()]
    mine = dict(zip([n for n, _ in module.weights.named_parameters()], second))
    for name, s in zip(names, ref_second):
        if s is not None and mine.get(name) is not None:
            torch.testing.assert_close(mine[name], s, rtol=1e-9, atol=1e-9, msg=name)


def test_kernels_check_their_shapes():
    ops = torch.ops.neurovec_cpu
    csr = _csr(4, 10, False, torch.float64, seed=0)
    with pytest.raises(RuntimeError, match="chunk_weight_grad"):
        ops.chunk_weight_grad(torch.ones(4, 2, dtype=torch.float64), csr.t_ptr, csr.t_col, None,
                              torch.ones(9, 3, dtype=torch.float64), 2)
    with pytest.raises(RuntimeError, match="chunk_product"):  # 10 rows in 3 chunks
        ops.chunk_product(torch.ones(10, 3, dtype=torch.float64), torch.ones(3, 2, 3, dtype=torch.float64), 3)
    with pytest.raises(RuntimeError, match="gathered_chunk_product"):  # 4 rows in 3 chunks
        ops.gathered_chunk_product(torch.ones(10, 3, dtype=torch.float64), csr.ptr, csr.index, None,
                                   torch.ones(3, 2, 3, dtype=torch.float64), 3)
    with pytest.raises(RuntimeError, match="gathered_chunk_backward"):
        ops.gathered_chunk_backward(torch.ones(4, 2, dtype=torch.float64), torch.ones(9, 3, dtype=torch.float64),
                                    torch.ones(2, 2, 3, dtype=torch.float64), csr.t_ptr, csr.t_col, None, True, True)


@pytest.mark.slow
def test_torch_compiled_rgcn_with_the_thresholds_at_zero_equals_eager(monkeypatch):
    """Under torch.compile the fused backwards are not taken (dynamo reads no grad_fn): the compiled module's
    outputs and weight gradients equal the eager (fused) module's."""
    monkeypatch.setattr(torch_module, "_CHUNKED_FROM", 0)
    monkeypatch.setattr(kernels, "_GATHER_MIN_ELEMENTS", 0)
    monkeypatch.setattr(kernels, "_GATHER_MIN_FEATURES", 0)
    data = kgmod.synthetic_hetero(300, 3000, 12, n_features=4, n_classes=3, seed=5)
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, rgcn.RGCNSpec.create(4, 12, hidden=[5, 3]), seed=1)
    module = neurovec.compile(graph, dtype=torch.float64)
    out = module()
    grads = torch.autograd.grad(out.pow(2).sum(), list(module.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(module)
    out_c = compiled()
    grads_c = torch.autograd.grad(out_c.pow(2).sum(), list(module.parameters()))
    torch.testing.assert_close(out_c, out, rtol=1e-9, atol=1e-9)
    for g, h in zip(grads_c, grads):
        torch.testing.assert_close(g, h, rtol=1e-9, atol=1e-9)
