"""GNN templates: structure, sample lists, bad arguments, and builds on whole arrays."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import neurovec
from neurovec.datasets import DatasetError, gcn, gin, load_tu, sage, tu_batch


@pytest.fixture(scope="module")
def mutag(tu_dir):
    return load_tu("MUTAG", tu_dir)


def _python_calls(build) -> int:
    """Python function calls made while ``build()`` runs (sys.setprofile): a count, not a time."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        build()
    finally:
        sys.setprofile(None)
    return calls


def test_proteins_gcn_builds_from_whole_arrays(tu_dir):
    # The template works on whole arrays: the Python calls of a build do not grow with the graphs
    # (a loop per graph, node or edge would make all 1113 graphs cost ~10x the calls of 100).
    proteins = load_tu("PROTEINS", tu_dir)
    graph = gcn(proteins)
    assert graph.output_layer.size == 1113
    few = _python_calls(lambda: gcn(proteins, samples=np.arange(100)))
    every = _python_calls(lambda: gcn(proteins))
    assert every < 1.5 * few, (few, every)


def test_layers_are_grouped_by_predicate(mutag):
    graph = gcn(mutag, hidden=[8, 4])
    assert [layer.name for layer in graph.layers] == ["x", "conv1.lin", "conv1", "conv2.lin", "conv2", "pool", "out"]
    assert graph.layer_shapes[graph.layer_index("conv1")] == (8,)
    assert graph.layer_shapes[-1] == (1,)
    learnable = sorted(w.name for w in graph.weights if w.learnable)
    assert learnable == ["conv1.bias", "conv1.lin.weight", "conv2.bias", "conv2.lin.weight", "lin.bias", "lin.weight"]
    # GCN normalisation: fixed scalars 1/sqrt(deg_i deg_j), one per distinct degree product.
    norms = [w for w in graph.weights if w.name.startswith("gcn_norm.")]
    assert norms and not any(w.learnable for w in norms)
    for w in norms:
        assert w.value == pytest.approx(1 / np.sqrt(int(w.name.removeprefix("gcn_norm.deg"))))
    conv1 = graph.layer("conv1")
    assert conv1.size == mutag.n_nodes and conv1.n_edges == mutag.n_nodes + mutag.n_edges


def test_gin_and_sage_layers(mutag):
    assert [l.name for l in sage(mutag, layers=1).layers] == ["x", "conv1.mean", "conv1", "pool", "out"]
    assert [l.name for l in gin(mutag, layers=1).layers] == ["x", "conv1.agg", "conv1.mlp", "conv1", "pool", "out"]


def test_one_output_neuron_per_sample_in_order(mutag):
    samples = [10, 3, 10, 187]
    graph = sage(mutag, hidden=4, samples=samples, readout="sum")
    assert graph.output_layer.size == 4 and graph.layer("pool").size == 4
    sizes = np.bincount(mutag.graph_of_node)
    assert graph.layer("pool").counts.tolist() == sizes[samples].tolist()
    batch = tu_batch(mutag, samples)
    assert np.array_equal(mutag.graph_of_node[batch.nodes], np.repeat(samples, sizes[samples]))


def test_same_seed_same_weights(mutag):
    a, b, c = gin(mutag, seed=4), gin(mutag, seed=4), gin(mutag, seed=5)
    assert all(np.array_equal(x.value, y.value) for x, y in zip(a.weights, b.weights))
    assert not np.array_equal(a.weights[0].value, c.weights[0].value)


def test_isolated_nodes_read_themselves_times_zero(tu_dir):
    ds = load_tu("ENZYMES", tu_dir)
    graph = sage(ds, hidden=4)
    zero = [i for i, w in enumerate(graph.weights) if w.name == "fixed.zero"]
    assert len(zero) == 1 and graph.weights[zero[0]].value == 0 and not graph.weights[zero[0]].learnable
    isolated = np.bincount(ds.edge_index[1], minlength=ds.n_nodes) == 0
    assert int((graph.layer("conv1.mean").input_weight == zero[0]).sum()) == int(isolated.sum())


@pytest.mark.parametrize("samples, message", [
    ([], "non-empty"),
    ([0, 188], "sample 188 .* out of range"),
    ([-1], "out of range"),
    ([0.5], "integer"),
    ([[0, 1]], "1-D"),
])
def test_bad_samples(mutag, samples, message):
    with pytest.raises(DatasetError, match=message):
        gcn(mutag, samples=samples)


@pytest.mark.parametrize("options, message", [
    ({"readout": "median"}, "unknown readout 'median'"),
    ({"output_transformation": "softmax"}, "unknown output_transformation"),
    ({"hidden": 0}, "positive width"),
    ({"layers": 0}, "at least one convolution"),
])
def test_bad_hyperparameters(mutag, options, message):
    with pytest.raises(DatasetError, match=message):
        gcn(mutag, **options)


def test_compiled_and_reference_agree_on_a_batch(mutag):
    graph = gin(mutag, hidden=4, samples=[7, 2])
    expected = neurovec.ReferenceModule(graph)()
    # compile() creates float32 weights, so .double() starts from the rounded initial values.
    torch.testing.assert_close(neurovec.compile(graph).double()(), expected, atol=1e-6, rtol=1e-6)
