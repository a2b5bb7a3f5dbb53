"""Cora node classification as Kipf & Welling (2017) train it, in neurovec and in its PyG twin, identically.

    python examples/train_planetoid.py                        # GCN, 2 layers x 16, 10 seeds
    python examples/train_planetoid.py --model sage --seeds 3
    python examples/train_planetoid.py --data-dir ../shared/data/planetoid

For every seed: the template's weights (``seed``) go into the PyG twin; both train
full-batch for 200 epochs with Adam (lr 0.01, weight decay 5e-4 on the first
layer, as Kipf's code and PyG's example do), dropout 0.5 on the input features
and between the layers, features row-normalised (PyG's ``NormalizeFeatures``),
the public split. The dropout masks are drawn by neurovec (``neurovec.dropout``)
and handed to the twin, so both compute the same function step for step. Reported:
test accuracy at the epoch of best validation accuracy (PyG's example does so),
mean +- std over the seeds, and each framework's wall time (neurovec's includes
compiling). Everything runs in float64 (``--dtype float32`` for speed), so the two
agree to printing precision.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from neurovec import dropout
from neurovec.datasets import gnn, pyg_twins
from neurovec.datasets.planetoid import load_planetoid, normalize_features


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="Cora", help="Cora, CiteSeer or PubMed (default: Cora)")
    parser.add_argument("--model", default="gcn", choices=["gcn", "sage", "gin"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--raw-features", action="store_true", help="do not row-normalise the features")
    parser.add_argument("--data-dir", default=None, help="Planetoid folder (default: $NEUROVEC_DATA, else the cache)")
    return parser.parse_args(argv)


def optimizer(params: dict, lr: float, weight_decay: float) -> torch.optim.Adam:
    """Adam with weight decay on the first convolution's weights only (Kipf's setting)."""
    first = [p for name, p in params.items() if name.startswith("conv1.")]
    rest = [p for name, p in params.items() if not name.startswith("conv1.")]
    return torch.optim.Adam([{"params": first, "weight_decay": weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=lr)


def accuracy(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((out[mask].argmax(-1) == y[mask]).double().mean())


def run_seed(ds, args, seed: int, dtype: torch.dtype) -> dict:
    options = dict(hidden=args.hidden, layers=args.layers, dropout=args.dropout, input_dropout=args.dropout)
    template = getattr(gnn, args.model)
    start = time.perf_counter()
    model = dropout.compile(template(ds, seed=seed, **options), dtype=dtype, seed=seed)
    compile_s = time.perf_counter() - start
    twin = pyg_twins.make_twin(gnn.GNNSpec.create(args.model, ds, **options)).to(dtype)
    pyg_twins.copy_weights(model.module, twin)
    x, edge_index = pyg_twins.pyg_node_data(ds, dtype)
    y = torch.as_tensor(ds.y)
    masks = {name: torch.as_tensor(getattr(ds, f"{name}_mask")) for name in ("train", "val", "test")}
    ours = optimizer(dict(model.module.weights.named_parameters()), args.lr, args.weight_decay)
    theirs = optimizer(dict(twin.named_parameters()), args.lr, args.weight_decay)
    seconds = {"neurovec": compile_s, "pyg": 0.0}
    best = {"neurovec": (-1.0, 0.0), "pyg": (-1.0, 0.0)}
    for _ in range(args.epochs):
        start = time.perf_counter()
        model.train()
        ours.zero_grad()
        F.cross_entropy(model()[masks["train"]], y[masks["train"]]).backward()
        ours.step()
        model.eval()
        with torch.no_grad():
            out = model()
        seconds["neurovec"] += time.perf_counter() - start
        drawn = model.last_masks  # the twin steps with the very masks neurovec drew
        start = time.perf_counter()
        twin.train()
        theirs.zero_grad()
        F.cross_entropy(twin(x, edge_index, drawn)[masks["train"]], y[masks["train"]]).backward()
        theirs.step()
        twin.eval()
        with torch.no_grad():
            twin_out = twin(x, edge_index)
        seconds["pyg"] += time.perf_counter() - start
        for name, result in (("neurovec", out), ("pyg", twin_out)):
            val, test = accuracy(result, y, masks["val"]), accuracy(result, y, masks["test"])
            if val > best[name][0]:
                best[name] = (val, test)
    return {"test": {k: v[1] for k, v in best.items()}, "seconds": seconds, "compile_s": compile_s}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    ds = load_planetoid(args.dataset, args.data_dir or os.environ.get("NEUROVEC_DATA"))
    if not args.raw_features:
        ds = dataclasses.replace(ds, x=normalize_features(ds.x))
    print(f"{ds}; {args.model}, {args.layers} layers x {args.hidden}, dropout {args.dropout}, "
          f"{args.epochs} epochs, {args.dtype}, {args.threads} thread(s)")
    results = []
    for seed in range(args.seeds):
        result = run_seed(ds, args, seed, dtype)
        results.append(result)
        print(f"seed {seed}: test accuracy neurovec {100 * result['test']['neurovec']:.1f}%, "
              f"PyG {100 * result['test']['pyg']:.1f}%; seconds neurovec {result['seconds']['neurovec']:.2f} "
              f"(compile {result['compile_s']:.2f}), PyG {result['seconds']['pyg']:.2f}", flush=True)
    print("\n| framework | test accuracy, mean +- std over %d seeds | wall time per run, s |" % args.seeds)
    print("|---|---|---|")
    for name, label in (("neurovec", "neurovec"), ("pyg", "PyG twin")):
        accuracies = 100 * np.array([r["test"][name] for r in results])
        seconds = np.array([r["seconds"][name] for r in results])
        print(f"| {label} | {accuracies.mean():.1f} +- {accuracies.std():.1f} | {seconds.mean():.2f} |")
    same = sum(r["test"]["neurovec"] == r["test"]["pyg"] for r in results)
    print(f"\nseeds with the same test accuracy: {same}/{len(results)}")


if __name__ == "__main__":
    main()
