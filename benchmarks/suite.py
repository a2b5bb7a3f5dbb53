"""Run a benchmark: every engine of every task, correctness first, then timing.

    config = Config(datasets=("MUTAG",), engines=("default", "pyg"), reps=5)
    results = run(config)                 # a JSON-ready dict, see docs/benchmarks.md
    report.write(results, "out/")          # results.json, results.md, *.png

For each task (dataset x model x features x scale, plus a ``[NeuraLogic]``
variant when the ``neuralogic`` engine is asked for) every engine is built and
runs a first forward and backward pass (both timed: their sum is its compile
time), is checked against the task's oracle (outputs and gradients) and warmed
up; then its ``reps`` timed iterations run, interleaved with the other engines of
the task (``schedule="sequential"`` times one engine after the other instead). An
engine whose check fails is still timed, so a wrong fast result stays visible,
but its record says ``valid: false`` and no summary or ratio uses it. An engine
that raises is recorded as ``failed`` and the run goes on; ``on_group`` sees the
results after every task, so a caller can write them as they grow.

The memory bandwidth (a large tensor copy) is measured at the start and the end
of the run, and each TU task carries its estimated bytes per training step
(:func:`~neurovec.benchmarks.tasks.step_bytes`): the report sets every step time
against that physical limit.
"""
from __future__ import annotations

import datetime
import gc
import os
import platform
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import neurovec
from neurovec.compiler import list_presets

from .contenders import (PYG_VARIANTS, AutotuneEngine, Engine, NeurovecEngine, PyGEngine, ReferenceEngine, Skipped,
                         warm_up_torch_compile)
from .measure import MemoryProbe, Stopwatch, memory_bandwidth, peak_rss_bytes, summarize, synchronizer
from .tasks import (DATASETS, FEATURES, ORACLE_MAX_NODES, TU_DATASETS, DataCache, ModelOptions, Task, make_task,
                    models_for, step_bytes, task_key)

__all__ = ["Config", "SPECIAL_ENGINES", "PYG_ENGINES", "expand_engines", "plan", "make_engine", "run", "Trial",
           "measure_engine", "measure_group", "check_engine", "machine_description", "run_peak_rss", "TOLERANCES",
           "SCHEMA"]

SCHEMA = "neurovec-benchmark/2"
PYG_ENGINES = tuple(PYG_VARIANTS)
SPECIAL_ENGINES = PYG_ENGINES + ("neuralogic", "reference", "autotune")
# (outputs: atol, rtol; gradients: error relative to the largest oracle gradient)
TOLERANCES = {"float32": (1e-4, 1e-4, 1e-3), "float64": (1e-8, 1e-6, 1e-6)}
STEP_LAPS = {"neuralogic": ("epoch",)}  # every other engine: forward + backward + optimizer
_DEFAULT_STEP_LAPS = ("forward", "backward", "optimizer")


@dataclass
class Config:
    """Everything a run depends on; stored in the results file."""

    task: str = "graph"                     # a key of TASK_KINDS: "graph" (TU, Mutagenesis) or "node"
    datasets: tuple = ("MUTAG",)
    models: tuple | None = None             # None: every model that applies to each dataset
    engines: tuple = ("default", "pyg", "pyg-tuned", "pyg-compiled")
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 3
    reps: int = 10
    threads: int | None = None              # None: torch's default
    scales: tuple = (1,)
    scale_mode: str = "distinct"            # replicated TU copies: "distinct" features or "identical"
    features: tuple = ("labels",)           # TU node features: "labels" and/or "continuous"
    oracle_max_nodes: int = ORACLE_MAX_NODES  # larger batches: the oracle checks a subset of the samples
    bandwidth_mb: int = 128                 # the tensor copied to measure the memory bandwidth
    data_dir: str | None = None
    options: ModelOptions = field(default_factory=ModelOptions)
    reference_max_neurons: int = 20_000
    autotune_budget_s: float = 60.0
    neuralogic_warmup: int = 5              # the JVM's JIT needs a few epochs to settle
    schedule: str = "interleaved"           # or "sequential": one engine after the other
    settle: int = 1                         # interleaved: untimed iterations before each timed one
    progress: bool = True
    node_hidden: int | None = None          # node tasks: width and depth (None: the dataset's own, node_tasks.SIZES)
    node_layers: int | None = None
    isolate: bool = False                   # every engine of a task in a process of its own (see run)
    memory_limit_gb: float | None = None    # isolate: the address-space limit of each engine's process

    def to_dict(self) -> dict:
        data = asdict(self)
        data["options"] = asdict(self.options)
        return data


def expand_engines(names) -> list[str]:
    """Engine names in order, ``all`` expanded to every preset, duplicates dropped; unknown names raise."""
    presets = list_presets()
    expanded: list[str] = []
    for name in names:
        for item in (presets if name == "all" else [name]):
            if item not in presets and item not in SPECIAL_ENGINES:
                raise ValueError(f"unknown engine {item!r}: expected a preset ({', '.join(presets)}), 'all', "
                                 f"or one of {', '.join(SPECIAL_ENGINES)}")
            if item not in expanded:
                expanded.append(item)
    return expanded


def _plan_nodes(config: Config) -> tuple[list[tuple], list[str]]:
    from .node_tasks import NODE_DATASETS, NODE_MODELS
    cells = []
    for dataset in config.datasets:
        if dataset not in NODE_DATASETS:
            raise ValueError(f"unknown node dataset {dataset!r} (expected one of {NODE_DATASETS})")
        for model in config.models or NODE_MODELS:
            if model not in NODE_MODELS:
                raise ValueError(f"model {model!r} has no node-level template (expected one of {NODE_MODELS})")
            cells.append((dataset, model, "node", 1, "template"))
    return cells, []


#: Task kinds: how a kind plans its cells and builds a task (``make(config, cache, dataset, model, features,
#: scale, source)``). A new kind (knowledge graphs, circuits) adds an entry; engines see only the Task
#: interface (graph, loss_fn, oracle, ...).
TASK_KINDS: dict[str, dict] = {}


def plan(config: Config) -> tuple[list[tuple], list[str]]:
    """The task keys ``(dataset, model, features, scale, source)`` to run, and notes on what was left out.

    Relational datasets have categorical inputs only: they run once, with them,
    whatever ``features`` says. NeuraLogic variants run with label features at scale 1.
    """
    if config.task not in TASK_KINDS:
        raise ValueError(f"unknown task kind {config.task!r} (expected one of {', '.join(TASK_KINDS)})")
    return TASK_KINDS[config.task]["plan"](config)


def _plan_graphs(config: Config) -> tuple[list[tuple], list[str]]:
    from . import neuralogic_models

    notes, cells = [], []
    unknown = [f for f in config.features if f not in FEATURES]
    if unknown or not config.features:
        raise ValueError(f"unknown features {unknown or list(config.features)} (expected some of {FEATURES})")
    for dataset in config.datasets:
        if dataset not in DATASETS:
            raise ValueError(f"unknown dataset {dataset!r} (expected one of {DATASETS})")
        models = [m for m in (config.models or models_for(dataset)) if m in models_for(dataset)]
        features = list(config.features) if dataset in TU_DATASETS else ["labels"]
        if dataset not in TU_DATASETS and "labels" not in config.features:
            notes.append(f"{dataset} has categorical inputs only: it runs with them (no continuous features)")
        for model in models:
            for feature in features:
                for scale in config.scales:
                    cells.append((dataset, model, feature, scale, "template"))
            if "neuralogic" in config.engines:
                if neuralogic_models.supports(dataset, model):
                    cells.append((dataset, model, "labels", 1, "neuralogic"))
                else:
                    notes.append(f"no NeuraLogic model for {dataset}/{model}: NeuraLogic not timed there")
    if not cells:
        raise ValueError(f"no model applies to datasets {list(config.datasets)} among models {config.models}")
    return cells, notes


def _engine_names(dataset: str, source: str, engines: list[str]) -> list[str]:
    from .node_tasks import NODE_DATASETS
    if dataset in NODE_DATASETS:
        return [e for e in engines if e != "neuralogic"]
    if source == "neuralogic":
        # The NeuraLogic variant: NeuraLogic itself, and neurovec compiled from its built samples.
        return ["neuralogic"] + [e for e in engines if e not in PYG_ENGINES + ("neuralogic",)]
    # PyG twins exist for the TU GNNs only; relational tasks are neurovec's own (and NeuraLogic's).
    return [e for e in engines if e != "neuralogic" and (e not in PYG_ENGINES or dataset in TU_DATASETS)]


def make_engine(name: str, config: Config, custom: dict | None = None) -> Engine:
    """A fresh engine for ``name`` (a preset, one of SPECIAL_ENGINES, or a key of ``custom``)."""
    custom = custom or {}
    if name in custom:
        return custom[name]()
    if name in PYG_ENGINES:
        return PyGEngine(name)
    if name == "reference":
        return ReferenceEngine(config.reference_max_neurons)
    if name == "autotune":
        # autotune's own candidate list, as a user calls it: its pick is decided before this run times it
        return AutotuneEngine(None, config.autotune_budget_s)
    if name == "neuralogic":
        from .neuralogic_models import NeuraLogicEngine
        return NeuraLogicEngine()
    return NeurovecEngine(name)


def run(config: Config, custom_engines: dict[str, Callable[[], Engine]] | None = None,
        on_group: Callable[[dict], None] | None = None) -> dict:
    """Run the whole benchmark and return the results (see the module doc).

    ``custom_engines`` maps extra engine names (listed in ``config.engines``) to
    factories; the tests use it to plant a deliberately wrong engine. ``on_group``
    is called with the results so far after every task.
    """
    custom = dict(custom_engines or {})
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA was requested but torch.cuda.is_available() is False on this machine")
    if config.threads:
        torch.set_num_threads(config.threads)
    engines: list[str] = []
    for name in config.engines:
        for item in ([name] if name in custom else expand_engines([name])):
            if item not in engines:
                engines.append(item)
    if config.schedule not in ("interleaved", "sequential"):
        raise ValueError(f"schedule must be 'interleaved' or 'sequential' (got {config.schedule!r})")
    if config.settle < 0:
        raise ValueError(f"settle must be 0 or more (got {config.settle})")
    cells, notes = plan(config)
    cache = TASK_KINDS[config.task]["cache"](config.data_dir)
    started = datetime.datetime.now().astimezone()
    results = {"schema": SCHEMA, "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
               "config": config.to_dict(), "engines": engines, "machine": machine_description(device),
               "started": started.isoformat(timespec="seconds"), "load_average_start": _load_average(),
               "bandwidth": {"start": memory_bandwidth(device, config.bandwidth_mb)}, "notes": notes,
               "groups": []}
    if any(name == "pyg-compiled" for name in engines):
        warm_up_torch_compile()
    results["machine"]["neurovec_native_kernels"] = _native_kernels()
    progress = _progress_bar(config, cells, engines)
    try:
        for dataset, model, features, scale, source in cells:
            results["groups"].append(_run_task(dataset, model, features, scale, source, engines, config, custom,
                                               cache, progress))
            gc.collect()
            if on_group is not None:
                on_group(results)
    finally:
        progress.close()
        results["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        results["load_average_end"] = _load_average()
        results["peak_rss_bytes"] = run_peak_rss(results)
    results["bandwidth"]["end"] = memory_bandwidth(device, config.bandwidth_mb)
    return results


def _run_task(dataset, model, features, scale, source, engines, config, custom, cache, progress) -> dict:
    """One task: build it, then measure its engines; a task that cannot be built is recorded, not raised."""
    group = {"dataset": dataset, "model": model, "features": features, "scale": scale, "source": source,
             "key": task_key(dataset, model, features, scale, source), "engines": []}
    progress.set_description(f"{dataset}/{model} {features} x{scale} {source}: building the task")
    probe = MemoryProbe("cpu")  # the task's data, graph and oracle live in host memory
    probe.start()
    try:
        task = TASK_KINDS[config.task]["make"](config, cache, dataset, model, features, scale, source)
    except Exception as error:
        group["error"] = _describe(error)
        progress.update(len(_engine_names(dataset, source, engines)) * (1 + config.reps))
        return group
    group.update(key=task.key, info=task.info, notes=task.notes,
                 traffic=step_bytes(task, torch.tensor([], dtype=getattr(torch, config.dtype)).element_size()))
    progress.set_description(f"{task.key}: oracle")
    task.oracle()  # before any engine: its time and memory belong to no engine
    group["memory"] = probe.result()
    group_engines = []
    for name in _engine_names(dataset, source, engines):
        try:
            group_engines.append(make_engine(name, config, custom))
        except Exception as error:
            group["engines"].append({"engine": name, "kind": "unknown", "status": "failed", "valid": None,
                                     "error": _describe(error)})
    if config.isolate:
        from .isolated import measure_isolated
        group["engines"] += [measure_isolated(name, (dataset, model, features, scale, source), config, task)
                             for name in [e.name for e in group_engines]]
        progress.update(len(group_engines) * (1 + config.reps))
    else:
        group["engines"] += measure_group(group_engines, task, config, progress)
    group["oracle"] = task.oracle_summary()
    return group


def _make_graph_task(config, cache, dataset, model, features, scale, source):
    return make_task(cache, dataset, model, scale, source, config.options, config.scale_mode, features,
                     config.oracle_max_nodes)


def _make_node_task(config, cache, dataset, model, features, scale, source):
    from .node_tasks import make_node_task, node_options
    options = node_options(dataset, config.node_hidden, config.node_layers, config.options.seed)
    return make_node_task(cache, dataset, model, options, config.oracle_max_nodes)


def _node_cache(data_dir):
    from .node_tasks import NodeDataCache
    return NodeDataCache(data_dir)


TASK_KINDS.update({
    "graph": {"plan": _plan_graphs, "make": _make_graph_task, "cache": DataCache},
    "node": {"plan": _plan_nodes, "make": _make_node_task, "cache": _node_cache},
})


def _native_kernels() -> bool | None:
    """Whether neurovec's C++ kernels are on, building them now if needed (None: this neurovec has none).

    Built once per machine and cached, like inductor's initialisation: done before the
    first task so that no engine's compile time includes it.
    """
    try:
        from neurovec.engines import native
        return bool(native.available())
    except Exception:  # an optional part of neurovec: its absence or failure changes nothing here
        return None


def run_peak_rss(results: dict) -> int | None:
    """The run's peak resident memory: the largest peak of any task build or engine measured in host memory.

    (The process's own high-water mark, e.g. ``/usr/bin/time``'s, is not it: the
    harness resets the kernel's mark before each engine.)
    """
    peaks = [peak_rss_bytes() or 0]
    for group in results["groups"]:
        for memory in [group.get("memory")] + [r.get("memory") for r in group.get("engines", [])]:
            if memory and memory.get("kind", "").startswith("cpu_rss"):
                peaks.append(memory["peak_bytes"])
    return max(peaks) or None


class Trial:
    """One engine on one task while it is measured: ``prepare``, then ``iterate`` per repetition, ``finish``.

    ``prepare`` builds (timed), checks, and runs the warm-up iterations. Peak memory
    covers exactly that span (the check runs a forward and backward pass, so the
    peak includes activations even without warm-up), because later, while other
    engines are interleaved, the process-wide peak no longer belongs to one engine.
    Exceptions never escape: they end up in ``record``.
    """

    def __init__(self, engine: Engine, task: Task, config: Config):
        self.engine, self.task, self.config = engine, task, config
        self.device = torch.device(config.device)
        self.cpu_only = engine.kind == "neuralogic"
        self.sync = synchronizer("cpu" if self.cpu_only else self.device)
        self.record: dict = {"engine": engine.name, "kind": engine.kind, "status": None, "valid": None}
        self.laps: dict[str, list[float]] = defaultdict(list)
        self.warmup = max(config.warmup, config.neuralogic_warmup) if self.cpu_only else config.warmup
        self.alive = False

    def prepare(self) -> bool:
        """Build, check, warm up; True when the engine is ready to be timed."""
        record, dtype = self.record, getattr(torch, self.config.dtype)
        probe = MemoryProbe("cpu" if self.cpu_only else self.device)
        probe.start()
        try:
            start = time.perf_counter()
            info = self.engine.build(self.task, self.device, dtype) or {}
            self.sync()
            record["build_s"] = info.pop("build_s", time.perf_counter() - start)
            record["build"] = info
            if self.engine.device_note:
                record["device"] = self.engine.device_note
            probe.sample()
            start = time.perf_counter()
            self.engine.first_pass()
            self.sync()
            record["first_pass_s"] = time.perf_counter() - start
            record["compile_s"] = record["build_s"] + record["first_pass_s"]
            record["build"].update(self.engine.build_details())
            probe.sample()
            record["check"] = check_engine(self.engine, self.task, self.config.dtype)
            record["valid"] = record["check"]["valid"]
            for _ in range(self.warmup):
                self._iteration(probe)
            record["memory"] = probe.result()
        except Exception as error:
            self._fail(error)
            return False
        self.alive = True
        return True

    def iterate(self, settle: int = 0) -> None:
        """``settle`` untimed iterations, then one timed iteration (memory is not sampled any more)."""
        if not self.alive:
            return
        try:
            for _ in range(settle):
                self._iteration(_NO_PROBE, timed=False)
            self._iteration(_NO_PROBE)
        except Exception as error:
            self._fail(error)

    def _iteration(self, probe, timed: bool = True) -> None:
        watch = Stopwatch(self.sync)
        self.engine.iteration(watch, probe)
        if timed:
            for lap, seconds in watch.laps.items():
                self.laps[lap].append(seconds)

    def _fail(self, error: Exception) -> None:
        if isinstance(error, Skipped):
            self.record.update(status="skipped", reason=str(error))
        else:  # a broken engine must not end the run
            self.record.update(status="failed", error=_describe(error))
        self.record.pop("memory", None)
        self._close()

    def _close(self) -> None:
        self.alive = False
        self.engine.close()

    def finish(self) -> dict:
        """The engine's record, with raw laps and their summaries; frees the engine."""
        record = self.record
        if record["status"] is None:
            self._close()
            step_laps = STEP_LAPS.get(self.engine.kind, _DEFAULT_STEP_LAPS)
            n = min((len(self.laps[lap]) for lap in step_laps if lap in self.laps), default=0)
            self.laps["step"] = [sum(self.laps[lap][i] for lap in step_laps if lap in self.laps) for i in range(n)]
            record["warmup"] = self.warmup
            record["raw"] = dict(self.laps)  # every iteration; the first `warmup` of each list are not counted
            record["stats"] = {lap: summarize(values[self.warmup:]) for lap, values in self.laps.items()}
            record["status"] = {True: "ok", False: "invalid", None: "unchecked"}[record["valid"]]
        return record


class _NoProbe:
    def sample(self) -> None:
        pass


_NO_PROBE = _NoProbe()


def measure_engine(engine: Engine, task: Task, config: Config) -> dict:
    """Build, check and time one engine on its own; never raises (errors are recorded)."""
    trial = Trial(engine, task, config)
    if trial.prepare():
        for _ in range(config.reps):
            trial.iterate()
    return trial.finish()


def measure_group(engines: list[Engine], task: Task, config: Config, progress) -> list[dict]:
    """All engines of one task; ``config.schedule`` says whether their repetitions interleave.

    Interleaved (the default): every engine is prepared, then each round times one
    iteration of every engine, starting one engine later each round. A load burst
    from other processes then hits all engines alike instead of one of them, which
    is what keeps ratios meaningful on a shared machine. Before its timed iteration,
    each engine runs ``config.settle`` untimed ones: a training loop runs one model
    step after step, so the timed step should start from that engine's own caches
    and allocator state, not from the previous engine's (on MUTAG, where a step is
    1-3 ms, a step right after another engine's took up to twice as long).
    """
    if config.schedule == "sequential":
        records = []
        for engine in engines:
            progress.set_description(f"{task.key}: {engine.name}")
            records.append(measure_engine(engine, task, config))
            progress.update(1 + config.reps)
        return records
    trials = []
    for engine in engines:
        progress.set_description(f"{task.key}: build+check+warm-up {engine.name}")
        trial = Trial(engine, task, config)
        trial.prepare()
        trials.append(trial)
        progress.update(1)
    progress.set_description(f"{task.key}: timing {sum(t.alive for t in trials)} engines")
    for round_ in range(config.reps):
        for k in range(len(trials)):
            trials[(round_ + k) % len(trials)].iterate(config.settle)
        progress.update(len(trials))
    return [trial.finish() for trial in trials]


def check_engine(engine: Engine, task: Task, dtype: str) -> dict:
    """Compare ``engine``'s outputs (and gradients, where both sides have them) with the task's oracle."""
    if engine.kind == "neuralogic" and task.source == "neuralogic":
        return {"oracle": "itself", "valid": True}
    oracle = task.oracle()
    if oracle is None:
        return {"oracle": None, "valid": None, "message": "no oracle for this task: outputs not checked"}
    atol, rtol, grad_tol = TOLERANCES[dtype]
    outputs = engine.outputs()
    result = {"oracle": oracle.name, "valid": True, "tolerance": {"atol": atol, "rtol": rtol, "grad": grad_tol}}
    if oracle.positions is not None:  # a subset oracle: those samples' outputs, the loss over them
        outputs = outputs[oracle.positions]
        result["samples_checked"] = int(oracle.positions.size)
    if outputs.shape != oracle.outputs.shape:
        return {**result, "valid": False,
                "message": f"outputs have shape {outputs.shape}, the oracle's {oracle.outputs.shape}"}
    error = np.abs(outputs - oracle.outputs)
    result["max_abs_error"] = float(error.max()) if error.size else 0.0
    if not np.all(error <= atol + rtol * np.abs(oracle.outputs)):
        worst = int(np.argmax(error - rtol * np.abs(oracle.outputs)))
        result.update(valid=False, message=f"output {worst // max(outputs.shape[1], 1)} is "
                      f"{outputs.reshape(-1)[worst]:.6g}, the oracle says {oracle.outputs.reshape(-1)[worst]:.6g} "
                      f"(max abs error {result['max_abs_error']:.3g})")
        return result
    if not oracle.gradients:
        gradients = None
    elif oracle.positions is None:
        gradients = engine.gradients()
    else:
        gradients = engine.gradients(oracle.positions)
    if gradients:
        common = sorted(set(gradients) & set(oracle.gradients))
        scale = max((np.abs(g).max() for g in oracle.gradients.values() if g.size), default=0.0) or 1.0
        worst_name, worst = None, 0.0
        for name in common:
            mine, theirs = gradients[name].reshape(-1), oracle.gradients[name].reshape(-1)
            if mine.size != theirs.size:
                worst_name, worst = name, float("inf")
                break
            err = float(np.abs(mine - theirs).max()) / scale if mine.size else 0.0
            if err > worst:
                worst_name, worst = name, err
        result.update(gradients_checked=len(common), max_grad_rel_error=worst)
        if not common:
            result.update(valid=False, message=f"no gradient by the oracle's weight names (the engine has "
                                               f"{sorted(gradients)[:5]}, the oracle {sorted(oracle.gradients)[:5]})")
        if worst > grad_tol:
            result.update(valid=False, message=f"gradient of {worst_name!r} differs from the oracle's by "
                                               f"{worst:.3g} of the largest gradient")
    return result


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {str(error)[:500]}{where}"


def _progress_bar(config: Config, cells, engines):
    # One unit per engine preparation (build, check, warm-up) and one per timed iteration.
    total = sum(len(_engine_names(dataset, source, engines)) for dataset, _, _, _, source in cells)
    total *= 1 + config.reps
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in the `bench` extra; run without a bar rather than fail
        return _NoBar()
    return tqdm(total=total, disable=not config.progress, unit="it", dynamic_ncols=True)


class _NoBar:
    disable = True

    def update(self, n=1):
        pass

    def set_description(self, text):
        pass

    def close(self):
        pass


# -- machine description -----------------------------------------------------------------------------------
def _load_average() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:
        return None


def _git(*args: str) -> str | None:
    try:
        repo = Path(neurovec.__file__).resolve().parent
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:
        return None


def machine_description(device: torch.device) -> dict:
    """What the numbers were measured on: hardware, software versions, the neurovec commit."""
    try:
        import psutil
        memory = psutil.virtual_memory().total
        physical = psutil.cpu_count(logical=False)
    except ImportError:
        memory = physical = None
    description = {
        "platform": platform.platform(), "python": platform.python_version(), "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(), "physical_cpus": physical,
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": memory, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "device": str(device), "neurovec": neurovec.__version__,
        "neurovec_commit": _git("rev-parse", "HEAD"),
        # modified tracked files, committed benchmark results aside: is the measured code the commit's?
        "neurovec_dirty_files": len((_git("status", "--porcelain", "--untracked-files=no", "--", ".",
                                          ":!benchmarks/results") or "").splitlines()),
        "packages": {name: _version(name) for name in ("torch_geometric", "torch_scatter", "neuralogic",
                                                       "numpy", "matplotlib")},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        description.update(gpu=props.name, gpu_memory_bytes=props.total_memory, cuda=torch.version.cuda)
    return description
