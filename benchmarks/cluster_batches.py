"""Cluster mini-batches against full-batch training on one large graph: epoch time and test accuracy.

    python benchmarks/cluster_batches.py                              # arxiv-like, GCN 3 x 128, 30 epochs
    python benchmarks/cluster_batches.py --dataset products-like --parts 200 --clusters-per-batch 10

Both train the same template (``datasets.gcn/sage/gin``, node level, the same seed)
with Adam on the cross-entropy of the training nodes, in neurovec
(:class:`neurovec.MiniBatchModel`):

* full batch: one compiled program of the whole graph, one step per epoch;
* cluster batches (:class:`neurovec.clusters.ClusterLoader`): the nodes partitioned
  into ``--parts`` clusters (METIS via pymetis if installed, else the numpy
  breadth-first fallback), ``--clusters-per-batch`` clusters per batch, each batch
  the induced subgraph, compiled once (the first epoch) and reused.

After every epoch both are evaluated on the whole graph (the full-batch program;
the cluster model compiles it once for that, not counted in its epochs); reported:
test accuracy at the epoch of best validation accuracy, the median epoch time from
the second epoch on, the first epoch (which compiles), and the compile time.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import neurovec
from neurovec.clusters import ClusterLoader
from neurovec.partition.partitioner import metis_available
from neurovec.datasets import gnn
from neurovec.datasets.synthetic import rmat_dataset


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="arxiv-like", choices=["arxiv-like", "products-like"])
    parser.add_argument("--model", default="gcn", choices=["gcn", "sage", "gin"])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--parts", type=int, default=40)
    parser.add_argument("--clusters-per-batch", type=int, default=4)
    parser.add_argument("--method", default="auto", choices=["auto", "metis", "bfs", "contiguous"])
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def train(model: neurovec.MiniBatchModel, batches, evaluate, ds, epochs: int, lr: float) -> dict:
    """``batches(epoch)`` -> the epoch's MiniBatches; returns epoch times and the test accuracy at best validation."""
    y = torch.as_tensor(ds.y)
    train_mask = torch.as_tensor(ds.train_mask)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    seconds, best = [], (-1.0, 0.0, -1)
    for epoch in range(epochs):
        start = time.perf_counter()
        for batch in batches(epoch):
            nodes = torch.as_tensor(batch.samples)
            mask = train_mask[nodes]
            if not bool(mask.any()):
                continue
            optimizer.zero_grad()
            F.cross_entropy(model(batch)[mask], y[nodes][mask]).backward()
            optimizer.step()
        seconds.append(time.perf_counter() - start)
        val, test = evaluate()
        if val > best[0]:
            best = (val, test, epoch)
    return {"epoch_s": statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0],
            "first_epoch_s": seconds[0], "val": best[0], "test": best[1], "best_epoch": best[2],
            "compiled": model.n_compiled}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    ds = rmat_dataset(args.dataset, seed=args.seed)
    print(f"{ds} generated in {time.perf_counter() - start:.1f} s; {args.model} {args.layers} x {args.hidden}, "
          f"{args.epochs} epochs, Adam lr {args.lr}, {args.threads} thread(s)", flush=True)
    build = functools.partial(getattr(gnn, args.model), ds, args.hidden, args.layers, subgraph="induced",
                              seed=args.seed)
    everything = np.arange(ds.n_nodes)
    y = torch.as_tensor(ds.y)
    masks = {k: torch.as_tensor(getattr(ds, f"{k}_mask")) for k in ("val", "test")}

    def evaluator(model):
        def evaluate():
            with torch.no_grad():
                out = model(model.batch(everything))
            return tuple(float((out[m].argmax(-1) == y[m]).double().mean()) for m in masks.values())
        return evaluate

    rows = {}
    full = neurovec.MiniBatchModel(build)
    start = time.perf_counter()
    whole = full.batch(everything)
    compile_s = time.perf_counter() - start
    rows["full batch"] = {**train(full, lambda e: [whole], evaluator(full), ds, args.epochs, args.lr),
                          "compile_s": compile_s, "batches": 1, "edges kept": 1.0}
    print("full batch:", rows["full batch"], flush=True)
    clustered = neurovec.MiniBatchModel(build)
    start = time.perf_counter()
    loader = ClusterLoader(clustered, ds, args.parts, args.clusters_per_batch, seed=args.seed, method=args.method)
    partition_s = time.perf_counter() - start
    start = time.perf_counter()
    list(loader)  # compile every batch once (the first epoch's work, timed apart)
    compile_s = time.perf_counter() - start
    loader.set_epoch(0)
    method = {"metis": "METIS (pymetis)", "bfs": "numpy BFS", "contiguous": "contiguous ids"}[
        "metis" if args.method == "auto" and metis_available() else "bfs" if args.method == "auto" else args.method]
    rows["cluster batches"] = {**train(clustered, lambda e: loader, evaluator(clustered), ds, args.epochs, args.lr),
                               "compile_s": compile_s, "partition_s": partition_s, "batches": len(loader),
                               "edges kept": loader.edge_share(), "partition": method}
    print("cluster batches:", rows["cluster batches"], flush=True)
    print(f"\n| training | batches | edges kept | compile s | epoch s (median, from the 2nd) | test accuracy at best "
          f"validation |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['batches']} | {100 * row['edges kept']:.0f}% | {row['compile_s']:.1f} | "
              f"{row['epoch_s']:.2f} | {100 * row['test']:.1f}% (epoch {row['best_epoch']}) |")


if __name__ == "__main__":
    main()
