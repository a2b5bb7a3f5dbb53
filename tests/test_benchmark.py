"""The benchmark harness (``benchmark.py``, ``neurovec.benchmarks``) on tiny runs.

No assertion here is about speed: only that the harness measures what it says,
writes its files, refuses to trust an engine whose outputs or gradients are
wrong, and exits non-zero when nothing valid ran.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import neurovec
import neurovec.benchmark as cli
from neurovec.benchmarks import contenders, measure, report, suite, tasks
from neurovec.benchmarks.contenders import Engine, NeurovecEngine
from neurovec.benchmarks.neuralogic_models import _mutagenesis_template
from neurovec.benchmarks.tasks import DataCache, make_task, replicate_tu, step_bytes

pytest.importorskip("torch_geometric")
pytest.importorskip("matplotlib")


class WrongEngine(NeurovecEngine):
    """neurovec's default preset with every output nudged by 0.01: fast, and wrong."""

    kind = "neurovec"

    def __init__(self):
        super().__init__("default", name="wrong")

    def forward(self) -> torch.Tensor:
        return self.module() + 0.01


class WrongGradientEngine(NeurovecEngine):
    """The right outputs with gradients 1.5 times too large: only the gradient check can catch it."""

    kind = "neurovec"

    def __init__(self):
        super().__init__("default", name="wrong-gradient")

    def forward(self) -> torch.Tensor:
        out = self.module()
        return out + 0.5 * (out - out.detach())


class FailingEngine(Engine):
    """An engine whose build raises: the run must go on and record why."""

    def build(self, task, device, dtype):
        raise RuntimeError("this engine cannot be built")


CUSTOM = {"wrong": WrongEngine, "wrong-gradient": WrongGradientEngine, "failing": lambda: FailingEngine("failing")}


def _config(tu_dir, **overrides) -> suite.Config:
    settings = dict(datasets=("MUTAG",), models=("gcn",), engines=("default", "pyg", "pyg-tuned", "wrong", "failing"),
                    warmup=1, reps=1, threads=1, data_dir=str(tu_dir.parent), progress=False, bandwidth_mb=8)
    settings.update(overrides)
    return suite.Config(**settings)


@pytest.fixture(scope="module")
def mutag_run(tu_dir):
    return suite.run(_config(tu_dir), custom_engines=CUSTOM)


def _records(results, k: int = 0) -> dict:
    return {record["engine"]: record for record in results["groups"][k]["engines"]}


def test_run_checks_before_timing(mutag_run):
    records = _records(mutag_run)
    for name in ("default", "pyg", "pyg-tuned"):
        assert records[name]["status"] == "ok" and records[name]["valid"] is True, name
        assert records[name]["check"]["gradients_checked"] > 0, name
    assert records["pyg-tuned"]["build"] == {"cached": True, "adjacency": "csr", "torch_compile": False}
    # The wrong engine is timed (its speed stays visible) but marked invalid, with the reason.
    wrong = records["wrong"]
    assert wrong["status"] == "invalid" and wrong["valid"] is False
    assert "oracle says" in wrong["check"]["message"]
    assert wrong["stats"]["step"]["n"] == 1
    assert records["failing"]["status"] == "failed"
    assert "cannot be built" in records["failing"]["error"]


def test_records_hold_raw_laps_compile_time_and_memory(mutag_run):
    record = _records(mutag_run)["default"]
    raw = record["raw"]
    assert set(raw) >= {"forward", "backward", "optimizer", "step"}
    assert len(raw["step"]) == record["warmup"] + 1  # warm-up kept in the raw data, not in the stats
    assert np.isclose(raw["step"][-1], raw["forward"][-1] + raw["backward"][-1] + raw["optimizer"][-1])
    assert record["memory"]["peak_bytes"] >= record["memory"]["baseline_bytes"] > 0
    assert record["compile_s"] == pytest.approx(record["build_s"] + record["first_pass_s"])
    assert mutag_run["machine"]["torch_threads"] == 1
    assert mutag_run["bandwidth"]["start"]["bytes_per_s"] > 0 and mutag_run["bandwidth"]["end"]["bytes_per_s"] > 0
    assert mutag_run["groups"][0]["traffic"]["bytes"] > 0


class CountingEngine(NeurovecEngine):
    """neurovec's default preset, counting its training iterations."""

    kind = "neurovec"

    def __init__(self):
        super().__init__("default", name="counting")
        self.iterations = 0

    def iteration(self, watch, probe):
        self.iterations += 1
        super().iteration(watch, probe)


@pytest.mark.parametrize("settle", [0, 2])
def test_interleaved_timing_settles_each_engine_before_its_timed_step(tu_dir, settle):
    engine = CountingEngine()
    config = _config(tu_dir, engines=("counting", "pyg"), warmup=1, reps=3, settle=settle)
    results = suite.run(config, custom_engines={"counting": lambda: engine})
    record = _records(results)["counting"]
    assert engine.iterations == 1 + 3 * (1 + settle)  # warm-up, then each round: settle + the timed one
    assert len(record["raw"]["step"]) == 1 + 3  # only the warm-up and the timed iterations are recorded
    assert results["config"]["settle"] == settle


def test_summaries_ignore_invalid_engines(mutag_run):
    (group,) = mutag_run["groups"]
    assert report.best_preset(group)["engine"] == "default"  # "wrong" is faster or not: it is invalid
    (row,) = report.headline_rows(mutag_run)
    assert row["default_speedup"] > 0 and row["pyg"] in ("pyg", "pyg-tuned") and row["features"] == "labels"


def test_report_files(mutag_run, tmp_path):
    paths = report.write(mutag_run, tmp_path)
    for name in ("json", "markdown", "speedup", "step", "forward", "backward", "iterations", "best"):
        assert paths[name].is_file() and paths[name].stat().st_size > 0, name
    assert paths["step"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = json.loads(paths["json"].read_text())
    assert loaded["schema"] == suite.SCHEMA and loaded["groups"][0]["engines"][0]["raw"]["step"]
    text = paths["markdown"].read_text()
    # The headline is the first table of results.md.
    assert text.index("## Headline: neurovec against the fastest PyG contender") < text.index("| ")
    assert "## The physical limit" in text and "## The PyG contenders" in text
    assert "**invalid**" in text and "MUTAG/gcn labels" in text


def test_report_only_rewrites_tables_and_plots(mutag_run, tmp_path):
    report.write(mutag_run, tmp_path / "run", plots=False)
    assert cli.main(["--report-only", str(tmp_path / "run" / "results.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "results.md").read_text() == (tmp_path / "run" / "results.md").read_text()
    assert (tmp_path / "again" / "step.png").is_file() and not (tmp_path / "again" / "results.json").exists()


def _group(features="labels", **steps) -> dict:
    kinds = {"pyg": "pyg", "pyg-tuned": "pyg", "pyg-compiled": "pyg", "autotune": "autotune"}
    engines = [{"engine": name, "kind": kinds.get(name, "neurovec"), "status": "ok",
                "stats": {"step": {"median": seconds}}, "build": {"chosen": "upward-05-rel-0.5/auto"}}
               for name, seconds in steps.items()]
    return {"key": f"T/gcn {features}", "dataset": "T", "model": "gcn", "features": features, "scale": 1,
            "source": "template", "engines": engines}


def test_headline_is_default_or_autotune_against_the_fastest_pyg():
    results = {"groups": [
        # the fastest PyG is the compiled one; autotune beats default; a preset picked after timing beats both
        _group("labels", default=4.0, autotune=2.0, **{"upward-00-free": 1.0, "pyg": 20.0, "pyg-tuned": 10.0,
                                                       "pyg-compiled": 5.0}),
        _group("continuous", default=10.0, autotune=12.0, pyg=9.0),
    ]}
    labels, continuous = report.headline_rows(results)
    assert labels["pyg"] == "pyg-compiled" and labels["speedup"] == pytest.approx(2.5)
    assert labels["default_speedup"] == pytest.approx(1.25) and labels["autotune_speedup"] == pytest.approx(2.5)
    assert labels["best"] == "upward-00-free" and labels["best_speedup"] == pytest.approx(5.0)
    assert labels["target"] == 2.0 and labels["met"] is True
    assert continuous["speedup"] == pytest.approx(0.9) and continuous["target"] == 1.5 and continuous["met"] is False
    # an invalid PyG contender is never "the fastest"
    results["groups"][0]["engines"][-1]["status"] = "invalid"
    assert report.headline_rows(results)[0]["pyg"] == "pyg-tuned"


def test_headline_pools_two_timings_of_one_program_when_autotune_keeps_default():
    group = _group("labels", default=4.0, autotune=2.0, pyg=8.0)
    default, tuned = group["engines"][:2]
    default.update(warmup=1, raw={"step": [9.0, 4.0, 4.0, 4.0, 4.0]})
    tuned.update(warmup=1, raw={"step": [9.0, 2.0, 2.0, 2.0]}, build={"chosen": report.DEFAULT_CONFIGURATION})
    (row,) = report.headline_rows({"groups": [group]})
    # Not the faster of the two timings (8 / 2): the median of all seven timed steps, 4.
    assert row["speedup"] == pytest.approx(2.0) and row["autotune_speedup"] == pytest.approx(4.0)
    # A different program picked by autotune is what a user gets: the better of the two stands.
    tuned["build"] = {"chosen": "upward-05-rel-0.5/auto"}
    assert report.headline_rows({"groups": [group]})[0]["speedup"] == pytest.approx(4.0)


def test_limit_rows_set_steps_against_the_bandwidth_bound():
    group = _group("labels", default=0.002, pyg=0.004)
    group["traffic"] = {"bytes": 10_000_000}
    results = {"groups": [group], "bandwidth": {"start": {"bytes_per_s": 1e10}, "end": {"bytes_per_s": 3e10}}}
    (row,) = report.limit_rows(results)
    assert row["bound"] == pytest.approx(10_000_000 / 2e10)  # the mean of the two measurements
    assert row["default"] == pytest.approx(0.25) and row["pyg"] == pytest.approx(0.125)


def test_step_bytes_follows_its_documented_model(tu_dir):
    task = make_task(DataCache(tu_dir.parent), "MUTAG", "gcn")
    n, e = 3371, 7442 + 3371          # MUTAG: nodes, directed edges + one self loop per node
    b, i = 4, 4
    adjacency = e * i + n * i + e * b  # GCN: column indices, row offsets, edge values
    layer1 = (n * 7 * b + adjacency + 2 * n * 7 * b + n * 16 * b) + (2 * n * 16 * b + 2 * n * 7 * b + n * 7 * b)
    layer2 = (n * 16 * b + adjacency + 2 * n * 16 * b + n * 16 * b) + (2 * n * 16 * b + 2 * n * 16 * b
                                                                     + n * 16 * b + adjacency + n * 16 * b)
    readout = 2 * (n * 16 * b + n * i)
    assert step_bytes(task, 4)["bytes"] == layer1 + layer2 + readout
    assert step_bytes(make_task(DataCache(tu_dir.parent), "mutagenesis", "simple"), 4) is None


def test_continuous_features_perturb_every_node(tu_dir):
    cache = DataCache(tu_dir.parent)
    labels = make_task(cache, "MUTAG", "gcn").data.node_features()
    task = make_task(cache, "MUTAG", "gcn", features="continuous")
    again = make_task(cache, "MUTAG", "gcn", features="continuous")
    continuous = task.data.node_features()
    assert task.key == "MUTAG/gcn continuous" and not task.identical_copies
    ratio = continuous[labels != 0] / labels[labels != 0]
    assert np.all(np.abs(ratio - 1) <= tasks.FEATURE_SPREAD) and np.unique(ratio).size == ratio.size  # copy 0 too
    assert np.array_equal(continuous == 0, labels == 0) and np.array_equal(continuous, again.data.node_features())
    # at scale, every copy has its own features
    twice = make_task(cache, "MUTAG", "gcn", scale=2, features="continuous").data.node_features()
    first, second = np.split(twice, 2)
    assert np.array_equal(first, continuous) and not np.array_equal(second, first)
    with pytest.raises(ValueError, match="TU datasets only"):
        make_task(cache, "mutagenesis", "simple", features="continuous")


def test_both_feature_modes_in_one_run(tu_dir):
    cells, _ = suite.plan(_config(tu_dir, features=("labels", "continuous"), datasets=("MUTAG", "mutagenesis"),
                                  models=("gcn", "simple")))
    assert ("MUTAG", "gcn", "labels", 1, "template") in cells and ("MUTAG", "gcn", "continuous", 1, "template") in cells
    assert [c for c in cells if c[0] == "mutagenesis"] == [("mutagenesis", "simple", "labels", 1, "template")]


@pytest.mark.parametrize("features, mode",
                         [("labels", "distinct"), ("labels", "identical"), ("continuous", "distinct")])
def test_scaling_replicates_the_dataset(tu_dir, tmp_path, features, mode):
    results = suite.run(_config(tu_dir, engines=("default", "pyg-tuned"), scales=(1, 2), warmup=0, scale_mode=mode,
                                features=(features,)))
    small, large = results["groups"]
    assert large["info"]["samples"] == 2 * small["info"]["samples"]
    assert large["traffic"]["bytes"] > 1.9 * small["traffic"]["bytes"]
    assert all(r["status"] == "ok" for g in results["groups"] for r in g["engines"])  # oracle: tiled or recomputed
    rows = report.scaling_rows(results)
    assert [(r["scale"], r["kind"]) for r in rows] == [(1, "task"), (1, "neurovec"), (1, "pyg"), (2, "task"),
                                                        (2, "neurovec"), (2, "pyg")]
    assert results["peak_rss_bytes"] >= max(r["memory"] for r in rows)
    assert "scaling" in report.write(results, tmp_path)


def test_distinct_copies_differ_only_in_features(tu_dir):
    data, _ = DataCache(tu_dir.parent).get("MUTAG")
    twice = replicate_tu(data, 2)
    assert twice.n_graphs == 2 * data.n_graphs and twice.n_edges == 2 * data.n_edges
    first, second = np.split(twice.node_features(), 2)
    assert np.array_equal(first, data.node_features())
    assert not np.array_equal(second, first) and np.array_equal(second != 0, first != 0)


def test_replicate_refuses_a_field_it_does_not_understand(tu_dir):
    data, _ = DataCache(tu_dir.parent).get("MUTAG")

    @dataclass(frozen=True, eq=False)
    class Extended(type(data)):
        class_names: tuple = ("a", "b")

    fields = {name: getattr(data, name) for name in data.__dataclass_fields__}
    with pytest.raises(ValueError, match="class_names"):
        replicate_tu(Extended(**fields), 2)


def test_subset_oracle_checks_outputs_and_gradients(tu_dir):
    # A batch "too large" for the full oracle: the check covers a subset of samples, exactly.
    config = _config(tu_dir, engines=("default", "pyg-tuned", "wrong", "wrong-gradient"), oracle_max_nodes=1000,
                     features=("continuous",))
    results = suite.run(config, custom_engines=CUSTOM)
    records = _records(results)
    group = results["groups"][0]
    assert "samples" in group["oracle"]["name"]
    for name in ("default", "pyg-tuned"):
        check = records[name]["check"]
        assert records[name]["status"] == "ok" and 0 < check["samples_checked"] < group["info"]["samples"], name
        assert check["gradients_checked"] > 0
    assert records["wrong"]["status"] == "invalid"
    wrong_gradient = records["wrong-gradient"]
    assert wrong_gradient["status"] == "invalid" and "gradient" in wrong_gradient["check"]["message"]


def test_template_weights_do_not_depend_on_the_samples(tu_dir):
    # The PyG contenders copy the template's weights from a one-sample graph (cheap at any scale).
    cache = DataCache(tu_dir.parent)
    for model in ("gcn", "sage", "gin"):
        task = make_task(cache, "MUTAG", model, features="continuous")
        whole = dict(neurovec.ReferenceModule(task.graph, torch.float64).weights.named_parameters())
        one = dict(tasks.template_weights(task).weights.named_parameters())
        assert whole.keys() == one.keys() and all(torch.equal(whole[k], one[k]) for k in whole), model


def test_pyg_compiled_is_one_graph_and_matches_the_oracle(tu_dir):
    # GCNConv(cached=True) under torch.compile: the cache is filled eagerly first, else the graph breaks.
    results = suite.run(_config(tu_dir, engines=("pyg-compiled",)))
    record = _records(results)["pyg-compiled"]
    assert record["status"] == "ok" and record["check"]["gradients_checked"] > 0
    assert record["build"]["graphs"] == 1 and record["build"]["graph_breaks"] == 0
    assert record["first_pass_s"] > record["build_s"]  # the compile happens in the first pass


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "gin"])
def test_pyg_contenders_on_every_model(tu_dir, model):
    results = suite.run(_config(tu_dir, models=(model,), engines=("pyg", "pyg-tuned", "pyg-compiled"),
                                features=("continuous",)))
    records = _records(results)
    assert all(r["status"] == "ok" for r in records.values()), records
    assert records["pyg-compiled"]["build"]["graphs"] == 1


def test_task_labels_and_oracle_shapes(tu_dir):
    task = make_task(DataCache(tu_dir.parent), "MUTAG", "sage")
    oracle = task.oracle()
    assert oracle.outputs.shape == (task.n_samples, 1) and oracle.positions is None
    assert set(np.unique(task.labels)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="does not apply"):
        make_task(DataCache(tu_dir.parent), "MUTAG", "dims")


def test_cli_arguments():
    args = cli.parse_args(["--engines", "all", "pyg", "--datasets", "MUTAG", "mutagenesis", "--scale", "1", "10",
                           "--features", "labels", "continuous"])
    config = cli.config_from_args(args)
    assert config.scales == (1, 10) and config.models is None and config.features == ("labels", "continuous")
    assert len(suite.expand_engines(config.engines)) == len(suite.list_presets()) + 1
    assert cli.config_from_args(cli.parse_args([])).engines == ("default", "pyg", "pyg-tuned", "pyg-compiled")
    assert cli.config_from_args(cli.parse_args(["--settle", "0"])).settle == 0
    for bad in (["--engines", "no-such-preset"], ["--reps", "0"], ["--settle", "-1"], ["--features", "fuzzy"]):
        with pytest.raises(SystemExit):
            cli.parse_args(bad)


# -- exit codes: non-zero whenever nothing valid ran -------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_a_gpu_exits_2(tmp_path, capsys):
    assert cli.main(["--device", "cuda", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_data_dir_exits_2(tmp_path, capsys):
    assert cli.main(["--data-dir", str(tmp_path / "no-such-dir"), "--out", str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'no-such-dir'}: no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["--data-dir", str(tmp_path / "empty"), "--datasets", "ENZYMES"]) == 2
    err = capsys.readouterr().err
    assert "ENZYMES_A.txt" in err and str(tmp_path / "empty") in err
    assert not list((tmp_path / "empty").iterdir())  # nothing was downloaded into it


@pytest.mark.parametrize("engine", [lambda: FailingEngine("failing"), WrongEngine])
def test_every_engine_failing_or_invalid_exits_1(tu_dir, tmp_path, monkeypatch, capsys, engine):
    monkeypatch.setattr(suite, "make_engine", lambda name, config, custom=None: engine())
    code = cli.main(["--datasets", "MUTAG", "--models", "gcn", "--engines", "default", "--data-dir", str(tu_dir.parent),
                     "--reps", "1", "--warmup", "0", "--no-plots", "--quiet", "--out", str(tmp_path / "out")])
    assert code == 1
    assert "no engine ran and passed its check" in capsys.readouterr().err
    assert (tmp_path / "out" / "results.md").is_file()  # what happened is still written


def test_results_are_written_as_the_run_goes(tu_dir, tmp_path, monkeypatch):
    # The second task is interrupted: the first one's results are on disk already.
    real = suite.make_task
    calls = []

    def make_task_then_stop(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(suite, "make_task", make_task_then_stop)
    code = cli.main(["--datasets", "MUTAG", "--models", "gcn", "sage", "--engines", "default", "--quiet",
                     "--data-dir", str(tu_dir.parent), "--reps", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert code == 130
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [g["key"] for g in saved["groups"]] == ["MUTAG/gcn labels"]
    assert saved["groups"][0]["engines"][0]["status"] == "ok"


def test_plan_and_engine_names():
    cells, notes = suite.plan(suite.Config(datasets=("MUTAG", "mutagenesis"), models=("gcn", "simple"),
                                           engines=("default", "neuralogic")))
    assert ("MUTAG", "gcn", "labels", 1, "template") in cells
    assert ("mutagenesis", "simple", "labels", 1, "neuralogic") in cells
    assert not notes
    _, notes = suite.plan(suite.Config(models=("sage",), engines=("neuralogic",)))
    assert "no NeuraLogic model for MUTAG/sage" in notes[0]
    assert suite._engine_names("mutagenesis", "template", ["default", "pyg", "pyg-compiled"]) == ["default"]


def test_summaries_stopwatch_and_memory():
    stats = measure.summarize([3.0, 1.0, 2.0, None])
    assert stats["n"] == 3 and stats["median"] == 2.0 and stats["min"] == 1.0 and stats["max"] == 3.0
    assert measure.summarize([]) == {"n": 0}
    watch = measure.Stopwatch(measure.synchronizer("cpu"))
    watch.lap("a")
    watch.lap("b")
    assert set(watch.laps) == {"a", "b"} and min(watch.laps.values()) >= 0
    probe = measure.MemoryProbe("cpu")
    probe.start()
    transient = torch.ones(64 * 2 ** 20 // 4)  # 64 MB, freed before the probe is read
    del transient
    result = probe.result()
    if result["kind"] == "cpu_rss_hwm":  # the kernel's peak mark sees what sampling would miss
        assert result["growth_bytes"] >= 60 * 2 ** 20
    speed = measure.memory_bandwidth("cpu", megabytes=8, repeats=3)
    assert speed["bytes_per_s"] > 0 and speed["copy_bytes"] == 8 * 2 ** 20


def test_dims_template_text():
    text = _mutagenesis_template("dims", 3, 1)
    assert "{1,1} bond_embed(B) :- b_7(B)." in text
    assert "l2_embed(X) :- {3,3} l1_embed(X), {3,3} l1_embed(Y), bond(X,Y,B), {3,1} bond_embed(B)." in text


def test_autotune_engine(tu_dir, monkeypatch):
    task = make_task(DataCache(tu_dir.parent), "MUTAG", "gcn")
    config = _config(tu_dir, engines=("default", "autotune"), autotune_budget_s=7.0)
    calls = []

    def fake_autotune(graph, presets, device, budget_s, dtype):
        calls.append((presets, budget_s))
        module = neurovec.compile(graph, "default", dtype)
        table = SimpleNamespace(as_records=lambda: [{"preset": "default", "status": "ok"}])
        return SimpleNamespace(module=module, table=table, preset="default", kernel="auto")

    monkeypatch.setattr("neurovec.autotune", fake_autotune)
    record = suite.measure_engine(suite.make_engine("autotune", config), task, config)
    assert record["status"] == "ok" and record["build"]["chosen"] == "default/auto"
    assert calls == [(None, 7.0)]  # autotune's own candidates, as a user calls it: not the run's presets
    monkeypatch.delattr("neurovec.autotune")
    assert "not available" in suite.measure_engine(suite.make_engine("autotune", config), task, config)["reason"]


def test_torch_contenders_use_fused_adam():
    weights = [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.zeros(2))]
    assert contenders.adam(weights, 1e-3).defaults["fused"] is True


# -- node tasks (--task node): one large graph ---------------------------------------------------------------
def _node_config(planetoid_dir, **overrides) -> suite.Config:
    settings = dict(task="node", datasets=("cora",), models=("gcn",), engines=("default", "pyg-tuned", "wrong"),
                    warmup=0, reps=1, threads=1, data_dir=str(planetoid_dir), progress=False, bandwidth_mb=8)
    settings.update(overrides)
    return suite.Config(**settings)


def test_node_task_checks_then_times_against_tuned_pyg(planetoid_dir):
    results = suite.run(_node_config(planetoid_dir), custom_engines=CUSTOM)
    group = results["groups"][0]
    assert group["key"] == "cora/gcn node" and group["info"]["conv_layers"] == 2 and group["info"]["hidden"] == 16
    records = _records(results)
    assert records["default"]["status"] == "ok" and records["default"]["check"]["gradients_checked"] == 4
    assert records["pyg-tuned"]["status"] == "ok" and records["pyg-tuned"]["build"]["x"].startswith("sparse CSR")
    assert records["wrong"]["status"] == "invalid"
    row = report.headline_rows(results)[0]
    assert row["target"] == 2.0 and row["pyg"] == "pyg-tuned"
    assert "cora/gcn node" in report.markdown(results)


@pytest.mark.parametrize("model", ["gcn", "sage", "gin"])
def test_node_subset_oracle_is_exact_on_the_k_hop_neighbourhood(planetoid_dir, model):
    from neurovec.benchmarks.node_tasks import NodeDataCache, make_node_task, node_options
    task = make_node_task(NodeDataCache(planetoid_dir), "cora", model, node_options("cora"), oracle_max_nodes=100)
    oracle = task.oracle()
    assert oracle is not None and oracle.positions.size == 8 and "neighbourhood of 8 training nodes" in oracle.name
    engine = NeurovecEngine("default")
    engine.build(task, torch.device("cpu"), torch.float64)
    check = suite.check_engine(engine, task, "float64")
    assert check["valid"] and check["samples_checked"] == 8, check
    assert check["max_abs_error"] < 1e-9 and check["max_grad_rel_error"] < 1e-9


def test_node_cli_arguments():
    config = cli.config_from_args(cli.parse_args(["--task", "node", "--models", "sage", "--isolate",
                                                  "--memory-limit-gb", "20"]))
    assert config.task == "node" and config.datasets == ("cora",) and config.isolate and config.memory_limit_gb == 20
    assert config.node_hidden is None and config.options.hidden == 16  # the dataset's own sizes
    assert suite.plan(config)[0] == [("cora", "sage", "node", 1, "template")]
    for bad in (["--task", "node", "--datasets", "MUTAG"], ["--datasets", "cora"], ["--memory-limit-gb", "4"],
                ["--task", "node", "--models", "dims"]):
        with pytest.raises(SystemExit):
            cli.parse_args(bad)


def test_isolated_engines_run_alone_and_out_of_memory_is_reported(planetoid_dir, monkeypatch):
    import signal
    import subprocess
    from neurovec.benchmarks import isolated
    results = suite.run(_node_config(planetoid_dir, engines=("default",), isolate=True))
    record = _records(results)["default"]
    assert record["status"] == "ok" and record["isolated"] and record["check"]["valid"]
    assert isolated.is_out_of_memory("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried ...")
    assert not isolated.is_out_of_memory("RuntimeError: shapes do not match")
    killed = subprocess.CompletedProcess([], -signal.SIGKILL, "", "")
    monkeypatch.setattr(isolated.subprocess, "run", lambda *a, **k: killed)
    results = suite.run(_node_config(planetoid_dir, engines=("pyg",), isolate=True))
    record = _records(results)["pyg"]
    assert record["status"] == "out of memory" and "SIGKILL" in record["reason"]
    assert "out of memory: killed by the kernel" in report.markdown(results)


def test_tuned_pyg_inputs_compute_the_twin_on_a_multigraph_with_self_loops():
    """A sparse adj_t for pyg-tuned keeps repeated edges apart (SAGE's mean counts each) and has no listed
    self loops for GCN (GCNConv adds its own on top of them on a sparse adj_t): the same function as the
    twin on edge_index. The subset oracle's neighbourhood on such a graph is exact too."""
    from neurovec.benchmarks.node_tasks import NodeTask
    from neurovec.datasets import gnn, pyg_twins
    from neurovec.datasets.synthetic import rmat_dataset
    data = rmat_dataset(nodes=800, edges=8000, features=4, classes=3, seed=1)
    assert (data.edge_index[0] == data.edge_index[1]).any()
    for model in ("gcn", "sage", "gin"):
        spec = gnn.GNNSpec.create(model, data, 8, 2)
        task = NodeTask("rmat", model, tasks.ModelOptions(8, 2), data, spec, oracle_max_nodes=100)
        twin = pyg_twins.make_twin(spec).double()
        pyg_twins.copy_weights(task.template_weights(), twin)
        (x, adj_t), _ = task.pyg_inputs("pyg-tuned", "cpu", torch.float64)
        (x2, edge_index), _ = task.pyg_inputs("pyg", "cpu", torch.float64)
        torch.testing.assert_close(twin(x, adj_t), twin(x2, edge_index), atol=1e-9, rtol=1e-9)
        task.graph = gnn.build_gnn(data, spec, None, 0)
        engine = NeurovecEngine("default")
        engine.build(task, torch.device("cpu"), torch.float64)
        assert suite.check_engine(engine, task, "float64")["max_abs_error"] < 1e-9, model


def test_node_step_times_a_small_fraction_of_arxiv_like(capsys):
    """benchmarks/node_step.py (the A/B script of one node task's step) runs and reports its medians."""
    from neurovec.benchmarks import node_step
    result = node_step.main(["gcn", "--fraction", "0.002", "--steps", "1", "--threads", "1"])
    assert result["cpu_ms_1"] > 0 and result["wall_ms_1"] > 0 and result["model"] == "gcn"
    assert capsys.readouterr().out.startswith("RESULT {")
