"""neurovec.distributed: 2 real processes on localhost (gloo, launched by torchrun) train like one process."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import neurovec
from neurovec import distributed
from neurovec.datasets import gnn
from neurovec.datasets.tu import load_tu

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(tmp_path, tu_dir, *args) -> Path:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "examples" / "train_distributed.py"), "--data-dir", str(tu_dir), "--out", str(out),
               "--dtype", "float64", "--hidden", "8", *args]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def _one_process(ds, samples, batches, lr=0.01) -> dict[str, torch.Tensor]:
    """The same training in one process: each step's whole batch, plain mean loss."""
    model = neurovec.MiniBatchModel(functools.partial(gnn.gcn, ds, hidden=8, layers=2, seed=0), dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    labels = torch.tensor(ds.graph_labels, dtype=torch.float64)
    for batch in batches:
        loss = F.binary_cross_entropy(model(batch).squeeze(-1), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict()


def _assert_same_weights(path: Path, expected: dict) -> None:
    got = torch.load(path)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name}: {m}")


def test_two_ranks_full_batch_equal_one_process(tmp_path, tu_dir):
    """101 samples: unequal shards (51 + 50); after 5 Adam steps the weights equal full-batch training."""
    out = _torchrun(tmp_path, tu_dir, "--samples", "101", "--epochs", "5")
    ds = load_tu("MUTAG", tu_dir)
    samples = np.arange(101)
    _assert_same_weights(out / "weights.pt", _one_process(ds, samples, [samples] * 5))
    # Each rank compiled only its shard, once.
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["compiled_samples"] for r in ranks] == [list(range(51)), list(range(51, 101))]
    assert [r["programs"] for r in ranks] == [1, 1]


def test_two_ranks_minibatches_equal_one_process(tmp_path, tu_dir):
    """Mini-batches across ranks compose with the loader: rank r runs part r of each of the loader's batches."""
    out = _torchrun(tmp_path, tu_dir, "--samples", "101", "--epochs", "2", "--batch-size", "34")
    ds = load_tu("MUTAG", tu_dir)
    model = neurovec.MiniBatchModel(functools.partial(gnn.gcn, ds, hidden=8, layers=2, seed=0))
    loader = neurovec.SampleLoader(model, np.arange(101), batch_size=34, shuffle=True, seed=0)
    batches = loader.batches(0) + loader.batches(1)
    assert len(batches) == 6 and sorted(b.size for b in batches) == [33, 33, 34, 34, 34, 34]
    _assert_same_weights(out / "weights.pt", _one_process(ds, np.arange(101), batches))


def test_mean_loss_without_a_group(tu_dir):
    assert not dist.is_initialized()
    model = neurovec.MiniBatchModel(functools.partial(gnn.gcn, load_tu("MUTAG", tu_dir), hidden=4, seed=0))
    batch = model.batch([3, 1, 2])
    losses = torch.tensor([[1.0], [2.0], [6.0]])
    assert distributed.mean_loss(losses, batch).item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="one row per sample"):
        distributed.mean_loss(losses.sum(), batch)
    with pytest.raises(RuntimeError, match="launch with torchrun"):
        distributed.init()
