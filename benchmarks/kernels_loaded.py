"""A cached training step on an idle machine and beside a competing CPU-bound process.

    python benchmarks/kernels_loaded.py --data-dir ../shared/data

Each task (``dataset/model/features``; default MUTAG GCN with one-hot labels, and PROTEINS GCN with
continuous features, where the C++ kernels split their work among threads) is compiled once under
preset ``default`` (the graph cached in the module, as PyG's cached layers) and trained with fused
Adam on the benchmark's MSE loss. One competing process spins in a ``while True`` loop;
it is stopped (``SIGSTOP``) for the idle rounds and continued (``SIGCONT``) for the loaded ones.
Idle and loaded rounds alternate (their order shuffled in each pair), every round runs each task
for ``--steps`` steps, and each cell is the median step over all its rounds. The must-show (issue
23, item 8): the loaded step within 2x of the idle one, at torch's default number of threads.

Every table is made twice, each in a fresh process: with torch's OpenMP threads waiting as torch
starts them (``OMP_WAIT_POLICY`` unset: they spin a while before they sleep) and with
``OMP_WAIT_POLICY=passive`` (they sleep at once); the variable only counts before torch is imported
(``--wait-policies`` picks). On a machine that other work already keeps busy, "idle" is only "without
our competitor": the load average printed says how busy it was. ``--threads`` sets torch's threads
(default: torch's own default).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import torch

import neurovec
from neurovec.benchmarks.tasks import DataCache, make_task

DEFAULT_TASKS = ("MUTAG/gcn/labels", "PROTEINS/gcn/continuous")


def stepper(module: torch.nn.Module, labels: torch.Tensor):
    """One training step of ``module`` (fused Adam, MSE of the sigmoid outputs as the benchmark's)."""
    optimizer = torch.optim.Adam(list(module.parameters()), lr=1e-3, fused=True)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(torch.sigmoid(module().reshape(-1)), labels)
        loss.backward()
        optimizer.step()

    return step


@contextlib.contextmanager
def competitor():
    """A CPU-bound process, stopped; yields ``load(on)`` which continues or stops it."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.kill(process.pid, signal.SIGSTOP)

    def load(on: bool) -> None:
        os.kill(process.pid, signal.SIGCONT if on else signal.SIGSTOP)
        time.sleep(0.05)  # let the scheduler see the change

    try:
        yield load
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait()


def measure(tasks: list[str], rounds: int = 10, steps: int = 20, warmup: int = 5, data_dir: str | None = None,
            preset: str = "default", seed: int = 0) -> dict[str, dict[str, float]]:
    """``{task: {"idle": median s, "loaded": median s}}`` for tasks named ``dataset/model/features``."""
    cache = DataCache(data_dir)
    steps_of = {}
    for name in tasks:
        dataset, model, features = name.split("/")
        task = make_task(cache, dataset, model, features=features)
        module = neurovec.compile(task.graph, preset)
        labels = torch.as_tensor(task.labels, dtype=torch.get_default_dtype()).reshape(-1)
        steps_of[name] = stepper(module, labels)
        for _ in range(warmup):
            steps_of[name]()
    times = {name: {"idle": [], "loaded": []} for name in tasks}
    rng = random.Random(seed)
    with competitor() as load:
        for _ in range(rounds):
            for condition in rng.sample(["idle", "loaded"], 2):
                load(condition == "loaded")
                for name in rng.sample(tasks, len(tasks)):
                    step = steps_of[name]
                    for _ in range(steps):
                        start = time.perf_counter()
                        step()
                        times[name][condition].append(time.perf_counter() - start)
    return {name: {c: statistics.median(v) for c, v in cells.items()} for name, cells in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder with the TU datasets (as benchmark.py's)")
    parser.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="dataset/model/features")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="steps per task and round")
    parser.add_argument("--wait-policies", nargs="+", default=["default", "passive"],
                        help="OMP_WAIT_POLICY of each run, in a process of its own ('default': unset)")
    parser.add_argument("--policy-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.policy_child:
        forwarded = list(argv if argv is not None else sys.argv[1:])
        for policy in args.wait_policies:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            if policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            print(f"\nOMP_WAIT_POLICY={policy if policy != 'default' else 'unset'}:", flush=True)
            subprocess.run([sys.executable, __file__, *forwarded, "--policy-child"], env=env, check=True)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    rows = measure(args.tasks, args.rounds, args.steps, data_dir=args.data_dir, preset=args.preset)
    print(f"Training step, preset {args.preset}, {torch.get_num_threads()} torch threads on {os.cpu_count()} CPUs, "
          f"median of {args.rounds} x {args.steps} steps per cell, idle and loaded rounds interleaved; "
          f"load average before: {load_before:.1f}")
    print("| task | idle (ms) | loaded (ms) | loaded / idle |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        ratio = row["loaded"] / row["idle"]
        print(f"| {name} | {row['idle'] * 1e3:.3f} | {row['loaded'] * 1e3:.3f} | {ratio:.2f}x "
              f"({'within' if ratio <= 2 else 'NOT within'} 2x) |")


if __name__ == "__main__":
    main()
