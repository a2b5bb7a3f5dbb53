"""Node-level GCN, SAGE and GIN (readout=None): exact PyG twins in float64 (outputs and every weight
gradient), dropout masks shared with the twin, sub-batches of nodes, and clear errors for bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec import dropout
from neurovec.datasets import gnn
from neurovec.datasets._common import DatasetError
from neurovec.datasets.nodes import NodeDataset
from neurovec.datasets.planetoid import load_planetoid
from neurovec.datasets.synthetic import SHAPES, rmat_dataset

twins = pytest.importorskip("neurovec.datasets.pyg_twins")
pytest.importorskip("torch_geometric")

KINDS = ("gcn", "sage", "gin")


@pytest.fixture(scope="module")
def cora(planetoid_dir):
    return load_planetoid("Cora", planetoid_dir)


@pytest.fixture(scope="module")
def odd():
    """Self loops, a duplicated edge, isolated nodes (no edges at all) and a node with only out-edges."""
    rng = np.random.default_rng(3)
    edges = [(0, 1), (1, 0), (1, 2), (2, 2), (3, 2), (3, 2), (4, 3), (0, 4), (4, 0), (5, 5), (2, 6), (6, 1)]
    edge_index = np.array(edges).T
    y = rng.integers(0, 3, 10)
    return NodeDataset("odd", rng.standard_normal((10, 5)), edge_index, y, num_classes=3)


def _grads(module, twin, ours, theirs):
    probe = torch.linspace(-1.0, 1.0, ours.numel(), dtype=torch.float64).reshape(ours.shape)
    (ours * probe).sum().backward()
    (theirs * probe).sum().backward()
    params = dict(twin.named_parameters())
    assert set(params) == {name for name, _ in module.weights.named_parameters()}
    for name, weight in module.weights.named_parameters():
        torch.testing.assert_close(weight.grad.reshape(params[name].shape), params[name].grad, atol=1e-9,
                                   rtol=1e-9, msg=lambda m: f"{name}: {m}")


def _twin(kind, ds, **options):
    return twins.make_twin(gnn.GNNSpec.create(kind, ds, **options)).double()


@pytest.mark.parametrize("kind", KINDS)
def test_cora_twin_exact_with_dropout(cora, kind):
    options = dict(hidden=16, layers=2, dropout=0.5, input_dropout=0.5)
    model = dropout.compile(getattr(gnn, kind)(cora, seed=1, **options), dtype=torch.float64, seed=4)
    twin = _twin(kind, cora, **options)
    twins.copy_weights(model.module, twin)
    x, edge_index = twins.pyg_node_data(cora, torch.float64)
    model.train()
    ours = model()
    masks = model.last_masks
    assert set(masks) == {"dropout[p=0.5]:x", "dropout[p=0.5]:conv1"}
    assert masks["dropout[p=0.5]:conv1"].eq(0).float().mean().item() == pytest.approx(0.5, abs=0.02)
    theirs = twin(x, edge_index, masks)
    assert ours.shape == (2708, 7)
    torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)
    _grads(model.module, twin, ours, theirs)
    model.eval()  # no dropout: the twin without masks
    torch.testing.assert_close(model(), twin(x, edge_index), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_odd_graph_twin_exact(odd, kind):
    module = neurovec.compile(getattr(gnn, kind)(odd, hidden=4, layers=3, seed=2), dtype=torch.float64)
    twin = _twin(kind, odd, hidden=4, layers=3)
    twins.copy_weights(module, twin)
    x, edge_index = twins.pyg_node_data(odd, torch.float64)
    ours, theirs = module(), twin(x, edge_index)
    assert ours.shape == (10, 3)
    torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)
    _grads(module, twin, ours, theirs)


@pytest.mark.parametrize("kind", KINDS)
def test_k_hop_samples_equal_the_whole_graph(odd, kind):
    whole = neurovec.compile(getattr(gnn, kind)(odd, hidden=4, layers=2, seed=2), dtype=torch.float64)()
    samples = np.array([3, 0, 9, 3, 6])
    part = neurovec.compile(getattr(gnn, kind)(odd, hidden=4, layers=2, seed=2, samples=samples),
                            dtype=torch.float64)()
    torch.testing.assert_close(part, whole[samples], atol=1e-12, rtol=1e-12)


def test_induced_subgraph_is_the_twin_on_the_subgraph(odd):
    from neurovec.datasets.nodes import induced_edges
    nodes = np.array([0, 1, 2, 3, 6])
    module = neurovec.compile(gnn.gcn(odd, hidden=4, samples=nodes, subgraph="induced", seed=2), dtype=torch.float64)
    twin = _twin("gcn", odd, hidden=4)
    twins.copy_weights(module, twin)
    edge_index, _ = induced_edges(odd.edge_index, odd.n_nodes, nodes)
    x = torch.as_tensor(odd.x[nodes])
    torch.testing.assert_close(module(), twin(x, torch.from_numpy(edge_index)), atol=1e-9, rtol=1e-9)


def test_max_readout_twin(tu_dir):
    from neurovec.datasets.tu import load_tu
    mutag = load_tu("MUTAG", tu_dir)
    for kind in KINDS:
        module = neurovec.compile(getattr(gnn, kind)(mutag, hidden=8, readout="max", seed=1), dtype=torch.float64)
        twin = twins.make_twin(gnn.GNNSpec.create(kind, mutag, 8, 2, readout="max")).double()
        twins.copy_weights(module, twin)
        ours, theirs = module(), twin(*twins.pyg_batch(mutag, dtype=torch.float64))
        torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)
        _grads(module, twin, ours, theirs)


def test_node_level_defaults_follow_pyg(cora):
    graph = gnn.gcn(cora)
    assert graph.output_layer.size == cora.n_nodes
    assert graph.layer_shapes[graph.output_layer[0]] == (cora.num_classes,)
    assert graph.layers[graph.output_layer[0]].transformation == "identity"
    embed = gnn.sage(cora, hidden=32, layers=2, out_dim=64)
    assert embed.layer_shapes[embed.output_layer[0]] == (64,)


def test_dropout_is_seeded_and_off_in_eval(odd):
    graph = gnn.gcn(odd, hidden=4, dropout=0.5, input_dropout=0.2)
    first, second = dropout.compile(graph, seed=7), dropout.compile(graph, seed=7)
    torch.testing.assert_close(first(), second())          # same seed, same masks
    assert not torch.equal(first(), second.module())         # a training call drops something
    first.eval()
    torch.testing.assert_close(first(), first.module())      # eval: the stored ones
    assert dropout.dropout_layers(graph) == {"dropout[p=0.2]:x": 0.2, "dropout[p=0.5]:conv1": 0.5}


def test_input_dropout_draws_only_where_features_are_not_zero(cora):
    model = dropout.compile(gnn.gcn(cora, input_dropout=0.5))
    assert model.support["dropout[p=0.5]:x"].size == np.count_nonzero(cora.x)
    mask = model.masks()["dropout[p=0.5]:x"].numpy()
    assert np.all(mask[cora.x == 0] == 1)
    assert set(np.unique(mask[cora.x != 0])) == {0.0, 2.0}


@pytest.mark.parametrize("make, message", [
    (lambda ds: NodeDataset("bad", ds.x, np.array([[0, 10], [1, 2]]), ds.y), r"edge_index column 1 names node 10"),
    (lambda ds: NodeDataset("bad", ds.x[:9], ds.edge_index, ds.y), r"y must have one label per node.*x has 9 rows"),
    (lambda ds: NodeDataset("bad", ds.x, ds.edge_index, ds.y, train_mask=np.ones(9, bool)),
     r"train_mask must be a boolean array of shape \(10,\)"),
    (lambda ds: gnn.gcn(ds, samples=[1, 10]), r"samples\[1\] = 10 is not a node: the graph has 10 nodes"),
    (lambda ds: gnn.gcn(ds, dropout=1.0), r"dropout must be a probability"),
    (lambda ds: gnn.gcn(ds, subgraph="whole"), r"unknown subgraph 'whole'"),
    (lambda ds: gnn.gcn(ds, readout=None, output_transformation="sigmoid"), r"node-level model"),
])
def test_bad_input_is_named(odd, make, message):
    with pytest.raises(DatasetError, match=message):
        make(odd)


def test_synthetic_rmat_is_seeded_and_skewed():
    first = rmat_dataset(nodes=2000, edges=20000, features=8, classes=4, seed=5)
    again = rmat_dataset(nodes=2000, edges=20000, features=8, classes=4, seed=5)
    assert np.array_equal(first.edge_index, again.edge_index) and np.array_equal(first.x, again.x)
    assert first.n_edges == 20000 and first.x.shape == (2000, 8) and first.num_classes == 4
    degree = np.bincount(first.edge_index[1], minlength=2000)
    assert degree.max() > 20 * degree.mean()                  # hubs
    assert (first.train_mask & first.test_mask).sum() == 0
    undirected = rmat_dataset(nodes=500, edges=4001, features=2, classes=2, undirected=True)
    assert undirected.n_edges == 4001
    assert SHAPES["arxiv-like"][:4] == (169_343, 1_166_243, 128, 40)
    assert SHAPES["products-like"][:4] == (2_449_029, 61_859_140, 100, 47)


def test_factorised_gcn_normalisation_is_exact(odd, monkeypatch):
    """Beyond MAX_NORM_PRODUCTS distinct degree products GCN reads 1/sqrt(deg_j) per edge and 1/sqrt(deg_i)
    after the sum (NOTE: [GCN normalisation]): the twin's outputs and gradients still."""
    monkeypatch.setattr(gnn, "MAX_NORM_PRODUCTS", 2)
    graph = gnn.gcn(odd, hidden=4, layers=2, seed=2)
    layers = {layer.name: layer for layer in graph.layers}
    # Each node's row times its own 1/sqrt(deg_j) once (conv1.scaled), summed over the edges unweighted:
    # no per-edge product for the compiler to find equal and merge (the compile of products-like).
    assert (layers["conv1.scaled"].input_weight >= 0).all() and layers["conv1.scaled"].size == odd.n_nodes
    assert (layers["conv1.agg"].input_weight < 0).all()
    assert sum(w.name.startswith("gcn_norm.inv_sqrt_deg") for w in graph.weights) == 4  # degrees 1, 2, 3, 4
    module = neurovec.compile(graph, dtype=torch.float64)
    twin = _twin("gcn", odd, hidden=4)
    twins.copy_weights(module, twin)
    ours, theirs = module(), twin(*twins.pyg_node_data(odd, torch.float64))
    torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)
    _grads(module, twin, ours, theirs)


def test_gcn_norm_helpers_equal_the_plain_sorts():
    # _few_products counts distinct degree products over the (degree, degree) pairs present; _by_owner
    # sorts with torch's radix sort: both must give what a sort of every edge gives.
    from neurovec.datasets._common import csr
    from neurovec.datasets.gnn import _by_owner, _few_products

    rng = np.random.default_rng(3)
    for n_levels, n in [(5, 50), (60, 400), (5000, 6000)]:  # the last has too many pairs to count: it sorts
        deg = rng.integers(1, n_levels + 1, n)
        src, dst = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)
        distinct = np.unique(np.concatenate([deg * deg, deg[dst] * deg[src]])).size
        for limit in (distinct - 1, distinct):
            assert _few_products(deg, src, dst, limit) == (distinct <= limit)
        weight = rng.integers(-1, 9, src.size)
        for got, want in zip(_by_owner(dst, n, src, weight), csr(dst, n, src, weight)):
            assert np.array_equal(got, want)
