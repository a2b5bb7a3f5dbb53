"""The GNN templates, compiled, compute what their PyTorch Geometric twins compute.

For every TU dataset and GCN / SAGE / GIN: copy the compiled module's weights
into the twin, then compare outputs and the gradient of every weight on the
full dataset (float32 within 1e-4, float64 within 1e-9).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec.datasets import gnn
from neurovec.datasets import pyg_twins as twins
from neurovec.datasets.tu import load_tu

pytest.importorskip("torch_geometric")

DATASETS = ["MUTAG", "ENZYMES", "PROTEINS"]
KINDS = {
    "gcn": (gnn.gcn, twins.gcn_twin),
    "sage": (gnn.sage, twins.sage_twin),
    "gin": (gnn.gin, twins.gin_twin),
}


@pytest.fixture(scope="module")
def datasets(tu_dir):
    return {name: load_tu(name, tu_dir) for name in DATASETS}


def _compare(module, twin, ds, samples, dtype, tol, use_attributes=False):
    twins.copy_weights(module, twin)
    x, edge_index, batch, n = twins.pyg_batch(ds, samples, use_attributes, dtype=dtype)
    ours, theirs = module(), twin(x, edge_index, batch, n)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=tol, rtol=tol)
    # A non-uniform loss, so that every output's gradient matters differently.
    probe = torch.linspace(-1.0, 1.0, ours.numel(), dtype=dtype).reshape(ours.shape)
    (ours * probe).sum().backward()
    (theirs * probe).sum().backward()
    params = dict(twin.named_parameters())
    for name, weight in module.weights.named_parameters():
        assert weight.grad is not None, name
        torch.testing.assert_close(weight.grad, params[name].grad, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", DATASETS)
def test_full_dataset_float32(datasets, name, kind):
    template, make_twin = KINDS[kind]
    ds = datasets[name]
    module = neurovec.compile(template(ds, hidden=16, layers=2, seed=1))
    _compare(module, make_twin(ds, hidden=16, layers=2), ds, None, torch.float32, 1e-4)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", DATASETS)
def test_full_dataset_float64(datasets, name, kind):
    template, make_twin = KINDS[kind]
    ds = datasets[name]
    module = neurovec.compile(template(ds, hidden=[8, 6, 5], seed=2)).double()
    _compare(module, make_twin(ds, hidden=[8, 6, 5]).double(), ds, None, torch.float64, 1e-9)


@pytest.mark.parametrize("options", [
    {"normalize": False},
    {"readout": "sum", "output_transformation": "identity", "use_attributes": True},
    {"out_dim": 3, "readout": "sum"},
])
def test_gcn_variants(datasets, options):
    ds = datasets["ENZYMES"]  # has isolated nodes and attributes
    module = neurovec.compile(gnn.gcn(ds, hidden=8, **options)).double()
    _compare(module, twins.gcn_twin(ds, hidden=8, **options).double(), ds, None, torch.float64, 1e-9,
             options.get("use_attributes", False))


def test_gin_with_eps(datasets):
    ds = datasets["MUTAG"]
    module = neurovec.compile(gnn.gin(ds, hidden=8, eps=0.25)).double()
    _compare(module, twins.gin_twin(ds, hidden=8, eps=0.25).double(), ds, None, torch.float64, 1e-9)


@pytest.mark.parametrize("kind", list(KINDS))
def test_sample_list_in_any_order(datasets, kind):
    """A mini-batch in shuffled order, with a repeat, gives the full-dataset outputs in that order."""
    template, make_twin = KINDS[kind]
    ds = datasets["PROTEINS"]
    samples = [700, 3, 1112, 3, 0, 41]
    full = neurovec.compile(template(ds, hidden=8, seed=3)).double()()
    batch = neurovec.compile(template(ds, hidden=8, seed=3, samples=samples)).double()
    torch.testing.assert_close(batch(), full[samples], atol=1e-10, rtol=1e-10)
    _compare(batch, make_twin(ds, hidden=8).double(), ds, samples, torch.float64, 1e-9)


def test_reference_engine_agrees_on_a_few_graphs(datasets):
    ds = datasets["ENZYMES"]
    samples = [5, 2]
    for kind, (template, make_twin) in KINDS.items():
        module = neurovec.ReferenceModule(template(ds, hidden=4, samples=samples))
        _compare(module, make_twin(ds, hidden=4).double(), ds, samples, torch.float64, 1e-9)


def test_copy_weights_back_and_forth(datasets):
    ds = datasets["MUTAG"]
    module = neurovec.ReferenceModule(gnn.sage(ds, hidden=4, samples=[0]))
    twin = twins.sage_twin(ds, hidden=4).double()
    with torch.no_grad():
        for p in twin.parameters():
            p.uniform_(-1, 1)
    twins.copy_weights_from_twin(twin, module)
    for name, weight in module.weights.named_parameters():
        assert torch.equal(weight, dict(twin.named_parameters())[name])
    mismatched = twins.gcn_twin(ds, hidden=4)
    with pytest.raises(ValueError, match="lin_l"):
        twins.copy_weights(module, mismatched)


def test_pyg_batch_matches_template_order(datasets):
    ds = datasets["MUTAG"]
    x, edge_index, batch, n = twins.pyg_batch(ds, [2, 0])
    sizes = np.bincount(ds.graph_of_node)
    assert n == 2 and x.shape[0] == sizes[2] + sizes[0]
    assert batch.tolist() == [0] * sizes[2] + [1] * sizes[0]
    assert edge_index.max() < x.shape[0]


def test_twins_reachable_as_in_the_readme():
    """``datasets.pyg_twins.gcn_twin`` after ``from neurovec import datasets`` (a fresh interpreter)."""
    import subprocess
    import sys
    code = "from neurovec import datasets; print(datasets.pyg_twins.gcn_twin.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gcn_twin"
