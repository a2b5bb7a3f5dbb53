"""Data-parallel epochs with 1 and 2 ranks, side by side: neurovec.distributed under torchrun.

    python benchmarks/distributed.py                                  # PROTEINS GCN, full batch and 128
    python benchmarks/distributed.py --model gin --batch-sizes 0 256 --rounds 3

Each configuration (ranks x torch threads per rank) is a real ``torchrun
--standalone`` launch of ``examples/train_distributed.py`` (gloo on CPU), run in
turn, round after round, so load on the machine hits all alike. Per launch: the
first epoch (which compiles every rank's shard) and the median of the later
epochs, the slowest rank counting (a step waits for all ranks), and every rank's
peak resident memory (``ru_maxrss``: the whole process, torch included). The
table shows medians over rounds. ``--batch-sizes 0`` means full batch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/distributed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="PROTEINS")
    parser.add_argument("--model", default="gcn", choices=["gcn", "sage", "gin"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[0, 128], help="0: full batch")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=["1x1", "1x2", "2x1"],
                        help="RANKSxTHREADS per launch (default: 1x1 1x2 2x1)")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--data-dir", default="../shared/data/tu")
    return parser.parse_args(argv)


def launch(args, ranks: int, threads: int, batch_size: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
               str(ROOT / "examples" / "train_distributed.py"), "--dataset", args.dataset, "--model", args.model,
               "--epochs", str(args.epochs), "--hidden", str(args.hidden), "--layers", str(args.layers),
               "--threads", str(threads), "--data-dir", args.data_dir, "--out", str(out)]
    if batch_size:
        command += ["--batch-size", str(batch_size)]
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stdout}\n{run.stderr}")
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    epochs = list(zip(*(r["epoch_seconds"] for r in records)))  # per epoch, every rank's time
    return {"first": max(epochs[0]), "epoch": statistics.median(max(e) for e in epochs[1:]),
            "peak_mb": [r["peak_mb"] for r in records], "programs": [r["programs"] for r in records]}


def main(argv=None) -> None:
    args = parse_args(argv)
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs]
    print(f"{args.dataset} {args.model}, {args.layers} layers x {args.hidden}, float32, Adam, gloo on CPU; "
          f"median over {args.rounds} rounds of {args.epochs} epochs (first epoch compiles)")
    print("| batch | ranks x threads | epoch s | first epoch s | speed-up vs 1x1 | peak RSS per rank (MB) | "
          "programs per rank |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for batch_size in args.batch_sizes:
            results = {c: [] for c in configs}
            for r in range(args.rounds):
                for ranks, threads in configs:
                    out = Path(scratch) / f"b{batch_size}-{ranks}x{threads}-{r}"
                    results[(ranks, threads)].append(launch(args, ranks, threads, batch_size, out))
            base = statistics.median(x["epoch"] for x in results[configs[0]])
            for (ranks, threads), runs in results.items():
                epoch = statistics.median(x["epoch"] for x in runs)
                first = statistics.median(x["first"] for x in runs)
                peaks = [statistics.median(x["peak_mb"][k] for x in runs) for k in range(ranks)]
                print(f"| {batch_size or 'full'} | {ranks} x {threads} | {epoch:.3f} | {first:.2f} | "
                      f"{base / epoch:.2f}x | {', '.join(f'{p:.0f}' for p in peaks)} | "
                      f"{', '.join(map(str, runs[-1]['programs']))} |", flush=True)


if __name__ == "__main__":
    main()
