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


# -- the small layers are checked together (graph._SmallLayers); an error is still the first bad layer's own --

def _sequential_error(monkeypatch, make):
    """The error when every layer is checked on its own, in order (the small layers' joint check switched off)."""
    from neurovec.sources import graph as graph_module
    with monkeypatch.context() as m:
        m.setattr(graph_module._SmallLayers, "validate", classmethod(lambda cls, *args: None))
        with pytest.raises(GraphError) as raised:
            make()
    return str(raised.value)


def _chain(n_layers=8, bad=None, big=()):
    """Facts, then layers each reading the facts (through weight 'W') and the layer before; ``bad``: a dict from a
    layer's position to a change of its arrays, ``big``: positions made larger than the rest (two inputs more)."""
    weights = [Weight("W", np.ones((2, 2))), Weight("b", np.ones(2)), Weight("V", np.ones((3, 2))),
               Weight("s", np.ones(3))]
    layers = [facts()]
    for k in range(1, n_layers + 1):
        arrays = dict(counts=[2, 2], input_layer=[0, k - 1, 0, k - 1], input_ordinal=[0, 0, 1, 1],
                      input_weight=[0, -1, 0, -1], bias=[-1, 1])
        if k in big:
            arrays.update(counts=[3, 3], input_layer=[0, k - 1, 0] * 2, input_ordinal=[0, 0, 1, 1, 1, 2],
                          input_weight=[0, -1, 0] * 2)
        extra = {}
        for key, value in (bad or {}).get(k, {}).items():
            (arrays if key in arrays else extra)[key] = value
        layers.append(NeuronLayer(f"h{k}", **arrays, **extra))
    return layers, weights


BAD = {   # a change of one layer's arrays, and the error it gives
    "missing layer": ({"input_layer": [0, 9, 0, 2]}, r"neuron 0, input 1: references missing layer index 9"),
    "later layer": ({"input_layer": [0, 2, 0, 7]}, r"neuron 1, input 1: references later layer 'h7'"),
    "own layer": ({"input_layer": [0, 3, 0, 2]}, r"neuron 0, input 1: references neuron 0 of its own layer"),
    "missing neuron": ({"input_ordinal": [0, 0, 1, 5]}, r"neuron 1, input 1: references missing neuron 5"),
    "missing weight": ({"input_weight": [0, -1, 4, -1]}, r"neuron 1, input 0: references missing weight index 4"),
    "missing bias": ({"bias": [-1, 7]}, r"neuron 1: bias references missing weight index 7"),
    "second input's weight": ({"input_weight": [0, -1, 2, -1]}, r"neuron 1, input 0: weighted input has shape "
                                                                r"\(3,\), but input 1 of the layer gives \(2,\)"),
    "weight does not fit": ({"input_weight": [3, -1, 0, -1]}, r"weight 's' of shape \(3,\) does not fit"),
    "bias shape": ({"bias": [-1, 3]}, r"neuron 1: bias 's' has shape \(3,\) but the neuron's value has shape"),
    "biases differ": ({"bias": [1, 0]}, r"neuron 0: bias 'b' has shape \(2,\), but other biases of the layer "
                                        r"have shape \(2, 2\)"),
    "no inputs": ({"counts": [4, 0]}, r"neuron 1: has no inputs"),
    "counts": ({"counts": [2, 1]}, r"counts sum to 3 but there are 4 inputs"),
    "aggregation": ({"aggregation": "median"}, r"unknown aggregation 'median'"),
    "softmax of scalars": ({"input_weight": [-1, -1, -1, -1], "input_layer": [0, 0, 0, 0],
                            "transformation": "softmax", "bias": [-1, -1]}, None),
}


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("big, total", [((), 1 << 22), ((2, 4), 1 << 22), ((), 10)])
def test_joint_checks_name_the_same_error_as_layer_by_layer(kind, big, total, monkeypatch):
    # One bad layer (h3) among good ones, some of them checked on their own (big, or past the joint check's
    # total): the same error as when every layer is checked on its own, naming h3, neuron and input.
    from neurovec.sources import graph as graph_module
    change, message = BAD[kind]
    monkeypatch.setattr(graph_module, "_SMALL_LAYER", 5)   # layers of 6 inputs (big) are checked on their own
    monkeypatch.setattr(graph_module, "_SMALL_TOTAL", total)   # 10: h1, h2 together, the rest on their own
    if kind == "softmax of scalars":   # a layer of scalar values: facts of scalars
        layers, weights = _chain(bad={3: change}, big=big)
        layers[0] = FactLayer("x", np.ones(3))
        for k in (1, 2):
            layers[k] = replace_weights(layers[k], -1)
        message = r"softmax needs vector or matrix values"
    else:
        layers, weights = _chain(bad={3: change}, big=big)
    make = lambda: Graph(layers, weights, [len(layers) - 1], [0])  # noqa: E731
    with pytest.raises(GraphError, match=r"layer 'h3'(, |: | is )?.*" + message) as raised:
        make()
    assert str(raised.value) == _sequential_error(monkeypatch, make)


def replace_weights(layer, weight):
    return NeuronLayer(layer.name, layer.counts, layer.input_layer, layer.input_ordinal,
                       np.full(layer.n_edges, weight), np.full(layer.size, -1), layer.aggregation,
                       layer.transformation)


@pytest.mark.parametrize("first, second", [("second input's weight", "missing layer"),
                                           ("bias shape", "missing neuron"),
                                           ("missing weight", "second input's weight")])
@pytest.mark.parametrize("big", [(), (4,), (2, 6)])
def test_the_first_bad_layer_is_named_when_later_layers_are_bad_too(first, second, big, monkeypatch):
    # h3 has a shape problem (found only once the shapes are known), h5 an input that the joint check of ranges
    # finds at once: h3's error comes first, as when layers are checked one by one; likewise the other way round.
    from neurovec.sources import graph as graph_module
    monkeypatch.setattr(graph_module, "_SMALL_LAYER", 5)
    layers, weights = _chain(bad={3: BAD[first][0], 5: BAD[second][0]}, big=big)
    make = lambda: Graph(layers, weights, [len(layers) - 1], [0])  # noqa: E731
    with pytest.raises(GraphError, match=r"layer 'h3', .*" + BAD[first][1]) as raised:
        make()
    assert str(raised.value) == _sequential_error(monkeypatch, make)


def test_joint_checks_give_every_layers_shape(monkeypatch):
    from neurovec.sources import graph as graph_module
    layers, weights = _chain(n_layers=30)
    graph = Graph(layers, weights, [30], [0])
    assert graph.layer_shapes == ((2,),) * 31
    sizes = np.array([layer.size for layer in layers])
    assert graph_module._SmallLayers.validate(layers, sizes, weights) == list(graph.layer_shapes)   # the joint path
    monkeypatch.setattr(graph_module, "_SMALL_TOTAL", 50)   # 12 layers together, 18 on their own
    assert Graph(layers, weights, [30], [0]).layer_shapes == graph.layer_shapes
    monkeypatch.setattr(graph_module._SmallLayers, "validate", classmethod(lambda cls, *args: None))
    assert Graph(layers, weights, [30], [0]).layer_shapes == graph.layer_shapes


def test_nan_in_one_of_many_weights_is_named():
    weights = [Weight(f"w{k}", np.ones(2)) for k in range(50)] + [Weight("big", np.ones((100, 50)))]
    layers = [facts(), layer(weight=(0,))]
    assert Graph(layers, weights, [1], [0]).layer_shapes[1] == (2,)
    for name, k in (("w7", 7), ("big", 50)):
        values = np.ones(weights[k].shape)
        values.reshape(-1)[-1] = np.nan
        bad = list(weights)
        bad[k] = Weight(name, values)
        with pytest.raises(GraphError, match=rf"weight '{name}' contains NaN or inf"):
            Graph(layers, bad, [1], [0])


def test_a_bad_big_layer_after_a_bad_small_one(monkeypatch):
    # h5 is checked on its own (big) and has a missing layer; h3, small, a shape problem that is found only after
    # h5's own check has run: h3's error still comes first.
    from neurovec.sources import graph as graph_module
    monkeypatch.setattr(graph_module, "_SMALL_LAYER", 5)
    layers, weights = _chain(bad={3: BAD["second input's weight"][0], 5: {"input_layer": [0, 4, 0, 9, 4, 0]}},
                             big=(5,))
    make = lambda: Graph(layers, weights, [len(layers) - 1], [0])  # noqa: E731
    with pytest.raises(GraphError, match=r"layer 'h3', neuron 1, input 0: weighted input has shape") as raised:
        make()
    assert str(raised.value) == _sequential_error(monkeypatch, make)
