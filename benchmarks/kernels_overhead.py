"""Where a small graph's training step goes: zero_grad, forward, loss, backward, optimizer.

    python benchmarks/kernels_overhead.py --data-dir ../shared/data --threads 1
    python benchmarks/kernels_overhead.py --dataset PROTEINS --tasks gcn/continuous --preset default

MUTAG's steps take well under a millisecond and are mostly per-call overhead (a
torch op with autograd costs a few µs before it computes anything), so this
script splits the step the benchmark times (fused Adam, MSE on the outputs, as
``benchmarks/contenders.py``) into its phases and also times a forward under
``torch.no_grad()``: forward minus no-grad forward is what recording the autograd
graph costs. The tasks are timed *interleaved*, step by step in shuffled order, and
each phase is reported as the median over ``--reps`` steps, in µs, next to the
generated forward's number of statements and reductions (``gather_sum`` / ``segment_reduce`` calls,
C++ operators with their autograd in C++ where they are built, see NOTE: [Operators in C++] in
``engines/ops.py``).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import neurovec
from neurovec.benchmarks.tasks import DataCache, make_task

PHASES = ("zero_grad", "forward", "loss", "backward", "optimizer", "step", "no-grad forward")


def _stepper(module: torch.nn.Module, labels: torch.Tensor):
    optimizer = torch.optim.Adam(list(module.parameters()), lr=1e-3, fused=True)

    def step() -> tuple[float, ...]:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        out = module()
        t2 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(out.reshape(-1), labels)
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        optimizer.step()
        t5 = time.perf_counter()
        with torch.no_grad():
            module()
        t6 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0, t6 - t5

    return step


def measure(dataset: str, tasks: list[str], preset: str = "default", reps: int = 300, warmup: int = 20,
            data_dir: str | None = None, seed: int = 0) -> dict[str, dict]:
    """``{task: {"statements": n, "reductions": n, phase: median µs, ...}}`` for tasks named
    ``model/features``: the generated forward's statements and reduction calls, and each phase's median."""
    cache = DataCache(data_dir)
    steps, rows = {}, {}
    for name in tasks:
        model, features = name.split("/")
        task = make_task(cache, dataset, model, features=features)
        module = neurovec.compile(task.graph, preset)
        labels = torch.as_tensor(task.labels, dtype=torch.get_default_dtype()).reshape(-1)
        steps[name] = _stepper(module, labels)
        code = module.code
        statements = [line for line in code.splitlines()[1:] if " = " in line
                      and not line.strip().startswith(("w = ", "inputs = "))]  # not the prologue
        rows[name] = {"statements": len(statements),
                      "reductions": code.count("gather_sum(") + code.count("segment_reduce(")}
    times: dict[str, list[tuple[float, ...]]] = {name: [] for name in steps}
    order = list(steps)
    rng = random.Random(seed)
    for k in range(warmup + reps):
        rng.shuffle(order)  # no task always runs right after the same one
        for name in order:
            laps = steps[name]()
            if k >= warmup:
                times[name].append(laps)
    for name, laps in times.items():
        for i, phase in enumerate(PHASES):
            rows[name][phase] = statistics.median(lap[i] for lap in laps) * 1e6
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder with the TU datasets (as benchmark.py's)")
    parser.add_argument("--dataset", default="MUTAG")
    parser.add_argument("--tasks", nargs="+", default=["sage/labels", "gcn/labels", "gin/continuous"],
                        help="model/features pairs")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.dataset, args.tasks, args.preset, args.reps, data_dir=args.data_dir)
    print(f"{args.dataset}, preset {args.preset}, {args.threads} thread(s), median of {args.reps} interleaved "
          "steps, µs (fused Adam, MSE):")
    print(f"| task | statements | reductions | {' | '.join(PHASES)} |")
    print("|---|" + "---|" * (len(PHASES) + 2))
    for name, row in rows.items():
        print(f"| {args.dataset}/{name} | {row['statements']} | {row['reductions']} | "
              + " | ".join(f"{row[phase]:.0f}" for phase in PHASES) + " |")


if __name__ == "__main__":
    main()
