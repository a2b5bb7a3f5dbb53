"""Benchmark tasks: a dataset and a model, turned into a neuron graph, training labels and an oracle.

A task is one cell of the benchmark grid: ``(dataset, model, scale, source)``.

* ``dataset``: a TU dataset (``MUTAG``, ``ENZYMES``, ``PROTEINS``) or relational
  ``mutagenesis``; ``model``: ``gcn``, ``sage``, ``gin`` (TU) or ``simple``, ``dims``
  (Mutagenesis, thesis 6.3).
* ``scale`` k replicates the dataset k times (one batch), to see how compile time,
  step time and memory grow with size. Identical copies would flatter neurovec:
  deduplication and isomorphic compression merge them back into one, while PyG
  computes every copy. So by default (``scale_mode="distinct"``) every copy of a
  TU dataset after the first gets its node features multiplied by ``1 + u``,
  ``u ~ U(-0.05, 0.05)`` per node (seeded): the same graphs and labels, different
  values, nothing to merge. Relational Mutagenesis has only categorical inputs, so
  its copies are identical (``scale_mode="identical"`` forces that for TU too).
* ``source``: ``template`` builds the graph with neurovec's own templates
  (:mod:`neurovec.datasets`); ``neuralogic`` builds the model in PyNeuraLogic and
  imports NeuraLogic's built samples with ``from_neuralogic``, so neurovec and
  NeuraLogic's own engine run the very same network.

Every task is trained full-batch on a binary target (the largest class against the
rest for TU datasets; mutagenic or not) with the mean squared error of the sigmoid
output, NeuraLogic's default loss, so that all engines, NeuraLogic included,
minimise the same function.

The oracle is what every engine's outputs (and, where it has them, gradients) are
compared with before timing: the PyG twin in float64 for TU templates, the
neuron-by-neuron reference engine for relational templates, and NeuraLogic's own
evaluation for imported tasks. For identical copies it is computed once and
tiled: the outputs repeat and the mean-loss gradients are the same.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from neurovec import datasets as nv_datasets
from neurovec.datasets.tu import TUDataset
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import Graph

__all__ = ["TU_DATASETS", "RELATIONAL_DATASETS", "DATASETS", "MODELS", "ModelOptions", "Oracle", "Task",
           "DataCache", "models_for", "make_task", "mse", "ReplicatedTU", "replicate_tu"]

TU_DATASETS = ("MUTAG", "ENZYMES", "PROTEINS")
RELATIONAL_DATASETS = ("mutagenesis",)
DATASETS = TU_DATASETS + RELATIONAL_DATASETS
TU_MODELS = ("gcn", "sage", "gin")
RELATIONAL_MODELS = ("simple", "dims")
MODELS = TU_MODELS + RELATIONAL_MODELS


def models_for(dataset: str) -> tuple[str, ...]:
    """The models that apply to ``dataset``."""
    return TU_MODELS if dataset in TU_DATASETS else RELATIONAL_MODELS


def mse(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The training loss of every engine: mean squared error of the (sigmoid) outputs."""
    return torch.nn.functional.mse_loss(outputs.reshape(-1), labels)


@dataclass(frozen=True)
class ModelOptions:
    """Model sizes shared by neurovec's templates, the PyG twins and the NeuraLogic models."""

    hidden: int = 16        # GNN width
    layers: int = 2         # GNN convolutions
    dim: int = 3            # relational embedding size (thesis 6.3)
    bond_dim: int = 1       # relational "dims" bond embedding size
    seed: int = 0


@dataclass
class Oracle:
    """The expected outputs ``(n_samples, ...)`` in float64, and gradients by weight name (or None)."""

    name: str
    outputs: np.ndarray
    gradients: dict | None = None
    seconds: float = 0.0


@dataclass
class Task:
    """One benchmark cell; engines read ``graph``, ``labels`` and, for the PyG twin, ``data``/``spec``."""

    dataset: str
    model: str
    scale: int
    source: str                     # "template" | "neuralogic"
    options: ModelOptions
    samples: np.ndarray             # sample list (dataset indices), replicated `scale` times
    labels: np.ndarray              # float64 training targets, one per sample position
    graph: Graph | None = None      # None when the NeuraLogic import failed
    data: object | None = None      # the loaded dataset (TUDataset or Mutagenesis)
    spec: object | None = None      # the GNNSpec (TU tasks, for the PyG twin)
    neuralogic: object | None = None  # neuralogic_models.NeuraLogicBuild (source "neuralogic")
    info: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    identical_copies: bool = True   # scale > 1: are the copies equal (oracle tiled) or distinct?
    _oracle: Oracle | None = None
    _oracle_tried: bool = False

    @property
    def key(self) -> str:
        """A short label: ``MUTAG/gcn``, ``PROTEINS/gcn x10``, ``mutagenesis/simple [NeuraLogic]``."""
        label = f"{self.dataset}/{self.model}"
        if self.scale != 1:
            label += f" x{self.scale}"
        if self.source == "neuralogic":
            label += " [NeuraLogic]"
        return label

    @property
    def n_samples(self) -> int:
        return int(self.samples.size)

    def labels_tensor(self, device, dtype) -> torch.Tensor:
        return torch.as_tensor(self.labels, dtype=dtype, device=device)

    def oracle(self) -> Oracle | None:
        """Computed once, on first use (seconds for relational graphs); None if there is none.

        A failure is remembered in ``notes``; the engines are then "unchecked", not failed.
        """
        if self._oracle is None and not self._oracle_tried:
            self._oracle_tried = True
            try:
                self._oracle = _compute_oracle(self)
            except Exception as error:
                self.notes.append(f"the oracle failed, outputs are not checked: {type(error).__name__}: "
                                  f"{str(error)[:300]}")
        return self._oracle

    def oracle_summary(self) -> dict | None:
        """Name and cost of the oracle, if it was computed."""
        return None if self._oracle is None else {"name": self._oracle.name, "seconds": self._oracle.seconds}


# -- data --------------------------------------------------------------------------------------------------
class DataCache:
    """Loads each dataset once per run.

    ``data_dir`` (the ``--data-dir`` option, else ``$NEUROVEC_DATA``) holds the TU
    folders (``DIR/NAME``, ``DIR/tu/NAME``, PyG's ``NAME/raw``) and ``mutagenesis/``
    with the CSV tables. Without it TU datasets come from the cache
    ``~/.cache/neurovec/tu`` and are downloaded there (via PyG) when missing.
    """

    def __init__(self, data_dir: str | os.PathLike | None = None):
        data_dir = data_dir or os.environ.get("NEUROVEC_DATA") or None
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        self._loaded: dict[str, tuple[object, float]] = {}

    def get(self, name: str):
        """``(dataset, load seconds)``."""
        if name not in self._loaded:
            start = time.perf_counter()
            if name == "mutagenesis":
                data = nv_datasets.load_mutagenesis(self._mutagenesis_dir())
            else:
                data = nv_datasets.load_tu(name, self.data_dir)
            self._loaded[name] = (data, time.perf_counter() - start)
        return self._loaded[name]

    def _mutagenesis_dir(self) -> Path | None:
        if self.data_dir is None:
            return None  # load_mutagenesis looks at $NEUROVEC_MUTAGENESIS / $NEUROVEC_DATA
        for folder in (self.data_dir / "mutagenesis", self.data_dir):
            if (folder / "molecule.csv").is_file():
                return folder
        return self.data_dir / "mutagenesis"  # the loader's error then names the missing file


# -- tasks -------------------------------------------------------------------------------------------------
def make_task(cache: DataCache, dataset: str, model: str, scale: int = 1, source: str = "template",
              options: ModelOptions = ModelOptions(), scale_mode: str = "distinct") -> Task:
    """Load the data and build the graph (timed: ``info['template_s']``, ``info['load_s']``)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} (expected one of {DATASETS})")
    if model not in models_for(dataset):
        raise ValueError(f"model {model!r} does not apply to {dataset} (expected one of {models_for(dataset)})")
    if scale < 1:
        raise ValueError(f"scale must be a positive integer (got {scale})")
    if scale_mode not in ("distinct", "identical"):
        raise ValueError(f"scale_mode must be 'distinct' or 'identical' (got {scale_mode!r})")
    data, load_s = cache.get(dataset)
    n = data.n_graphs if dataset in TU_DATASETS else data.n_molecules
    identical = scale == 1 or scale_mode == "identical" or dataset not in TU_DATASETS
    if identical:
        samples = np.tile(np.arange(n), scale)
    else:
        data, samples = replicate_tu(data, scale, seed=options.seed), np.arange(n * scale)
    if dataset in TU_DATASETS:
        labels = (data.graph_labels[samples] == data.graph_labels.max()).astype(np.float64)
    else:
        labels = data.labels[samples].astype(np.float64)
    task = Task(dataset, model, scale, source, options, samples, labels, data=data, identical_copies=identical)
    task.info["load_s"] = load_s
    if scale > 1:
        task.notes.append(f"{scale} copies of the dataset in one batch; " + (
            "identical copies: passes that merge equal values can compute them once, PyG cannot"
            if identical else "copies after the first have node features scaled by 1 + U(-0.05, 0.05) per "
                              "node, so no pass can merge them"))
    if dataset in TU_DATASETS:
        task.spec = nv_datasets.GNNSpec.create(model, data, options.hidden, options.layers)
    if source == "neuralogic":
        from . import neuralogic_models
        neuralogic_models.attach(task, data, options)
    else:
        start = time.perf_counter()
        task.graph = _template(data, dataset, model, samples, options)
        task.info["template_s"] = time.perf_counter() - start
    if task.graph is not None:
        task.info.update(_sizes(task.graph))
    task.info["samples"] = task.n_samples
    return task


@dataclass(frozen=True, eq=False)
class ReplicatedTU(TUDataset):
    """A TU dataset whose node features are multiplied per node by ``feature_scale`` (see the module doc)."""

    feature_scale: np.ndarray | None = field(repr=False, default=None)

    def node_features(self, use_attributes: bool = False) -> np.ndarray:
        features = super().node_features(use_attributes)
        return features if self.feature_scale is None else features * self.feature_scale[:, None]


def replicate_tu(data: TUDataset, k: int, seed: int = 0, spread: float = 0.05) -> ReplicatedTU:
    """``k`` copies of ``data`` as one dataset (graph ``g`` of copy ``c`` is graph ``c * n + g``).

    Copy 0 keeps its features; later copies get theirs scaled by ``1 + U(-spread, spread)``.
    """
    n_nodes, n_graphs = data.n_nodes, data.n_graphs
    copies = np.arange(k)
    edge_index = np.concatenate([data.edge_index + c * n_nodes for c in copies], axis=1)
    graph_of_node = np.concatenate([data.graph_of_node + c * n_graphs for c in copies])
    tile = lambda a: None if a is None else np.concatenate([a] * k)  # noqa: E731
    scale = np.ones(n_nodes * k)
    scale[n_nodes:] += np.random.default_rng(seed).uniform(-spread, spread, n_nodes * (k - 1))
    return ReplicatedTU(f"{data.name}x{k}", edge_index, graph_of_node, tile(data.graph_labels),
                        tile(data.node_labels), tile(data.node_attributes), data.label_values, feature_scale=scale)


def _template(data, dataset: str, model: str, samples: np.ndarray, options: ModelOptions) -> Graph:
    if dataset in TU_DATASETS:
        template = {"gcn": nv_datasets.gcn, "sage": nv_datasets.sage, "gin": nv_datasets.gin}[model]
        return template(data, options.hidden, options.layers, samples=samples, seed=options.seed)
    if model == "simple":
        return nv_datasets.mutagenesis_simple(data, options.dim, samples=samples, seed=options.seed)
    return nv_datasets.mutagenesis_dims(data, options.dim, options.bond_dim, samples=samples, seed=options.seed)


def _sizes(graph: Graph) -> dict:
    return {"layers": len(graph.layers), "neurons": int(graph.n_neurons), "edges": int(graph.n_edges),
            "weights": len(graph.weights)}


# -- oracle ------------------------------------------------------------------------------------------------
def _compute_oracle(task: Task) -> Oracle | None:
    start = time.perf_counter()
    if task.source == "neuralogic":
        oracle = task.neuralogic.oracle() if task.neuralogic is not None else None
    else:
        base = make_unscaled(task)
        if task.dataset in TU_DATASETS and _has_pyg():
            oracle = _twin_oracle(base)
        else:
            oracle = _reference_oracle(base)
    if oracle is None:
        return None
    if task.scale != 1 and task.identical_copies:
        oracle.outputs = np.concatenate([oracle.outputs] * task.scale)
    oracle.seconds = time.perf_counter() - start
    return oracle


def make_unscaled(task: Task) -> Task:
    """The same task on the samples taken once (itself when ``scale`` is 1 or the copies differ)."""
    if task.scale == 1 or not task.identical_copies:
        return task
    n = task.n_samples // task.scale
    base = Task(task.dataset, task.model, 1, task.source, task.options, task.samples[:n], task.labels[:n],
                data=task.data, spec=task.spec)
    base.graph = _template(task.data, task.dataset, task.model, base.samples, task.options)
    return base


def _has_pyg() -> bool:
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        return False
    return True


def _twin_oracle(task: Task) -> Oracle:
    """The PyG twin in float64, with the template's initial weights; MSE gradients by weight name."""
    from neurovec.datasets.pyg_twins import copy_weights, make_twin, pyg_batch

    twin = make_twin(task.spec).double()
    copy_weights(ReferenceModule(task.graph, torch.float64), twin)
    x, edge_index, batch, n = pyg_batch(task.data, task.samples, dtype=torch.float64)
    out = twin(x, edge_index, batch, n)
    mse(out, torch.as_tensor(task.labels)).backward()
    grads = {name: p.grad.detach().numpy().copy() for name, p in twin.named_parameters() if p.grad is not None}
    return Oracle("PyG twin (float64)", out.detach().numpy().reshape(n, -1), grads)


def _reference_oracle(task: Task) -> Oracle:
    """neurovec's neuron-by-neuron reference engine in float64 (seconds for a few 10k neurons)."""
    reference = ReferenceModule(task.graph, torch.float64)
    out = reference()
    mse(out, torch.as_tensor(task.labels)).backward()
    grads = {name: p.grad.detach().numpy().copy() for name, p in reference.weights.named_parameters()
             if p.grad is not None}
    return Oracle("reference engine (float64)", out.detach().numpy().reshape(task.n_samples, -1), grads)
