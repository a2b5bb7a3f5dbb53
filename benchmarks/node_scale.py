"""Where do time and memory go when a node-level GNN is built, compiled and trained on one large graph?

    python benchmarks/node_scale.py                                       # arxiv-like and products-like, GCN and SAGE
    python benchmarks/node_scale.py --dataset products-like --fraction 0.125 0.25 --model gcn
    python benchmarks/node_scale.py --pyg pyg-tuned --out benchmarks/results/node-scale-loaded

One command, one fresh process per (dataset, model): each gets the machine's memory to
itself, and its peak is its own. A dataset is a named shape of
:mod:`neurovec.datasets.synthetic` (R-MAT graphs of ogbn-arxiv's and ogbn-products'
sizes) or that shape's node and edge counts scaled by ``--fraction``. In order, the phases:

* ``generate``: the synthetic dataset (R-MAT edges, features, planted labels, masks);
* ``build``: the template's neuron graph (``datasets.gnn.build_gnn``), validation included (for PyG: the
  twin and its inputs);
* ``validate``: the ``Graph`` validation alone (the same layers validated again);
* ``vectorize`` and every compiler pass the preset enables (``compiler.pipeline.PIPELINE``), each
  followed, as ``neurovec.compile`` does, by the program's verification when the preset verifies
  (its seconds in their own column, and in the phase's total);
* ``module``: the torch module (``CompiledModule``);
* ``step 1``, ``step 2``, ...: full-batch training steps (forward, cross-entropy of the training
  nodes, backward, Adam), the first one with its one-off costs. neurovec's process keeps only the
  labels and the training nodes of the dataset after ``build``: the module holds what it reads of
  the features and edges (PyG's keeps the dataset: its forward reads ``x`` and the adjacency).

With ``--pyg pyg-tuned`` (or ``pyg``), the same dataset and model in PyG, in a process of its
own: ``pyg build`` (the twin, its inputs: for pyg-tuned a cached sparse CSR ``adj_t``, as the
node benchmark's contender) and its steps. An engine that runs out of memory (a
``MemoryError``, torch's allocation error, or the process killed) is recorded so, with the
phase it reached: not dropped.

Per phase: wall seconds, CPU seconds, graph edges per second (the dataset's edges, as the
issue counts them) and the process's peak RSS during the phase (Linux: reset before each
phase through ``/proc/self/clear_refs``; the compile runs inside ``reusing_freed_memory`` as
``compile()`` does, where freed blocks stay in malloc's heap, so a pass's peak includes what
earlier passes freed). The summary gives compile seconds (vectorize + passes + verification
+ module) and its graph and neuron-graph edges per second, and the process's peak RSS.

``--out DIR`` writes ``results.jsonl`` (one line per process) and ``README.md`` (the tables).
Time a quiet machine; on a shared one the numbers are only "loaded" (``--label``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neurovec.benchmarks.measure import max_rss_bytes, peak_rss_bytes, reset_peak_rss

DATASETS = ("arxiv-like", "products-like")
MODELS = ("gcn", "sage", "gin")
OUT_OF_MEMORY = ("out of memory", "can't allocate", "cannot allocate", "DefaultCPUAllocator")


# -- memory ----------------------------------------------------------------------------------------

def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or any(text in str(error) for text in OUT_OF_MEMORY)


# -- the worker: one dataset and model in this process -----------------------------------------------

class Phases:
    """Rows of phases, each written to ``out`` (a JSON line) as soon as it ends: a killed process
    leaves the phases it finished."""

    def __init__(self, out, graph_edges: int | None = None):
        self.out, self.graph_edges = out, graph_edges

    def emit(self, record: dict) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def phase(self, name: str, group: str):
        return _Phase(self, name, group)


class _Phase:
    def __init__(self, phases: Phases, name: str, group: str):
        self.phases, self.name, self.group = phases, name, group
        self.verify_s = 0.0

    def __enter__(self):
        self.phases.emit({"started": self.name})
        reset_peak_rss()
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, kind, error, trace):
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        row = {"phase": self.name, "group": self.group, "seconds": wall, "cpu_seconds": cpu,
               "verify_seconds": self.verify_s, "peak_rss": peak_rss_bytes() or max_rss_bytes()}
        if error is not None:
            row["error"] = ("out of memory: " if is_out_of_memory(error) else "") + f"{kind.__name__}: {error}"[:500]
        self.phases.emit(row)
        edges = self.phases.graph_edges
        print(f"  {self.name}: {wall:.2f} s" + (f" ({edges / wall / 1e6:.2f} M edges/s)" if edges and wall else "")
              + f", peak RSS {row['peak_rss'] / 1e9:.2f} GB" + (f"  [{row['error']}]" if error else ""),
              file=sys.stderr, flush=True)
        return False


def dataset_sizes(name: str, fraction: float) -> dict:
    from neurovec.datasets.synthetic import SHAPES
    nodes, edges, features, classes, undirected, split = SHAPES[name]
    return dict(nodes=max(1, round(nodes * fraction)), edges=round(edges * fraction), features=features,
                classes=classes, undirected=undirected, split=split)


def make_dataset(name: str, fraction: float):
    from neurovec.datasets.synthetic import rmat_dataset
    if fraction == 1:
        return rmat_dataset(name, seed=0)
    return rmat_dataset(**dataset_sizes(name, fraction), seed=0)


def train_step(forward, optimizer, y, train) -> None:
    import torch
    optimizer.zero_grad(set_to_none=True)
    out = forward()
    torch.nn.functional.cross_entropy(out[train], y[train]).backward()
    optimizer.step()


def run_neurovec(data, args, phases: Phases) -> None:
    import numpy as np
    import torch

    from neurovec.compiler import Settings
    from neurovec.compiler.ir import IRError
    from neurovec.compiler.pipeline import PIPELINE
    from neurovec.compiler.vectorizer import vectorize
    from neurovec.datasets import gnn
    from neurovec.engines.torch_module import CompiledModule
    from neurovec.memory import reusing_freed_memory
    from neurovec.sources.graph import Graph

    spec = gnn.GNNSpec.create(args.model, data, args.hidden, args.layers)
    with phases.phase("build", "graph"):
        graph = gnn.build_gnn(data, spec, None, 0)
    # The module holds what it reads of the features and edges (compiled in): training needs only the
    # labels and the training nodes, so the dataset goes (at products-like size 2 GB: features and edges).
    y = torch.as_tensor(data.y)
    train = torch.as_tensor(np.flatnonzero(data.train_mask))
    del data
    phases.emit({"info": {"neurons": int(graph.n_neurons), "neuron_edges": int(graph.n_edges),
                          "layers": len(graph.layers), "weights": len(graph.weights)}})
    with phases.phase("validate", "graph"):
        Graph(graph.layers, graph.weights, graph.output_layer, graph.output_ordinal)
    settings = Settings.preset(args.preset).for_dtype(torch.float32)
    gc.collect()
    with reusing_freed_memory():  # as compile() does
        with phases.phase("vectorize", "compile"):
            program = vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts))
        verified = None
        for name, enabled, run in PIPELINE:
            if not enabled(settings):
                continue
            with phases.phase(name, "compile") as phase:
                program = run(program, settings)
                if settings.verify:
                    start = time.perf_counter()
                    try:
                        program.verify(unchanged_since=verified)
                    except IRError as error:
                        raise IRError(f"after pass {name!r}: {error}") from error
                    verified = program
                    phase.verify_s = time.perf_counter() - start
        del graph, verified
        with phases.phase("module", "compile"):
            module = CompiledModule(program, torch.float32)
    phases.emit({"info": {"program_nodes": len(program.nodes)}})
    del program
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    for k in range(1, args.steps + 1):
        with phases.phase(f"step {k}", "train"):
            train_step(module, optimizer, y, train)


def run_pyg(data, args, phases: Phases) -> None:
    import numpy as np
    import torch

    from neurovec.benchmarks.contenders import PyGEngine
    from neurovec.benchmarks.node_tasks import NodeTask
    from neurovec.benchmarks.tasks import ModelOptions
    from neurovec.datasets import gnn

    spec = gnn.GNNSpec.create(args.model, data, args.hidden, args.layers)
    task = NodeTask(args.dataset, args.model, ModelOptions(args.hidden, args.layers), data, spec)
    engine = PyGEngine(args.pyg)
    with phases.phase(f"{args.pyg} build", "graph"):
        details = engine.build(task, torch.device("cpu"), torch.float32)
    phases.emit({"info": {"pyg": details}})
    y = torch.as_tensor(data.y)
    train = torch.as_tensor(np.flatnonzero(data.train_mask))
    for k in range(1, args.steps + 1):
        with phases.phase(f"{args.pyg} step {k}", "train"):
            train_step(engine.forward, engine.optimizer, y, train)


def worker(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    if args.memory_limit_gb:
        limit = int(args.memory_limit_gb * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(args.worker, "a") as out:
        phases = Phases(out)
        try:
            with phases.phase("generate", "graph"):
                data = make_dataset(args.dataset, args.fraction)
            phases.graph_edges = int(data.n_edges)
            phases.emit({"info": {"nodes": int(data.n_nodes), "edges": int(data.n_edges)}})
            given = [data]
            del data  # the run's argument is then its only reference: it may let the dataset go
            (run_pyg if args.pyg else run_neurovec)(given.pop(), args, phases)
        except Exception as error:  # recorded in its phase's row: the parent reports it
            if not is_out_of_memory(error):
                raise
            sys.exit(3)


# -- the parent: one process per cell, then the tables -------------------------------------------------

def run_cell(args, dataset: str, fraction: float, model: str, pyg: str | None) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as handle:
        path = Path(handle.name)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), "--dataset", dataset,
               "--fraction", str(fraction), "--model", model, "--hidden", str(args.hidden), "--layers",
               str(args.layers), "--preset", args.preset, "--steps", str(args.steps), "--threads", str(args.threads)]
    if pyg:
        command += ["--pyg", pyg]
    if args.memory_limit_gb:
        command += ["--memory-limit-gb", str(args.memory_limit_gb)]
    start = time.perf_counter()
    returncode = subprocess.run(command).returncode
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    cell = {"dataset": dataset if fraction == 1 else f"{dataset} x {fraction:g}", "shape": dataset,
            "fraction": fraction, "model": model, "engine": pyg or f"neurovec {args.preset}",
            "threads": args.threads, "returncode": returncode, "wall_s": time.perf_counter() - start,
            "phases": [line for line in lines if "phase" in line], "info": {}}
    for line in lines:
        cell["info"].update(line.get("info", {}))
    finished = {row["phase"] for row in cell["phases"]}
    unfinished = [line["started"] for line in lines if "started" in line and line["started"] not in finished]
    failed = [row for row in cell["phases"] if "error" in row]
    cap = f", {args.memory_limit_gb:g} GB cap" if args.memory_limit_gb else ""
    cell["memory_limit_gb"] = args.memory_limit_gb
    if failed:
        kind = "out of memory" if failed[0]["error"].startswith("out of memory") else "failed"
        cell["outcome"] = f"{kind} in {failed[0]['phase']}{cap if kind == 'out of memory' else ''}"
        cell["error"] = failed[0]["error"]
    elif returncode == 0:
        cell["outcome"] = "ok"
    elif returncode in (-9, 137):
        cell["outcome"] = (f"killed (SIGKILL: out of memory?) in {unfinished[0]}" if unfinished
                           else "killed (SIGKILL: out of memory?)")
    else:
        cell["outcome"] = f"failed (exit {returncode})" + (f" in {unfinished[0]}" if unfinished else "")
    return cell


def summary(cell: dict) -> dict:
    rows = cell["phases"]
    edges = cell["info"].get("edges")
    compile_rows = [row for row in rows if row["group"] == "compile"]
    compile_s = sum(row["seconds"] for row in compile_rows)
    build_s = sum(row["seconds"] for row in rows if row["phase"] == "build" or row["phase"].endswith(" build"))
    steps = [row["seconds"] for row in rows if row["group"] == "train"]
    step_cpu = [row["cpu_seconds"] for row in rows if row["group"] == "train"]
    out = {"compile_s": compile_s, "verify_s": sum(row["verify_seconds"] for row in compile_rows),
           "compile_cpu_s": sum(row["cpu_seconds"] for row in compile_rows),
           "build_s": build_s, "peak_rss": max((row["peak_rss"] for row in rows), default=0),
           "first_step_s": steps[0] if steps else None,
           "step_s": min(steps[1:]) if len(steps) > 1 else None,
           "step_cpu_s": min(step_cpu[1:]) if len(step_cpu) > 1 else None}
    if edges and compile_s:
        out["compile_edges_per_s"] = edges / compile_s
        out["build_compile_edges_per_s"] = edges / (compile_s + build_s)
        out["compile_neuron_edges_per_s"] = cell["info"].get("neuron_edges", 0) / compile_s
        # On a loaded machine the process waits for a core: its CPU seconds say more than the wall's.
        out["compile_edges_per_cpu_s"] = edges / max(out["compile_cpu_s"], 1e-9)
    if cell.get("outcome") != "ok":  # a compile cut short has no time or rate
        out.update(compile_s=0.0, compile_cpu_s=0.0, verify_s=0.0)
        for key in ("compile_edges_per_s", "build_compile_edges_per_s", "compile_neuron_edges_per_s",
                    "compile_edges_per_cpu_s"):
            out.pop(key, None)
    return out


def markdown(cells: list[dict], label: str) -> str:
    lines = [f"# Node-level scale ({label})", "",
             f"Machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
             "Peak RSS per phase (reset before each), in GB; edges/s counts the dataset's edges.", ""]
    lines += ["| dataset | engine | model | outcome | build s | compile s (verify) | compile M edges/s | "
              "compile CPU s | M edges/CPU s | build+compile M edges/s | first step s | step s | step CPU s | "
              "peak RSS GB |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cell in cells:
        s = summary(cell)

        def num(value, scale=1.0, digits=2):
            return "-" if value is None else f"{value / scale:.{digits}f}"
        compile_cell = "-" if not s["compile_s"] else f"{s['compile_s']:.2f} ({s['verify_s']:.2f})"
        lines.append(f"| {cell['dataset']} | {cell['engine']} | {cell['model'].upper()} | {cell['outcome']} | "
                     f"{num(s['build_s'] or None)} | {compile_cell} | {num(s.get('compile_edges_per_s'), 1e6)} | "
                     f"{num(s['compile_cpu_s'] or None)} | {num(s.get('compile_edges_per_cpu_s'), 1e6)} | "
                     f"{num(s.get('build_compile_edges_per_s'), 1e6)} | {num(s['first_step_s'])} | "
                     f"{num(s['step_s'])} | {num(s['step_cpu_s'])} | {num(s['peak_rss'], 1e9)} |")
    for cell in cells:
        info = cell["info"]
        lines += ["", f"## {cell['dataset']}, {cell['model'].upper()} {cell.get('layers', '')}, {cell['engine']}, "
                      f"{cell['threads']} thread(s): {cell['outcome']}", ""]
        described = ", ".join(f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}"
                              for key, value in info.items())
        if "error" in cell:
            described += f"; {cell['error'][:300]}"
        lines += [described, "", "| phase | s | CPU s | verify s | M edges/s | peak RSS GB |",
                  "|---|---:|---:|---:|---:|---:|"]
        edges = info.get("edges")
        for row in cell["phases"]:
            rate = f"{edges / row['seconds'] / 1e6:.2f}" if edges and row["seconds"] > 0 else "-"
            note = " (out of memory)" if row.get("error", "").startswith("out of memory") else (
                " (failed)" if "error" in row else "")
            lines.append(f"| {row['phase']}{note} | {row['seconds']:.2f} | {row['cpu_seconds']:.2f} | "
                         f"{row['verify_seconds']:.2f} | {rate} | {row['peak_rss'] / 1e9:.2f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--fraction", type=float, nargs="+", default=[1.0],
                        help="scale each dataset's nodes and edges (e.g. 0.125 0.25 of products-like)")
    parser.add_argument("--model", nargs="+", default=["gcn", "sage"], choices=MODELS)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--steps", type=int, default=3, help="training steps after the compile (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pyg", nargs="*", default=[], choices=["pyg", "pyg-tuned"],
                        help="also time these PyG contenders, each in its own process")
    parser.add_argument("--no-neurovec", action="store_true", help="only the PyG contenders")
    parser.add_argument("--memory-limit-gb", type=float, help="each process's address-space limit (RLIMIT_AS)")
    parser.add_argument("--out", type=Path, help="write results.jsonl and README.md here")
    parser.add_argument("--label", default="loaded", help="what the machine was doing (quiet, loaded)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        for name in ("dataset", "fraction", "model", "pyg"):
            value = getattr(args, name)
            setattr(args, name, value[0] if isinstance(value, list) and value else (value or None))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    cells = []
    for dataset in args.dataset:
        for fraction in args.fraction:
            for model in args.model:
                for engine in ([] if args.no_neurovec else [None]) + list(args.pyg):
                    name = dataset if fraction == 1 else f"{dataset} x {fraction:g}"
                    print(f"{name}, {model}, {engine or 'neurovec ' + args.preset}:", file=sys.stderr, flush=True)
                    cell = run_cell(args, dataset, fraction, model, engine)
                    cell["layers"] = f"{args.layers} x {args.hidden}"
                    cells.append(cell)
                    if args.out:
                        args.out.mkdir(parents=True, exist_ok=True)
                        with (args.out / "results.jsonl").open("a") as out:
                            out.write(json.dumps({**cell, "label": args.label, "summary": summary(cell)}) + "\n")
    print(markdown(cells, args.label))
    if args.out:  # the tables of every run recorded there (runs of several commands add up)
        recorded = [json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines() if line.strip()]
        labels = sorted({cell["label"] for cell in recorded})
        (args.out / "README.md").write_text(markdown(recorded, ", ".join(labels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
