"""The benchmark harness (``benchmark.py``, ``neurovec.benchmarks``) on tiny runs.

No assertion here is about speed: only that the harness measures what it says,
writes its files, and refuses to trust an engine whose outputs are wrong.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import neurovec
import neurovec.benchmark as cli
from neurovec.benchmarks import measure, report, suite
from neurovec.benchmarks.contenders import Engine, NeurovecEngine
from neurovec.benchmarks.neuralogic_models import _mutagenesis_template
from neurovec.benchmarks.tasks import DataCache, make_task, replicate_tu

pytest.importorskip("torch_geometric")
pytest.importorskip("matplotlib")


class WrongEngine(NeurovecEngine):
    """neurovec's default preset with every output nudged by 0.01: fast, and wrong."""

    kind = "neurovec"

    def __init__(self):
        super().__init__("default", name="wrong")

    def forward(self) -> torch.Tensor:
        return self.module() + 0.01


class FailingEngine(Engine):
    """An engine whose build raises: the run must go on and record why."""

    def build(self, task, device, dtype):
        raise RuntimeError("this engine cannot be built")


def _config(tu_dir, **overrides) -> suite.Config:
    settings = dict(datasets=("MUTAG",), models=("gcn",), engines=("default", "pyg", "wrong", "failing"),
                    warmup=1, reps=1, threads=1, data_dir=str(tu_dir.parent), progress=False)
    settings.update(overrides)
    return suite.Config(**settings)


@pytest.fixture(scope="module")
def mutag_run(tu_dir):
    config = _config(tu_dir)
    return suite.run(config, custom_engines={"wrong": WrongEngine, "failing": lambda: FailingEngine("failing")})


def _records(results) -> dict:
    (group,) = results["groups"]
    return {record["engine"]: record for record in group["engines"]}


def test_run_checks_before_timing(mutag_run):
    records = _records(mutag_run)
    assert records["default"]["status"] == "ok" and records["default"]["valid"] is True
    assert records["pyg"]["status"] == "ok"
    assert records["default"]["check"]["gradients_checked"] > 0
    # The wrong engine is timed (its speed stays visible) but marked invalid, with the reason.
    wrong = records["wrong"]
    assert wrong["status"] == "invalid" and wrong["valid"] is False
    assert "oracle says" in wrong["check"]["message"]
    assert wrong["stats"]["step"]["n"] == 1
    assert records["failing"]["status"] == "failed"
    assert "cannot be built" in records["failing"]["error"]


def test_records_hold_raw_laps_and_memory(mutag_run):
    record = _records(mutag_run)["default"]
    raw = record["raw"]
    assert set(raw) >= {"forward", "backward", "optimizer", "step"}
    assert len(raw["step"]) == record["warmup"] + 1  # warm-up kept in the raw data, not in the stats
    assert np.isclose(raw["step"][-1], raw["forward"][-1] + raw["backward"][-1] + raw["optimizer"][-1])
    assert record["memory"]["kind"] == "cpu_rss" and record["memory"]["peak_bytes"] > 0
    assert record["build_s"] >= 0 and "passes_s" in record["build"]
    assert mutag_run["machine"]["torch_threads"] == 1


def test_best_preset_ignores_invalid_engines(mutag_run):
    (group,) = mutag_run["groups"]
    assert report.best_preset(group)["engine"] == "default"
    (row,) = report.pyg_rows(mutag_run)
    assert row["best"] == "default" and row["speedup_step"] > 0


def test_report_files(mutag_run, tmp_path):
    paths = report.write(mutag_run, tmp_path)
    for name in ("json", "markdown", "step", "forward", "backward", "iterations", "best"):
        assert paths[name].is_file() and paths[name].stat().st_size > 0, name
    assert paths["step"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = json.loads(paths["json"].read_text())
    assert loaded["schema"] == suite.SCHEMA and loaded["groups"][0]["engines"][0]["raw"]["step"]
    text = paths["markdown"].read_text()
    assert "Best neurovec preset against PyG" in text and "**invalid**" in text and "MUTAG/gcn" in text


def test_report_only_rewrites_tables_and_plots(mutag_run, tmp_path):
    report.write(mutag_run, tmp_path / "run", plots=False)
    assert cli.main(["--report-only", str(tmp_path / "run" / "results.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "results.md").read_text() == (tmp_path / "run" / "results.md").read_text()
    assert (tmp_path / "again" / "step.png").is_file() and not (tmp_path / "again" / "results.json").exists()


@pytest.mark.parametrize("mode", ["distinct", "identical"])
def test_scaling_replicates_the_dataset(tu_dir, tmp_path, mode):
    results = suite.run(_config(tu_dir, engines=("default",), scales=(1, 2), warmup=0, scale_mode=mode))
    small, large = results["groups"]
    assert large["info"]["samples"] == 2 * small["info"]["samples"]
    assert all(r["status"] == "ok" for g in results["groups"] for r in g["engines"])  # oracle: tiled or recomputed
    rows = report.scaling_rows(results)
    assert [r["scale"] for r in rows] == [1, 2]
    assert "scaling" in report.write(results, tmp_path)


def test_distinct_copies_differ_only_in_features(tu_dir):
    data, _ = DataCache(tu_dir.parent).get("MUTAG")
    twice = replicate_tu(data, 2)
    assert twice.n_graphs == 2 * data.n_graphs and twice.n_edges == 2 * data.n_edges
    first, second = np.split(twice.node_features(), 2)
    assert np.array_equal(first, data.node_features())
    assert not np.array_equal(second, first) and np.array_equal(second != 0, first != 0)


def test_task_labels_and_oracle_shapes(tu_dir):
    task = make_task(DataCache(tu_dir.parent), "MUTAG", "sage")
    oracle = task.oracle()
    assert oracle.outputs.shape == (task.n_samples, 1)
    assert set(np.unique(task.labels)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="does not apply"):
        make_task(DataCache(tu_dir.parent), "MUTAG", "dims")


def test_cli_arguments():
    args = cli.parse_args(["--engines", "all", "pyg", "--datasets", "MUTAG", "mutagenesis", "--scale", "1", "10"])
    config = cli.config_from_args(args)
    assert config.scales == (1, 10) and config.models is None
    assert len(suite.expand_engines(config.engines)) == len(suite.list_presets()) + 1
    with pytest.raises(SystemExit):
        cli.parse_args(["--engines", "no-such-preset"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--reps", "0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_a_gpu_is_skipped(tmp_path, capsys):
    assert cli.main(["--device", "cuda", "--out", str(tmp_path / "out")]) == 0
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_plan_and_engine_names():
    cells, notes = suite.plan(suite.Config(datasets=("MUTAG", "mutagenesis"), models=("gcn", "simple"),
                                           engines=("default", "neuralogic")))
    assert ("MUTAG", "gcn", 1, "template") in cells and ("mutagenesis", "simple", 1, "neuralogic") in cells
    assert not notes
    _, notes = suite.plan(suite.Config(models=("sage",), engines=("neuralogic",)))
    assert "no NeuraLogic model for MUTAG/sage" in notes[0]


def test_summaries_and_stopwatch():
    stats = measure.summarize([3.0, 1.0, 2.0, None])
    assert stats["n"] == 3 and stats["median"] == 2.0 and stats["min"] == 1.0 and stats["max"] == 3.0
    assert measure.summarize([]) == {"n": 0}
    watch = measure.Stopwatch(measure.synchronizer("cpu"))
    watch.lap("a")
    watch.lap("b")
    assert set(watch.laps) == {"a", "b"} and min(watch.laps.values()) >= 0


def test_dims_template_text():
    text = _mutagenesis_template("dims", 3, 1)
    assert "{1,1} bond_embed(B) :- b_7(B)." in text
    assert "l2_embed(X) :- {3,3} l1_embed(X), {3,3} l1_embed(Y), bond(X,Y,B), {3,1} bond_embed(B)." in text


def test_autotune_engine(tu_dir, monkeypatch):
    # Until neurovec.autotune exists the engine is skipped with a reason, never faked.
    monkeypatch.delattr("neurovec.autotune", raising=False)
    task = make_task(DataCache(tu_dir.parent), "MUTAG", "gcn")
    config = _config(tu_dir, engines=("autotune",))
    assert "not available" in suite.measure_engine(suite.make_engine("autotune", config), task, config)["reason"]
    # With it, whatever it picks is checked and timed like a preset.
    calls = []

    def fake_autotune(graph, presets, device, budget_s, dtype):
        calls.append(presets)
        module = neurovec.compile(graph, "default", dtype)
        table = SimpleNamespace(as_records=lambda: [{"preset": "default", "status": "ok"}])
        return SimpleNamespace(module=module, table=table, preset="default", kernel="auto")

    monkeypatch.setattr("neurovec.autotune", fake_autotune, raising=False)
    config = _config(tu_dir, engines=("all", "autotune"))
    record = suite.measure_engine(suite.make_engine("autotune", config), task, config)
    assert record["status"] == "ok" and record["build"]["chosen"] == "default/auto"
    assert calls[0] == suite.list_presets()
