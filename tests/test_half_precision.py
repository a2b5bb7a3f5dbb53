"""Half precision near float16's range: no preset overflows where the neuron-by-neuron order does not
(issue 23, NOTE: [half range] in compiler/settings.py).

Tolerance: float16 keeps 11 significant bits (unit roundoff 2^-11 = 4.9e-4) and bfloat16 8
(3.9e-3). Each output and gradient is a sum of a few dozen terms, so it may be off by a few
roundoffs of the sum of its terms' magnitudes: we allow 8 roundoffs of that magnitude (``scale``).
"""
import numpy as np
import pytest
import torch

import neurovec
from neurovec.compiler import Settings, build_program
from neurovec.engines.reference import ReferenceModule
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import FactLayer, Graph, NeuronLayer, Weight

ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def summed_before_weight(seed=0) -> Graph:
    """Each node sums six neighbours' ``W x`` with facts near 3e4 and W about 0.015: every product
    is about 1,350, every sum about 8,000. reorder_linear moves W after the sum, whose facts add up
    to 1.6e5: inf in float16."""
    rng = np.random.default_rng(seed)
    n, d, h, degree = 8, 3, 4, 6
    layers = [FactLayer("x", rng.uniform(2e4, 3e4, (n, d))),
              NeuronLayer("conv", np.full(n, degree), np.zeros(n * degree, int), rng.integers(0, n, n * degree),
                          np.zeros(n * degree, int)),
              NeuronLayer("pool", np.array([n]), np.full(n, 1), np.arange(n)),
              NeuronLayer("out", np.array([1]), np.array([2]), np.array([0]), np.array([1]))]
    weights = [Weight("W", rng.uniform(0.01, 0.02, (h, d))), Weight("V", rng.uniform(-0.5, 0.5, (1, h)))]
    return Graph(layers, weights, np.array([3]), np.array([0]))


def cancelling_sums(seed=0, k=4, d=3) -> Graph:
    """``diff_j = x_j - x_{k+j}``, two facts near 3e4 that nearly cancel, and a readout of their sum.
    compose_sums makes one sum of ``x_0 + ... + x_{k-1} - x_k - ...``, whose partial sums reach
    1e5: inf in float16, where each neuron is below 1e4."""
    rng = np.random.default_rng(seed)
    big = rng.uniform(2e4, 3e4, (k, d))
    x = np.concatenate([big, big - rng.uniform(1e3, 2e3, (k, d))])
    rows = np.stack([np.arange(k), k + np.arange(k)], 1).ravel()
    layers = [FactLayer("x", x),
              NeuronLayer("diff", np.full(k, 2), np.zeros(2 * k, int), rows, np.tile([0, 1], k)),
              NeuronLayer("pool", np.array([k]), np.full(k, 1), np.arange(k)),
              NeuronLayer("out", np.array([1]), np.array([2]), np.array([0]), np.array([2]))]
    weights = [Weight("plus", np.array(1.0), learnable=False), Weight("minus", np.array(-1.0), learnable=False),
               Weight("V", rng.uniform(0.5, 1.0, (2, d)))]
    return Graph(layers, weights, np.array([3]), np.array([0]))


# The second case keeps its facts replaceable (else they fold into one constant) and sums with
# sparse matrices, which compose_sums composes.
CASES = {"summed_before_weight": (summed_before_weight, {}),
         "cancelling_sums": (cancelling_sums, {"dynamic_facts": ("x",), "reduce_kernel": "sparse_mm",
                                               "transposed_reductions": False})}


def _outputs_and_grads(module):
    out = module()
    params = list(module.parameters())
    grads = torch.autograd.grad(out.float().sum(), params)
    return out.detach().double(), [g.double() for g in grads]


def _magnitudes(graph: Graph):
    """Outputs and gradients of the graph with every fact and weight made positive: the sums of the
    terms' magnitudes, against which the roundoff is measured."""
    layers = [FactLayer(l.name, np.abs(l.values)) if isinstance(l, FactLayer) else l for l in graph.layers]
    weights = [Weight(w.name, np.abs(w.value), w.learnable) for w in graph.weights]
    positive = Graph(layers, weights, graph.output_layer, graph.output_ordinal)
    return _outputs_and_grads(ReferenceModule(positive, torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_every_preset_stays_within_half_precision_of_float64(case, dtype):
    make, fields = CASES[case]
    graph = make()
    exact_out, exact_grads = _outputs_and_grads(ReferenceModule(graph, torch.float64))
    scale_out, scale_grads = _magnitudes(graph)
    tol = 8 * ROUNDOFF[dtype]
    _, by_neuron_grads = _outputs_and_grads(ReferenceModule(graph, dtype))
    for preset in neurovec.list_presets():
        module = neurovec.compile(graph, Settings.preset(preset, **fields), dtype)
        out, grads = _outputs_and_grads(module)
        assert torch.all((out - exact_out).abs() <= tol * scale_out), (preset, out, exact_out)
        for g, exact, scale, by_neuron in zip(grads, exact_grads, scale_grads, by_neuron_grads):
            finite = torch.isfinite(by_neuron)  # where the neuron-by-neuron order stays finite
            assert torch.all((g - exact).abs()[finite] <= tol * scale[finite]), (preset, g, exact)


@pytest.mark.parametrize("case, switch", [("summed_before_weight", "reorder_linear"),
                                          ("cancelling_sums", "compose_sums")])
def test_the_reassociating_pass_overflows_float16_unless_guarded(case, switch):
    # Why float16 compiles without them: with the pass, the module computes inf.
    make, fields = CASES[case]
    graph = make()
    settings = Settings(**fields)
    unguarded = CompiledModule(build_program(graph, settings), torch.float16)
    assert not torch.isfinite(unguarded()).all()
    assert getattr(settings, switch) and not getattr(settings.for_dtype(torch.float16), switch)
    assert torch.isfinite(neurovec.compile(graph, settings, torch.float16)()).all()
    assert settings.for_dtype(torch.bfloat16) is settings  # float32's exponent range: nothing to guard
