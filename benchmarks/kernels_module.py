"""PROTEINS GCN training step: neurovec's kernels vs. the same module on plain torch-scatter.

    python benchmarks/kernels_module.py [--data-dir ../shared/data/tu] [--threads 2]

Three modules, timed side by side (interleaved rounds, medians):

* ``auto``: the ``default`` preset, kernels chosen per layer (dense / fused sparse matmul / segment);
* ``segment``: every reduction forced to neurovec's segment kernels (gather backward);
* ``torch-scatter``: the *same program* as ``segment``, with each segment reduction
  replaced by ``torch_scatter.segment_csr`` and its own backward (thesis 6.4's setup).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import neurovec
from neurovec import datasets


def plain_torch_scatter(module: neurovec.compiler.pipeline.CompiledModule) -> None:
    import torch_scatter

    def segment_csr(x, ptr, seg_id, counts, aggregation):
        return torch_scatter.segment_csr(x, ptr, reduce={"sum": "sum", "mean": "mean", "max": "max",
                                                          "min": "min"}[aggregation])

    # Each compiled program has its own globals: swap the kernel in this module only.
    type(module).forward.__globals__["segment_reduce"] = segment_csr


def step(module, optimizer, target):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(module().reshape(-1), target)
    loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ds = datasets.load_tu("PROTEINS", args.data_dir)
    graph = datasets.gcn(ds, hidden=16, layers=2)
    target = torch.tensor((ds.graph_labels == ds.graph_labels.max()).astype("float32"))
    modules = {"auto": neurovec.compile(graph, "default"),
               "segment": neurovec.compile(graph, neurovec.Settings(reduce_kernel="segment")),
               "torch-scatter": neurovec.compile(graph, neurovec.Settings(reduce_kernel="segment"))}
    plain_torch_scatter(modules["torch-scatter"])
    torch.testing.assert_close(modules["torch-scatter"](), modules["segment"](), rtol=1e-5, atol=1e-6)
    optimizers = {k: torch.optim.Adam(m.parameters(), lr=1e-3) for k, m in modules.items()}
    times = {k: [] for k in modules}
    for rep in range(args.reps + 3):
        for name, module in modules.items():
            start = time.perf_counter()
            step(module, optimizers[name], target)
            if rep >= 3:
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["torch-scatter"])
    print(f"PROTEINS GCN training step, {args.threads} threads, median of {args.reps}:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<14} {median * 1e3:8.2f} ms   ({base / median:.2f}x vs torch-scatter segment_csr)")


if __name__ == "__main__":
    main()
