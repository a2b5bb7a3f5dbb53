"""Partitioned node-level models against the project's templates (datasets.gcn / datasets.sage) on Cora.

NodeGNN (which builds a rank's rows without the whole graph) is the same model as the
node-level templates: the same initial weights, outputs and gradients (float64, 1e-9).
And any template graph splits: datasets.gcn's own neuron graph, partitioned through
GraphSource, gives the whole graph's outputs and gradients.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec import datasets, partition
from neurovec.datasets.nodes import NodeDataset
from neurovec.engines.weights import WeightStore
from neurovec.partition import GraphSource, NodeGNN, compile_rank, simulate

TEMPLATES = {"gcn": datasets.gcn, "sage": datasets.sage}


@pytest.fixture(scope="module")
def cora(planetoid_dir):
    from neurovec.datasets.planetoid import load_planetoid
    return load_planetoid("Cora", data_dir=planetoid_dir)


def toy() -> NodeDataset:
    """Self loops, a repeated edge, isolated nodes."""
    rng = np.random.default_rng(3)
    n = 30
    src, dst = rng.integers(0, n - 3, (2, 80))
    edges = np.stack([np.concatenate([src, [4, 5, 5, 1]]), np.concatenate([dst, [4, 5, 6, 6]])])
    return NodeDataset("toy", rng.standard_normal((n, 6)), edges, rng.integers(0, 3, n))


def _outputs_and_grads(module):
    out = module()
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    names = sorted(dict(module.weights.named_parameters()))
    params = dict(module.weights.named_parameters())
    grads = torch.autograd.grad((out * projection).sum(), [params[n] for n in names])
    return out, dict(zip(names, grads))


@pytest.mark.parametrize("kind, which", [("gcn", "cora"), ("gcn", "toy"), ("sage", "toy"),
                                         pytest.param("sage", "cora", marks=pytest.mark.slow)])
def test_node_gnn_is_the_template(kind, which, request):
    ds = request.getfixturevalue("cora") if which == "cora" else toy()
    template = neurovec.compile(TEMPLATES[kind](ds, hidden=16, layers=2, seed=0), "default", torch.float64)
    ours = neurovec.compile(NodeGNN(kind, ds.x, ds.edge_index, (16, ds.num_classes), seed=0).graph(), "default",
                            torch.float64)
    for name, value in template.weights.state_dict().items():  # the same initial weights, by name
        torch.testing.assert_close(ours.weights.state_dict()[name], value, rtol=0, atol=0)
    out_t, grads_t = _outputs_and_grads(template)
    out_o, grads_o = _outputs_and_grads(ours)
    torch.testing.assert_close(out_o, out_t, rtol=1e-9, atol=1e-9)
    assert grads_o.keys() == grads_t.keys()
    for name in grads_t:
        torch.testing.assert_close(grads_o[name], grads_t[name], rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("kind", ["gcn", pytest.param("sage", marks=pytest.mark.slow)])
def test_the_template_graph_itself_splits(kind, cora):
    """datasets.gcn/sage's own neuron graph through GraphSource: 3 ranks give the whole graph's outputs and
    gradients (GCN's per-edge 1/sqrt(deg_i deg_j) weights included)."""
    graph = TEMPLATES[kind](cora, hidden=16, layers=2, seed=0)
    whole = neurovec.compile(graph, "default", torch.float64)
    out_w, grads_w = _outputs_and_grads(whole)
    parts = partition.partition_nodes(cora.edge_index, cora.n_nodes, 3, "bfs")
    store = WeightStore([w for w in graph.weights if w.learnable], torch.float64)
    source = GraphSource(graph)
    modules = [compile_rank(source, parts, r, 3, "default", torch.float64, weights=store) for r in range(3)]
    assert all(m.exchanges for m in modules)
    outs = simulate(modules)
    out = torch.empty_like(out_w)
    for m, o in zip(modules, outs):
        out[torch.from_numpy(m.output_ids)] = o
    torch.testing.assert_close(out, out_w, rtol=1e-9, atol=1e-9)
    projection = torch.randn(out_w.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    names = sorted(grads_w)
    grads = torch.autograd.grad((out * projection).sum(), [store[n] for n in names])
    for name, g in zip(names, grads):
        torch.testing.assert_close(g, grads_w[name], rtol=1e-9, atol=1e-9, msg=name)
