"""Mini-batch training epochs: neurovec's SampleLoader against PyG's DataLoader, same model, same batches.

    python benchmarks/minibatch.py                          # PROTEINS, GCN and GIN, batch 32 and 128
    python benchmarks/minibatch.py --threads 1 2 --rounds 7

For each model and batch size, every contender trains epochs over the *same*
batches (the neurovec loader's seeded partition, visited in each epoch's order),
from the same initial weights, with Adam; a round runs one epoch of each
contender in turn (interleaved, so load on the machine hits all alike), and the
table shows medians over the rounds:

* ``neurovec``: ``SampleLoader`` epochs once every batch is compiled (cached programs);
* ``neurovec 1st``: the first epoch, which compiles the partition's batches;
* ``recompile``: drawing fresh batches every epoch, i.e. compiling every batch of
  every epoch, under the ``default`` and the ``unoptimized`` preset (the options
  the loader's design rejects; see neurovec/loader.py);
* ``PyG loader``: ``torch_geometric.loader.DataLoader`` with the same batches as its
  ``batch_sampler`` (collating every batch every epoch, PyG's usual loop);
* ``PyG cached``: the same batches collated once (in a warm-up epoch), kept;
* ``PyG adj_t``: collated once, with a transposed sparse CSR adjacency per batch
  instead of ``edge_index`` (PyG's sparse ``message_and_aggregate`` path).

Before timing, each contender's outputs on the first batch are checked against
neurovec's (float32, 1e-4). Timings on a loaded machine are for decisions only.
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
from neurovec import datasets
from neurovec.datasets import pyg_twins

TEMPLATES = {"gcn": (datasets.gcn, pyg_twins.gcn_twin), "sage": (datasets.sage, pyg_twins.sage_twin),
             "gin": (datasets.gin, pyg_twins.gin_twin)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/minibatch.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="PROTEINS")
    parser.add_argument("--models", nargs="+", default=["gcn", "gin"], choices=list(TEMPLATES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="timed epochs per contender (default: 5)")
    parser.add_argument("--recompile-rounds", type=int, default=2,
                        help="timed epochs of the recompiling contenders, which are slow (default: 2)")
    parser.add_argument("--threads", nargs="+", type=int, default=[1], help="torch thread counts (default: 1)")
    parser.add_argument("--data-dir", default="../shared/data/tu")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


class Neurovec:
    """The loader's cached batches; ``first`` is the epoch that compiles them."""

    def __init__(self, build, samples, batch_size, seed, labels, lr):
        self.model = neurovec.MiniBatchModel(build)
        self.loader = neurovec.SampleLoader(self.model, samples, batch_size=batch_size, shuffle=True, seed=seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.labels = labels

    def epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)
        for batch in self.loader:
            loss = F.cross_entropy(self.model(batch), self.labels[batch.samples])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


class Recompile(Neurovec):
    """Fresh batches every epoch: every batch of every epoch is compiled anew (no cache)."""

    def __init__(self, build, samples, batch_size, seed, labels, lr, preset):
        self.model = neurovec.MiniBatchModel(build, settings=preset, cache=False)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.labels, self.samples, self.batch_size, self.seed = labels, samples, batch_size, seed

    def epoch(self, epoch: int) -> None:
        order = self.samples[np.random.default_rng([self.seed, 2, epoch]).permutation(self.samples.size)]
        for k in range(0, order.size, self.batch_size):
            batch = self.model.batch(order[k:k + self.batch_size])
            loss = F.cross_entropy(self.model(batch), self.labels[batch.samples])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


class PygLoader:
    """PyG's DataLoader over Data objects, the neurovec loader's batches as its batch_sampler."""

    def __init__(self, twin, data, batches_of, lr):
        self.twin, self.data, self.batches_of = twin, data, batches_of
        self.optimizer = torch.optim.Adam(twin.parameters(), lr=lr)

    def batches(self, epoch):
        from torch_geometric.loader import DataLoader

        return DataLoader(self.data, batch_sampler=self.batches_of(epoch))

    def run(self, batch):
        return self.twin(batch.x, batch.edge_index, batch.batch, batch.num_graphs)

    def epoch(self, epoch: int) -> None:
        for batch in self.batches(epoch):
            loss = F.cross_entropy(self.run(batch), batch.y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def first_output(self):
        return self.run(next(iter(self.batches(0)))).detach()


class PygCached(PygLoader):
    """The same batches collated once (keyed by sample list), optionally with a sparse adj_t."""

    def __init__(self, twin, data, batches_of, lr, adj_t: bool):
        super().__init__(twin, data, batches_of, lr)
        self.adj_t, self.cache = adj_t, {}

    def batches(self, epoch):
        from torch_geometric.data import Batch
        from torch_geometric.utils import to_torch_csr_tensor

        out = []
        for samples in self.batches_of(epoch):
            key = np.asarray(samples).tobytes()
            if key not in self.cache:
                batch = Batch.from_data_list([self.data[int(s)] for s in samples])
                if self.adj_t:
                    n = batch.num_nodes
                    batch.edge_index = to_torch_csr_tensor(batch.edge_index.flip(0), size=(n, n))
                self.cache[key] = batch
            out.append(self.cache[key])
        return out


def measure(args, ds, kind, batch_size) -> dict[str, list[float]]:
    template, make_twin = TEMPLATES[kind]
    options = dict(hidden=args.hidden, layers=args.layers, out_dim=ds.num_classes, output_transformation="identity")
    build = functools.partial(template, ds, seed=args.seed, **options)
    samples = np.arange(ds.n_graphs)
    labels = torch.from_numpy(ds.graph_labels)
    data = datasets.to_pyg(ds)
    ours = Neurovec(build, samples, batch_size, args.seed, labels, 0.01)
    batches_of = ours.loader.batches

    def twin():
        module = make_twin(ds, **options)
        pyg_twins.copy_weights(ours.model, module)
        return module

    contenders = {
        "PyG loader": PygLoader(twin(), data, batches_of, 0.01),
        "PyG cached": PygCached(twin(), data, batches_of, 0.01, adj_t=False),
        "PyG adj_t": PygCached(twin(), data, batches_of, 0.01, adj_t=True),
    }
    times: dict[str, list[float]] = {name: [] for name in ["neurovec 1st", "neurovec", *contenders,
                                                            "recompile default", "recompile unoptimized"]}
    # Check before timing: every PyG contender's outputs on the first batch equal neurovec's (initial weights).
    reference = neurovec.MiniBatchModel(build)(batches_of(0)[0]).detach()
    for name, contender in contenders.items():
        torch.testing.assert_close(contender.first_output(), reference, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"{name}: {m}")
    start = time.perf_counter()
    ours.epoch(0)
    times["neurovec 1st"].append(time.perf_counter() - start)
    for contender in contenders.values():
        contender.epoch(0)  # warm-up (the cached contenders collate here)
    contenders = {"neurovec": ours, **contenders}
    for r in range(1, args.rounds + 1):
        for name, contender in contenders.items():
            start = time.perf_counter()
            contender.epoch(r)
            times[name].append(time.perf_counter() - start)
    for preset in ("default", "unoptimized"):
        slow = Recompile(build, samples, batch_size, args.seed, labels, 0.01, preset)
        for r in range(args.recompile_rounds):
            start = time.perf_counter()
            slow.epoch(r)
            times[f"recompile {preset}"].append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    args = parse_args(argv)
    ds = datasets.load_tu(args.dataset, data_dir=args.data_dir)
    columns = ["neurovec", "neurovec 1st", "PyG loader", "PyG cached", "PyG adj_t", "recompile default",
               "recompile unoptimized"]
    print(f"{args.dataset}: {ds.n_graphs} graphs, {args.layers} layers x {args.hidden}, float32, Adam; "
          f"epoch seconds, median of {args.rounds} interleaved epochs ({args.recompile_rounds} for recompile)")
    print("| threads | model | batch | " + " | ".join(columns) + " | PyG loader / neurovec | PyG cached / neurovec |")
    print("|" + "---|" * (len(columns) + 5))
    for threads in args.threads:
        torch.set_num_threads(threads)
        for kind in args.models:
            for batch_size in args.batch_sizes:
                times = measure(args, ds, kind, batch_size)
                med = {name: statistics.median(values) for name, values in times.items()}
                cells = " | ".join(f"{med[c]:.3f}" for c in columns)
                print(f"| {threads} | {kind} | {batch_size} | {cells} | {med['PyG loader'] / med['neurovec']:.2f}x | "
                      f"{med['PyG cached'] / med['neurovec']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
