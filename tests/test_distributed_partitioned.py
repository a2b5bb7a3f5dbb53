"""neurovec.partition on real processes: gloo on localhost, launched by torchrun, trains like one process.

Each launch runs examples/train_partitioned.py (several models and presets per launch, to pay
the start-up once); the test trains the same models in this process on the whole graph and
compares weights and outputs (float64, 1e-9), and counts the bytes exchanged per step
against the halo computed here from the edges.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neurovec
from neurovec.partition import NodeGNN

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["default", "unoptimized", "upward-17-aggressive"]
TIMEOUT_S = 600


def _example():
    spec = importlib.util.spec_from_file_location("train_partitioned", ROOT / "examples" / "train_partitioned.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun(out: Path, nproc: int, *args: str) -> Path:
    """Launch the example on ``nproc`` gloo ranks; kill the whole process group if it hangs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(ROOT / "examples" / "train_partitioned.py"), "--out", str(out), "--dtype", "float64", *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"torchrun did not finish within {TIMEOUT_S} s:\n{output}")
    assert process.returncode == 0, output
    return out


def one_process(data: dict, kind: str, preset: str, widths, epochs: int = 5, lr: float = 0.01):
    """The same training in one process: the whole graph compiled, mean loss over the training nodes."""
    graph = NodeGNN(kind, data["x"], data["edge_index"], widths, seed=0).graph()
    module = neurovec.compile(graph, preset, torch.float64)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    labels, train = torch.as_tensor(data["y"]), torch.as_tensor(data["train_mask"])
    for _ in range(epochs):
        loss = F.cross_entropy(module()[train], labels[train])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return module.weights.state_dict(), module()


def check_equal(out: Path, nproc: int, data: dict, kinds, presets, widths) -> None:
    weights = torch.load(out / "weights.pt")
    outputs = [torch.load(out / f"outputs{r}.pt") for r in range(nproc)]
    for kind in kinds:
        for preset in presets:
            expected_state, expected_out = one_process(data, kind, preset, widths)
            got = weights[(kind, preset)]
            assert got.keys() == expected_state.keys()
            for name, value in expected_state.items():
                torch.testing.assert_close(got[name], value, rtol=1e-9, atol=1e-9,
                                           msg=lambda m: f"{kind} {preset}, {name}: {m}")
            assembled = torch.full_like(expected_out, float("nan"))
            for rank_outputs in outputs:
                ids, values = rank_outputs[(kind, preset)]
                assembled[ids] = values
            torch.testing.assert_close(assembled, expected_out, rtol=1e-9, atol=1e-9,
                                       msg=lambda m: f"{kind} {preset}, outputs: {m}")


def halo_per_rank(edge_index: np.ndarray, parts: np.ndarray, world: int, drop_loops: bool) -> np.ndarray:
    """halo[p, r]: distinct nodes owned by r read by p's nodes (r != p), counted here from the edges."""
    src, dst = edge_index
    if drop_loops:
        src, dst = src[src != dst], dst[src != dst]
    halo = np.zeros((world, world), np.int64)
    for p in range(world):
        for r in range(world):
            if p != r:
                halo[p, r] = np.unique(src[(parts[dst] == p) & (parts[src] == r)]).size
    return halo


def check_bytes(out: Path, nproc: int, data: dict, widths) -> None:
    """Per step each rank sends, forward, every row its peers read of each exchanged layer, and backward
    the gradients of every row it read: halo rows x width x 8 bytes (float64), layer by layer."""
    parts = np.load(out / "parts.npy")
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    for kind in ("gcn", "sage"):
        halo = halo_per_rank(data["edge_index"], parts, nproc, drop_loops=kind == "gcn")
        # GCN exchanges every convolution's lin (each width); SAGE every convolution's output read by the next.
        width = sum(widths) if kind == "gcn" else sum(widths[:-1])
        for r, record in enumerate(records):
            run = next(run for run in record["runs"] if run["model"] == kind)
            expected = [int(halo[:, r].sum()) * width * 8, int(halo[r, :].sum()) * width * 8]
            assert all(step == expected for step in run["step_bytes"]), (kind, r, run["step_bytes"], expected)
            assert run["values_sent"] * 8 == expected[0] and run["values_received"] * 8 == expected[1]


def test_two_gloo_ranks_train_like_one_process(tmp_path):
    """Graph with self loops, a repeated edge and isolated nodes; GCN and SAGE under three presets."""
    out = torchrun(tmp_path / "out", 2, "--dataset", "toy", "--models", "gcn", "sage", "--presets", *PRESETS,
                   "--hidden", "6")
    data = _example().toy_dataset(0)
    check_equal(out, 2, data, ["gcn", "sage"], PRESETS, (6, 3))
    check_bytes(out, 2, data, (6, 3))


@pytest.mark.slow
def test_four_gloo_ranks_train_like_one_process(tmp_path):
    out = torchrun(tmp_path / "out", 4, "--dataset", "toy", "--models", "gcn", "sage", "--presets", *PRESETS,
                   "--hidden", "6", "--layers", "3")
    data = _example().toy_dataset(0)
    check_equal(out, 4, data, ["gcn", "sage"], PRESETS, (6, 6, 3))
    check_bytes(out, 4, data, (6, 6, 3))


def _cora(planetoid_dir):
    planetoid = pytest.importorskip("neurovec.datasets.planetoid", reason="datasets.load_planetoid not landed yet")
    ds = planetoid.load_planetoid("Cora", data_dir=planetoid_dir)
    return {"x": ds.x, "edge_index": ds.edge_index, "y": ds.y, "train_mask": ds.train_mask,
            "num_classes": ds.num_classes}


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_cora_on_gloo_ranks_trains_like_one_process(tmp_path, planetoid_dir, nproc):
    data = _cora(planetoid_dir)
    out = torchrun(tmp_path / "out", nproc, "--dataset", "cora", "--data-dir", str(planetoid_dir), "--models", "gcn",
                   "sage", "--presets", *PRESETS)
    check_equal(out, nproc, data, ["gcn", "sage"], PRESETS, (16, 7))
    check_bytes(out, nproc, data, (16, 7))


@pytest.mark.slow
def test_a_partition_for_another_world_size_is_refused(tmp_path):
    """parts made for 4 ranks, 2 processes launched: each rank stops with a clear error."""
    data = _example().toy_dataset(0)
    np.save(tmp_path / "parts.npy", np.arange(data["x"].shape[0]) % 4)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "examples" / "train_partitioned.py"), "--dataset", "toy", "--parts",
               str(tmp_path / "parts.npy")]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode != 0
    assert "node 2 is given rank 2, outside 0..1 (2 ranks)" in run.stdout + run.stderr
