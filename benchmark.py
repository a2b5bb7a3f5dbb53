"""neurovec's benchmark: compiled modules against PyTorch Geometric and NeuraLogic, reproducibly.

    python benchmark.py                       # quick: MUTAG, GCN/SAGE/GIN, labels: default vs the 3 PyG contenders
    python benchmark.py --datasets MUTAG ENZYMES PROTEINS --features labels continuous \
        --engines default autotune all pyg pyg-tuned pyg-compiled --threads 1
    python benchmark.py --datasets PROTEINS --models gcn --features continuous --scale 1 10 100 \
        --engines default pyg pyg-compiled --schedule sequential --warmup 1 --reps 3
    python benchmark.py --device cuda --dtype float64 --reps 50
    python benchmark.py --task node --datasets cora arxiv-like --models gcn sage gin   # one large graph

For every dataset x model x features (x scale) every engine is built and runs a
first forward/backward pass (together: its compile time), its outputs and
gradients are checked against an oracle (the PyG twin in float64, the reference
engine, or NeuraLogic itself), then its training iterations are timed: forward,
backward, training step (forward + loss + backward + Adam step), with CUDA
synchronisation, interleaved with the other engines; and its peak memory is
recorded. An engine that fails the check is timed but marked invalid; one that
raises is recorded as failed and the run goes on.

The headline is neurovec as a user gets it (the ``default`` preset and
``autotune``'s pick) against the fastest PyG contender of each task (``pyg``,
``pyg-tuned``, ``pyg-compiled``); each step is also set against the bytes it must
move at the memory bandwidth measured in the run.

Results go to ``--out`` (default ``benchmark-results/<date>-<device>``), rewritten
after every task so that an interrupted run leaves its partial results:
``results.json`` (every raw measurement and the machine), ``results.md`` (the
headline, then the details) and PNG plots at the end. See ``docs/benchmarks.md``.

Exit status: 0 when at least one engine ran and passed its check (or had no
oracle), 1 when nothing valid ran, 2 for bad arguments (an unknown engine, a
CUDA device on a machine without CUDA, a data folder that does not exist or
lacks a dataset).

Data: ``--data-dir`` or ``$NEUROVEC_DATA`` (TU folders, ``mutagenesis/`` CSVs);
otherwise TU datasets come from, or are downloaded to, ``~/.cache/neurovec/tu``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

__all__ = ["main", "parse_args", "config_from_args", "preflight", "valid_measurements", "DEFAULT_ENGINES"]


DEFAULT_ENGINES = ["default", "pyg", "pyg-tuned", "pyg-compiled"]


def parse_args(argv=None) -> argparse.Namespace:
    from neurovec.benchmarks.suite import SPECIAL_ENGINES
    from neurovec.benchmarks.tasks import DATASETS, FEATURES, MODELS, ORACLE_MAX_NODES
    from neurovec.compiler import list_presets

    parser = argparse.ArgumentParser(
        prog="python benchmark.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="engines: a preset name, 'all' (every preset), " + ", ".join(SPECIAL_ENGINES)
               + "\npresets: " + " ".join(list_presets()))
    from neurovec.benchmarks.node_tasks import NODE_DATASETS, NODE_MODELS

    what = parser.add_argument_group("what to compare")
    what.add_argument("--task", default="graph", choices=["graph", "node"],
                      help="graph: graph classification over TU datasets and Mutagenesis (default); node: "
                           f"full-batch node classification on one large graph ({', '.join(NODE_DATASETS)})")
    what.add_argument("--datasets", nargs="+", default=None, choices=DATASETS + NODE_DATASETS, metavar="NAME",
                      help=f"datasets: {', '.join(DATASETS)} (default: MUTAG); with --task node: "
                           f"{', '.join(NODE_DATASETS)} (default: cora)")
    what.add_argument("--models", nargs="+", default=None, choices=tuple(dict.fromkeys(MODELS + NODE_MODELS)),
                      metavar="NAME",
                      help=f"models: {', '.join(MODELS)} (default: every model that applies to each dataset: "
                           "gcn sage gin for TU, simple dims for mutagenesis)")
    what.add_argument("--engines", nargs="+", default=DEFAULT_ENGINES, metavar="NAME",
                      help="neurovec presets by name, 'all' (every preset), 'autotune', 'pyg', 'pyg-tuned', "
                           "'pyg-compiled', 'neuralogic', 'reference' (default: " + " ".join(DEFAULT_ENGINES) + ")")
    what.add_argument("--features", nargs="+", default=["labels"], choices=FEATURES, metavar="MODE",
                      help="TU node features: 'labels' (one-hot, as in the files) and/or 'continuous' (every "
                           "node's features scaled by 1 + U(-0.05, 0.05), so nothing can merge); "
                           "e.g. --features labels continuous (default: labels)")
    what.add_argument("--scale", nargs="+", type=int, default=[1], metavar="K",
                      help="replicate each dataset K times in one batch, e.g. --scale 1 10 100 (default: 1)")
    what.add_argument("--scale-mode", default="distinct", choices=["distinct", "identical"],
                      help="with label features, TU copies after the first get slightly different node features "
                           "(default) so no pass can merge them, or stay identical")
    how = parser.add_argument_group("how to measure")
    how.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    how.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    how.add_argument("--warmup", type=int, default=3, help="untimed iterations per engine (default: 3)")
    how.add_argument("--reps", type=int, default=10, help="timed iterations per engine (default: 10)")
    how.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    how.add_argument("--schedule", default="interleaved", choices=["interleaved", "sequential"],
                     help="interleave the engines' timed iterations (default) or time one engine after another")
    how.add_argument("--settle", type=int, default=1,
                     help="interleaved: untimed iterations of an engine right before each of its timed ones, so "
                          "that a timed step starts from the engine's own warm state, as in a training loop "
                          "(default: 1)")
    how.add_argument("--neuralogic-warmup", type=int, default=5,
                     help="at least this many warm-up epochs for NeuraLogic (JIT; default: 5)")
    how.add_argument("--reference-max-neurons", type=int, default=20_000,
                     help="skip the reference engine on larger graphs (default: 20000)")
    how.add_argument("--oracle-max-nodes", type=int, default=ORACLE_MAX_NODES,
                     help="above this many batch nodes the oracle checks a random subset of the samples "
                          f"(default: {ORACLE_MAX_NODES})")
    how.add_argument("--bandwidth-mb", type=int, default=128,
                     help="size of the tensor copied to measure the memory bandwidth (default: 128 MB)")
    how.add_argument("--autotune-budget", type=float, default=60.0, help="seconds for neurovec.autotune")
    how.add_argument("--isolate", action="store_true",
                     help="run every engine of a task in a process of its own (compiled contenders compile alone; "
                          "an engine that runs out of memory is recorded as such); implies sequential timing")
    how.add_argument("--memory-limit-gb", type=float, default=None,
                     help="with --isolate: the address-space limit of each engine's process (RLIMIT_AS)")
    model = parser.add_argument_group("model sizes")
    model.add_argument("--hidden", type=int, default=None,
                       help="GNN width (default: 16; node tasks: 16 on cora, 128 on the synthetic graphs)")
    model.add_argument("--layers", type=int, default=None,
                       help="GNN convolutions (default: 2; node tasks: 2 on cora, 3 on the synthetic graphs)")
    model.add_argument("--dim", type=int, default=3, help="relational embedding size (default: 3)")
    model.add_argument("--bond-dim", type=int, default=1, help="'dims' bond embedding size (default: 1)")
    io = parser.add_argument_group("input and output")
    io.add_argument("--data-dir", default=None, help="dataset folder (default: $NEUROVEC_DATA, else the cache)")
    io.add_argument("--out", default=None, help="results folder (default: benchmark-results/<date>-<device>)")
    io.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    io.add_argument("--report-only", metavar="JSON", default=None,
                    help="measure nothing: rewrite results.md and the plots of an earlier results.json "
                         "(into --out, default: its folder)")
    io.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.datasets is None:
        args.datasets = ["cora"] if args.task == "node" else ["MUTAG"]
    wrong = [d for d in args.datasets if (d in NODE_DATASETS) != (args.task == "node")]
    if wrong:
        parser.error(f"dataset {wrong[0]} is not a {args.task} task dataset (--task node takes "
                     f"{', '.join(NODE_DATASETS)}; --task graph {', '.join(DATASETS)})")
    if args.task == "node" and args.models and set(args.models) - set(NODE_MODELS):
        parser.error(f"--task node models: {', '.join(NODE_MODELS)}")
    if args.memory_limit_gb is not None and not args.isolate:
        parser.error("--memory-limit-gb needs --isolate (it limits each engine's own process)")
    for name in ("warmup", "settle", "reps", "hidden", "layers", "dim", "bond_dim", "oracle_max_nodes", "bandwidth_mb"):
        if getattr(args, name) is not None and getattr(args, name) < (0 if name in ("warmup", "settle") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive (got {getattr(args, name)})")
    if any(k < 1 for k in args.scale):
        parser.error(f"--scale factors must be positive integers (got {args.scale})")
    try:
        from neurovec.benchmarks.suite import expand_engines
        expand_engines(args.engines)
    except ValueError as error:
        parser.error(str(error))
    return args


def config_from_args(args: argparse.Namespace):
    from neurovec.benchmarks.suite import Config
    from neurovec.benchmarks.tasks import ModelOptions

    return Config(task=args.task, node_hidden=args.hidden, node_layers=args.layers, isolate=args.isolate,
                  memory_limit_gb=args.memory_limit_gb,
                  datasets=tuple(args.datasets), models=tuple(args.models) if args.models else None,
                  engines=tuple(args.engines), device=args.device, dtype=args.dtype, warmup=args.warmup,
                  reps=args.reps, threads=args.threads, scales=tuple(args.scale), scale_mode=args.scale_mode,
                  features=tuple(dict.fromkeys(args.features)), data_dir=args.data_dir,
                  oracle_max_nodes=args.oracle_max_nodes, bandwidth_mb=args.bandwidth_mb,
                  options=ModelOptions(args.hidden or 16, args.layers or 2, args.dim, args.bond_dim),
                  reference_max_neurons=args.reference_max_neurons, autotune_budget_s=args.autotune_budget,
                  neuralogic_warmup=args.neuralogic_warmup, schedule=args.schedule, settle=args.settle,
                  progress=not args.quiet)


def preflight(args: argparse.Namespace) -> str | None:
    """Why the run cannot start (one line), or None: checked before anything is measured."""
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return (f"--device {args.device}: CUDA is not available on this machine (torch.cuda.is_available() "
                "is False); use --device cpu")
    if args.data_dir is not None:
        from neurovec.benchmarks.tasks import TU_DATASETS, DataCache
        from neurovec.datasets.tu import find_tu

        folder = Path(args.data_dir).expanduser()
        if not folder.is_dir():
            return f"--data-dir {folder}: no such directory"
        for dataset in args.datasets:
            if dataset == "cora":
                from neurovec.datasets.planetoid import find_planetoid
                if find_planetoid("Cora", folder) is None and find_planetoid("Cora", folder / "planetoid") is None:
                    return (f"--data-dir {folder}: no Cora/raw/ind.cora.x there (nor in {folder / 'planetoid'})")
            if dataset in TU_DATASETS and find_tu(dataset, folder) is None:
                return (f"--data-dir {folder}: no {dataset}_A.txt for dataset {dataset} there (looked in "
                        f"{folder}, {folder / dataset}, {folder / dataset / 'raw'} and {folder / 'tu' / dataset})")
            if dataset == "mutagenesis" and not (DataCache(folder).mutagenesis_dir() / "molecule.csv").is_file():
                return f"--data-dir {folder}: no mutagenesis/molecule.csv there (nor molecule.csv)"
    return None


def valid_measurements(results: dict) -> int:
    """How many engines were timed and passed their check (or had no oracle)."""
    return sum(1 for group in results["groups"] for record in group.get("engines", [])
               if record.get("status") in ("ok", "unchecked") and record.get("stats", {}).get("step", {}).get("n"))


def _problems(results: dict) -> list[str]:
    lines = []
    for group in results["groups"]:
        if group.get("error"):
            lines.append(f"{group['key']}: task not built: {group['error']}")
        for record in group.get("engines", []):
            if record.get("status") == "failed":
                lines.append(f"{group['key']}: {record['engine']} failed: {record.get('error')}")
            elif record.get("status") == "invalid":
                lines.append(f"{group['key']}: {record['engine']} is invalid: {record['check'].get('message')}")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    from neurovec.benchmarks import report, suite

    if args.report_only:
        source = Path(args.report_only)
        results = json.loads(source.read_text())
        paths = report.write(results, Path(args.out) if args.out else source.parent, plots=not args.no_plots,
                             raw=False)
        print(f"rewrote: {', '.join(str(p) for p in paths.values())}")
        return 0

    problem = preflight(args)
    if problem is not None:
        print(f"benchmark: {problem}; nothing was run.", file=sys.stderr)
        return 2
    config = config_from_args(args)
    out = Path(args.out or Path("benchmark-results") /
               f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{args.device.replace(':', '')}")
    try:
        # results.json and results.md are rewritten after every task: a run cut short keeps what it measured
        results = suite.run(config, on_group=lambda partial: report.write(partial, out, plots=False))
    except KeyboardInterrupt:
        print(f"\nbenchmark: interrupted; the tasks finished so far are in {out}", file=sys.stderr)
        return 130
    paths = report.write(results, out, plots=not args.no_plots)
    print(report.markdown(results))
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    problems = _problems(results)
    if problems:
        print(f"benchmark: {len(problems)} problem(s):\n  " + "\n  ".join(problems), file=sys.stderr)
    if not valid_measurements(results):
        print("benchmark: no engine ran and passed its check; see results.md", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
