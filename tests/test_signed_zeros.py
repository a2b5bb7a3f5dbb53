"""Max and min over ties of 0.0 and -0.0 give IEEE 754-2019's zero, in every engine.

torch's kernels return either zero of a tie, depending on the kernel, the input order and even the
row width (NOTE: [signed zeros in max and min] in ``engines/functions.py``); ``1 / x`` then gives
inf or -inf. The reference engine and the generated modules both order -0.0 below 0.0.
"""
import numpy as np
import pytest
import torch

import neurovec
from neurovec.engines.functions import order_signed_zeros, preferred_zeros
from neurovec.engines.reference import ReferenceModule

from .equivalence import assert_equivalent

KERNELS = ["auto", "scatter", "segment", "dense"]


def signed_zero_ties(aggregation: str, width: tuple, counts=(2, 3, 40)):
    """Neurons reading alternately 1e6 * 0.0 and 1e6 * -0.0 (``counts`` inputs, starting with
    either), then ``inverse``: inf where the neuron is 0.0, -inf where it is -0.0."""
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.full((1,) + width, 1e6))
    zeros = [b.weight("plus", np.array(0.0), learnable=False), b.weight("minus", np.array(-0.0), learnable=False)]
    h = b.layer("h", aggregation=aggregation, transformation="inverse")
    b.output(*(h.neuron([(x[0], zeros[(i + first) % 2]) for i in range(k)]) for k in counts for first in (0, 1)))
    return b.build()


@pytest.mark.parametrize("width", [(), (3,), (16,)])  # rows of 16: torch's amax(0) vectorizes
@pytest.mark.parametrize("aggregation", ["max", "min"])
def test_ties_of_signed_zeros_give_the_ieee_zero(aggregation, width):
    graph = signed_zero_ties(aggregation, width)
    expected = torch.full((6,) + width, np.inf if aggregation == "max" else -np.inf, dtype=torch.float64)
    assert torch.equal(ReferenceModule(graph)(), expected)
    for preset in ("unoptimized", "default"):
        for kernel in KERNELS:
            module = neurovec.compile(graph, neurovec.Settings.preset(preset, reduce_kernel=kernel), torch.float64)
            assert torch.equal(module(), expected), (preset, kernel, module().tolist())


@pytest.mark.parametrize("aggregation", ["max", "min"])
def test_a_single_zero_keeps_its_sign(aggregation):
    # Only a tie is ordered: max{-0.0, -0.0} is -0.0, max{0.0} is 0.0.
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([0.0, -0.0, -1.0]))
    h = b.layer("h", aggregation=aggregation, transformation="inverse")
    b.output(h.neuron([x[0], x[0]]), h.neuron([x[1], x[1]]), h.neuron([x[1], x[2]] if aggregation == "max" else [x[0]]))
    graph = b.build()
    expected = [np.inf, -np.inf, -np.inf if aggregation == "max" else np.inf]
    for preset in ("unoptimized", "default"):
        assert neurovec.compile(graph, preset, dtype=torch.float64)().tolist() == expected
    assert ReferenceModule(graph)().tolist() == expected


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("aggregation", ["max", "min"])
def test_the_order_of_zeros_keeps_the_gradients(aggregation, kernel):
    # A tie of learnable 0.0 * 2 and -0.0 * 3: the extremum's gradient is split between them as
    # before (the reordering adds 0.0, derivative 1); a learnable bias keeps 1 / x finite.
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([2.0, 3.0, -5.0]))
    w = [b.weight("w0", np.array(0.0)), b.weight("w1", np.array(-0.0)), b.weight("w2", np.array(0.1))]
    h = b.layer("h", aggregation=aggregation)
    ties = h.neuron([(x[0], w[0]), (x[1], w[1])])
    other = h.neuron([(x[1], w[1]), (x[2], w[2]), (x[0], w[0])])
    out = b.layer("out", aggregation="max", transformation="inverse")
    bias = b.weight("bias", np.array(0.7))
    b.output(out.neuron([ties], bias=bias), out.neuron([other], bias=bias))
    graph = b.build()
    for preset in ("unoptimized", "default"):
        assert_equivalent(graph, neurovec.compile(graph, neurovec.Settings.preset(preset, reduce_kernel=kernel),
                                                  dtype=torch.float64))


@pytest.mark.parametrize("aggregation", ["max", "min"])
def test_ordering_the_zeros_passes_the_gradient_bit_for_bit(aggregation):
    """order_signed_zeros changes a tie's zero, never the gradient: an incoming -0.0 stays -0.0
    (a torch.where would add its other branch's +0.0 at every tie)."""
    xs = torch.tensor([[0.0, -0.0, 0.0, -0.0, 2.0, -0.0], [-0.0, 0.0, 0.0, -0.0, 1.0, 3.0]], dtype=torch.float64,
                      requires_grad=True)
    plain = xs.amax(0) if aggregation == "max" else xs.amin(0)
    preferred = preferred_zeros(xs, aggregation)
    ordered = order_signed_zeros(plain, preferred.amax(0) if aggregation == "max" else preferred.amin(0), aggregation)
    # Ties of both zeros give the IEEE zero; ties of one zero keep it.
    signs = [False, False, False, True, False, False] if aggregation == "max" else [True, True, False, True, False, True]
    assert torch.signbit(ordered).tolist() == signs
    for g in (torch.full((6,), -0.0, dtype=torch.float64), torch.tensor([-0.0, 0.0, -1.5, 2.0, -0.0, 0.0],
                                                                         dtype=torch.float64)):
        (expected,) = torch.autograd.grad(plain, xs, g, retain_graph=True)
        (actual,) = torch.autograd.grad(ordered, xs, g, retain_graph=True)
        assert torch.equal(actual, expected) and torch.equal(torch.signbit(actual), torch.signbit(expected))


@pytest.mark.parametrize("aggregation", ["max", "min"])
def test_the_reference_gradient_through_a_tie_keeps_its_sign(aggregation):
    """The reference engine's weight gradients through a tie of 0.0 and -0.0 are the chain rule's,
    signed zeros included: here the product's weight -0.0 sends -0.0 or 0.0 back into the tie."""
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([2.0, -3.0]))
    w = [b.weight("w0", np.array(0.0)), b.weight("w1", np.array(-0.0)), b.weight("wo", np.array(-0.0))]
    h = b.layer("h", aggregation=aggregation)
    out = b.layer("out")
    b.output(out.neuron([(h.neuron([(x[0], w[0]), (x[1], w[1])]), w[2])]))
    reference = ReferenceModule(b.build())
    params = [reference.weights[name] for name in ("w0", "w1")]
    grads = torch.autograd.grad(reference()[0], params)
    # The chain rule by hand: d out / d w_i = wo * (share of the tie) * x_i, both zeros tied.
    expected = [torch.tensor(-0.0 * 0.5 * 2.0, dtype=torch.float64), torch.tensor(-0.0 * 0.5 * -3.0, dtype=torch.float64)]
    assert [bool(torch.signbit(g)) for g in grads] == [bool(torch.signbit(e)) for e in expected]
