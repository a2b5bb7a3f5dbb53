"""The relational Mutagenesis templates (thesis 6.3) over the SQL-loaded dataset."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec.datasets import (DatasetError, create_database, load_mutagenesis, mutagenesis_dims,
                               mutagenesis_simple, mutagenesis_template)
from neurovec.datasets.mutagenesis import Mutagenesis

pytest.importorskip("sqlalchemy")

TEMPLATES = {"simple": mutagenesis_simple, "dims": mutagenesis_dims}


@pytest.fixture(scope="module")
def mutagenesis(mutagenesis_dir, tmp_path_factory):
    """Loaded through a fresh SQLite file, as a user would."""
    path = tmp_path_factory.mktemp("db") / "mutagenesis.db"
    create_database(mutagenesis_dir, path)
    return load_mutagenesis(path)


def _direct(ds: Mutagenesis, weights, architecture: str, layers: int = 3) -> torch.Tensor:
    """The template rules written directly in torch (embedding lookups and index_add), no neuron graph."""
    w = lambda name: weights[name]  # noqa: E731
    atom = torch.tanh(torch.stack([w(f"atom_embed.{e}") for e in ds.element_names])[ds.atom_element])
    bond = torch.tanh(torch.stack([w(f"bond_embed.type{t}") for t in ds.bond_type_values.tolist()])[ds.bond_type])
    x, y, b = (torch.from_numpy(a) for a in ds.directed)
    count = torch.bincount(x, minlength=ds.n_atoms).to(atom.dtype)[:, None]
    h = atom
    for k in range(1, layers + 1):
        e = bond[b] @ w(f"layer{k}.bond").T + 1.0 if architecture == "dims" else bond[b]
        rule = torch.tanh(h[x] @ w(f"layer{k}.atom_x").T + h[y] @ w(f"layer{k}.atom_y").T + e)
        h = torch.tanh(torch.zeros_like(h[:, :1].expand(-1, rule.shape[1])).index_add(0, x, rule) / count)
    molecule = torch.from_numpy(ds.atom_molecule)
    pooled = torch.zeros(ds.n_molecules, h.shape[1], dtype=h.dtype).index_add(0, molecule, h)
    pooled = pooled / torch.bincount(molecule, minlength=ds.n_molecules).to(h.dtype)[:, None]
    return torch.sigmoid(pooled @ w("out.weight").T)


def test_every_atom_is_bonded(mutagenesis):
    # The direct implementation (and the thesis' 4893 -> 188 readout) rely on it.
    assert np.bincount(mutagenesis.directed[0], minlength=mutagenesis.n_atoms).min() > 0


@pytest.mark.parametrize("architecture", list(TEMPLATES))
def test_structure(mutagenesis, architecture):
    graph = TEMPLATES[architecture](mutagenesis)
    names = [layer.name for layer in graph.layers]
    assert names[-1] == "out" and "layer3_rule" in names and ("bond" in names) == (architecture == "dims")
    assert graph.layer("layer1_rule").size == 2 * 5243 and graph.layer("layer3").size == 4893
    assert graph.layer("atom_embed").size == 4893 and graph.layer("bond_embed").size == 5243
    assert graph.output_layer.size == 188 and graph.layer_shapes[-1] == (1,)
    shapes = {w.name: w.shape for w in graph.weights}
    assert shapes["atom_embed.cl"] == (3,) and shapes["layer2.atom_y"] == (3, 3) and shapes["out.weight"] == (1, 3)
    if architecture == "dims":
        assert shapes["bond_embed.type7"] == (1,) and shapes["layer1.bond"] == (3, 1)
        assert graph.layer("layer1_rule").counts[0] == 4
    else:
        assert shapes["bond_embed.type7"] == (3,) and "layer1.bond" not in shapes
        assert graph.layer("layer1_rule").counts[0] == 3


@pytest.mark.parametrize("architecture", list(TEMPLATES))
def test_compiled_equals_direct_implementation(mutagenesis, architecture):
    module = neurovec.compile(TEMPLATES[architecture](mutagenesis, seed=1)).double()
    out = module()
    expected = _direct(mutagenesis, module.weights, architecture)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    out.sum().backward()
    for name, weight in module.weights.named_parameters():
        assert weight.grad is not None and torch.isfinite(weight.grad).all(), name


@pytest.mark.parametrize("architecture", list(TEMPLATES))
def test_reference_engine_on_a_few_molecules(mutagenesis, architecture):
    """Forward + backward with the reference engine; a batch equals the full graph's rows."""
    samples = ["d42", 3, 0, 3]
    module = neurovec.ReferenceModule(TEMPLATES[architecture](mutagenesis, samples=samples, seed=2))
    out = module()
    assert out.shape == (4, 1)
    out.sum().backward()
    assert module.weights["layer1.atom_x"].grad.abs().sum() > 0
    full = neurovec.ReferenceModule(TEMPLATES[architecture](mutagenesis, seed=2))
    index = [mutagenesis.molecule_ids.index("d42"), 3, 0, 3]
    expected = _direct(mutagenesis, full.weights, architecture)[index]
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("architecture", list(TEMPLATES))
def test_training_reduces_the_loss(mutagenesis, architecture):
    torch.manual_seed(0)
    module = neurovec.compile(TEMPLATES[architecture](mutagenesis, seed=3))
    target = torch.tensor(mutagenesis.labels, dtype=torch.float32)[:, None]
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy(module(), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.01 and np.mean(losses[-5:]) < np.mean(losses[:5]), losses


def test_generic_entry_point_and_errors(mutagenesis):
    assert mutagenesis_template(mutagenesis, "dims", 4, 2, layers=2).layer_shapes[-1] == (1,)
    with pytest.raises(DatasetError, match="unknown architecture"):
        mutagenesis_template(mutagenesis, "deep")
    with pytest.raises(DatasetError, match="unknown sample id 'zzz'"):
        mutagenesis_simple(mutagenesis, samples=["zzz"])


def test_molecule_without_bonds_is_an_error():
    lonely = Mutagenesis(
        molecule_ids=("m0", "m1"), labels=np.array([1, 0]), atom_ids=("a", "b", "c"),
        atom_molecule=np.array([0, 0, 1]), atom_element=np.array([0, 0, 0]), atom_type=np.array([0, 0, 0]),
        bond_atoms=np.array([[0, 1]]), bond_type=np.array([0]), element_names=("c",),
        type_values=np.array([22]), bond_type_values=np.array([1]))
    assert mutagenesis_simple(lonely, samples=[0]).output_layer.size == 1
    with pytest.raises(DatasetError, match="molecule 'm1' has no bonds"):
        mutagenesis_simple(lonely)
