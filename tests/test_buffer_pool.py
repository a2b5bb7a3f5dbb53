"""Large dense outputs in a pool of the program's own (NOTE: [a pool of large outputs] in
engines/runtime.py): ``dense`` and ``relu_`` give the plain ops' values, a block is handed out again
only once nothing holds it (a kept output, a view, a tensor saved for backward, a leaf's ``.grad``),
and the generated code that uses them equals the reference engine at 1, 2 and 4 threads,
differentiable again, pickled and under torch.compile."""
from __future__ import annotations

import pickle
import re

import pytest
import torch

import neurovec
from neurovec import datasets
from neurovec.datasets.synthetic import rmat_dataset
from neurovec.engines import runtime, torch_module

from .equivalence import assert_equivalent, outputs_and_grads


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _inputs(seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(50, 6, generator=gen, dtype=dtype)
    w = torch.randn(4, 6, generator=gen, dtype=dtype, requires_grad=True)
    b = torch.randn(4, generator=gen, dtype=dtype, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_and_relu_equal_the_plain_ops_bitwise(dtype):
    pool = runtime.BufferPool()
    for seed in range(3):  # the second and third calls write into the first one's blocks
        x, w, b = _inputs(seed, dtype)
        x.requires_grad_(True)
        y = runtime.relu_(runtime.dense(x, w.T, b, pool), pool)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=dtype)
        grads = torch.autograd.grad((y * g).sum(), (x, w, b))
        x2, w2, b2 = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
        expected = torch.relu_(torch.addmm(b2, x2, w2.T))
        expected_grads = torch.autograd.grad((expected * g).sum(), (x2, w2, b2))
        assert torch.equal(y, expected)
        for actual, wanted in zip(grads, expected_grads):
            torch.testing.assert_close(actual, wanted, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)
    assert 0 < len(pool) <= 4  # the blocks were handed out again, not made anew


def test_dense_is_differentiable_again():
    pool = runtime.BufferPool()
    x, w, b = _inputs(1)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, c, d: runtime.relu_(runtime.dense(a, c.T, d, pool), pool), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda a, c, d: runtime.dense(a, c.T, d, pool), (x, w, b))


def test_a_held_block_is_never_handed_out_again():
    pool = runtime.BufferPool()
    x, w, b = _inputs(2)
    with torch.enable_grad():
        kept = runtime.dense(x, w.T, b, pool)
        value = kept.detach().clone()
        second = runtime.dense(x * 2, w.T, b, pool)
        assert second.data_ptr() != kept.data_ptr()  # the caller keeps the first output
        assert torch.equal(kept, value)
        freed = second.data_ptr()
        del second
        assert runtime.dense(x, w.T, b, pool).data_ptr() == freed  # nothing holds it: handed out again

        view, kept_ptr = kept[1:], kept.data_ptr()
        del kept
        assert runtime.dense(x * 3, w.T, b, pool).data_ptr() != kept_ptr  # a view of it holds it
        assert torch.equal(view, value[1:])
        del view

        saved = runtime.dense(x, w.T, b, pool)
        ptr = saved.data_ptr()
        loss = (saved * saved).sum()  # autograd saves the output for the product's backward
        del saved
        other = runtime.dense(x * 5, w.T, b, pool)
        assert other.data_ptr() != ptr
        (grad_w,) = torch.autograd.grad(loss, w)
        w2 = w.detach().clone().requires_grad_(True)
        (expected,) = torch.autograd.grad((torch.addmm(b, x, w2.T) ** 2).sum(), w2)
        torch.testing.assert_close(grad_w, expected, rtol=1e-12, atol=0)


def test_a_leafs_gradient_is_never_overwritten():
    """A gradient that autograd keeps as a leaf's ``.grad`` (it may keep the tensor the backward made)
    holds its block: the next backward accumulates into it, and must not have written it meanwhile."""
    pool = runtime.BufferPool()
    x, w, b = _inputs(3)
    x.requires_grad_(True)
    for _ in range(2):
        runtime.dense(x, w.T, b, pool).sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    for _ in range(2):
        torch.addmm(b, x2, w.T).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=0)


def _node_graph(model: str):
    data = rmat_dataset("arxiv-like", nodes=300, edges=2000, features=8, classes=3, seed=0)
    return getattr(datasets, model)(data, hidden=6, layers=3, dropout=0.0)


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_large_value_code_equals_the_reference(model, monkeypatch, threads, n_threads):
    """A node-level GCN / SAGE with the threshold at 0: its GEMMs are ``dense`` and its ReLUs ``relu_``;
    outputs and every weight gradient equal the reference engine's (float64, 1e-9) on a first and a
    second step (the second in the first one's blocks), differentiable again."""
    monkeypatch.setattr(torch_module, "_LARGE_VALUES", 0)
    threads(n_threads)
    graph = _node_graph(model)
    module = neurovec.compile(graph, dtype=torch.float64)
    assert "dense(" in module.code and "relu_(" in module.code, module.code
    if model == "sage":  # NOTE: [additions into a pooled output]: the two terms of its middle layer, the
        # neighbours' one a sparse sum added in the same pass (NOTE: [a sum added into a pooled output])
        assert ".add_(" in module.code or "= gather_sum_into(" in module.code, module.code
        # NOTE: [a shared value's GEMM first]: the root term's product before the neighbours' sum
        shared = re.findall(r"dense\((\w+),", module.code)
        firsts = [v for v in shared if f"gather_sum({v}," in module.code]
        assert firsts, module.code
        for value in firsts:
            assert module.code.index(f"dense({value},") < module.code.index(f"gather_sum({value},"), module.code
    first = outputs_and_grads(module)
    assert_equivalent(graph, module)
    second = outputs_and_grads(module)
    assert torch.equal(first[0], second[0])
    for name, grad in first[1].items():
        assert torch.equal(grad, second[1][name]), name
    weights = list(module.parameters())
    projection = torch.randn(module().shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = torch.autograd.grad((module() * projection).sum(), weights, create_graph=True)
    again = torch.autograd.grad(sum((g * g).sum() for g in grads), weights, allow_unused=True)
    assert any(a is not None and bool(a.abs().sum() > 0) for a in again)


def test_large_value_code_pickles_and_traces(monkeypatch):
    """The generated code with ``dense`` / ``relu_`` survives pickling (a new program, a new pool) and
    dynamo (torch.compile, where they are the plain ops), with the same values."""
    monkeypatch.setattr(torch_module, "_LARGE_VALUES", 0)
    module = neurovec.compile(_node_graph("gcn"), dtype=torch.float64)
    assert "dense(" in module.code
    out, grads = outputs_and_grads(module)
    copy = pickle.loads(pickle.dumps(module))
    out2, grads2 = outputs_and_grads(copy)
    assert torch.equal(out, out2)
    traced = torch.compile(module, backend="eager", fullgraph=True)
    out3, grads3 = outputs_and_grads(traced)
    torch.testing.assert_close(out3, out, rtol=1e-12, atol=1e-12)
    for name, grad in grads.items():
        assert torch.equal(grad, grads2[name]), name
        torch.testing.assert_close(grads3[name], grad, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("how", ["compiled", "unpickled"])
def test_a_freed_module_lets_go_of_its_pool(monkeypatch, how):
    """A program's class (and so its pool) lives until the garbage collector finds its cycles; the pool
    lets go of its blocks as soon as its module is freed, while a tensor still holding a block keeps it."""
    monkeypatch.setattr(torch_module, "_LARGE_VALUES", 0)
    module = neurovec.compile(_node_graph("gcn"), dtype=torch.float64)
    if how == "unpickled":
        module = pickle.loads(pickle.dumps(module))
    pool = type(module).buffer_pool
    kept, _ = outputs_and_grads(module)
    assert len(pool) > 0
    del module
    assert len(pool) == 0
    assert torch.isfinite(kept).all()  # the kept output's block stays with it


def _pool_pointers(pool: runtime.BufferPool) -> set[int]:
    return {block.data_ptr() for blocks in pool._blocks.values() for block in blocks}


def _csr(seed: int, sources: int = 40, segments: int = 30, dtype=torch.float64) -> runtime.CSRIndices:
    from neurovec.engines import kernels
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 5, (segments,), generator=gen)
    index = torch.randint(0, sources, (int(counts.sum()),), generator=gen)
    values = torch.randn(index.shape, generator=gen, dtype=torch.float64)
    return runtime.CSRIndices(kernels.GatherSum.from_index(index, counts, sources, values, dtype=dtype))


@pytest.mark.skipif(not neurovec.engines.ops.native_ok(torch.zeros(1)), reason="needs the C++ kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gather_sum_into_the_pool_equals_the_operator_bitwise(dtype):
    """NOTE: [a pool of gather sums' outputs]: with a pool, a marked sum's output and its source's gradient
    are blocks of the pool, handed out again on the next call; values and gradients are the C++
    operator's bit for bit, the bias's to rounding."""
    csr = _csr(0, dtype=dtype)
    csr.pool_output = csr.pool_gradient = True
    pool = runtime.BufferPool()
    gen = torch.Generator().manual_seed(1)
    pointers = []
    for _ in range(3):
        x = torch.randn(40, 7, generator=gen, dtype=dtype, requires_grad=True)
        bias = torch.randn(7, generator=gen, dtype=dtype, requires_grad=True)
        g = torch.randn(30, 7, generator=gen, dtype=dtype)
        y = runtime.gather_sum(x, csr, bias, pool=pool)
        assert y.untyped_storage().data_ptr() in _pool_pointers(pool)
        grads = torch.autograd.grad((y * g).sum(), (x, bias))
        assert grads[0].untyped_storage().data_ptr() in _pool_pointers(pool)
        x2, bias2 = (t.detach().clone().requires_grad_(True) for t in (x, bias))
        expected = runtime.gather_sum(x2, csr, bias2)  # no pool: the C++ operator and its autograd
        assert torch.equal(y, expected)
        grad_x, grad_bias = torch.autograd.grad((expected * g).sum(), (x2, bias2))
        assert torch.equal(grads[0], grad_x)
        # the bias's gradient is a GEMV (runtime._row_sum): the same sums in another order
        torch.testing.assert_close(grads[1], grad_bias, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)
        pointers.append(y.data_ptr())
        del y, grads
    assert len(set(pointers)) == 1  # the first call's block, handed out again
    assert len(pool) == 2


@pytest.mark.skipif(not neurovec.engines.ops.native_ok(torch.zeros(1)), reason="needs the C++ kernels")
def test_pooled_gather_sum_keeps_held_blocks_and_is_differentiable_again():
    csr = _csr(2)
    csr.pool_output = csr.pool_gradient = True
    pool = runtime.BufferPool()
    x = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        kept = runtime.gather_sum(x, csr, pool=pool)
        value = kept.detach().clone()
        second = runtime.gather_sum(x * 2, csr, pool=pool)
        assert second.data_ptr() != kept.data_ptr()
        assert torch.equal(kept, value) and torch.equal(second, 2 * value)
    assert torch.autograd.gradcheck(lambda a: runtime.gather_sum(a, csr, pool=pool), (x,))
    assert torch.autograd.gradgradcheck(lambda a: runtime.gather_sum(a, csr, pool=pool) ** 2, (x,))
    with torch.no_grad():  # no graph: the operator's own fresh output, as before
        assert runtime.gather_sum(x, csr, pool=pool).untyped_storage().data_ptr() not in _pool_pointers(pool)


@pytest.mark.skipif(not neurovec.engines.ops.native_ok(torch.zeros(1)), reason="needs the C++ kernels")
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_large_gather_sums_use_the_programs_pool(model, monkeypatch):
    """A node-level program's large sparse sums write into its pool, and a source that others read too
    gets its gradient in a block of its own (autograd adds the other gradients into it, in place);
    a step equals the same step with every sum unpooled (its outputs bit for bit)."""
    monkeypatch.setattr(torch_module, "_LARGE_VALUES", 0)
    module = neurovec.compile(_node_graph(model), dtype=torch.float64)
    sums = {name: csr for name, csr in module.named_modules() if isinstance(csr, runtime.CSRIndices)}
    assert sums and all(csr.pool_output for csr in sums.values())
    if model == "sage":  # the first layer's output is read by the root term's product and the neighbours' mean
        assert any(not csr.pool_gradient for csr in sums.values()) and any(csr.pool_gradient for csr in sums.values())
    first = outputs_and_grads(module)
    pool = type(module).buffer_pool
    assert module().untyped_storage().data_ptr() in _pool_pointers(pool)  # the output is the last layer's sum
    for csr in sums.values():
        csr.pool_output = csr.pool_gradient = False
    unpooled = outputs_and_grads(module)
    assert torch.equal(first[0], unpooled[0])
    for name, grad in first[1].items():  # a bias's gradient is a GEMV where pooled (runtime._row_sum)
        torch.testing.assert_close(grad, unpooled[1][name], rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.skipif(not neurovec.engines.ops.native_ok(torch.zeros(1)), reason="needs the C++ kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [4, 7, 40])  # a fixed width (registers), any width (a row of its own)
def test_gather_sum_into_equals_add_of_the_sum_bitwise(dtype, width, threads):
    """NOTE: [a sum added into a pooled output]: ``gather_sum_into(into, x, csr)`` is
    ``into.add_(gather_sum(x, csr))`` bit for bit, values and gradients, at 1 and 2 threads, and
    differentiable again."""
    csr = _csr(3, sources=200, segments=150, dtype=dtype)
    csr.pool_gradient = True
    pool = runtime.BufferPool()
    gen = torch.Generator().manual_seed(4)
    for n_threads in (1, 2):
        threads(n_threads)
        base = torch.randn(150, width, generator=gen, dtype=dtype, requires_grad=True)
        x = torch.randn(200, width, generator=gen, dtype=dtype, requires_grad=True)
        g = torch.randn(150, width, generator=gen, dtype=dtype)
        y = runtime.gather_sum_into(base * 1, x, csr, pool=pool)
        assert y.grad_fn.name().startswith("_GatherSumInto")
        grads = torch.autograd.grad((y * g).sum(), (base, x))
        expected = (base * 1).add_(runtime.gather_sum(x, csr))
        assert torch.equal(y, expected)
        for actual, wanted in zip(grads, torch.autograd.grad((expected * g).sum(), (base, x))):
            assert torch.equal(actual, wanted)
    base = torch.randn(150, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(200, 3, dtype=torch.float64, requires_grad=True)
    csr64 = _csr(3, sources=200, segments=150)
    assert torch.autograd.gradgradcheck(lambda a, b: runtime.gather_sum_into(a * 1, b, csr64, pool=pool) ** 2, (base, x))


@pytest.mark.skipif(not neurovec.engines.ops.native_ok(torch.zeros(1)), reason="needs the C++ kernels")
def test_sage_adds_its_neighbours_sum_into_the_root_term(monkeypatch, threads):
    """A SAGE whose neighbours' term is a sparse sum (wide enough for the fused gather) writes it as
    ``gather_sum_into`` and equals the reference engine (float64, 1e-9) at 1 and 2 threads."""
    monkeypatch.setattr(torch_module, "_LARGE_VALUES", 0)
    data = rmat_dataset("arxiv-like", nodes=2500, edges=12000, features=8, classes=3, seed=0)
    graph = datasets.sage(data, hidden=8, layers=3, dropout=0.0)
    module = neurovec.compile(graph, dtype=torch.float64)
    assert "= gather_sum_into(" in module.code, module.code
    for n_threads in (1, 2):
        threads(n_threads)
        assert_equivalent(graph, module)
