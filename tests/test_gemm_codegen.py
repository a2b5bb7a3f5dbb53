"""How the code generator writes shared-weight GEMMs (engines/torch_module.py): narrow
weights as a row-major copy of their transpose (NOTE: [weight gradient layout]) and a
shared bias inside the GEMM (NOTE: [bias in the GEMM]). The same function, fewer and
faster ops."""
import numpy as np
import pytest
import torch

import neurovec
from neurovec.engines.reference import ReferenceModule

from .equivalence import outputs_and_grads


def narrow_gnn(rows: int, features: int = 7, hidden: int = 16, seed: int = 0) -> neurovec.Graph:
    """``rows`` distinct fact rows of ``features`` values, a sum over 1-3 of them times one
    shared (hidden, features) weight per neuron, relu, then a mean of everything through a
    (1, hidden) weight."""
    rng = np.random.default_rng(seed)
    b = neurovec.GraphBuilder()
    x = b.facts("x", rng.normal(size=(rows, features)))
    W = b.weight("W", rng.normal(size=(hidden, features)))
    bias = b.weight("b", rng.normal(size=hidden))
    V = b.weight("V", rng.normal(size=(1, hidden)))
    h = b.layer("h", aggregation="sum", transformation="relu")
    hs = [h.neuron([(x[int(j)], W) for j in rng.integers(0, rows, 1 + i % 3)], bias=bias) for i in range(rows)]
    out = b.layer("out", aggregation="mean", transformation="sigmoid")
    b.output(*[out.neuron([(n, V) for n in hs[k::7]]) for k in range(7)])
    return b.build()


@pytest.fixture(scope="module")
def graph_and_reference():
    graph = narrow_gnn(1200)
    return graph, outputs_and_grads(ReferenceModule(graph, torch.float64))


@pytest.mark.parametrize("preset", neurovec.list_presets())
def test_narrow_weight_products_equal_the_reference(graph_and_reference, preset):
    graph, (out_ref, grad_ref) = graph_and_reference
    module = neurovec.compile(graph, preset, dtype=torch.float64)
    out, grad = outputs_and_grads(module)
    torch.testing.assert_close(out, out_ref, atol=1e-9, rtol=1e-9)
    for name, expected in grad_ref.items():
        torch.testing.assert_close(grad[name], expected, atol=1e-9, rtol=1e-9)


def test_narrow_weight_is_copied_transposed_where_rows_are_many(graph_and_reference):
    graph, _ = graph_and_reference
    code = neurovec.compile(graph).code
    assert "w['W'].T.contiguous()" in code, code


def test_no_copy_for_few_rows_or_wide_weights():
    assert ".contiguous()" not in neurovec.compile(narrow_gnn(200)).code  # few rows: both products cost µs
    assert ".contiguous()" not in neurovec.compile(narrow_gnn(1200, features=16)).code  # as fast either way


def test_bias_is_added_by_the_gemm(graph_and_reference):
    graph, _ = graph_and_reference
    code = neurovec.compile(graph).code
    assert "torch.addmm(w['b'], " in code and "+ w['b']" not in code, code


def one_neuron(transformation: str) -> neurovec.Graph:
    """``T(W . 0 + b)`` with ``W < 0`` and ``b = -0.0``: every product is -0.0."""
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.zeros((2, 3)))
    W = b.weight("W", -np.ones((4, 3)))
    bias = b.weight("b", np.full(4, -0.0))
    h = b.layer("h", transformation=transformation)
    b.output(h.neuron([(x[0], W)], bias=bias))
    return b.build()


def test_no_addmm_where_a_division_could_see_the_sign_of_a_zero():
    """addmm may start its sum from b = -0.0 and give -0.0 where the neuron's sum gives +0.0
    (float32, one row): equal values, but 1/x is then -inf instead of +inf."""
    graph = one_neuron("inverse")
    module = neurovec.compile(graph)
    assert "addmm" not in module.code
    assert torch.equal(module().detach(), ReferenceModule(graph, torch.float32)().detach())  # +inf, +inf
    assert "addmm" in neurovec.compile(one_neuron("relu")).code
