"""Weighted model counting on SDD circuits: neurovec against KLay's torch backend.

    python -m neurovec.benchmarks.circuits --out benchmarks/results/circuits     # the committed run
    python -m neurovec.benchmarks.circuits --must-show --out benchmarks/results/circuits-must-show
    python -m neurovec.benchmarks.circuits --circuits sudoku_4 cnf-30 --batch 128 --threads 1 --rounds 5

``--must-show`` runs only the cells of the issue's target (the random CNFs, batch 128,
``default`` and ``klay``, 1 and 2 threads). It runs as the environment says: torch's default
OpenMP waiting unless ``OMP_WAIT_POLICY`` is set (the run records which). On a busy machine set
``OMP_WAIT_POLICY=PASSIVE``: with threads that spin while they wait, a 2-thread step there ran
5-20x slower (KLay's as well as neurovec's).

Circuits: the three of ``../shared/data/circuits`` (``sudoku_4``, ``road_r``, ``4-grid``;
``--data``) and the random CNFs of :data:`neurovec.datasets.circuits.BENCHMARK_CNFS`
(``cnf-30`` ... ``cnf-44``, about 2x10^4 to 10^6 circuit nodes), compiled with pysdd
once into ``--cache`` (seeded: the same files on every machine).

Engines, on the same literal probabilities (float32, ``[batch, n_vars]``, uniform in
(0.05, 0.95)):

* ``default``: ``circuits.compile(circuit, batch)``, neurovec's ``default`` preset;
* ``autotune``: ``neurovec.autotune`` over every preset with the literals dynamic
  (``--autotune-budget`` seconds), its pick compiled and timed here. autotune times a
  forward only: the literal weights are call-time facts, not parameters, and autotune
  has no way to pass them with ``requires_grad`` (see docs/circuits.md);
* ``klay``: ``klay.Circuit().add_sdd_from_file(path).to_torch_module("real", compile=False)``,
  KLay's torch layers as its own benchmarks run them on CPU. ``klay-compiled``
  (``compile=True``: ``torch.compile``) is opt-in and should run alone in its process.

Steps: ``fwd`` (``torch.no_grad`` forward) and ``fwd+bwd`` (forward, ``sum().backward()``
into the literal weights). For every circuit, batch size and thread count, the engines
are checked against a float64 evaluation (KLay's, relative 1e-3; ``results.json``
records each engine's largest relative error) and timed *interleaved*: each round times one step of every engine in turn, after
``--warmup`` untimed rounds; the cells are medians over ``--rounds`` rounds. Compile
times are each engine's, from the circuit file (or the parsed circuit) to a callable
module, per batch size (neurovec compiles per batch size; KLay's module takes any).
Cells whose edge values would pass ``--max-gb`` (edges x batch x 4 bytes) are skipped
and listed as such. Results: ``results.json`` (every raw time) and ``results.md``
(tables) in ``--out``, rewritten after every circuit.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import neurovec
from neurovec.datasets import circuits as random_circuits
from neurovec.sources import circuits

SHARED = ("sudoku_4", "road_r", "4-grid")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "circuits"
ENGINES = ("default", "autotune", "klay")
#: The must-show: neurovec default >= 2x KLay, fwd+bwd at batch 128, circuits of >= 10^4 nodes.
TARGET = 2.0
TARGET_NODES = 10_000


def circuit_path(name: str, data: Path, cache: Path) -> Path:
    if name in random_circuits.BENCHMARK_CNFS:
        n_vars, n_clauses, width, seed = random_circuits.BENCHMARK_CNFS[name]
        return random_circuits.random_sdd(n_vars, n_clauses, width, seed, cache)
    return data / f"{name}.sdd"


def klay_module(path: Path, compiled: bool = False):
    """``(nodes, module)``: KLay's node count as loaded (its layers add nodes), and its torch module."""
    import klay
    circuit = klay.Circuit()
    circuit.add_sdd_from_file(str(path))
    nodes = circuit.nb_nodes()
    return nodes, circuit.to_torch_module(semiring="real", compile=compiled)


class Engine:
    """One contender on one circuit and batch size: a callable ``weights -> (batch,)`` WMC."""

    def __init__(self, name: str, module, compile_s: float, note: str = ""):
        self.name, self.module, self.compile_s, self.note = name, module, compile_s, note

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x).reshape(-1)


def build_engines(names, path: Path, circuit, batch: int, budget: float, overrides: dict) -> list[Engine]:
    engines = []
    for name in names:
        begin = time.perf_counter()
        if name == "default":
            settings = circuits.settings("default", **overrides) if overrides else "default"
            module = circuits.compile(circuit, batch, preset=settings)
            engines.append(Engine(name, module, time.perf_counter() - begin,
                                  f"settings {json.dumps(overrides)}" if overrides else ""))
        elif name == "autotune":
            graph = circuits.to_graph(circuit, batch)
            presets = [circuits.settings(p) for p in neurovec.list_presets()]
            result = neurovec.autotune(graph, presets=presets, budget_s=budget, progress=False)
            module = circuits.WMCModule(result.module, circuit.n_vars, batch, "real")
            picked = result.settings.model_dump(exclude={"reduce_kernel", "verify"})
            pick = next((p for p in neurovec.list_presets() if circuits.settings(p).model_dump(
                exclude={"reduce_kernel", "verify"}) == picked), result.preset)
            engines.append(Engine(name, module, time.perf_counter() - begin,
                                  f"pick: {pick}, kernel {result.kernel}{' +compile' if result.compiled else ''}"))
        elif name in ("klay", "klay-compiled"):
            _, module = klay_module(path, compiled=name == "klay-compiled")
            engines.append(Engine(name, module, time.perf_counter() - begin))
        else:
            raise ValueError(f"unknown engine {name!r} (expected one of {ENGINES + ('klay-compiled',)})")
    return engines


def check(engines: list[Engine], x: torch.Tensor, rtol: float = 1e-3) -> dict:
    """Every engine's float32 WMC against a float64 evaluation: KLay's module on ``x.double()``
    where KLay runs (an independent implementation), else the first engine's. Returns each
    engine's largest relative error. (float32 sums of up to thousands of terms, a dozen
    levels deep, differ from float64 by up to ~1e-4 relative, so engines summing in different
    orders differ from each other by as much: the tolerance is 1e-3.)"""
    oracle = next((e for e in engines if e.name.startswith("klay")), engines[0])
    with torch.no_grad():
        expected = oracle(x.detach().double() if oracle.name.startswith("klay") else x.detach()).double()
        errors = {}
        for engine in engines:
            out = engine(x).detach().double()
            torch.testing.assert_close(out, expected, rtol=rtol, atol=0,
                                       msg=lambda m: f"{engine.name} disagrees with {oracle.name} in float64: {m}")
            errors[engine.name] = float(((out - expected).abs() / expected.abs()).max())
    return errors


def interleaved(engines: list[Engine], x: torch.Tensor, backward: bool, rounds: int, warmup: int) -> dict:
    def step(engine: Engine) -> float:
        begin = time.perf_counter()
        if backward:
            x.grad = None
            engine(x).sum().backward()
        else:
            with torch.no_grad():
                engine(x)
        return time.perf_counter() - begin

    times: dict[str, list[float]] = {e.name: [] for e in engines}
    for r in range(warmup + rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]  # rotate who goes first
        for engine in order:
            seconds = step(engine)
            if r >= warmup:
                times[engine.name].append(seconds * 1e3)
    return times


def run(args) -> dict:
    results = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
               "argv": sys.argv[1:], "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
               "load_average_at_start": os.getloadavg(), "cells": [], "circuits": {}, "compile": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.circuits:
        begin = time.perf_counter()
        path = circuit_path(name, Path(args.data), Path(args.cache))
        generate_s = time.perf_counter() - begin
        begin = time.perf_counter()
        circuit = circuits.read_sdd(path)
        read_s = time.perf_counter() - begin
        info = {"path": str(path), "n_vars": circuit.n_vars, "nodes": circuit.n_nodes, "edges": circuit.n_edges,
                "depth": circuit.depth, "sdd_nodes": circuit.sdd_nodes, "read_s": read_s, "generate_s": generate_s}
        if any(e.startswith("klay") for e in args.engines):
            info["klay_nodes"], _ = klay_module(path)
        results["circuits"][name] = info
        print(f"{name}: {info}", flush=True)
        for batch in args.batch:
            gb = circuit.n_edges * batch * 4 / 1e9
            if gb > args.max_gb:
                for threads in args.threads:
                    for step in ("fwd", "fwd+bwd"):
                        results["cells"].append({"circuit": name, "batch": batch, "threads": threads, "step": step,
                                                 "skipped": f"edge values {gb:.1f} GB > --max-gb {args.max_gb}"})
                continue
            torch.set_num_threads(max(args.threads))
            engines = build_engines(args.engines, path, circuit, batch, args.autotune_budget, json.loads(args.override))
            for engine in engines:
                results["compile"].append({"circuit": name, "batch": batch, "engine": engine.name,
                                           "seconds": engine.compile_s, "note": engine.note})
            x = torch.tensor(np.random.default_rng(0).uniform(0.05, 0.95, (batch, max(circuit.n_vars, 1))),
                             dtype=torch.float32, requires_grad=True)
            errors = check(engines, x)
            results.setdefault("errors", []).append({"circuit": name, "batch": batch, "relative": errors})
            print(f"  batch {batch}: largest relative error against float64: {errors}", flush=True)
            for threads in args.threads:
                torch.set_num_threads(threads)
                for step in ("fwd", "fwd+bwd"):
                    times = interleaved(engines, x, step == "fwd+bwd", args.rounds, args.warmup)
                    cell = {"circuit": name, "batch": batch, "threads": threads, "step": step, "times_ms": times,
                            "median_ms": {k: statistics.median(v) for k, v in times.items()}}
                    results["cells"].append(cell)
                    print(f"  batch {batch} threads {threads} {step}: "
                          + ", ".join(f"{k} {v:.2f} ms" for k, v in cell["median_ms"].items()), flush=True)
            del engines
            gc.collect()
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.md").write_text(report(results))
    return results


def report(results: dict) -> str:
    load = ", ".join(f"{v:.1f}" for v in results.get("load_average_at_start", ()))
    lines = ["# Weighted model counting: neurovec vs KLay (torch backend)", "",
             f"torch {results['torch']}; arguments: `{' '.join(results['argv'])}`; "
             f"OMP_WAIT_POLICY={results.get('omp_wait_policy')}; load average at the start: {load}", "",
             "| circuit | variables | nodes (neurovec) | nodes (KLay) | edges | depth | SDD nodes | read s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in results["circuits"].items():
        lines.append(f"| {name} | {c['n_vars']} | {c['nodes']} | {c.get('klay_nodes', '')} | {c['edges']} | "
                     f"{c['depth']} | {c['sdd_nodes']} | {c['read_s']:.2f} |")
    lines += ["", "Medians in ms (interleaved rounds); speed-up = KLay / neurovec default. "
              f"Target: >= {TARGET:g}x at fwd+bwd, batch 128, circuits of >= {TARGET_NODES} nodes.", "",
              "| circuit | batch | threads | step | default | autotune | klay | speed-up | target |",
              "|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for cell in results["cells"]:
        c = results["circuits"][cell["circuit"]]
        head = f"| {cell['circuit']} | {cell['batch']} | {cell['threads']} | {cell['step']} |"
        if "skipped" in cell:
            lines.append(f"{head} skipped: {cell['skipped']} | | | | |")
            continue
        m = cell["median_ms"]
        ratio = m["klay"] / m["default"] if "klay" in m and "default" in m else None
        nodes = c.get("klay_nodes", c["nodes"])
        applies = cell["step"] == "fwd+bwd" and cell["batch"] == 128 and nodes >= TARGET_NODES
        verdict = ("met" if ratio >= TARGET else "**not met**") if applies and ratio is not None else ""
        ms = {k: f"{m[k]:.2f}" if k in m else "" for k in ("default", "autotune", "klay")}  # "": not run
        lines.append(f"{head} {ms['default']} | {ms['autotune']} | {ms['klay']} | "
                     + (f"{ratio:.2f}x" if ratio is not None else "") + f" | {verdict} |")
    lines += ["", "Compile times (s), per batch size:", "", "| circuit | batch | engine | s | note |",
              "|---|---:|---|---:|---|"]
    for row in results["compile"]:
        lines.append(f"| {row['circuit']} | {row['batch']} | {row['engine']} | {row['seconds']:.2f} | {row['note']} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--circuits", nargs="+", default=list(SHARED) + list(random_circuits.BENCHMARK_CNFS))
    parser.add_argument("--engines", nargs="+", default=list(ENGINES))
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 128, 1024])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--autotune-budget", type=float, default=60.0)
    parser.add_argument("--max-gb", type=float, default=2.0, help="skip cells whose edge values pass this")
    parser.add_argument("--override", default="{}",
                        help="JSON settings over the default preset, e.g. '{\"iso_compression\": false}' "
                             "(shown in the compile table)")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "neurovec" / "circuits"))
    parser.add_argument("--out", default="circuits-results")
    parser.add_argument("--must-show", action="store_true",
                        help="only the target's cells: the random CNFs, batch 128, default and klay")
    args = parser.parse_args(argv)
    if args.must_show:
        args.circuits, args.batch, args.engines = list(random_circuits.BENCHMARK_CNFS), [128], ["default", "klay"]
    return args


def main(argv=None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
