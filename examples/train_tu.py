"""10-fold cross-validation on TU datasets: neurovec and its PyG twin, trained identically.

    python examples/train_tu.py                                   # MUTAG and PROTEINS x GCN, SAGE, GIN
    python examples/train_tu.py --datasets MUTAG --models gin --folds 10 --epochs 50

The TU folders are found in ``--data-dir`` or ``$NEUROVEC_DATA`` (holding ``MUTAG/`` or ``tu/MUTAG/``), then
the cache; nothing is downloaded unless ``--download`` is given.

For every fold (stratified, seeded): a validation split is held out of the
training folds; a neurovec :class:`~neurovec.MiniBatchModel` and the PyG twin
(:mod:`neurovec.datasets.pyg_twins`) start from the same initial weights, train with
Adam on the same mini-batches (the neurovec :class:`~neurovec.SampleLoader`'s,
fed to PyG's ``DataLoader`` as its ``batch_sampler``) in the same order, and stop
early on validation accuracy. Each keeps a checkpoint of its best epoch on disk,
reloads it into a fresh model and scores the test fold. Everything is float64, so
the two make the same decisions and the accuracies agree fold for fold: the
models are equal.

Prints accuracy mean +- std over the folds and the wall time of each framework
(training, evaluation and neurovec's compiles included; the two alternate epoch by
epoch, so load on the machine hits both alike). ``docs/training.md`` has a run.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import neurovec
from neurovec import datasets
from neurovec.datasets import pyg_twins

TEMPLATES = {"gcn": (datasets.gcn, pyg_twins.gcn_twin), "sage": (datasets.sage, pyg_twins.sage_twin),
             "gin": (datasets.gin, pyg_twins.gin_twin)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python examples/train_tu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["MUTAG", "PROTEINS"], metavar="NAME")
    parser.add_argument("--models", nargs="+", default=list(TEMPLATES), choices=list(TEMPLATES))
    parser.add_argument("--folds", type=int, default=10, help="cross-validation folds (default: 10)")
    parser.add_argument("--epochs", type=int, default=100, help="at most this many epochs (default: 100)")
    parser.add_argument("--patience", type=int, default=20,
                        help="stop after this many epochs without a better validation accuracy (default: 20)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--data-dir", default=None,
                        help="the folder holding NAME/ or tu/NAME/ (default: $NEUROVEC_DATA, then the cache)")
    parser.add_argument("--download", action="store_true",
                        help="download a dataset found neither there nor in the cache (default: never)")
    parser.add_argument("--checkpoints", default=None, help="where to keep checkpoints (default: a temp folder)")
    return parser.parse_args(argv)


# -- splits ------------------------------------------------------------------------------------------

def stratified_folds(labels: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """``k`` disjoint test folds with the class proportions of ``labels`` (seeded)."""
    rng = np.random.default_rng(seed)
    fold_of = np.empty(labels.size, np.int64)
    offset = 0
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        fold_of[members] = (offset + np.arange(members.size)) % k   # deal out round-robin
        offset += members.size
    return [np.flatnonzero(fold_of == f) for f in range(k)]


def split(labels: np.ndarray, folds: list[np.ndarray], f: int, seed: int):
    """(train, validation, test) for fold ``f``: validation is one stratified tenth of the rest."""
    test = folds[f]
    rest = np.setdiff1d(np.arange(labels.size), test)
    val = rest[stratified_folds(labels[rest], 10, seed + 1000 + f)[0]]
    return np.setdiff1d(rest, val), val, test


# -- the two frameworks, behind one small interface ------------------------------------------------------

class NeurovecRun:
    def __init__(self, ds, kind, args, seed):
        template, _ = TEMPLATES[kind]
        self.build = functools.partial(template, ds, hidden=args.hidden, layers=args.layers, seed=seed,
                                       out_dim=ds.num_classes, output_transformation="identity")
        self.model = neurovec.MiniBatchModel(self.build, dtype=torch.float64)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.labels = torch.from_numpy(ds.graph_labels)

    def train_epoch(self, loader):
        for batch in loader:
            loss = F.cross_entropy(self.model(batch), self.labels[batch.samples])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def accuracy(self, samples, model=None) -> float:
        out = (model or self.model)(samples)               # one batch, compiled once and cached
        return (out.argmax(1) == self.labels[samples]).double().mean().item()

    def save(self, path):
        torch.save(self.model.state_dict(), path)

    def reloaded_accuracy(self, path, samples) -> float:
        fresh = neurovec.MiniBatchModel(self.build, dtype=torch.float64)
        fresh.load_state_dict(torch.load(path))
        return self.accuracy(samples, fresh)


class PygRun:
    def __init__(self, ds, kind, args, neurovec_model):
        from torch_geometric.data import Batch

        _, make_twin = TEMPLATES[kind]
        self.make = lambda: make_twin(ds, hidden=args.hidden, layers=args.layers, out_dim=ds.num_classes,
                                      output_transformation="identity").double()
        self.model = self.make()
        pyg_twins.copy_weights(neurovec_model, self.model)          # the same initial weights
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.data = datasets.to_pyg(ds, dtype=torch.float64)
        self.batch_of = lambda samples: Batch.from_data_list([self.data[int(s)] for s in samples])

    def forward(self, batch, model=None):
        return (model or self.model)(batch.x, batch.edge_index, batch.batch, batch.num_graphs)

    def train_epoch(self, batches):
        from torch_geometric.loader import DataLoader

        for batch in DataLoader(self.data, batch_sampler=batches):   # PyG's loop, the same batches
            loss = F.cross_entropy(self.forward(batch), batch.y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def accuracy(self, samples, model=None) -> float:
        batch = self.batch_of(samples)
        return (self.forward(batch, model).argmax(1) == batch.y).double().mean().item()

    def save(self, path):
        torch.save(self.model.state_dict(), path)

    def reloaded_accuracy(self, path, samples) -> float:
        fresh = self.make()
        fresh.load_state_dict(torch.load(path))
        return self.accuracy(samples, fresh)


# -- one fold, then the table ------------------------------------------------------------------------

@dataclass
class Result:
    accuracy: list[float] = field(default_factory=list)
    seconds: float = 0.0
    epochs: list[int] = field(default_factory=list)


def run_fold(ds, kind, args, train, val, test, seed, folder: Path) -> tuple[float, float, float, float, int, int]:
    ours = NeurovecRun(ds, kind, args, seed)
    theirs = PygRun(ds, kind, args, ours.model)
    loader = neurovec.SampleLoader(ours.model, train, batch_size=args.batch_size, shuffle=True, seed=seed)
    results = []
    def neurovec_batches(epoch):
        loader.set_epoch(epoch)
        return loader

    for name, run, epoch_batches in (("neurovec", ours, neurovec_batches),
                                     ("pyg", theirs, lambda e: loader.batches(e))):
        results.append({"run": run, "name": name, "batches": epoch_batches, "best": -1.0, "best_epoch": -1,
                        "seconds": 0.0, "done": False})
    for epoch in range(args.epochs):
        for r in results:                                 # alternate: the same load on both
            if r["done"]:
                continue
            start = time.perf_counter()
            r["run"].train_epoch(r["batches"](epoch))
            accuracy = r["run"].accuracy(val)
            if accuracy > r["best"]:
                r["best"], r["best_epoch"] = accuracy, epoch
                r["run"].save(folder / f"{r['name']}.pt")
            r["done"] = epoch - r["best_epoch"] >= args.patience
            r["seconds"] += time.perf_counter() - start
        if all(r["done"] for r in results):
            break
    scores = []
    for r in results:
        start = time.perf_counter()
        scores.append(r["run"].reloaded_accuracy(folder / f"{r['name']}.pt", test))
        r["seconds"] += time.perf_counter() - start
    return scores[0], scores[1], results[0]["seconds"], results[1]["seconds"], results[0]["best_epoch"], \
        results[1]["best_epoch"]


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = Path(args.checkpoints or tempfile.mkdtemp(prefix="neurovec-train-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{args.folds}-fold CV, {args.layers} layers x {args.hidden}, batch {args.batch_size}, Adam lr {args.lr}, "
          f"<= {args.epochs} epochs, patience {args.patience}, float64, {args.threads} torch thread(s)")
    print("| dataset | model | neurovec accuracy | PyG accuracy | folds equal | neurovec s | PyG s |")
    print("|---|---|---|---|---|---|---|")
    for name in args.datasets:
        ds = datasets.load_tu(name, data_dir=args.data_dir, download=args.download)
        with_nodes = np.flatnonzero(ds.nodes.sizes > 0)   # a graph without nodes has nothing to classify
        if with_nodes.size < ds.n_graphs:
            print(f"{name}: {ds.n_graphs - with_nodes.size} graphs without nodes left out")
            ds = _subset(ds, with_nodes)
        folds = stratified_folds(ds.graph_labels, args.folds, args.seed)
        for kind in args.models:
            ours, theirs = Result(), Result()
            for f in range(args.folds):
                train, val, test = split(ds.graph_labels, folds, f, args.seed)
                a, b, sa, sb, ea, eb = run_fold(ds, kind, args, train, val, test, args.seed + f, folder)
                ours.accuracy.append(a)
                theirs.accuracy.append(b)
                ours.seconds += sa
                theirs.seconds += sb
                ours.epochs.append(ea)
                theirs.epochs.append(eb)
            equal = sum(a == b for a, b in zip(ours.accuracy, theirs.accuracy))
            print(f"| {name} | {kind} | {_mean_std(ours.accuracy)} | {_mean_std(theirs.accuracy)} | "
                  f"{equal}/{args.folds} | {ours.seconds:.1f} | {theirs.seconds:.1f} |", flush=True)


def _subset(ds, graphs: np.ndarray):
    """The graphs ``graphs`` of ``ds`` (in order) as a dataset of their own."""
    items, _, start = ds.nodes.take(graphs)
    new_id = np.full(ds.n_nodes, -1, np.int64)
    new_id[items] = np.arange(items.size)
    edges = np.flatnonzero(new_id[ds.edge_index[0]] >= 0)
    pick = lambda a: None if a is None else a[items]  # noqa: E731
    return datasets.TUDataset(ds.name, new_id[ds.edge_index[:, edges]], np.repeat(np.arange(graphs.size),
                              ds.nodes.sizes[graphs]), ds.graph_labels[graphs], pick(ds.node_labels),
                              pick(ds.node_attributes), ds.label_values,
                              None if ds.edge_labels is None else ds.edge_labels[edges],
                              None if ds.edge_attributes is None else ds.edge_attributes[edges])


def _mean_std(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.1f} +- {100 * statistics.pstdev(values):.1f}"


if __name__ == "__main__":
    main()
