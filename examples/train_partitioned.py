"""Full-graph node classification with one graph split across processes; launch with torchrun.

    torchrun --standalone --nproc_per_node 2 examples/train_partitioned.py --dataset cora --model gcn
    torchrun --standalone --nproc_per_node 4 examples/train_partitioned.py --dataset arxiv-like --hidden 128 --layers 3

Every rank owns a part of the nodes (METIS through pymetis where installed, else
BFS blocks; ``--partition``), builds and compiles only its nodes' neurons
(neurovec.partition), and exchanges the halo rows other ranks read before every
layer that reads them (gloo on CPU, nccl on CUDA). Weights are replicated and
their gradients summed over ranks; the loss is the mean cross-entropy over the
training nodes of all ranks, so training equals one process's full-graph training.

Datasets: ``cora`` (Planetoid's public split, ``--data-dir``), ``arxiv-like`` and
``products-like`` (synthetic R-MAT graphs, ``neurovec.datasets.synthetic``), and
``toy`` (a small random graph with self loops, repeated edges and isolated nodes,
for tests), or ``npz:FILE``, your own graph as arrays (``np.savez(FILE, x=..., edge_index=...,
y=..., train_mask=...)``). ``--whole`` trains the whole graph in one process without
partitioning (plain ``neurovec.compile``; no torchrun needed), the baseline the
benchmark compares with. For several machines, run the same command on each with
``--nnodes N --node_rank K --rdzv_endpoint HOST:PORT`` (and ``--rdzv_backend c10d``)
instead of ``--standalone``. ``--shards DIR`` (written once by ``partition.write_shards``)
has each rank load only its share of the graph, as a run across machines would.

``--out DIR`` writes per rank ``rank<r>.json`` (plan, compile and epoch times, peak
memory, halo rows, bytes exchanged per step, the partition's quality) and
``outputs<r>.pt`` (the final outputs and their node ids), and rank 0's final
weights ``weights.pt`` (a dict per model and preset with ``--models``/``--presets``)
and the partition ``parts.npy``;
``benchmarks/partitioned.py`` and ``tests/test_distributed_partitioned.py`` read them.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import neurovec
from neurovec import distributed, partition


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="torchrun ... examples/train_partitioned.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora", help="cora, arxiv-like, products-like, toy, or npz:FILE "
                                                           "(arrays x, edge_index, y, train_mask from np.savez)")
    parser.add_argument("--models", nargs="+", default=["gcn"], choices=list(partition.gnn.KINDS))
    parser.add_argument("--presets", nargs="+", default=["default"], help="compile presets (default: default)")
    parser.add_argument("--settings", default=None,
                        help='settings over each preset, as JSON: \'{"fold_constants": false}\'')
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2, help="convolutions; the last maps to the classes")
    parser.add_argument("--epochs", type=int, default=5, help="full-graph Adam steps")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: 1)")
    parser.add_argument("--partition", default="auto", choices=list(partition.METHODS))
    parser.add_argument("--parts", default=None, help="a .npy file of one rank per node (made beforehand)")
    parser.add_argument("--shards", default=None, help="a folder of shards (partition.write_shards): each rank "
                                                       "loads only its edges and feature rows; replaces --dataset")
    parser.add_argument("--data-dir", default="../shared/data/planetoid")
    parser.add_argument("--whole", action="store_true", help="one process, the whole graph, no partition")
    parser.add_argument("--out", default=None, help="folder for rank<r>.json, outputs<r>.pt and weights.pt")
    return parser.parse_args(argv)


def toy_dataset(seed: int = 0, n: int = 60, classes: int = 3) -> dict:
    """A small random graph with self loops, a repeated edge and isolated nodes (nothing in or out)."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - 4, (2, 4 * n))
    src = np.concatenate([src, [5, 6, 6, 2]])
    dst = np.concatenate([dst, [5, 6, 7, 7]])  # self loops 5->5, 6->6; 6->7 listed with 2->7
    edge_index = np.stack([src, dst])          # nodes n-4 .. n-1 are isolated
    x = rng.standard_normal((n, 8))
    y = rng.integers(0, classes, n)
    train = rng.random(n) < 0.5
    return {"name": "toy", "x": x, "edge_index": edge_index, "y": y, "train_mask": train, "num_classes": classes}


def load_dataset(name: str, data_dir: str, seed: int) -> dict:
    if name == "toy":
        return toy_dataset(seed)
    if name.startswith("npz:"):  # arrays saved with np.savez: x, edge_index, y, train_mask (and num_classes)
        with np.load(name[4:]) as arrays:
            data = {key: arrays[key] for key in ("x", "edge_index", "y", "train_mask")}
            data["num_classes"] = int(arrays["num_classes"]) if "num_classes" in arrays else int(data["y"].max()) + 1
        data["name"] = Path(name[4:]).stem
        return data
    if name == "cora":
        from neurovec.datasets.planetoid import load_planetoid
        ds = load_planetoid("Cora", data_dir=data_dir)
    else:
        from neurovec.datasets.synthetic import rmat_dataset
        ds = rmat_dataset(name, seed=seed)
    return {"name": ds.name, "x": ds.x, "edge_index": ds.edge_index, "y": ds.y, "train_mask": ds.train_mask,
            "num_classes": ds.num_classes}


def settings_of(args, preset: str) -> neurovec.Settings:
    return neurovec.Settings.preset(preset, **(json.loads(args.settings) if args.settings else {}))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def node_parts(args, data: dict, ctx) -> np.ndarray:
    """The partition: read from --parts, else made on rank 0 and broadcast (one deterministic answer)."""
    n = data["x"].shape[0]
    if args.parts:
        return partition.check_parts(np.load(args.parts), n, ctx.world_size, where=f"--parts {args.parts}")
    parts = torch.zeros(n, dtype=torch.int64)
    if ctx.rank == 0:
        parts = torch.from_numpy(partition.partition_nodes(data["edge_index"], n, ctx.world_size, args.partition,
                                                           args.seed))
    dist.broadcast(parts, src=0)
    return parts.numpy()


def train_one(args, data, parts, kind: str, preset: str, ctx, dtype) -> dict:
    widths = (args.hidden,) * (args.layers - 1) + (int(data["num_classes"]),)
    start = time.perf_counter()
    shard = data.get("shard")
    if shard is None:
        source = partition.NodeGNN(kind, data["x"], data["edge_index"], widths, seed=args.seed)
    else:  # this rank's share only: its edges and the feature rows it reads
        source = partition.NodeGNN(kind, shard.x, shard.edge_index, widths, seed=args.seed, x_ids=shard.x_ids,
                                   n_nodes=shard.n_nodes, cut=shard.cut)
    built = time.perf_counter() - start
    rank_module = partition.compile_rank(source, parts, ctx.rank, ctx.world_size, settings_of(args, preset), dtype)
    del source
    model = partition.PartitionedModule(rank_module)
    if ctx.device.type != "cpu":
        model.to(ctx.device)
    after_compile_mb = current_mb()
    ids = torch.from_numpy(model.output_ids).to(ctx.device)
    if shard is None:
        labels = torch.as_tensor(data["y"], device=ctx.device)[ids]
        train = torch.as_tensor(data["train_mask"], device=ctx.device)[ids]
    else:  # a shard's labels are its own nodes', which are this rank's outputs, in order
        assert np.array_equal(shard.nodes, model.output_ids)
        labels = torch.as_tensor(shard.y, device=ctx.device)
        train = torch.as_tensor(shard.train_mask, device=ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    epoch_seconds, losses, step_bytes = [], [], []
    for _ in range(args.epochs):
        model.counter.reset()
        start = time.perf_counter()
        out = model()
        loss = partition.mean_loss(F.cross_entropy(out[train], labels[train], reduction="none"))
        optimizer.zero_grad()
        loss.backward()
        model.all_reduce_gradients()
        optimizer.step()
        epoch_seconds.append(time.perf_counter() - start)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        step_bytes.append([model.counter.forward_bytes, model.counter.backward_bytes])
    with torch.no_grad():
        final = model()
    sent, received = rank_module.exchanged_values()
    return {"model": kind, "preset": preset, "build_seconds": built, "plan_seconds": rank_module.timings["plan"],
            "compile_seconds": rank_module.timings["compile"], "epoch_seconds": epoch_seconds, "losses": losses,
            "step_bytes": step_bytes, "values_sent": sent, "values_received": received,
            "halo_rows": {x.name: int(x.recv_rows.size) for x in rank_module.exchanges},
            "owned_outputs": int(ids.numel()), "after_compile_mb": after_compile_mb,
            "outputs": final.cpu(), "output_ids": ids.cpu(),
            "state": {k: v.cpu() for k, v in model.weights.state_dict().items()}}


def train_whole(args, data, kind: str, preset: str, dtype) -> dict:
    """The baseline: the whole graph compiled and trained in this process (plain neurovec.compile)."""
    widths = (args.hidden,) * (args.layers - 1) + (int(data["num_classes"]),)
    start = time.perf_counter()
    graph = partition.NodeGNN(kind, data["x"], data["edge_index"], widths, seed=args.seed).graph()
    built = time.perf_counter() - start
    start = time.perf_counter()
    module = neurovec.compile(graph, settings_of(args, preset), dtype)
    compiled = time.perf_counter() - start
    del graph
    after_compile_mb = current_mb()
    labels, train = torch.as_tensor(data["y"]), torch.as_tensor(data["train_mask"])
    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr)
    epoch_seconds, losses = [], []
    for _ in range(args.epochs):
        start = time.perf_counter()
        loss = F.cross_entropy(module()[train], labels[train])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        epoch_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    with torch.no_grad():
        final = module()
    return {"model": kind, "preset": preset, "build_seconds": built, "plan_seconds": 0.0, "compile_seconds": compiled,
            "epoch_seconds": epoch_seconds, "losses": losses, "step_bytes": [[0, 0]] * args.epochs,
            "values_sent": 0, "values_received": 0, "halo_rows": {}, "owned_outputs": int(final.shape[0]),
            "after_compile_mb": after_compile_mb, "outputs": final, "output_ids": torch.arange(final.shape[0]),
            "state": dict(module.weights.state_dict())}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    neurovec.set_progress(False)
    ctx = distributed.Context(0, 1, torch.device("cpu"), "none") if args.whole else distributed.init()
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    if args.shards:  # this rank's share, written beforehand by partition.write_shards
        shard = partition.load_shard(args.shards, ctx.rank, ctx.world_size)
        data = {"name": Path(args.shards).name, "shard": shard, "num_classes": shard.num_classes}
        parts, quality = shard.parts, shard.quality
        size = f"{shard.n_nodes:,} nodes, this rank's shard {shard.edge_index.shape[1]:,} edges"
    else:
        data = load_dataset(args.dataset, args.data_dir, args.seed)
        parts = np.zeros(data["x"].shape[0], np.int64) if args.whole else node_parts(args, data, ctx)
        quality = partition.partition_quality(data["edge_index"], parts, ctx.world_size, args.partition).as_dict()
        size = f"{data['x'].shape[0]:,} nodes, {data['edge_index'].shape[1]:,} edges"
    load_seconds = time.perf_counter() - start
    loaded_mb = current_mb()
    if ctx.rank == 0:
        print(f"{data['name']}: {size}; "
              f"{'whole graph, one process' if args.whole else partition.PartitionQuality.from_dict(quality)}",
              flush=True)
    runs = []
    for kind in args.models:
        for preset in args.presets:
            if args.whole:
                run = train_whole(args, data, kind, preset, dtype)
            else:
                run = train_one(args, data, parts, kind, preset, ctx, dtype)
            runs.append(run)
            if ctx.rank == 0:
                print(f"{kind} {preset}: compile {run['compile_seconds']:.2f} s (rank 0), loss "
                      f"{run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}, "
                      f"step {np.median(run['epoch_seconds']):.4f} s",
                      flush=True)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend, "dataset": data["name"],
                  "whole": args.whole,
                  "load_seconds": load_seconds, "loaded_mb": loaded_mb, "peak_mb": peak_mb(),
                  "quality": quality, "owned_nodes": int(np.sum(parts == ctx.rank)),
                  "runs": [{k: v for k, v in run.items() if k not in ("outputs", "output_ids", "state")}
                           for run in runs]}
        (folder / f"rank{ctx.rank}.json").write_text(json.dumps(record))
        torch.save({(r["model"], r["preset"]): (r["output_ids"], r["outputs"]) for r in runs},
                   folder / f"outputs{ctx.rank}.pt")
        if ctx.rank == 0:
            torch.save({(r["model"], r["preset"]): r["state"] for r in runs}, folder / "weights.pt")
            np.save(folder / "parts.npy", parts)
    if not args.whole:
        dist.barrier()  # not destroy_process_group: with gloo it hung now and then (examples/train_distributed.py)


if __name__ == "__main__":
    main()
    # Leave without interpreter and C++ static teardown (as examples/train_distributed.py does): with
    # gloo a rank's teardown aborted now and then after all its work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
