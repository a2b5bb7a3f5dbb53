"""Optimizer payoff on real GNNs: compile time per pass, and training-step time per preset.

    python benchmarks/optimizer_speed.py --dataset PROTEINS --models gcn gin --presets unoptimized default

For each model it prints the compile time (vectorize + every pass, with the
slowest passes), then the median training step (forward + loss + backward +
Adam step) of each preset, measured side by side in one run. Data comes from
``--data-dir`` or ``$NEUROVEC_DATA`` (TU raw files).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import neurovec
from neurovec import datasets
from neurovec.compiler import Settings, build_program
from neurovec.engines.torch_module import CompiledModule

TEMPLATES = {"gcn": datasets.gcn, "sage": datasets.sage, "gin": datasets.gin}


def train_step_times(module: torch.nn.Module, labels: torch.Tensor, repeat: int, warmup: int) -> list[float]:
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    times = []
    for k in range(warmup + repeat):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy(module().reshape(-1), labels)
        loss.backward()
        optimizer.step()
        if k >= warmup:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="PROTEINS")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--models", nargs="+", default=["gcn", "gin"], choices=sorted(TEMPLATES))
    parser.add_argument("--presets", nargs="+", default=["unoptimized", "default"])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ds = datasets.load_tu(args.dataset, args.data_dir)
    labels = torch.tensor((ds.graph_labels == ds.graph_labels.max()).astype("float32"))
    for model in args.models:
        start = time.perf_counter()
        graph = TEMPLATES[model](ds, hidden=args.hidden, layers=2, normalize=False) if model == "gcn" \
            else TEMPLATES[model](ds, hidden=args.hidden, layers=2)
        print(f"\n{args.dataset} {model.upper()}: {graph!r}; template built in {time.perf_counter() - start:.2f} s")
        medians = {}
        for preset in args.presets:
            timings: dict[str, float] = {}
            start = time.perf_counter()
            program = build_program(graph, Settings.preset(preset), timings)
            module = CompiledModule(program)
            compile_s = time.perf_counter() - start
            slowest = sorted(timings.items(), key=lambda kv: -kv[1])[:3]
            steps = train_step_times(module, labels, args.repeat, args.warmup)
            medians[preset] = statistics.median(steps)
            print(f"  {preset:<24} compile {compile_s:6.2f} s (slowest: "
                  f"{', '.join(f'{k} {v:.2f}s' for k, v in slowest)}) | train step median "
                  f"{medians[preset] * 1e3:8.2f} ms (min {min(steps) * 1e3:.2f}, max {max(steps) * 1e3:.2f}) | "
                  f"{len(program.nodes)} nodes")
        if "unoptimized" in medians:
            for preset, median in medians.items():
                if preset == "unoptimized":
                    continue
                print(f"  speed-up of {preset} over unoptimized: {medians['unoptimized'] / median:.2f}x")


if __name__ == "__main__":
    main()
