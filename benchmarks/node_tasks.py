"""Node-level benchmark tasks: one large graph, a prediction per node, full-batch training (``--task node``).

A node task is ``(dataset, model)``: ``cora`` (the Planetoid files, 2 layers x 16, as
Kipf & Welling), ``arxiv-like`` and ``products-like`` (synthetic R-MAT graphs of
ogbn-arxiv's and ogbn-products' sizes, :mod:`neurovec.datasets.synthetic`; 3 layers x
128, as the OGB baselines), with ``gcn``, ``sage`` or ``gin`` at node level
(``readout=None``: the last convolution gives the class logits of every node). No
dropout, so that every engine computes one deterministic function and can be
checked. Every engine minimises the cross-entropy of the training nodes' logits.

PyG contenders (:data:`neurovec.benchmarks.contenders.PYG_VARIANTS`) get, per variant:

* ``pyg``: dense ``x`` and ``edge_index`` (the twin as written);
* ``pyg-tuned``: a cached sparse CSR ``adj_t`` (for GCN without listed self loops: on a
  sparse ``adj_t`` GCNConv adds its self loop on top of a listed one, on ``edge_index`` it
  replaces it, so the R-MAT graphs' self loops made pyg-tuned differ from the twin) and, where the features are mostly
  zeros (Cora: 1.3% nonzero), ``x`` as a sparse CSR tensor too, what a skilled PyG
  user does; where PyG's layers refuse a sparse ``x`` (the first pass raises), dense;
* ``pyg-compiled``: ``torch.compile`` of dense ``x`` and ``edge_index``.

The oracle is the PyG twin in float64 with the template's initial weights. Above
``oracle_max_nodes`` nodes it covers a few seeded training nodes: the twin runs on
their ``layers``-hop in-neighbourhood (a CSR ``adj_t``, GCN with the whole graph's
normalisation passed as edge weights), which gives exactly their whole-graph
outputs, and the gradients are those of the loss over those nodes only.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from neurovec.datasets import gnn
from neurovec.datasets.nodes import NodeDataset, induced_edges, k_hop
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import Graph

from .tasks import ORACLE_MAX_NODES, ModelOptions, Oracle

__all__ = ["NODE_DATASETS", "NODE_MODELS", "NodeTask", "NodeDataCache", "make_node_task", "node_options",
           "SPARSE_X_SHARE", "ORACLE_SEEDS"]

NODE_DATASETS = ("cora", "arxiv-like", "products-like")
NODE_MODELS = ("gcn", "sage", "gin")
SIZES = {"cora": (16, 2), "arxiv-like": (128, 3), "products-like": (128, 3)}  # (hidden, layers)
SPARSE_X_SHARE = 0.25   # pyg-tuned passes x as a sparse tensor when at most this share is nonzero
ORACLE_SEEDS = 8        # training nodes a subset oracle covers


def node_options(dataset: str, hidden: int | None = None, layers: int | None = None, seed: int = 0) -> ModelOptions:
    """The model sizes of a node task: the dataset's own unless given."""
    default_hidden, default_layers = SIZES[dataset]
    return ModelOptions(hidden or default_hidden, layers or default_layers, seed=seed)


class NodeDataCache:
    """Loads (or generates) each node dataset once per run; Cora from ``data_dir`` or ``$NEUROVEC_DATA``."""

    def __init__(self, data_dir: str | os.PathLike | None = None):
        self.data_dir = data_dir or os.environ.get("NEUROVEC_DATA") or None
        self._loaded: dict[str, tuple[NodeDataset, float]] = {}

    def get(self, name: str) -> tuple[NodeDataset, float]:
        if name not in self._loaded:
            start = time.perf_counter()
            if name == "cora":
                from neurovec.datasets.planetoid import find_planetoid, load_planetoid
                folder = None
                if self.data_dir is not None:
                    root = Path(self.data_dir).expanduser()
                    folder = next((r for r in (root, root / "planetoid") if find_planetoid("Cora", r)), root)
                data = load_planetoid("Cora", folder)
            elif name in ("arxiv-like", "products-like"):
                from neurovec.datasets.synthetic import rmat_dataset
                data = rmat_dataset(name, seed=0)
            else:
                raise ValueError(f"unknown node dataset {name!r} (expected one of {NODE_DATASETS})")
            self._loaded[name] = (data, time.perf_counter() - start)
        return self._loaded[name]


@dataclass
class NodeTask:
    """One node-level benchmark cell; the same interface as :class:`neurovec.benchmarks.tasks.Task`."""

    dataset: str
    model: str
    options: ModelOptions
    data: NodeDataset
    spec: gnn.GNNSpec
    graph: Graph | None = None
    info: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    oracle_max_nodes: int = ORACLE_MAX_NODES
    scale: int = 1
    source: str = "template"
    features: str = "node"
    _oracle: Oracle | None = None
    _oracle_tried: bool = False

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.model} node"

    @property
    def n_samples(self) -> int:
        return self.data.n_nodes

    @property
    def samples(self) -> np.ndarray:
        return np.arange(self.data.n_nodes)

    @property
    def labels(self) -> np.ndarray:
        return self.data.y

    def batch_sizes(self):
        return self.data.n_nodes, self.data.n_edges

    def loss_fn(self, device, dtype):
        """Cross-entropy of the training nodes' logits (``positions``: those nodes only)."""
        y = torch.as_tensor(self.data.y, device=device)
        train = torch.as_tensor(np.flatnonzero(self.data.train_mask), device=device)

        def loss(outputs, positions=None):
            index = train if positions is None else torch.as_tensor(positions, device=device)
            return torch.nn.functional.cross_entropy(outputs[index], y[index])
        return loss

    def template_weights(self) -> torch.nn.Module:
        """The template's initial weights (float64), from a one-node graph: weights come from the seed alone."""
        graph = getattr(gnn, self.model)(self.data, self.options.hidden, self.options.layers,
                                         samples=[0], subgraph="induced", seed=self.options.seed)
        return ReferenceModule(graph, torch.float64)

    def pyg_inputs(self, variant: str, device, dtype) -> tuple[tuple, dict]:
        """The PyG twin's inputs for ``variant`` and what they are (see the module doc)."""
        from neurovec.datasets.pyg_twins import pyg_node_data
        x, edge_index = pyg_node_data(self.data, dtype)
        x, edge_index = x.to(device), edge_index.to(device)
        if variant != "pyg-tuned":
            return (x, edge_index), {"x": "dense"}
        n = self.data.n_nodes
        if self.model == "gcn":
            # GCNConv adds one self loop per node to a sparse adj_t on top of any listed one, but replaces
            # listed ones on edge_index (add_remaining_self_loops): without them both compute the twin.
            edge_index = edge_index[:, edge_index[0] != edge_index[1]]
        adj_t = _csr_adj_t(edge_index, n, dtype, device)
        share = float(np.count_nonzero(self.data.x)) / max(self.data.x.size, 1)
        if share <= SPARSE_X_SHARE:
            sparse = x.to_sparse_csr()
            try:  # PyG's layers take a sparse x in some convolutions, not in others: try it once
                from neurovec.datasets.pyg_twins import make_twin
                with torch.no_grad():
                    make_twin(self.spec).to(device=device, dtype=dtype)(sparse, adj_t)
                return (sparse, adj_t), {"x": f"sparse CSR ({share:.1%} nonzero)"}
            except Exception as error:  # noqa: BLE001 - any refusal means: dense
                return (x, adj_t), {"x": f"dense (sparse x refused: {type(error).__name__})"}
        return (x, adj_t), {"x": f"dense ({share:.0%} nonzero)"}

    def oracle(self) -> Oracle | None:
        if self._oracle is None and not self._oracle_tried:
            self._oracle_tried = True
            try:
                start = time.perf_counter()
                self._oracle = _twin_oracle(self)
                self._oracle.seconds = time.perf_counter() - start
            except ImportError:
                self.notes.append("torch_geometric is missing: outputs are not checked")
            except Exception as error:  # noqa: BLE001
                self.notes.append(f"the oracle failed, outputs are not checked: {type(error).__name__}: "
                                  f"{str(error)[:300]}")
        return self._oracle

    def oracle_summary(self) -> dict | None:
        return None if self._oracle is None else {"name": self._oracle.name, "seconds": self._oracle.seconds}


def _csr_adj_t(edge_index: torch.Tensor, n: int, dtype, device, values: torch.Tensor | None = None) -> torch.Tensor:
    """The transposed adjacency as a sparse CSR tensor (row = target), a repeated edge kept as repeated
    entries: PyG's ``to_torch_csr_tensor`` coalesces them into one entry of value 2, which SAGE's mean then
    counts once in its denominator (unlike on ``edge_index``); kept apart, sums and means count each copy."""
    src, dst = edge_index.cpu()
    order = torch.argsort(dst, stable=True)
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    values = torch.ones(src.numel(), dtype=dtype) if values is None else values[order]
    return torch.sparse_csr_tensor(crow, src[order], values, (n, n), check_invariants=False).to(device)


def make_node_task(cache: NodeDataCache, dataset: str, model: str, options: ModelOptions,
                   oracle_max_nodes: int = ORACLE_MAX_NODES) -> NodeTask:
    """Load the data and build the node-level graph (timed: ``info['template_s']``, ``info['load_s']``)."""
    if dataset not in NODE_DATASETS:
        raise ValueError(f"unknown node dataset {dataset!r} (expected one of {NODE_DATASETS})")
    if model not in NODE_MODELS:
        raise ValueError(f"model {model!r} has no node-level template (expected one of {NODE_MODELS})")
    data, load_s = cache.get(dataset)
    spec = gnn.GNNSpec.create(model, data, options.hidden, options.layers)
    task = NodeTask(dataset, model, options, data, spec, oracle_max_nodes=oracle_max_nodes)
    task.info["load_s"] = load_s
    start = time.perf_counter()
    task.graph = gnn.build_gnn(data, spec, None, options.seed)
    task.info["template_s"] = time.perf_counter() - start
    task.info.update(layers=len(task.graph.layers), neurons=int(task.graph.n_neurons),
                     edges=int(task.graph.n_edges), weights=len(task.graph.weights),
                     batch_nodes=data.n_nodes, batch_edges=data.n_edges, samples=data.n_nodes,
                     features=data.num_features, classes=data.num_classes, hidden=options.hidden,
                     conv_layers=options.layers)
    task.notes.append(f"{data}: full-batch node classification, {options.layers} layers x {options.hidden}, "
                      f"cross-entropy over {int(data.train_mask.sum())} training nodes, no dropout")
    return task


def _twin_oracle(task: NodeTask) -> Oracle:
    from neurovec.datasets.pyg_twins import copy_weights, make_twin

    data = task.data
    twin = make_twin(task.spec).double()
    copy_weights(task.template_weights(), twin)
    y = torch.as_tensor(data.y)
    if data.n_nodes <= task.oracle_max_nodes:
        x, edge_index = torch.as_tensor(data.x, dtype=torch.float64), torch.from_numpy(data.edge_index)
        out = twin(x, edge_index)
        train = torch.as_tensor(np.flatnonzero(data.train_mask))
        torch.nn.functional.cross_entropy(out[train], y[train]).backward()
        grads = {name: p.grad.detach().numpy().copy() for name, p in twin.named_parameters() if p.grad is not None}
        return Oracle("PyG twin (float64)", out.detach().numpy(), grads)
    # A few training nodes, on their k-hop in-neighbourhood: exactly their whole-graph outputs.
    rng = np.random.default_rng(task.options.seed)
    seeds = np.sort(rng.choice(np.flatnonzero(data.train_mask), ORACLE_SEEDS, replace=False))
    nodes = k_hop(data.edge_index, data.n_nodes, seeds, len(task.spec.hidden))
    edges, _ = induced_edges(data.edge_index, data.n_nodes, nodes)
    sub = len(nodes)
    x = torch.as_tensor(data.x[nodes], dtype=torch.float64)
    src, dst = torch.from_numpy(edges)
    weight = torch.ones(src.numel(), dtype=torch.float64)
    if task.model == "gcn":
        degree = gnn.gcn_degree(data.edge_index, data.n_nodes)[nodes].astype(np.float64)
        keep = src != dst  # GCNConv replaces listed self loops by one of its own
        src, dst = torch.cat([src[keep], torch.arange(sub)]), torch.cat([dst[keep], torch.arange(sub)])
        inv = torch.from_numpy(degree ** -0.5)
        weight = inv[src] * inv[dst]
        for conv in twin.children():
            if hasattr(conv, "normalize"):
                conv.normalize = False
    adj_t = _csr_adj_t(torch.stack([src, dst]), sub, torch.float64, "cpu", weight)
    out = twin(x, adj_t)[: seeds.size]   # k_hop lists the seeds first, in order
    torch.nn.functional.cross_entropy(out, y[torch.from_numpy(seeds)]).backward()
    grads = {name: p.grad.detach().numpy().copy() for name, p in twin.named_parameters() if p.grad is not None}
    return Oracle(f"PyG twin (float64) on the {len(task.spec.hidden)}-hop neighbourhood of {seeds.size} training "
                  f"nodes ({sub} nodes)", out.detach().numpy(), grads, positions=seeds)
