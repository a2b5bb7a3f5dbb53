"""How fast does neurovec compile, and how much memory does each pass take? (target: >= 1M edges/s)

    python benchmarks/compile_speed.py --edges 1000000            # a random 3-layer graph
    python benchmarks/compile_speed.py --tu PROTEINS --scale 1 10  # PROTEINS GCN, continuous features
    python benchmarks/compile_speed.py --depth 16 28 40 60         # chains with skip connections

The first form builds a random 3-layer message-passing graph with the bulk array API and
times validation (Graph construction), the Vectorizer alone, the whole pipeline of a preset
(with its slowest passes) and module construction.

The third form compiles ``deep_chain(depth)`` (a chain whose layers each read the layer before
and the one before that: many paths to every node) under a preset and prints the compile time
(``neurovec.compile``, median of ``--repeat``) against depth: it grows linearly under ``default``.

The second form compiles a TU dataset replicated ``k`` times (distinct copies: continuous
features, so nothing merges; ``benchmarks.tasks.replicate_tu``) with one template, and prints
one table per scale: every pass's wall and CPU seconds and the process's peak RSS during it
(Linux: the peak is reset before each pass through ``/proc/self/clear_refs``; elsewhere it is
the peak so far; inside ``reusing_freed_memory``, as in ``build_program``, freed blocks stay in
malloc's heap, so a pass's peak includes what earlier passes freed), then edges per second for the vectorizer and passes, and for the whole
compile with module construction. Time a quiet machine: wall seconds are only as good as the
machine is idle (CPU seconds are less sensitive to other processes, not insensitive).
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import numpy as np

from neurovec import datasets
from neurovec.compiler import Settings, build_program, vectorize
from neurovec.memory import reusing_freed_memory
from neurovec.compiler.pipeline import PIPELINE
from neurovec.benchmarks.measure import max_rss_bytes, peak_rss_bytes, reset_peak_rss
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import FactLayer, Graph, NeuronLayer, Weight

def synthetic_graph(n_edges: int, n_nodes: int | None = None, dim: int = 8, layers: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    n_nodes = n_nodes or max(n_edges // 10, 1)
    per_layer = n_edges // layers
    weights = [Weight(f"W{k}", rng.normal(size=(dim, dim))) for k in range(layers)]
    graph_layers = [FactLayer("x", rng.normal(size=(n_nodes, dim)))]
    for k in range(layers):
        # Random in-degrees summing to per_layer, every node at least one input.
        counts = np.bincount(rng.integers(0, n_nodes, per_layer - n_nodes), minlength=n_nodes) + 1
        graph_layers.append(NeuronLayer(
            f"h{k}", counts=counts, input_layer=np.full(per_layer, k),
            input_ordinal=rng.integers(0, n_nodes, per_layer), input_weight=np.full(per_layer, k),
            aggregation=["sum", "mean", "max"][k % 3], transformation="relu"))
    return graph_layers, weights, n_nodes


def deep_chain(depth: int, width: int = 4, dim: int = 3, weighted_layers: int | None = None, skip: int = 2,
               aggregation: str = "sum", transformation: str = "tanh", seed: int = 0) -> Graph:
    """A chain of ``depth`` layers with skip connections: neuron i of layer k reads neurons i and
    i + 1 (mod ``width``) of layer k - 1 and neuron i of layer k - ``skip`` (the facts where that is
    before the first layer). The first ``weighted_layers`` layers (None: all) multiply their first
    input by a matrix of their own; the others add their inputs as they are. Every node of
    the vectorized program is reachable through many paths (Fibonacci-many for ``skip=2``): the
    shape on which a labelling that re-walked every path below a node never finished."""
    rng = np.random.default_rng(seed)
    layers: list = [FactLayer("x", rng.normal(size=(width, dim)))]
    weights: list[Weight] = []
    weighted = depth if weighted_layers is None else weighted_layers
    i = np.arange(width)
    for k in range(depth):
        prev = len(layers) - 1
        back = max(len(layers) - skip, 0)
        w = -1
        if k < weighted:
            weights.append(Weight(f"W{k}", rng.normal(size=(dim, dim)) * 0.5))
            w = len(weights) - 1
        src = np.stack([np.full(width, prev), np.full(width, back), np.full(width, prev)], 1).ravel()
        ordinal = np.stack([i, i, (i + 1) % width], 1).ravel()
        wts = np.stack([np.full(width, w), np.full(width, -1), np.full(width, -1)], 1).ravel()
        layers.append(NeuronLayer(f"h{k}", np.full(width, 3), src, ordinal, wts, aggregation=aggregation,
                                  transformation=transformation))
    return Graph(layers, weights, np.full(width, len(layers) - 1), np.arange(width))


# -- peak memory ----------------------------------------------------------------------------------

class Step:
    """Wall seconds, CPU seconds and peak RSS of one step (``with Step(name, rows): ...``)."""

    def __init__(self, name: str, rows: list):
        self.name, self.rows = name, rows

    def __enter__(self):
        reset_peak_rss()
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc):
        self.rows.append((self.name, time.perf_counter() - self.wall, time.process_time() - self.cpu,
                          peak_rss_bytes() or max_rss_bytes()))


def timed_pipeline(graph: Graph, settings: Settings) -> tuple[list[tuple], object]:
    """Vectorize and run every enabled pass; per step: (name, wall s, CPU s, peak RSS bytes)."""
    rows: list[tuple] = []
    gc.collect()
    with reusing_freed_memory():  # as build_program does
        with Step("vectorize", rows):
            program = vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts))
        for name, enabled, run in PIPELINE:
            if enabled(settings):
                with Step(name, rows):
                    program = run(program, settings)
    return rows, program


# -- the two forms -------------------------------------------------------------------------------------

def synthetic(args) -> None:
    layers, weights, n_nodes = synthetic_graph(args.edges)
    t0 = time.perf_counter()
    graph = Graph(layers, weights, np.full(n_nodes, len(layers) - 1), np.arange(n_nodes))
    t1 = time.perf_counter()
    vectorize(graph)
    t2 = time.perf_counter()
    timings: dict[str, float] = {}
    program = build_program(graph, Settings.preset(args.preset, verify=False), timings)
    t3 = time.perf_counter()
    with reusing_freed_memory():  # as compile() builds it
        module = CompiledModule(program)
    t4 = time.perf_counter()
    module()
    t5 = time.perf_counter()
    slowest = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(timings.items(), key=lambda kv: -kv[1])[:4])
    print(f"{graph!r}")
    print(f"validate {t1 - t0:.2f} s | vectorize alone {t2 - t1:.2f} s | {args.preset} pipeline {t3 - t2:.2f} s "
          f"({slowest}) | module {t4 - t3:.2f} s | first forward {t5 - t4:.2f} s")
    print(f"{graph.n_edges / (t3 - t2) / 1e6:.2f} M edges/s (pipeline), "
          f"{graph.n_edges / (t4 - t2) / 1e6:.2f} M edges/s (pipeline + module)")


def tu_scaling(args) -> None:
    from neurovec.benchmarks.tasks import replicate_tu
    data = datasets.load_tu(args.tu, args.data_dir, download=False)
    settings = Settings.preset(args.preset, verify=False)
    template = getattr(datasets, args.model)
    for scale in args.scale:
        replicated = replicate_tu(data, scale, first_copy=True)
        graph = template(replicated, samples=np.arange(replicated.n_graphs))
        del replicated
        rows, program = timed_pipeline(graph, settings)
        with Step("module", rows), reusing_freed_memory():  # as compile() builds it
            module = CompiledModule(program)
        passes = [sum(r[k] for r in rows if r[0] != "module") for k in (1, 2)]
        total = [passes[k] + rows[-1][k + 1] for k in (0, 1)]
        print(f"\n{args.tu} {args.model.upper()} x{scale}, continuous features, preset {args.preset}: {graph!r}")
        print("| step | seconds | CPU seconds | peak RSS (GB) |\n|---|---:|---:|---:|")
        for name, wall, cpu, peak in rows:
            print(f"| {name} | {wall:.2f} | {cpu:.2f} | {peak / 1e9:.2f} |")
        print(f"| **vectorize + passes** | **{passes[0]:.2f}** | **{passes[1]:.2f}** | |")
        print(f"| **total** | **{total[0]:.2f}** | **{total[1]:.2f}** | **{max(r[3] for r in rows) / 1e9:.2f}** |")
        print(f"{graph.n_edges / passes[0] / 1e6:.2f} M edges/s (vectorize + passes), "
              f"{graph.n_edges / total[0] / 1e6:.2f} M edges/s (with the module); by CPU time "
              f"{graph.n_edges / passes[1] / 1e6:.2f} and {graph.n_edges / total[1] / 1e6:.2f}", flush=True)
        del graph, program, module
        gc.collect()


def depth_scaling(args) -> None:
    """Compile time against depth: ``deep_chain`` of each depth, the preset's pipeline and the module
    (``neurovec.compile``), the median of ``--repeat`` compiles, and the program's nodes."""
    import neurovec
    print(f"| depth | neurons | edges | {args.preset} compile (s) | program nodes |\n|---:|---:|---:|---:|---:|")
    for depth in args.depth:
        graph = deep_chain(depth)
        seconds = []
        for _ in range(args.repeat):
            gc.collect()
            start = time.perf_counter()
            module = neurovec.compile(graph, args.preset)
            seconds.append(time.perf_counter() - start)
        print(f"| {depth} | {graph.n_neurons} | {graph.n_edges} | {sorted(seconds)[len(seconds) // 2]:.2f} | "
              f"{len(module.program.nodes)} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=1_000_000, help="size of the synthetic graph")
    parser.add_argument("--preset", default="default", help="optimizer preset")
    parser.add_argument("--tu", default=None, help="a TU dataset (MUTAG, ENZYMES, PROTEINS) instead")
    parser.add_argument("--model", default="gcn", choices=["gcn", "sage", "gin"])
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 10, 100], help="copies of the dataset")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/tu"))
    parser.add_argument("--depth", type=int, nargs="+", default=None,
                        help="compile a chain with skip connections of each depth instead (deep_chain)")
    parser.add_argument("--repeat", type=int, default=3, help="compiles per depth (the median is shown)")
    args = parser.parse_args()
    if args.depth:
        depth_scaling(args)
    elif args.tu:
        tu_scaling(args)
    else:
        synthetic(args)


if __name__ == "__main__":
    main()
