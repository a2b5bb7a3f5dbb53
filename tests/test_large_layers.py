"""What the generated code does differently for large layers (issue 27): a chunked product whose
backward asks MKL for the fast layout of the weight gradient (NOTE: [chunked product's weight gradient]),
gathers from constants as a C++ row copy (NOTE: [gathers from constants]). Exact against the reference
engine at 1, 2 and 4 threads, differentiable again."""
from __future__ import annotations

import re

import pytest
import torch

import neurovec
from neurovec import datasets
from neurovec.datasets import kg as kgmod
from neurovec.datasets import rgcn
from neurovec.engines import native, runtime, torch_module

from .equivalence import assert_equivalent, outputs_and_grads


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_chunked_product_equals_bmm_and_is_differentiable_again():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3 * 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(3, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    expected = torch.bmm(x.view(3, 5, 4), w.transpose(1, 2)).view(15, 2)
    torch.testing.assert_close(runtime.chunked_product(x, w, 3), expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: runtime.chunked_product(a, b, 3), (x, w))
    assert torch.autograd.gradgradcheck(lambda a, b: runtime.chunked_product(a, b, 3), (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1, 3, 16, 40])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_gather_rows_is_index_select_bitwise(dtype, width, n_threads, threads):
    if not native.available():
        pytest.skip("C++ kernels not built")
    threads(n_threads)
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(50, width, generator=gen).to(dtype)
    x[3] = -0.0  # a copy keeps the sign of a zero (a sum of one row from +0.0 would not)
    for index in (torch.randint(0, 50, (40_000,), generator=gen), torch.tensor([3, 3, 0])):
        for idx in (index, index.int()):
            y = runtime.gather_rows(x, idx)
            assert torch.equal(y, x.index_select(0, idx))
            assert torch.equal(torch.signbit(y), torch.signbit(x.index_select(0, idx)))
    x.requires_grad_(True)  # a source with a gradient: index_select, with its backward
    assert runtime.gather_rows(x, index).grad_fn is not None


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_large_layer_code_equals_the_reference(monkeypatch, threads, n_threads):
    """The relational layers' code with the threshold at 0: chunked_product in the forward, outputs and
    every weight gradient equal to the reference engine's (float64, 1e-9), differentiable again."""
    monkeypatch.setattr(torch_module, "_CHUNKED_FROM", 0)
    threads(n_threads)
    data = kgmod.synthetic_hetero(300, 3000, 12, n_features=4, n_classes=3, seed=5)
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, rgcn.RGCNSpec.create(4, 12, hidden=[5, 3]), seed=1)
    module = neurovec.compile(graph, dtype=torch.float64)
    assert module.code.count("chunked_product(") == 2 and "torch.bmm(" not in module.code
    assert_equivalent(graph, module)  # outputs and every weight's gradient
    projection = torch.randn(module().shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # Differentiable again: a gradient of a gradient, through both layers' products.
    weights = list(module.parameters())
    grads = torch.autograd.grad((module() * projection).sum(), weights, create_graph=True)
    second = torch.autograd.grad(sum((g * g).sum() for g in grads), weights, allow_unused=True)
    assert any(s is not None and bool(s.abs().sum() > 0) for s in second)


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_gathers_from_facts_as_row_copies_equal_the_reference(tu_dir, monkeypatch, threads, n_threads):
    """MUTAG GCN unoptimized gathers its node features from a fact: with the threshold at 0 that is
    gather_rows, and the module equals the reference engine."""
    monkeypatch.setattr(torch_module, "_COPIED_FROM", 0)
    threads(n_threads)
    graph = datasets.gcn(datasets.load_tu("MUTAG", tu_dir), hidden=8, layers=2, samples=[0, 1, 2, 3])
    module = neurovec.compile(graph, "unoptimized", dtype=torch.float64)
    assert "gather_rows(" in module.code
    assert_equivalent(graph, module)


def test_row_scale_plus_bias_is_one_addcmul(threads):
    """A node-level GCN whose normalisation stays a per-row scale after the sparse sum (products-like at
    1/500, with ``reduce_coefficients`` off: on, the scale goes into the sum's coefficients instead):
    ``torch.addcmul(bias, scale[:, None], sum)`` in the forward, whose outputs and gradients equal
    those of the same program written as ``scale[:, None] * sum + bias`` (what the equivalence suites check
    against the reference engine) at 1, 2 and 4 threads."""
    from neurovec.benchmarks.node_scale import dataset_sizes
    from neurovec.datasets import gnn
    from neurovec.datasets.synthetic import rmat_dataset

    data = rmat_dataset(**dataset_sizes("products-like", 0.002), seed=0)
    graph = gnn.build_gnn(data, gnn.GNNSpec.create("gcn", data, 4, 3), None, 0)
    module = neurovec.compile(graph, {"reduce_coefficients": False}, dtype=torch.float64)
    fused = re.findall(r"torch\.addcmul\((.+?), (\w+\[:, None\]), (\w+)\)", module.code)
    assert len(fused) == 3, module.code  # one per layer
    code = module.code
    for bias, scale, x in fused:
        code = code.replace(f"torch.addcmul({bias}, {scale}, {x})", f"{scale} * {x} + {bias}")
    separate = torch_module._rebuild_module(code, module.__getstate__())
    for n_threads in (1, 2, 4):
        threads(n_threads)
        out, grads = outputs_and_grads(module)
        expected, expected_grads = outputs_and_grads(separate)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        for name, grad in expected_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-12, atol=1e-12, msg=name)
