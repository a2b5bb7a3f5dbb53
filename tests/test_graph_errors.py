"""Bad input gets a clear error naming the layer and the neuron."""
import numpy as np
import pytest

import neurovec
from neurovec.sources.graph import FactLayer, Graph, GraphError, NeuronLayer, Weight


def facts(n=3, shape=(2,)):
    return FactLayer("x", np.ones((n,) + shape))


def layer(name="h", counts=(1,), src=(0,), ordinal=(0,), weight=None, bias=None, **kw):
    return NeuronLayer(name, counts=counts, input_layer=src, input_ordinal=ordinal, input_weight=weight,
                       bias=bias, **kw)


def build(layers, weights=(), out=None):
    out = out or (len(layers) - 1, 0)
    return Graph(layers, weights, [out[0]], [out[1]])


def test_backward_reference_or_cycle():
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 0: references later layer 'g' "
                                         r"\(a cycle or a backward reference"):
        build([facts(), layer("h", src=(2,)), layer("g", src=(1,))])


def test_builder_reference_to_layer_declared_later():
    b = neurovec.GraphBuilder()
    h = b.layer("h")
    g = b.layer("g")
    h.neuron([neurovec.Ref("g", 0)])
    b.output(g.neuron([neurovec.Ref("h", 0)]))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 0: references later layer 'g'"):
        b.build()


def test_missing_layer():
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1, input 0: references missing layer index 7"):
        build([facts(), layer(counts=(1, 1), src=(0, 7), ordinal=(0, 0))])
    b = neurovec.GraphBuilder()
    b.output(b.layer("h").neuron([neurovec.Ref("nope", 0)]))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 0: references missing layer 'nope'"):
        b.build()


def test_missing_ordinal():
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 1: references missing neuron 5 of "
                                         r"layer 'x' \(it has 3 neurons\)"):
        build([facts(), layer(counts=(2,), src=(0, 0), ordinal=(0, 5))])


def test_missing_output_neuron():
    with pytest.raises(GraphError, match=r"output 0 references neuron 4 of layer 'h', which has only 1"):
        build([facts(), layer()], out=(1, 4))


def test_neurons_of_one_layer_depending_on_each_other():
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1, input 0: references neuron 0 of its own "
                                         r"layer; neurons of one layer must be independent"):
        build([facts(), layer(counts=(1, 1), src=(0, 1), ordinal=(0, 0))])


def test_weight_shape_does_not_fit_input():
    w = Weight("W", np.ones((4, 3)))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 0: weight 'W' of shape \(4, 3\) does "
                                         r"not fit the value of layer 'x' with shape \(2,\)"):
        build([facts(), layer(weight=(0,))], [w])


def test_output_shapes_differ_within_layer():
    w = Weight("W", np.ones((4, 2)))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1, input 0: weighted input has shape \(4,\), "
                                         r"but input 0 of the layer gives \(2,\)"):
        build([facts(), layer(counts=(1, 1), src=(0, 0), ordinal=(0, 1), weight=(-1, 0))], [w])


def test_bias_shape_must_fit():
    b = Weight("b", np.ones(3))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0: bias 'b' has shape \(3,\) but the neuron's "
                                         r"value has shape \(2,\)"):
        build([facts(), layer(bias=(0,))], [b])


def test_unknown_aggregation_and_transformation():
    with pytest.raises(GraphError, match=r"layer 'h': unknown aggregation 'median'"):
        build([facts(), layer(aggregation="median")])
    with pytest.raises(GraphError, match=r"layer 'h': unknown transformation 'swish'"):
        build([facts(), layer(transformation="swish")])


def test_empty_layers():
    with pytest.raises(GraphError, match=r"layer 'h' is empty"):
        build([facts(), layer(counts=(), src=(), ordinal=())], out=(0, 0))
    with pytest.raises(GraphError, match=r"fact layer 'x' is empty"):
        build([FactLayer("x", np.ones((0, 2))), layer()])
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1: has no inputs"):
        build([facts(), layer(counts=(1, 0))])


def test_nan_and_inf_in_facts_and_weights():
    values = np.ones((3, 2))
    values[2, 1] = np.nan
    with pytest.raises(GraphError, match=r"fact layer 'x', neuron 2: value contains NaN or inf"):
        build([FactLayer("x", values), layer()])
    with pytest.raises(GraphError, match=r"weight 'W' contains NaN or inf"):
        build([facts(), layer()], [Weight("W", [np.inf])])


def test_nothing_dropped_inconsistent_arrays():
    with pytest.raises(GraphError, match=r"layer 'h': counts sum to 1 but there are 2 inputs"):
        build([facts(), layer(counts=(1,), src=(0, 0), ordinal=(0, 1))])
    with pytest.raises(GraphError, match=r"layer 'h': bias must have one entry per neuron"):
        build([facts(), layer(bias=(-1, -1))])
    with pytest.raises(GraphError, match=r"the graph has no outputs"):
        Graph([facts(), layer()], [], [], [])


def test_builder_undefined_weight_and_duplicates():
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.ones((1, 2)))
    b.output(b.layer("h").neuron([(x[0], "W")]))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 0: references undefined weight 'W'"):
        b.build()
    with pytest.raises(GraphError, match=r"layer name 'x' is used by layers 0 and 1"):
        build([facts(), facts()], out=(0, 0))
    with pytest.raises(GraphError, match=r"weight 'W' is defined twice"):
        b.weight("W", 1.0), b.weight("W", 2.0)


def test_output_neurons_must_share_a_shape():
    with pytest.raises(GraphError, match=r"output neurons must all have one shape"):
        Graph([facts(), FactLayer("s", np.ones(2)), layer()], [], [1, 2], [0, 0])
