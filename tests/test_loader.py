"""Mini-batches that share one set of weights (neurovec.loader), against the PyG twins."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neurovec
from neurovec.datasets import gnn
from neurovec.datasets.tu import load_tu

TEMPLATES = {"gcn": gnn.gcn, "sage": gnn.sage, "gin": gnn.gin}


@pytest.fixture(scope="module")
def mutag(tu_dir):
    return load_tu("MUTAG", tu_dir)


def _model(ds, kind="gcn", dtype=torch.float64, **options):
    return neurovec.MiniBatchModel(functools.partial(TEMPLATES[kind], ds, hidden=8, seed=3), dtype=dtype, **options)


def test_batches_share_the_models_parameters(mutag):
    model = _model(mutag)
    loader = neurovec.SampleLoader(model, np.arange(60), batch_size=16, shuffle=True, seed=1)
    batches = list(loader)
    assert len(batches) == 4 and model.n_compiled == 4
    ours = {id(p) for p in model.parameters()}
    for batch in batches:
        assert {id(p) for p in batch.program.parameters()} == ours
    before = [model(batch).detach().clone() for batch in batches]
    # One optimizer step on the first batch's loss changes every batch's forward.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(batches[0]).pow(2).mean().backward()
    optimizer.step()
    for batch, old in zip(batches, before):
        assert not torch.allclose(model(batch), old)
    # state_dict holds the weights once, under the template's names.
    assert set(model.state_dict()) == {f"weights.{n}" for n, _ in model.weights.named_parameters()}


def test_loader_batches(mutag):
    model = _model(mutag)
    samples = np.arange(10, 110)
    loader = neurovec.SampleLoader(model, samples, batch_size=32, shuffle=True, seed=7)
    first, second = loader.batches(0), loader.batches(1)
    # A partition of the samples, the same set of batches every epoch, visited in another order.
    assert sorted(np.concatenate(first).tolist()) == samples.tolist()
    assert [b.size for b in first].count(4) == 1
    assert {b.tobytes() for b in first} == {b.tobytes() for b in second}
    assert [b.tobytes() for b in first] != [b.tobytes() for b in second]
    list(loader)
    list(loader)
    assert model.n_compiled == 4  # no recompile in the second epoch
    same_seed = neurovec.SampleLoader(model, samples, batch_size=32, shuffle=True, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(same_seed.batches(0), first))
    # In order without shuffling; drop_last drops the short batch.
    plain = neurovec.SampleLoader(model, samples, batch_size=32, drop_last=True)
    assert [b.tolist() for b in plain.batches(5)] == [samples[i:i + 32].tolist() for i in (0, 32, 64)]
    # Several partitions: epoch e uses partition e % k.
    two = neurovec.SampleLoader(model, samples, batch_size=32, shuffle=True, seed=7, partitions=2)
    assert {b.tobytes() for b in two.batches(0)} == {b.tobytes() for b in two.batches(2)}
    assert {b.tobytes() for b in two.batches(0)} != {b.tobytes() for b in two.batches(1)}
    # Full batch.
    assert [b.tolist() for b in neurovec.SampleLoader(model, samples).batches()] == [samples.tolist()]


def test_loader_parts_for_ranks(mutag):
    model = _model(mutag)
    parts = [neurovec.SampleLoader(model, np.arange(50), batch_size=16, shuffle=True, seed=2, rank=r, world_size=2)
             for r in range(2)]
    for a, b, whole in zip(*(list(p) for p in parts), parts[0].batches(0)):
        assert np.array_equal(np.concatenate([a.samples, b.samples]), whole)
        assert a.global_size == b.global_size == whole.size
    with pytest.raises(ValueError, match="cannot be split across 2 ranks"):
        neurovec.SampleLoader(model, np.arange(33), batch_size=16, rank=0, world_size=2)


@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_minibatch_epochs_equal_the_pyg_twin(mutag, kind):
    """Output for output and gradient for gradient, two epochs of Adam over the same batches (float64)."""
    pytest.importorskip("torch_geometric")
    from neurovec.datasets import pyg_twins

    model = _model(mutag, kind)
    twin = getattr(pyg_twins, f"{kind}_twin")(mutag, hidden=8).double()
    pyg_twins.copy_weights(model, twin)
    ours_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=0.01)
    labels = torch.tensor(mutag.graph_labels, dtype=torch.float64)
    twin_params = dict(twin.named_parameters())
    loader = neurovec.SampleLoader(model, np.arange(mutag.n_graphs), batch_size=48, shuffle=True, seed=0)
    for epoch in range(2):
        for batch in loader:
            x, edge_index, graph, n = pyg_twins.pyg_batch(mutag, batch.samples, dtype=torch.float64)
            ours, theirs = model(batch), twin(x, edge_index, graph, n)
            torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)
            for optimizer, out in ((ours_opt, ours), (twin_opt, theirs)):
                optimizer.zero_grad()
                F.binary_cross_entropy(out.squeeze(-1), labels[batch.samples]).backward()
            for name, weight in model.weights.named_parameters():
                torch.testing.assert_close(weight.grad, twin_params[name].grad.reshape(weight.shape),
                                           rtol=1e-9, atol=1e-9, msg=lambda m: f"{name}: {m}")
            ours_opt.step()
            twin_opt.step()
    for name, weight in model.weights.named_parameters():
        torch.testing.assert_close(weight, twin_params[name].reshape(weight.shape), rtol=1e-9, atol=1e-9)


def test_checkpoint_and_device_moves(mutag, tmp_path):
    model = _model(mutag, "gin")
    batch = model.batch(np.arange(20))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    fresh = _model(mutag, "gin")
    fresh.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    torch.testing.assert_close(fresh(np.arange(20)), model(batch), rtol=0, atol=0)
    # model.float() moves the weights; a cached program follows them when used.
    expected = model(batch).float()
    model.float()
    out = model(batch)
    assert out.dtype == torch.float32 and all(p.dtype == torch.float32 for p in batch.program.parameters())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_inconsistent_templates_are_refused(mutag):
    calls = iter(range(100))
    model = neurovec.MiniBatchModel(lambda samples: gnn.gcn(mutag, hidden=4, samples=samples, seed=next(calls)))
    with pytest.raises(neurovec.GraphError, match="another initial value.*same seed"):
        model(np.arange(5))
    other = _model(mutag)
    with pytest.raises(ValueError, match="compiled by another MiniBatchModel"):
        other(_model(mutag).batch(np.arange(5)))
    with pytest.raises(ValueError, match="integer sample ids"):
        other(np.array([0.5, 1.0]))
    with pytest.raises(TypeError, match="must return a neurovec.Graph"):
        neurovec.MiniBatchModel(lambda samples: None)



def test_minibatch_is_immutable_and_pickles(mutag):
    import pickle
    model = _model(mutag)
    batch = model.batch([0, 1, 2])
    with pytest.raises(AttributeError, match="immutable"):
        batch.samples = np.arange(2)
    again = pickle.loads(pickle.dumps(batch))
    assert np.array_equal(again.samples, batch.samples) and again.global_size == 3 and len(again) == 3


def test_lightning_trains_two_epochs_with_minibatches_unchanged(mutag, tmp_path):
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.utilities import move_data_to_device
    model = _model(mutag, dtype=torch.float32)
    loader = neurovec.SampleLoader(model, np.arange(64), batch_size=32, shuffle=True, seed=0)
    labels = torch.tensor(mutag.graph_labels, dtype=torch.float32)
    batch = next(iter(loader))
    assert move_data_to_device(batch, torch.device("cpu")) is batch     # walked through, unchanged
    seen = []

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, index):
            seen.append(batch)
            return F.binary_cross_entropy(self.model(batch).squeeze(-1), labels[batch.samples])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    before = [p.detach().clone() for p in model.parameters()]
    trainer = lightning.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(Module(), train_dataloaders=loader)
    assert len(seen) == 4 and all(isinstance(b, neurovec.MiniBatch) for b in seen)
    assert model.n_compiled == 2                                          # each batch compiled once
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
