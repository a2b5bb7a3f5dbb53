"""Where does the compile of one large node-level graph spend its CPU time, stage by stage?

    python benchmarks/compile_stages.py                                   # products-like x 1/8, GCN
    python benchmarks/compile_stages.py --fraction 0.25 --model sage --rounds 2
    python benchmarks/compile_stages.py --profile fold_constants deduplicate   # cProfile those stages

The compile of ``benchmarks/node_scale.py`` (vectorize, every pass the preset enables, the
module) on ``products-like`` (or ``arxiv-like``) scaled by ``--fraction``, without the
verification and without training: per stage, CPU seconds (``time.process_time``: on a loaded
machine they say more than wall seconds) and the dataset's edges per CPU second. ``--rounds``
compiles the same graph again (the graph is built once) and prints the minimum per stage.
``--threads`` sets torch's threads (default 1; the C++ fold kernel splits its segments over them), and
wall seconds are printed beside CPU seconds. ``--profile NAME ...`` runs those stages under cProfile in the last round and prints their
costliest functions (cumulative and own time). To compare two versions of the code, run the
script alternately with ``PYTHONPATH`` pointing to each (the stages are those of the version
imported).
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time


def compile_stages(graph, settings, profile: set[str]) -> list[tuple[str, float, float]]:
    """(stage, CPU seconds, wall seconds) for vectorize, every enabled pass and the module, as ``neurovec.compile``."""
    import torch

    from neurovec.compiler.pipeline import PIPELINE
    from neurovec.compiler.vectorizer import vectorize
    from neurovec.engines.torch_module import CompiledModule
    from neurovec.memory import reusing_freed_memory

    rows: list[tuple[str, float, float]] = []

    def timed(name, run):
        profiler = cProfile.Profile() if name in profile else None
        start, wall = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        value = run()
        if profiler:
            profiler.disable()
        rows.append((name, time.process_time() - start, time.perf_counter() - wall))
        if profiler:
            for key in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(25)
                print(f"--- {name} by {key}\n" + "\n".join(text.getvalue().splitlines()[6:]), file=sys.stderr)
        return value

    gc.collect()
    with reusing_freed_memory():
        program = timed("vectorize", lambda: vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts)))
        for name, enabled, run in PIPELINE:
            if enabled(settings):
                program = timed(name, lambda: run(program, settings))
        module = timed("module", lambda: CompiledModule(program, torch.float32))
    del module, program
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="products-like", choices=["arxiv-like", "products-like"])
    parser.add_argument("--fraction", type=float, default=0.125)
    parser.add_argument("--model", default="gcn", choices=["gcn", "sage", "gin"])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--rounds", type=int, default=1, help="compiles of the same graph (the minimum per stage)")
    parser.add_argument("--profile", nargs="*", default=[], help="stages to run under cProfile (last round)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's threads (the C++ fold kernel splits its segments over them)")
    parser.add_argument("--min-share", type=float, default=0.005, help="hide stages under this share of the total")
    args = parser.parse_args(argv)

    import torch

    from neurovec.benchmarks.node_scale import make_dataset
    from neurovec.compiler import Settings
    from neurovec.datasets import gnn

    torch.set_num_threads(args.threads)
    data = make_dataset(args.dataset, args.fraction)
    edges = int(data.n_edges)
    graph = gnn.build_gnn(data, gnn.GNNSpec.create(args.model, data, args.hidden, args.layers), None, 0)
    del data
    settings = Settings.preset(args.preset, verify=False).for_dtype(torch.float32)
    best: dict[str, float] = {}
    best_wall: dict[str, float] = {}
    for k in range(args.rounds):
        rows = compile_stages(graph, settings, set(args.profile) if k == args.rounds - 1 else set())
        for name, cpu, wall in rows:
            best[name] = min(best.get(name, float("inf")), cpu)
            best_wall[name] = min(best_wall.get(name, float("inf")), wall)
        total, total_wall = sum(row[1] for row in rows), sum(row[2] for row in rows)
        print(f"round {k + 1}: {total:.2f} CPU s, {edges / total / 1e6:.2f} M edges/CPU s; {total_wall:.2f} wall s, "
              f"{edges / total_wall / 1e6:.2f} M edges/wall s", file=sys.stderr, flush=True)
    total, total_wall = sum(best.values()), sum(best_wall.values())
    print(f"{args.dataset} x {args.fraction:g}, {args.model.upper()} {args.layers} x {args.hidden}, {args.preset}, "
          f"{args.threads} thread(s): {edges:,} edges; minimum of {args.rounds} round(s) per stage")
    print("| stage | CPU s | wall s | M edges/CPU s | share |\n|---|---:|---:|---:|---:|")
    for name, cpu in best.items():
        if cpu >= args.min_share * total:
            print(f"| {name} | {cpu:.3f} | {best_wall[name]:.3f} | {edges / max(cpu, 1e-9) / 1e6:.1f} | {cpu / total:.0%} |")
    print(f"| **compile** | **{total:.2f}** | **{total_wall:.2f}** | **{edges / total / 1e6:.2f}** | |")
    print(f"{edges / total_wall / 1e6:.2f} M edges per wall s (the sum of the stages' minimum wall times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
