"""neurovec's benchmark: compiled modules against PyTorch Geometric and NeuraLogic, reproducibly.

    python benchmark.py                                   # quick: MUTAG, GCN/SAGE/GIN, 3 presets vs PyG
    python benchmark.py --datasets MUTAG ENZYMES PROTEINS mutagenesis --engines all pyg neuralogic
    python benchmark.py --datasets PROTEINS --models gcn --engines default pyg --scale 1 10
    python benchmark.py --device cuda --dtype float64 --reps 50

For every dataset x model (x scale) every engine is built (compile time), its
outputs and gradients are checked against an oracle (the PyG twin, the reference
engine, or NeuraLogic itself), then its training iterations are timed: forward,
backward, training step (forward + loss + backward + Adam step), with CUDA
synchronisation, interleaved with the other engines; and its peak memory is
recorded. An engine that fails the check is timed but marked invalid.

Results go to ``--out`` (default ``benchmark-results/<date>-<device>``):
``results.json`` (every raw measurement and the machine), ``results.md`` (ratios
against PyG and NeuraLogic, one table per task) and PNG plots. See
``docs/benchmarks.md``.

Data: ``--data-dir`` or ``$NEUROVEC_DATA`` (TU folders, ``mutagenesis/`` CSVs);
otherwise TU datasets come from, or are downloaded to, ``~/.cache/neurovec/tu``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

__all__ = ["main", "parse_args", "config_from_args"]


def parse_args(argv=None) -> argparse.Namespace:
    from neurovec.benchmarks.suite import SPECIAL_ENGINES
    from neurovec.benchmarks.tasks import DATASETS, MODELS
    from neurovec.compiler import list_presets

    parser = argparse.ArgumentParser(
        prog="python benchmark.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="engines: a preset name, 'all' (every preset), " + ", ".join(SPECIAL_ENGINES)
               + "\npresets: " + " ".join(list_presets()))
    what = parser.add_argument_group("what to compare")
    what.add_argument("--datasets", nargs="+", default=["MUTAG"], choices=DATASETS, metavar="NAME",
                      help=f"datasets: {', '.join(DATASETS)} (default: MUTAG)")
    what.add_argument("--models", nargs="+", default=None, choices=MODELS, metavar="NAME",
                      help=f"models: {', '.join(MODELS)} (default: every model that applies to each dataset: "
                           "gcn sage gin for TU, simple dims for mutagenesis)")
    what.add_argument("--engines", nargs="+", default=["unoptimized", "default", "upward-05-rel-0.5", "pyg"], metavar="NAME",
                      help="neurovec presets by name, 'all', 'autotune', 'pyg', 'neuralogic', 'reference' "
                           "(default: unoptimized default upward-05-rel-0.5 pyg)")
    what.add_argument("--scale", nargs="+", type=int, default=[1], metavar="K",
                      help="replicate each dataset K times in one batch, e.g. --scale 1 10 100 (default: 1)")
    what.add_argument("--scale-mode", default="distinct", choices=["distinct", "identical"],
                      help="TU copies get slightly different node features (default) so no pass can merge "
                           "them, or stay identical")
    how = parser.add_argument_group("how to measure")
    how.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    how.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    how.add_argument("--warmup", type=int, default=3, help="untimed iterations per engine (default: 3)")
    how.add_argument("--reps", type=int, default=10, help="timed iterations per engine (default: 10)")
    how.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    how.add_argument("--schedule", default="interleaved", choices=["interleaved", "sequential"],
                     help="interleave the engines' timed iterations (default) or time one engine after another")
    how.add_argument("--neuralogic-warmup", type=int, default=5,
                     help="at least this many warm-up epochs for NeuraLogic (JIT; default: 5)")
    how.add_argument("--reference-max-neurons", type=int, default=20_000,
                     help="skip the reference engine on larger graphs (default: 20000)")
    how.add_argument("--autotune-budget", type=float, default=60.0, help="seconds for neurovec.autotune")
    model = parser.add_argument_group("model sizes")
    model.add_argument("--hidden", type=int, default=16, help="GNN width (default: 16)")
    model.add_argument("--layers", type=int, default=2, help="GNN convolutions (default: 2)")
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
    for name in ("warmup", "reps", "hidden", "layers", "dim", "bond_dim"):
        if getattr(args, name) < (1 if name != "warmup" else 0):
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

    return Config(datasets=tuple(args.datasets), models=tuple(args.models) if args.models else None,
                  engines=tuple(args.engines), device=args.device, dtype=args.dtype, warmup=args.warmup,
                  reps=args.reps, threads=args.threads, scales=tuple(args.scale), scale_mode=args.scale_mode,
                  data_dir=args.data_dir,
                  options=ModelOptions(args.hidden, args.layers, args.dim, args.bond_dim),
                  reference_max_neurons=args.reference_max_neurons, autotune_budget_s=args.autotune_budget,
                  neuralogic_warmup=args.neuralogic_warmup, schedule=args.schedule, progress=not args.quiet)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from neurovec.benchmarks import report, suite

    if args.report_only:
        source = Path(args.report_only)
        results = json.loads(source.read_text())
        paths = report.write(results, Path(args.out) if args.out else source.parent, plots=not args.no_plots,
                             raw=False)
        print(f"rewrote: {', '.join(str(p) for p in paths.values())}")
        return 0

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"benchmark: --device {args.device} asked for, but CUDA is not available here "
              "(torch.cuda.is_available() is False); nothing was run. Use --device cpu.", file=sys.stderr)
        return 0
    config = config_from_args(args)
    results = suite.run(config)
    out = Path(args.out or Path("benchmark-results") /
               f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{args.device.replace(':', '')}")
    paths = report.write(results, out, plots=not args.no_plots)
    print(report.markdown(results))
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
