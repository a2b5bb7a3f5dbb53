"""One node task's full-batch training step, timed alone: for A/B runs of two checkouts.

    python benchmarks/node_step.py sage                        # arxiv-like, 1 and 2 threads
    python benchmarks/node_step.py gcn --threads 1 --profile   # and a torch.profiler table
    python benchmarks/node_step.py sage --print-code           # the generated forward

It compiles the ``default`` preset of the node-level template (3 layers x 128 on the synthetic
shapes, no dropout, float32, as ``benchmark.py node``) with the ``neurovec`` that Python imports,
then times ``steps`` Adam steps on the cross-entropy of the training nodes per thread count,
after two warm-up steps, and prints one ``RESULT {json}`` line: the median wall and CPU
milliseconds and minor page faults of a step (CPU: the process's user and system time, page faults included; on a
loaded machine the CPU time is the steadier of the two). For an A/B, run it alternately under
each checkout (``PYTHONPATH`` pointing at each) and compare the medians' ratios;
``benchmark.py node`` is the benchmark against PyG.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import this checkout as the package neurovec
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import neurovec  # noqa: E402
from neurovec import datasets  # noqa: E402
from neurovec.datasets.synthetic import SHAPES, rmat_dataset  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["gcn", "sage", "gin"])
    parser.add_argument("--shape", default="arxiv-like", help="a synthetic shape (default: arxiv-like)")
    parser.add_argument("--fraction", type=float, default=1.0, help="of the shape's nodes and edges")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default: 1,2)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per thread count (default: 8)")
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table of 3 steps, 1 thread")
    parser.add_argument("--print-code", action="store_true", help="print the generated forward")
    args = parser.parse_args(argv)

    if args.fraction == 1.0:
        ds = rmat_dataset(args.shape, seed=0)
    else:
        nodes, edges = SHAPES[args.shape][:2]
        ds = rmat_dataset(args.shape, nodes=int(nodes * args.fraction), edges=int(edges * args.fraction), seed=0)
    graph = getattr(datasets, args.model)(ds, hidden=128, layers=3, dropout=0.0)
    start = time.perf_counter()
    module = neurovec.compile(graph)
    result = {"model": args.model, "shape": args.shape, "fraction": args.fraction,
              "neurovec": str(Path(neurovec.__file__).resolve().parent), "compile_s": time.perf_counter() - start}
    if args.print_code:
        print(module.code)
    y = torch.as_tensor(ds.y)
    train = torch.as_tensor(np.flatnonzero(ds.train_mask))
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module()[train], y[train]).backward()
        optimizer.step()

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        step(), step()
        wall, cpu, faults = [], [], []
        for _ in range(args.steps):
            w, c, f = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step()
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
        result[f"wall_ms_{threads}"] = statistics.median(wall) * 1e3
        result[f"cpu_ms_{threads}"] = statistics.median(cpu) * 1e3
        result[f"faults_{threads}"] = statistics.median(faults)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        torch.set_num_threads(1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(3):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=30))
    print("RESULT", json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
