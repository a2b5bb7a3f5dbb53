"""Exact merging: inputs on which numeric (tolerance-based) isomorphic compression was wrong.

Each test compiles under ``default`` and compares with the neuron-by-neuron reference engine.
"""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.engines.reference import ReferenceModule

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite


def test_near_equal_facts_amplified_later_stay_apart():
    # h0 = w * 1, h1 = w * (1 + 2^-40): different values; d = 1e12 * h0 - 1e12 * h1 amplifies the
    # difference to about -1.2. Merging h0 and h1 gives 0.
    b = neurovec.GraphBuilder()
    w = b.weight("w", np.array(1.3))
    up = b.weight("up", np.array(1e12), learnable=False)
    down = b.weight("down", np.array(-1e12), learnable=False)
    x = b.facts("x", np.array([1.0, 1.0 + 2.0**-40]))
    h = b.layer("h")
    h0, h1 = h.neuron([(x[0], w)]), h.neuron([(x[1], w)])
    d = b.layer("d")
    b.output(d.neuron([(h0, up), (h1, down)]))
    graph = b.build()
    assert abs(ReferenceModule(graph)().item()) > 0.5
    assert_equivalent(graph, neurovec.compile(graph, "default", dtype=torch.float64))


@pytest.mark.parametrize("aggregation", ["max", "min", "prod"])
def test_signed_zeros_stay_apart(aggregation):
    # 1 / 0.0 = inf, but 1 / -0.0 = -inf: the facts 0.0 and -0.0 are different values.
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([0.0, -0.0]))
    h = b.layer("h", aggregation=aggregation, transformation="inverse")
    b.output(h.neuron([x[0]]), h.neuron([x[1]]))
    graph = b.build()
    module = neurovec.compile(graph, "default", dtype=torch.float64)
    assert module().tolist() == ReferenceModule(graph)().tolist() == [np.inf, -np.inf]


@pytest.mark.parametrize("aggregation", ["max", "min"])
def test_the_same_signed_zeros_in_another_order_are_the_same_value(aggregation):
    # 1e6 * 0.0 = 0.0 and 1e6 * -0.0 = -0.0: the two neurons read them in opposite orders. torch's
    # max of a tie returns the first zero (at this width): merging the neurons as equal multisets
    # gave inf twice where the reference gave inf, -inf. Max and min now order -0.0 < 0.0 in every
    # engine (NOTE: [signed zeros in max and min]), so the merge is exact.
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([1e6]))
    plus, minus = b.weight("plus", np.array(0.0), learnable=False), b.weight("minus", np.array(-0.0), learnable=False)
    h = b.layer("h", aggregation=aggregation, transformation="inverse")
    b.output(h.neuron([(x[0], plus), (x[0], minus)]), h.neuron([(x[0], minus), (x[0], plus)]))
    graph = b.build()
    expected = [np.inf, np.inf] if aggregation == "max" else [-np.inf, -np.inf]
    assert ReferenceModule(graph)().tolist() == expected
    for preset in neurovec.list_presets():
        assert neurovec.compile(graph, preset, dtype=torch.float64)().tolist() == expected, preset


def test_one_input_sum_of_negative_zero_then_inverse():
    # A sum starts from +0.0 (torch, and so the reference): sum{-0.0} = +0.0, and 1 / it = +inf.
    # Dropping the one-input sum as an identity would give -inf.
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([-0.0, 2.0]))
    h = b.layer("h", aggregation="sum")
    inv = b.layer("inv", aggregation="max", transformation="inverse")
    b.output(*(inv.neuron([h.neuron([x[k]])]) for k in range(2)))
    graph = b.build()
    for preset in neurovec.list_presets():
        module = neurovec.compile(graph, preset, dtype=torch.float64)
        assert module().tolist() == ReferenceModule(graph)().tolist() == [np.inf, 0.5], preset


def test_dominated_terms_keep_their_gradients():
    # a = 1e8 w0 + 1e-4 w1 and b = 1e8 w0 + 1e-4 w2 round to the same value at 32 mantissa bits,
    # but d a / d w1 = 1e-4 and d b / d w1 = 0.
    b = neurovec.GraphBuilder()
    w0, w1, w2 = (b.weight(f"w{k}", np.array(1.0 + k / 10)) for k in range(3))
    x = b.facts("x", np.array([1e8, 1e-4]))
    h = b.layer("h")
    n0 = h.neuron([(x[0], w0), (x[1], w1)])
    n1 = h.neuron([(x[0], w0), (x[1], w2)])
    out = b.layer("out")
    v0, v1 = b.weight("v0", np.array(0.5)), b.weight("v1", np.array(-2.0))
    b.output(out.neuron([(n0, v0)]), out.neuron([(n1, v1)]))
    graph = b.build()
    assert_equivalent(graph, neurovec.compile(graph, "default", dtype=torch.float64))


def no_nan(graph) -> bool:
    with torch.no_grad():
        values = ReferenceModule(graph).neuron_values()
    return not any(torch.isnan(v).any() for layer in values for v in layer)


@pytest.mark.parametrize("preset", neurovec.list_presets())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(graph=graphs(tricky_values=True))
def test_tricky_values_equal_reference(preset, graph):
    """Signed zeros, near-equal values and dominated terms, under every preset: outputs and gradients.

    Where some neuron is infinite (1 / 0), only the outputs are compared: the gradients are then
    NaN-defined (see ``test_equivalence.all_finite``).
    """
    assume(no_nan(graph))
    module = neurovec.compile(graph, preset, dtype=torch.float64)
    if all_finite(graph):
        assert_equivalent(graph, module)
    else:
        torch.testing.assert_close(module().detach(), ReferenceModule(graph)().detach(), atol=1e-9, rtol=1e-9)
