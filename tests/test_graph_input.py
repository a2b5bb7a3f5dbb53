"""Strict input: wrong dtypes are refused (never cast), validated graphs cannot change, JSON errors name the file."""
import copy
import json

import numpy as np
import pytest

import neurovec
from neurovec.sources import graph_to_dict, load_json, save_json
from neurovec.sources.graph import FactLayer, Graph, GraphError, NeuronLayer, Weight


def facts(values=None):
    return FactLayer("x", np.ones((3, 2)) if values is None else values)


def layer(**fields):
    arrays = dict(counts=[1], input_layer=[0], input_ordinal=[0])
    arrays.update(fields)
    return NeuronLayer("h", **arrays)


# -- dtypes ------------------------------------------------------------------------------

def test_float_ordinal_is_refused_not_truncated():
    with pytest.raises(GraphError, match=r"layer 'h', input_ordinal: expected an integer array \(got float64, "
                                         r"e\.g\. 1\.7 at position 0, which would be truncated\)"):
        layer(input_ordinal=np.array([1.7]))


def test_whole_float_counts_are_refused():
    with pytest.raises(GraphError, match=r"layer 'h', counts: expected an integer array \(got float64; pass "
                                         r"integers"):
        layer(counts=np.array([1.0]))


def test_boolean_weight_indices_are_refused():
    with pytest.raises(GraphError, match=r"layer 'h', input_weight: expected an integer array \(got booleans\)"):
        layer(input_weight=np.array([False]))
    with pytest.raises(GraphError, match=r"layer 'h', bias: expected an integer array \(got booleans\)"):
        layer(bias=[True])


@pytest.mark.parametrize("ordinal", [[2 ** 70], [2 ** 63], np.array([2 ** 63], np.uint64)])
def test_ordinal_beyond_int64_is_a_graph_error(ordinal):
    with pytest.raises(GraphError, match=r"layer 'h', input_ordinal: value 9?\d+ at position 0 is beyond the "
                                         r"int64 range"):
        layer(input_ordinal=ordinal)


def test_output_ordinals_must_be_integers():
    with pytest.raises(GraphError, match=r"graph, output_ordinal: expected an integer array"):
        Graph([facts(), layer()], [], [1], [0.0])


def test_complex_values_are_refused():
    with pytest.raises(GraphError, match=r"fact layer 'x', values: expected real floating or integer values "
                                         r"\(got complex complex128, e\.g\. \(1\+2j\) at position 1, whose "
                                         r"imaginary part would be dropped\)"):
        facts(np.array([[1.0], [1 + 2j]]))
    with pytest.raises(GraphError, match=r"weight 'W', value: expected real floating or integer values "
                                         r"\(got complex"):
        Weight("W", np.ones(2, complex))


@pytest.mark.parametrize("values, got", [
    (np.array([[True], [False]]), "booleans"),
    (np.array([["1.5"], ["2"]]), "<U3"),
    (np.ones((2, 1), np.longdouble), "float128, wider than float64"),
    (np.array([[2 ** 60]]), None),
])
def test_values_that_float64_cannot_hold_are_refused(values, got):
    if values.dtype == np.float64:  # platforms where longdouble is float64
        pytest.skip("longdouble is float64 here")
    message = "beyond \\+-2\\*\\*53" if got is None else f"got {got}"
    with pytest.raises(GraphError, match=f"fact layer 'x', values: .*{message}"):
        facts(values)


def test_accepted_kinds_convert_exactly():
    layer_ = layer(counts=np.array([1], np.uint8), input_ordinal=np.array([2], np.int32))
    assert layer_.counts.dtype == np.int64 and layer_.input_ordinal.tolist() == [2]
    assert facts(np.arange(6, dtype=np.int16).reshape(3, 2)).values.dtype == np.float64
    assert Weight("w", np.float32(0.5)).shape == ()  # a 0-d value stays a scalar
    empty = NeuronLayer("h", counts=[], input_layer=[], input_ordinal=[])
    assert empty.counts.dtype == np.int64 and empty.size == 0


def test_builder_refuses_float_ordinals_and_boolean_weights():
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.ones((2, 1)))
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0, input 0: the ordinal of .* must be an integer "
                                         r"\(got float\)"):
        b.layer("h").neuron([neurovec.Ref("x", 1.7)])
    with pytest.raises(GraphError, match=r"weight 'W', value: expected real floating or integer values"):
        b.weight("W", True)
    b.output(neurovec.Ref("x", 0.0))
    with pytest.raises(GraphError, match=r"output 0: the ordinal of .* must be an integer"):
        b.build()
    assert x[1].ordinal == 1
    with pytest.raises(GraphError, match=r"fact layer 'u', count: expected an integer \(got float\)"):
        b.unit_facts("u", 2.0)


# -- a validated graph cannot change behind its back ---------------------------------------

def test_caller_arrays_are_copied():
    values = np.ones((3, 2))
    ordinal = np.array([0])
    graph = Graph([facts(values), layer(input_ordinal=ordinal)], [], [1], [0])
    values[0, 0] = np.nan
    ordinal[0] = 7
    assert graph.layers[0].values[0, 0] == 1.0
    assert graph.layers[1].input_ordinal[0] == 0


def test_graph_arrays_are_read_only():
    w = np.ones(2)
    graph = Graph([facts(), layer(input_weight=[0])], [Weight("W", w)], [1], [0])
    with pytest.raises(ValueError, match="read-only"):
        graph.layers[0].values[0, 0] = np.nan
    with pytest.raises(ValueError, match="read-only"):
        graph.layers[1].counts[0] = 2
    with pytest.raises(ValueError, match="read-only"):
        graph.weights[0].value[0] = np.inf
    with pytest.raises(ValueError, match="read-only"):
        graph.output_ordinal[0] = 9
    w[0] = np.nan  # the caller's own array stays theirs, writable
    assert graph.weights[0].value[0] == 1.0


def test_validated_arrays_are_shared_not_copied_again():
    """Re-using a layer's arrays in a new layer (as passes and importers do) costs no memory."""
    first = layer(counts=np.array([1]))
    second = NeuronLayer("g", first.counts, first.input_layer, first.input_ordinal)
    assert second.counts is first.counts and second.input_ordinal is first.input_ordinal
    x = facts()
    assert FactLayer("y", x.values).values is x.values
    # A fresh conversion (a list, another dtype) is not copied twice either.
    converted = np.array([0], np.int32)
    assert not np.shares_memory(layer(input_ordinal=converted).input_ordinal, converted)


# -- JSON --------------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.ones((2, 3)))
    w = b.weight("W", np.ones(3))
    h = b.layer("h")
    b.output(h.neuron([(x[0], w)]), h.neuron([x[1]]))
    return graph_to_dict(b.build()), tmp_path / "graph.json"


def _load_mutated(saved, mutate):
    data, path = saved
    data = copy.deepcopy(data)
    mutate(data)
    path.write_text(json.dumps(data))
    return load_json(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["layers"][1].pop("counts"), r"key layers\[1\]\.counts: missing \(a required key\)"),
    (lambda d: d.pop("outputs"), r"key outputs: missing"),
    (lambda d: d["layers"][1].update(counts=[1.7, 1]),
     r"key layers\[1\]\.counts\[0\]: Input should be a valid integer \(got 1\.7\)"),
    (lambda d: d["layers"][1].update(input_weight=[True, -1]),
     r"key layers\[1\]\.input_weight\[0\]: Input should be a valid integer \(got True\)"),
    (lambda d: d["layers"][0]["values"].update(data=["1"] * 6),
     r"key layers\[0\]\.values\.data\[0\]: Input should be a valid number \(got '1'\)"),
    (lambda d: d["layers"][0]["values"].update(data=[1.0] * 5),
     r"key layers\[0\]\.values: 'data' has 5 numbers, but 'shape' \[2, 3\] needs 6"),
    (lambda d: d.update(weights={}), r"key weights: Input should be a valid list \(got \{\}\)"),
    (lambda d: d["weights"][0].update(learnable=1), r"key weights\[0\]\.learnable: Input should be a valid "
                                                    r"boolean"),
    (lambda d: d["layers"][0].update(kind="fax"), r"key layers\[0\]: .*'facts', 'neurons'"),
    (lambda d: d["layers"][0].pop("kind"), r"key layers\[0\]: has no key 'kind' \(expected 'facts' or 'neurons'\)"),
    (lambda d: d["layers"][1].update(input_ordinal=[0, 2 ** 70]),
     r"layer 'h', input_ordinal: value \d+ at position 1 is beyond the int64 range"),
    (lambda d: d["layers"][1].update(aggregation="median"), r"layer 'h': unknown aggregation 'median'"),
    (lambda d: d.update(format="onnx"), r"not a neurovec graph \(key format is 'onnx'"),
])
def test_json_errors_name_file_and_key(saved, mutate, message):
    with pytest.raises(GraphError, match=r"graph\.json: " + message):
        _load_mutated(saved, mutate)


def test_malformed_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "neurovec-graph",\n "weights": [')
    with pytest.raises(GraphError, match=r"broken\.json: not valid JSON \(line 2, column 14"):
        load_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(GraphError, match=r"broken\.json: expected a JSON object .* \(got list\)"):
        load_json(path)
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(GraphError, match=r"broken\.json: not a UTF-8 text file"):
        load_json(path)


def test_json_round_trip_still_exact(saved, tmp_path):
    data, _ = saved
    graph = neurovec.sources.graph_from_dict(data)
    save_json(graph, tmp_path / "again.json")
    assert graph_to_dict(load_json(tmp_path / "again.json")) == data


def test_copy_false_hands_arrays_over_read_only():
    """A builder of big graphs can skip the copy; the array is then the layer's, read-only."""
    ordinal = np.array([2])
    values = np.ones((3, 2))
    layer_ = layer(input_ordinal=ordinal, copy=False)
    facts_ = FactLayer("x", values, copy=False)
    assert layer_.input_ordinal is ordinal and facts_.values is values
    with pytest.raises(ValueError, match="read-only"):
        ordinal[0] = 0
    with pytest.raises(GraphError, match=r"layer 'h', input_ordinal: expected an integer array"):
        layer(input_ordinal=np.array([1.5]), copy=False)  # still checked


def test_builder_inputs_and_bulk_layers_name_what_is_wrong():
    """A 3-tuple, a bare name or a single Ref as a neuron's inputs, and a non-layer in the bulk list, failed with
    Python's own unpacking and attribute errors."""
    from neurovec.sources.builder import GraphBuilder
    b = GraphBuilder()
    w = b.weight("w", 1.0)
    a = b.unit_facts("a", 2)
    h = b.layer("h")
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0: input 0 is \(Ref\(layer='a', ordinal=0\), .*; an "
                                         r"input is a Ref .* or a \(Ref, weight\) pair"):
        h.neuron([(a[0], w, 3)])
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0: input 1 is 'a'; an input is a Ref"):
        h.neuron([a[1], "a"])
    with pytest.raises(GraphError, match=r"layer 'h', neuron 0: inputs must be a list .* \(got the single Ref "
                                         r"Ref\(layer='a', ordinal=0\): wrap it in a list\)"):
        h.neuron(a[0])
    h.neuron([(a[0], w), a[1]])
    b.output(h.neuron([a[0]]))
    assert b.build().n_neurons == 4
    with pytest.raises(GraphError, match=r"layer 1 is a str \('h'\), expected a neurovec FactLayer or NeuronLayer"):
        Graph([facts(), "h"], [], [0], [0])


# -- validation checks whole arrays first, and names the first bad input as a per-edge check would --

def test_ordinal_past_the_smaller_of_two_read_layers_is_named():
    # The ordinals' maximum (3) fits layer 'b' (5 neurons) but not 'a' (2): the whole-array check
    # must look per edge when a layer reads several layers.
    a, b = FactLayer("a", np.ones((2, 2))), FactLayer("b", np.ones((5, 2)))
    h = NeuronLayer("h", counts=[2, 2], input_layer=[1, 0, 1, 0], input_ordinal=[3, 1, 0, 3])
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1, input 1: references missing neuron 3 of layer "
                                         r"'a' \(it has 2 neurons\)"):
        Graph([a, b, h], [], [2], [0])


def test_weights_of_several_shapes_are_checked_per_input():
    # Weights 0 and 2 fit the (2,) input, weight 1 (between them, unused) does not: the layer is valid.
    # With weight 1 used on one input, that input is named.
    weights = [Weight("A", np.ones((3, 2))), Weight("B", np.ones((4, 4))), Weight("C", np.ones((3, 2)))]
    ok = NeuronLayer("h", counts=[2, 1], input_layer=[0, 0, 0], input_ordinal=[0, 1, 2], input_weight=[0, 2, 2])
    assert Graph([facts(), ok], weights, [1], [0]).layer_shapes[1] == (3,)
    bad = NeuronLayer("h", counts=[2, 1], input_layer=[0, 0, 0], input_ordinal=[0, 1, 2], input_weight=[0, 2, 1])
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1, input 0: weight 'B' of shape \(4, 4\) does not fit "
                                         r"the value of layer 'x' with shape \(2,\)"):
        Graph([facts(), bad], weights, [1], [0])


def test_first_bad_input_is_named_when_several_are_bad():
    # Checks run in a fixed order (missing layer, own layer, later layer, neuron, weight), each naming its
    # first input, whatever the whole-array check saw first.
    h = NeuronLayer("h", counts=[1, 2], input_layer=[0, 0, 0], input_ordinal=[0, 7, 1], input_weight=[0, -1, 5])
    with pytest.raises(GraphError, match=r"layer 'h', neuron 1, input 0: references missing neuron 7 of layer 'x'"):
        Graph([facts(), h], [Weight("W", np.ones((2, 2)))], [1], [0])


def test_validation_of_a_deep_graph_with_a_weight_per_layer():
    # Many layers, each reading the facts and the layer before through its own weight (as knowledge-graph
    # templates do): every layer's shape comes out, and a bad shape deep down is named.
    depth = 300
    layers, weights = [facts()], []
    for k in range(depth):
        weights.append(Weight(f"W{k}", np.ones((2, 2))))
        layers.append(NeuronLayer(f"h{k}", counts=[2, 2, 2], input_layer=[0, k, 0, k, 0, k],
                                  input_ordinal=[0, 0, 1, 1, 2, 2], input_weight=[k, -1, k, -1, k, -1]))
    graph = Graph(layers, weights, [depth], [0])
    assert graph.layer_shapes == ((2,),) * (depth + 1)
    weights[depth - 1] = Weight(f"W{depth - 1}", np.ones((3, 2)))
    with pytest.raises(GraphError, match=rf"layer 'h{depth - 1}', neuron 0, input 0: weighted input has shape "
                                         r"\(3,\), but input 1 of the layer gives \(2,\)"):
        Graph(layers, weights, [depth], [0])
