"""Benchmark tasks: a dataset and a model, turned into a neuron graph, training labels and an oracle.

A task is one cell of the benchmark grid: ``(dataset, model, features, scale, source)``.

* ``dataset``: a TU dataset (``MUTAG``, ``ENZYMES``, ``PROTEINS``) or relational
  ``mutagenesis``; ``model``: ``gcn``, ``sage``, ``gin`` (TU) or ``simple``, ``dims``
  (Mutagenesis, thesis 6.3).
* ``features`` (TU only): ``labels``, the one-hot node labels as they are, or
  ``continuous``: every node's features multiplied by ``1 + u``,
  ``u ~ U(-0.05, 0.05)`` per node (seeded). One-hot labels let a compiler merge the
  many nodes whose inputs are equal (PROTEINS' first layer has 7,188 distinct rows
  among 43,471); continuous features leave nothing to merge, which is the case
  for most real node features.
* ``scale`` k replicates the dataset k times (one batch), to see how compile time,
  step time and memory grow with size. Identical copies would flatter neurovec:
  deduplication and isomorphic compression merge them back into one, while PyG
  computes every copy. So by default (``scale_mode="distinct"``) with ``labels``
  every copy of a TU dataset after the first gets its node features multiplied
  as above (with ``continuous`` every copy, the first included, already has its
  own): the same graphs and labels, different values, nothing to merge.
  Relational Mutagenesis has only categorical inputs, so its copies are
  identical (``scale_mode="identical"`` forces that for TU labels too).
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
tiled: the outputs repeat and the mean-loss gradients are the same. For graphs
above ``oracle_max_nodes`` batch nodes (a float64 PyG twin of 100x PROTEINS
needs about as much memory as the engines it checks) the oracle covers a seeded
random subset of the samples: the engines' outputs are compared on those
samples, and their gradients of the loss taken over those samples only, which
is exact (the other samples do not enter that loss).

:func:`step_bytes` estimates the memory traffic of one training step of a TU
task, the physical limit its step time is compared with (see its docstring).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from neurovec import datasets as nv_datasets
from neurovec.datasets.tu import TUDataset, find_tu
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import Graph

__all__ = ["TU_DATASETS", "RELATIONAL_DATASETS", "DATASETS", "MODELS", "FEATURES", "ModelOptions", "Oracle", "Task",
           "DataCache", "models_for", "make_task", "mse", "ReplicatedTU", "replicate_tu", "step_bytes",
           "ORACLE_MAX_NODES", "FEATURE_SPREAD", "template_weights",
           "oracle_positions", "INDEX_BYTES", "task_key"]

TU_DATASETS = ("MUTAG", "ENZYMES", "PROTEINS")
RELATIONAL_DATASETS = ("mutagenesis",)
DATASETS = TU_DATASETS + RELATIONAL_DATASETS
TU_MODELS = ("gcn", "sage", "gin")
RELATIONAL_MODELS = ("simple", "dims")
MODELS = TU_MODELS + RELATIONAL_MODELS
FEATURES = ("labels", "continuous")
FEATURE_SPREAD = 0.05          # continuous features: x * (1 + U(-FEATURE_SPREAD, FEATURE_SPREAD)) per node
ORACLE_MAX_NODES = 1_000_000   # larger batches: the oracle covers a subset of the samples (module doc)


def task_key(dataset: str, model: str, features: str = "labels", scale: int = 1, source: str = "template") -> str:
    """A short label: ``MUTAG/gcn labels``, ``PROTEINS/gcn continuous x10``, ``mutagenesis/simple [NeuraLogic]``."""
    label = f"{dataset}/{model}"
    if dataset in TU_DATASETS:
        label += f" {features}"
    if scale != 1:
        label += f" x{scale}"
    if source == "neuralogic":
        label += " [NeuraLogic]"
    return label


def models_for(dataset: str) -> tuple[str, ...]:
    """The models that apply to ``dataset``."""
    return TU_MODELS if dataset in TU_DATASETS else RELATIONAL_MODELS


def mse(outputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The training loss of every engine: mean squared error of the (sigmoid) outputs.

    ``positions`` restricts it to those sample positions (the subset an oracle covers).
    """
    outputs = outputs.reshape(labels.shape[0], -1)
    if positions is not None:
        outputs, labels = outputs[positions], labels[positions]
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
    """The expected outputs in float64, and gradients by weight name (or None).

    ``positions`` None: outputs ``(n_samples, ...)`` of every sample, gradients of the
    whole training loss. Otherwise the sample positions covered: outputs of those
    samples only, gradients of the loss over those samples only.
    """

    name: str
    outputs: np.ndarray
    gradients: dict | None = None
    seconds: float = 0.0
    positions: np.ndarray | None = None


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
    features: str = "labels"        # "labels" | "continuous" (TU only; see the module doc)
    oracle_max_nodes: int = ORACLE_MAX_NODES
    _oracle: Oracle | None = None
    _oracle_tried: bool = False

    @property
    def key(self) -> str:
        return task_key(self.dataset, self.model, self.features, self.scale, self.source)

    @property
    def n_samples(self) -> int:
        return int(self.samples.size)

    def labels_tensor(self, device, dtype) -> torch.Tensor:
        return torch.as_tensor(self.labels, dtype=dtype, device=device)

    def loss_fn(self, device, dtype):
        """The training loss every engine minimises: ``loss(outputs, positions=None)`` (see :func:`mse`)."""
        labels = self.labels_tensor(device, dtype)
        return lambda outputs, positions=None: mse(outputs, labels, positions)

    def batch_sizes(self) -> tuple[int, int] | None:
        """TU tasks: ``(nodes, edges)`` of the whole batch (edges directed, as listed); else None."""
        if self.dataset not in TU_DATASETS or self.source != "template":
            return None
        graphs = self.data.n_graphs
        nodes = np.bincount(self.data.graph_of_node, minlength=graphs)
        edges = np.bincount(self.data.graph_of_node[self.data.edge_index[0]], minlength=graphs)
        return int(nodes[self.samples].sum()), int(edges[self.samples].sum())

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
                data = nv_datasets.load_mutagenesis(self.mutagenesis_dir())
            else:
                if self.data_dir is not None and find_tu(name, self.data_dir) is None:
                    raise FileNotFoundError(f"TU dataset {name}: no {name}_A.txt in {self.data_dir} (nor in "
                                            f"{self.data_dir / name}, {self.data_dir / name / 'raw'} or "
                                            f"{self.data_dir / 'tu' / name})")
                data = nv_datasets.load_tu(name, self.data_dir)
            self._loaded[name] = (data, time.perf_counter() - start)
        return self._loaded[name]

    def mutagenesis_dir(self) -> Path | None:
        if self.data_dir is None:
            return None  # load_mutagenesis looks at $NEUROVEC_MUTAGENESIS / $NEUROVEC_DATA
        for folder in (self.data_dir / "mutagenesis", self.data_dir):
            if (folder / "molecule.csv").is_file():
                return folder
        return self.data_dir / "mutagenesis"  # the loader's error then names the missing file


# -- tasks -------------------------------------------------------------------------------------------------
def make_task(cache: DataCache, dataset: str, model: str, scale: int = 1, source: str = "template",
              options: ModelOptions = ModelOptions(), scale_mode: str = "distinct", features: str = "labels",
              oracle_max_nodes: int = ORACLE_MAX_NODES) -> Task:
    """Load the data and build the graph (timed: ``info['template_s']``, ``info['load_s']``)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} (expected one of {DATASETS})")
    if model not in models_for(dataset):
        raise ValueError(f"model {model!r} does not apply to {dataset} (expected one of {models_for(dataset)})")
    if scale < 1:
        raise ValueError(f"scale must be a positive integer (got {scale})")
    if scale_mode not in ("distinct", "identical"):
        raise ValueError(f"scale_mode must be 'distinct' or 'identical' (got {scale_mode!r})")
    if features not in FEATURES:
        raise ValueError(f"features must be one of {FEATURES} (got {features!r})")
    if features == "continuous" and dataset not in TU_DATASETS:
        raise ValueError(f"continuous features apply to TU datasets only, not {dataset} (categorical inputs)")
    data, load_s = cache.get(dataset)
    n = data.n_graphs if dataset in TU_DATASETS else data.n_molecules
    continuous = features == "continuous"
    identical = not continuous and (scale == 1 or scale_mode == "identical" or dataset not in TU_DATASETS)
    if identical:
        samples = np.tile(np.arange(n), scale)
    else:
        data, samples = replicate_tu(data, scale, seed=options.seed, first_copy=continuous), np.arange(n * scale)
    if dataset in TU_DATASETS:
        labels = (data.graph_labels[samples] == data.graph_labels.max()).astype(np.float64)
    else:
        labels = data.labels[samples].astype(np.float64)
    task = Task(dataset, model, scale, source, options, samples, labels, data=data, identical_copies=identical,
                features=features if dataset in TU_DATASETS else "labels", oracle_max_nodes=oracle_max_nodes)
    task.info["load_s"] = load_s
    if continuous:
        task.notes.append(f"continuous features: every node's features scaled by 1 + U(-{FEATURE_SPREAD}, "
                          f"{FEATURE_SPREAD}) (seed {options.seed}), so no two nodes' inputs are equal")
    if scale > 1:
        task.notes.append(f"{scale} copies of the dataset in one batch; " + (
            "identical copies: passes that merge equal values can compute them once, PyG cannot"
            if identical else "every copy has its own node features, so no pass can merge them"))
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
    sizes = task.batch_sizes()
    if sizes is not None:
        task.info["batch_nodes"], task.info["batch_edges"] = sizes
    task.info["samples"] = task.n_samples
    return task


@dataclass(frozen=True, eq=False)
class ReplicatedTU(TUDataset):
    """A TU dataset whose node features are multiplied per node by ``feature_scale`` (see the module doc)."""

    feature_scale: np.ndarray | None = field(repr=False, default=None)

    def node_features(self, use_attributes: bool = False) -> np.ndarray:
        features = super().node_features(use_attributes)
        return features if self.feature_scale is None else features * self.feature_scale[:, None]


def replicate_tu(data: TUDataset, k: int, seed: int = 0, spread: float = FEATURE_SPREAD,
                 first_copy: bool = False) -> ReplicatedTU:
    """``k`` copies of ``data`` as one dataset (graph ``g`` of copy ``c`` is graph ``c * n + g``).

    Every copy after the first gets its node features scaled by ``1 + U(-spread, spread)``
    per node; with ``first_copy`` the first too (continuous features). Node-, graph- and
    edge-level arrays of the dataset are tiled, node and graph ids shifted per copy; a
    field this function does not know how to replicate raises instead of being copied
    wrongly.
    """
    n_nodes, n_graphs, n_edges = data.n_nodes, data.n_graphs, data.n_edges
    values = {}
    for item in fields(data):
        if item.name == "feature_scale":
            continue
        value = getattr(data, item.name)
        if k == 1 or value is None or item.name == "label_values":
            pass
        elif item.name == "name":
            value = f"{value}x{k}"
        elif item.name == "edge_index":
            value = np.concatenate([value + c * n_nodes for c in range(k)], axis=1)
        elif item.name == "graph_of_node":
            value = np.concatenate([value + c * n_graphs for c in range(k)])
        elif isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] in (n_nodes, n_graphs, n_edges):
            value = np.concatenate([value] * k)
        else:
            raise ValueError(f"replicate_tu: cannot replicate the dataset field {item.name!r} "
                             f"({type(value).__name__}); teach it which ids the field holds")
        values[item.name] = value
    rng = np.random.default_rng(seed)
    scale = np.ones(n_nodes * k)
    start = 0 if first_copy else n_nodes
    scale[start:] += rng.uniform(-spread, spread, scale.size - start)
    return ReplicatedTU(**values, feature_scale=scale)


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
        positions = oracle_positions(base)
        if positions is not None:
            base = _subset(base, positions)
        if task.dataset in TU_DATASETS and _has_pyg():
            oracle = _twin_oracle(base)
        else:
            oracle = _reference_oracle(base)
        if positions is not None:
            oracle.positions = positions
            oracle.name += f", {positions.size} of {task.n_samples} samples"
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
                data=task.data, spec=task.spec, features=task.features)
    base.graph = _template(task.data, task.dataset, task.model, base.samples, task.options)
    return base


def oracle_positions(task: Task, seed: int = 0) -> np.ndarray | None:
    """The sample positions a subset oracle covers (sorted), or None when the whole batch is checked.

    Above ``task.oracle_max_nodes`` batch nodes: a seeded random subset of about half
    that many nodes, spread over every copy.
    """
    sizes = task.batch_sizes()
    if sizes is None or sizes[0] <= task.oracle_max_nodes:
        return None
    count = max(1, int(task.n_samples * (task.oracle_max_nodes / 2) / sizes[0]))
    return np.sort(np.random.default_rng(seed).choice(task.n_samples, size=count, replace=False))


def _subset(task: Task, positions: np.ndarray) -> Task:
    sub = Task(task.dataset, task.model, task.scale, task.source, task.options, task.samples[positions],
               task.labels[positions], data=task.data, spec=task.spec, features=task.features)
    if not (task.dataset in TU_DATASETS and _has_pyg()):  # the reference engine needs the subset's graph
        sub.graph = _template(task.data, task.dataset, task.model, sub.samples, task.options)
    else:
        sub.graph = None
    return sub


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
    copy_weights(template_weights(task), twin)
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


def template_weights(task: Task) -> torch.nn.Module:
    """A module whose ``weights`` are the TU template's initial weights (float64), for ``copy_weights``.

    Taken from a template of the first sample alone: a template's weights are drawn
    from its seed, not from its samples (``tests/test_benchmark.py`` checks this), and
    the one-sample graph is cheap at any scale.
    """
    graph = _template(task.data, task.dataset, task.model, task.samples[:1], task.options)
    return ReferenceModule(graph, torch.float64)


# -- the physical limit ------------------------------------------------------------------------------------
INDEX_BYTES = 4  # an index is counted at int32: the least any implementation needs below 2**31 nodes


def step_bytes(task: Task, dtype_bytes: int) -> dict | None:
    """Estimated bytes one training step of a TU GNN task must move to and from memory (None: no model).

    The model counts compulsory traffic, each array read or written once per use,
    as if every operation streamed its operands at full bandwidth and nothing stayed
    in cache between operations. Weights are negligible (a few KB) and not counted.
    With ``N`` batch nodes, ``E`` directed edges (GCN adds ``N`` self loops), value
    size ``b`` and 4-byte indices, each convolution from width ``a`` to ``h``, which
    aggregates at width ``w = min(a, h)`` (a shared linear commutes with a sum or mean,
    so the narrower side can be the one aggregated), moves:

    * forward: read its input (``N a b``); read the adjacency (``E`` column indices,
      ``N`` row offsets, and for GCN ``E`` edge values); write and read the
      aggregate (``2 N w b``); write its output (``N h b``); GIN's MLP also writes and
      reads its hidden layer (``2 N h b``);
    * backward: read the output's gradient and the saved output (``2 N h b``), write
      and read the aggregate's gradient (``2 N w b``), read the saved input for the
      weight gradient (``N a b``); every layer but the first also reads the adjacency
      again and writes its input's gradient (``N a b``): nothing needs the gradient
      of the input features; GIN's hidden layer again ``2 N h b``.

    The readout reads the last layer's output and the graph index of every node
    forward, and writes its gradient backward. The result splits the total into
    ``forward`` and ``backward``, with the model's inputs.
    """
    sizes = task.batch_sizes()
    if sizes is None or task.spec is None:
        return None
    nodes, edges = sizes
    b, i = dtype_bytes, INDEX_BYTES
    gcn = task.model == "gcn"
    if gcn:
        edges += nodes  # GCNConv adds a self loop per node
    adjacency = edges * i + nodes * i + (edges * b if gcn else 0)
    widths = (task.spec.in_dim, *task.spec.hidden)
    forward = backward = 0
    for layer, (a, h) in enumerate(zip(widths[:-1], widths[1:])):
        w = min(a, h)
        mlp = 2 * nodes * h * b if task.model == "gin" else 0
        forward += nodes * a * b + adjacency + 2 * nodes * w * b + nodes * h * b + mlp
        backward += 2 * nodes * h * b + 2 * nodes * w * b + nodes * a * b + mlp
        if layer > 0:
            backward += adjacency + nodes * a * b
    last = widths[-1]
    forward += nodes * last * b + nodes * i
    backward += nodes * last * b + nodes * i
    return {"bytes": int(forward + backward), "forward": int(forward), "backward": int(backward),
            "nodes": nodes, "edges": edges, "widths": list(widths), "value_bytes": b, "index_bytes": i}
