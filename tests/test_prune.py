"""Neurons no output reaches are not computed (compiler/prune.py)."""
import numpy as np
import torch
from hypothesis import HealthCheck, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.prune import prune_unreachable, reachable
from neurovec.compiler.settings import Settings
from neurovec.compiler.vectorizer import vectorize
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import FactLayer, Graph, NeuronLayer, Weight

from .equivalence import assert_equivalent, outputs_and_grads
from .strategies import graphs


def _layer(name, counts, src, ordinal, weight=None, transformation="identity", bias=None):
    return NeuronLayer(name, counts=counts, input_layer=src, input_ordinal=ordinal, input_weight=weight,
                       bias=bias, transformation=transformation)


def test_unread_sqrt_at_zero_gives_no_nan_gradient():
    # layer1 neuron 1 is sqrt(-0.0 * layer0[1]), read by no output. Computed, its backward is
    # 0 * (1 / (2 sqrt(0))) = 0 * inf = NaN in the gradient of w1 (through layer0[1]), which the
    # output layer1 neuron 0 = sqrt(layer0[1]) does use.
    graph = Graph(
        layers=[FactLayer("fact0", np.array([[-1.0, -1e6]])),
                _layer("layer0", [1, 2, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, -1, 1, -1]),
                _layer("layer1", [1, 1], [1, 1], [1, 1], [-1, 2], "sqrt"),
                _layer("layer2", [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0])],
        weights=[Weight("w0", np.array([1.0, 1e6]), learnable=False),
                 Weight("w1", np.array([[-0.68, -0.44], [-0.40, -1.10]])),
                 Weight("w2", np.array(-0.0), learnable=False)],
        output_layer=[1, 2, 1], output_ordinal=[0, 0, 0])
    for preset in ("upward-03-rel-0.1", "unoptimized", "default"):
        module = neurovec.compile(graph, Settings.preset(preset), dtype=torch.float64)
        assert not outputs_and_grads(module)[1]["w1"].isnan().any(), preset
        assert_equivalent(graph, module)


def test_unread_sqrt_at_zero_next_to_a_used_neuron_gives_no_nan_gradient():
    # layer2 neuron 0 = sqrt(w6 * relu(...)) is read by no output, and the relu is 0 here: its
    # backward puts 0 * inf = NaN into w6's gradient, which the output layer2 neuron 3 does use.
    fixed = [[[0.023, 0.437], [-0.589, -0.130], [-0.386, 0.479]], [[0.032, -0.234], [-0.626, -0.206], [0.007, -0.220]],
             [[1.035, 0.805], [-2.169, -1.511], [-0.140, -0.338]], [[0.171, 0.174], [1.694, -0.890], [-0.302, 1.634]],
             [[0.517, 0.530], [-0.411, -1.318], [0.134, 0.087]], [[-0.982, -0.547], [-0.058, -0.756], [-0.079, 0.076]]]
    graph = Graph(
        layers=[FactLayer("fact0", np.array([[0.346, 0.822], [0.330, -1.303]])),
                FactLayer("fact1", np.array([[0.905, 0.446, -0.537]])),
                FactLayer("fact2", np.array([[0.581, 0.365, 0.294]])),
                _layer("layer0", [1, 2, 4], [0, 0, 0, 0, 0, 0, 1], [0] * 7, [0, 1, 2, 3, 4, 5, -1]),
                _layer("layer1", [1], [0], [1], transformation="relu"),
                _layer("layer2", [1, 2, 4, 4], [4] + [0] * 10, [0] * 11, [6, -1, -1, -1, -1, -1, -1, 6, -1, -1, -1],
                       "sqrt"),
                _layer("layer3", [1], [0], [0])],
        weights=[Weight(f"w{i}", np.array(value), learnable=False) for i, value in enumerate(fixed)]
        + [Weight("w6", np.array([0.028, -0.405]))],
        output_layer=[4, 4, 5], output_ordinal=[0, 0, 3])
    for preset in ("unoptimized", "default"):
        module = neurovec.compile(graph, Settings.preset(preset, simplify_gathers=True), dtype=torch.float64)
        assert not outputs_and_grads(module)[1]["w6"].isnan().any(), preset
        assert_equivalent(graph, module)


def test_an_unreachable_neuron_costs_no_rows():
    graph = Graph(
        layers=[FactLayer("x", np.arange(4.0)[:, None] + 1),
                _layer("hidden", [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 0, 0]),
                _layer("dead", [2], [1, 1], [0, 1], [0, 0]),  # read by nothing
                _layer("out", [1, 1, 1], [1, 1, 1], [3, 1, 3], [0, 0, 0], "tanh")],
        weights=[Weight("w", np.array([[0.5]]))],
        output_layer=[3, 3], output_ordinal=[2, 0])
    pruned = prune_unreachable(graph)
    assert [layer.name for layer in pruned.layers] == ["x", "hidden", "out"]
    assert pruned.layer("hidden").size == 1  # only hidden neuron 3 is read by out neurons 0 and 2
    assert pruned.layer("out").size == 2
    assert pruned.layer("x").size == 4  # fact layers stay whole
    program = vectorize(graph)
    reduces = {node.layer: node.count for node in program.nodes if node.op == Op.REDUCE}
    assert reduces == {"hidden": 1, "out": 2}
    assert_equivalent(graph, neurovec.compile(graph, "unoptimized", dtype=torch.float64))


def test_a_graph_without_unreachable_neurons_is_kept_as_it_is():
    graph = Graph(layers=[FactLayer("x", np.ones((2, 1))), _layer("y", [2], [0, 0], [0, 1])],
                  weights=[], output_layer=[1], output_ordinal=[0])
    assert prune_unreachable(graph) is graph


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_pruning_keeps_the_reference_values_and_gradients(graph):
    pruned = prune_unreachable(graph)
    assert all(mask.all() for layer, mask in zip(pruned.layers, reachable(pruned)) if isinstance(layer, NeuronLayer))
    assert prune_unreachable(pruned) is pruned
    out, grads = outputs_and_grads(ReferenceModule(graph))
    pruned_out, pruned_grads = outputs_and_grads(ReferenceModule(pruned))
    torch.testing.assert_close(pruned_out, out, rtol=0, atol=0, equal_nan=True)
    for name, grad in grads.items():
        if grad is None:
            assert pruned_grads[name] is None
        else:
            torch.testing.assert_close(pruned_grads[name], grad, rtol=0, atol=0, equal_nan=True)


def test_layers_reading_through_one_array_mark_the_rows_it_reads():
    """reachable() remembers the rows that an ordinal array shared by several layers reads (a GCN's layers
    share their edges), per length of the layer read: two fully used layers reading through one array that
    reads rows 0 and 2 mark rows 0 and 2 of each source, no more; a source of another length is marked by
    its own reading of the array."""
    shared = np.array([0, 0, 2, 2], dtype=np.int64)
    for other_size in (4, 5):
        graph = Graph(
            layers=[FactLayer("f0", np.arange(8.0).reshape(4, 2)),
                    FactLayer("f1", np.arange(2.0 * other_size).reshape(other_size, 2)),
                    NeuronLayer("a", np.ones(4, np.int64), np.zeros(4, np.int64), shared, copy=False),
                    NeuronLayer("b", np.ones(4, np.int64), np.ones(4, np.int64), shared, copy=False)],
            weights=[], output_layer=[2, 2, 2, 2, 3, 3, 3, 3], output_ordinal=[0, 1, 2, 3, 0, 1, 2, 3])
        assert graph.layers[2].input_ordinal is graph.layers[3].input_ordinal
        masks = reachable(graph)
        assert masks[0].tolist() == [True, False, True, False]
        assert masks[1].tolist() == [True, False, True, False] + [False] * (other_size - 4)
        assert masks[2].all() and masks[3].all()
