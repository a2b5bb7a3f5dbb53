"""The RGCN template against PyG's RGCNConv and FastRGCNConv (issue 27): exact in float64, outputs and gradients."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec import Settings
from neurovec.datasets import kg as kgmod
from neurovec.datasets import rgcn
from neurovec.datasets._common import DatasetError
from neurovec.datasets.link_prediction import LinkPredictor, NeurovecEncoder, corrupt
from neurovec.engines.reference import ReferenceModule

pytest.importorskip("torch_geometric", reason="torch_geometric is not installed (pip install neurovec[pyg])")
from neurovec.datasets import kg_twins  # noqa: E402

TOL = 1e-12  # relative to the largest value compared


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.detach(), b.detach()
    scale = max(float(b.abs().max()), 1e-300)
    assert float((a - b).abs().max()) <= TOL * scale, f"{what}: {float((a - b).abs().max()) / scale:.2e}"


def _random_twin(spec, fast, seed=0):
    twin = kg_twins.RGCNTwin(spec, fast=fast).double()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in twin.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))  # bias too: not zero
    return twin


def _compare(graph_data, spec, fast, presets=("default", "unoptimized"), reference=True):
    twin = _random_twin(spec, fast)
    graph = rgcn.rgcn(graph_data.x, graph_data.edge_index, graph_data.edge_type, spec,
                      values=kg_twins.twin_values(twin))
    x = torch.tensor(graph_data.x)
    expected = twin(x, torch.tensor(graph_data.edge_index), torch.tensor(graph_data.edge_type))
    expected.pow(2).sum().backward()
    grads = kg_twins.twin_to_neurovec({n: p.grad for n, p in twin.named_parameters()},
                                      [n for n, p in twin.named_parameters()] and
                                      [w.name for w in graph.weights if w.learnable])
    modules = {preset: neurovec.compile(graph, preset, dtype=torch.float64) for preset in presets}
    if reference:
        modules["reference"] = ReferenceModule(graph, torch.float64)
    for name, module in modules.items():
        out = module()
        _close(out, expected.detach(), f"{name} outputs")
        out.pow(2).sum().backward()
        for weight, param in module.weights.named_parameters():
            _close(param.grad, grads[weight], f"{name} gradient of {weight}")
    return graph


@pytest.fixture(scope="module")
def small():
    return kgmod.synthetic_hetero(60, 400, 11, n_features=5, n_classes=3, seed=1)


@pytest.mark.parametrize("fast", [False, True], ids=["RGCNConv", "FastRGCNConv"])
@pytest.mark.parametrize("options", [{}, {"num_bases": 3}, {"num_bases": 12}, {"root_weight": False},
                                     {"aggr": "sum"}, {"bias": False, "activation": "tanh"}],
                         ids=["plain", "bases3", "bases12", "no-root", "sum", "tanh-no-bias"])
def test_template_equals_pyg(small, fast, options):
    spec = rgcn.RGCNSpec.create(5, 11, hidden=[4, 3], **options)
    _compare(small, spec, fast, reference=options == {})


def test_isolated_nodes_without_root(small):
    """Nodes without incoming edges and without a root term: 0 plus the bias, as in PyG."""
    g = kgmod.synthetic_hetero(60, 40, 3, n_features=2, seed=4)  # sparse: many nodes have no edges
    spec = rgcn.RGCNSpec.create(2, 3, hidden=[3], root_weight=False)
    graph = _compare(g, spec, fast=False)
    assert any(w.name == "conv1.zero" and not w.learnable for w in graph.weights)


def test_weight_copies_round_trip(small):
    spec = rgcn.RGCNSpec.create(5, 11, hidden=[4, 3], num_bases=2)
    graph = rgcn.rgcn(small.x, small.edge_index, small.edge_type, spec, seed=3)
    module = neurovec.compile(graph, dtype=torch.float64)
    twin = kg_twins.RGCNTwin(spec).double()
    kg_twins.copy_weights(module, twin)
    other = neurovec.compile(rgcn.rgcn(small.x, small.edge_index, small.edge_type, spec, seed=4),
                             dtype=torch.float64)
    kg_twins.copy_weights_from_twin(twin, other)
    for name, param in module.weights.named_parameters():
        assert torch.equal(param, other.weights[name]), name
    assert twin.conv1.weight.shape == (2, 5, 4) and twin.conv1.comp.shape == (11, 2)


def test_bad_edges_and_relation_counts(small, kg_dir):
    spec = rgcn.RGCNSpec.create(5, 10, hidden=4)
    with pytest.raises(DatasetError, match=r"edge \d+ has relation type 10, but the template has 10 relation types"):
        rgcn.rgcn(small.x, small.edge_index, small.edge_type, spec)
    with pytest.raises(DatasetError, match="unknown aggr 'max'"):
        rgcn.RGCNSpec.create(5, 3, aggr="max")
    kinship = kgmod.load_kg("kinships", data_dir=kg_dir)
    with pytest.raises(DatasetError, match=r"kinships/train\.txt, line \d+: relation 'term\d+' is relation number "
                                           r"25, but the template has 24 relations"):
        rgcn.rgcn_encoder(kinship, hidden=4, n_relations=24)
    with pytest.raises(DatasetError, match=r"kinships/train\.txt: the knowledge graph has 25 relations, but the "
                                           r"template has 26"):
        rgcn.rgcn_encoder(kinship, hidden=4, n_relations=26)


def test_link_prediction_trains_like_the_twin():
    """Encoder + DistMult, neurovec against the twin: the same losses and gradients at every step, fresh
    negatives each step, one compiled module throughout."""
    graph_kg = kgmod.synthetic_kg(40, 5, 500, seed=2)
    dim = 6
    encoder_graph = rgcn.rgcn_encoder(graph_kg, hidden=dim, layers=2, num_bases=None, seed=0)
    module = neurovec.compile(encoder_graph, Settings.preset("default", dynamic_facts=("x",)), dtype=torch.float64)
    ours = LinkPredictor(NeurovecEncoder(module), graph_kg.n_entities, graph_kg.n_relations, dim, seed=1)
    spec = rgcn.RGCNSpec.create(dim, 2 * graph_kg.n_relations, hidden=[dim, dim])
    twin = kg_twins.RGCNTwin(spec).double()
    kg_twins.copy_weights(module, twin)
    theirs = LinkPredictor(kg_twins.TwinEncoder(twin, *graph_kg.message_edges()), graph_kg.n_entities,
                           graph_kg.n_relations, dim, seed=1)
    positives = torch.tensor(graph_kg.train)
    opt_ours = torch.optim.Adam(ours.parameters(), lr=0.01)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    program = module.program
    for step in range(5):
        negatives = corrupt(positives, graph_kg.n_entities, 1, generator)
        losses = []
        for model, optimizer in ((ours, opt_ours), (theirs, opt_theirs)):
            optimizer.zero_grad()
            loss = model.loss(positives, negatives)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        _close(losses[0], losses[1], f"loss at step {step}")
    assert module.program is program
    _close(ours.node_emb.detach(), theirs.node_emb.detach(), "embeddings after 5 steps")
    twin_weights = kg_twins.twin_to_neurovec(dict(twin.named_parameters()),
                                             [n for n, _ in module.weights.named_parameters()])
    for name, param in module.weights.named_parameters():
        _close(param.detach(), twin_weights[name].detach(), name)


@pytest.mark.slow
def test_torch_compiled_twin_equals_eager(small):
    spec = rgcn.RGCNSpec.create(5, 11, hidden=[4, 3])
    for fast in (False, True):
        twin = _random_twin(spec, fast)
        args = (torch.tensor(small.x), torch.tensor(small.edge_index), torch.tensor(small.edge_type))
        torch._dynamo.reset()
        _close(torch.compile(twin)(*args), twin(*args), "torch.compile'd twin")


def test_kinship_encoder_gradients_with_two_threads(kg_dir):
    """Kinship's encoder under default at 2 threads equals the reference engine, gradients included: its weight
    stacks are read by two sparse sums each, whose transposes end in empty segments (a parallel C++ kernel once
    left those rows unwritten, and the weight gradients came out wrong by up to 20%)."""
    kinship = kgmod.load_kg("kinships", data_dir=kg_dir)
    graph = rgcn.rgcn_encoder(kinship, hidden=8, layers=2, seed=0)
    x = torch.tensor(np.random.default_rng(0).normal(size=(kinship.n_entities, 8)))
    probe = torch.tensor(np.random.default_rng(1).normal(size=(kinship.n_entities, 8)))
    reference = ReferenceModule(graph, torch.float64)
    (reference(facts={"x": x}) * probe).sum().backward()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        module = neurovec.compile(graph, Settings.preset("default", dynamic_facts=("x",)), dtype=torch.float64)
        (module(facts={"x": x}) * probe).sum().backward()
    finally:
        torch.set_num_threads(threads)
    for name, param in module.weights.named_parameters():
        _close(param.grad, reference.weights[name].grad, name)
