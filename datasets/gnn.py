"""GNN templates (GCN, GraphSAGE, GIN) for TU datasets, built as pre-grouped neuron graphs.

Each template turns a :class:`~neurovec.datasets.tu.TUDataset` and a sample list
into a :class:`neurovec.Graph` whose layers are grouped by "rule and predicate"
(thesis 5.1.8): one layer per convolution step, holding that step's neuron for
every node of every sample. Layers are built from numpy arrays in bulk.

Semantics (``h`` = a node's input representation, ``N(i)`` = sources of the
edges into ``i``; ``act`` = ReLU after every convolution except the last):

* **GCN** (PyG ``GCNConv``): ``lin_i = W h_i`` (layer ``convK.lin``), then
  ``convK_i = act(sum_{j in N(i) + i} c_ij lin_j + b)`` with the fixed scalar
  weights ``c_ij = 1/sqrt(deg_i deg_j)`` (degrees counting the self-loop) when
  ``normalize``, else ``c_ij = 1`` and no self-loop. As in ``GCNConv``, a node has
  exactly one self loop under ``normalize`` (a listed one is not counted twice),
  and an edge listed twice counts twice.
* **SAGE** (PyG ``SAGEConv``, mean): ``convK.mean_i = mean_{j in N(i)} h_j``, then
  ``convK_i = act(W_l mean_i + W_r h_i + b_l)``.
* **GIN** (PyG ``GINConv``): ``convK.agg_i = (1+eps) h_i + sum_{j in N(i)} h_j``,
  ``convK.mlp_i = relu(W_1 agg_i + b_1)``, ``convK_i = act(W_2 mlp_i + b_2)``.
* readout: ``pool_g = mean|sum_{i in g} h_i`` (one neuron per sample), then
  ``out_g = T(W pool_g + b)``, T = sigmoid or identity; outputs follow the sample list.

A neuron needs at least one input, so an isolated node's empty neighbour
aggregation (0 in PyG) is expressed as its own value times the fixed weight 0.

Weight names equal the parameter names of the PyG twin
(:mod:`neurovec.datasets.pyg_twins`): ``conv1.lin.weight``, ``conv1.bias``,
``conv2.lin_l.weight``, ``conv1.nn.0.weight``, ``lin.weight``, ...
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sources.graph import FactLayer, Graph, NeuronLayer
from ._common import DatasetError, WeightTable, as_samples, csr, glorot
from .tu import TUDataset

__all__ = ["GNNSpec", "TUBatch", "tu_batch", "gcn", "sage", "gin", "build_gnn"]

KINDS = ("gcn", "sage", "gin")
READOUTS = ("mean", "sum")
OUTPUT_TRANSFORMATIONS = ("sigmoid", "identity")


@dataclass(frozen=True)
class GNNSpec:
    """The hyperparameters shared by a GNN template and its PyG twin."""

    kind: str
    in_dim: int
    hidden: tuple[int, ...]
    normalize: bool = True          # GCN only
    readout: str = "mean"
    output_transformation: str = "sigmoid"
    out_dim: int = 1
    activation: str = "relu"        # between convolutions
    eps: float = 0.0                # GIN only
    use_attributes: bool = False

    @classmethod
    def create(cls, kind: str, ds: TUDataset, hidden=16, layers: int = 2, **options) -> "GNNSpec":
        """Validate template arguments; ``hidden`` is one width or a list (then ``layers`` is ignored)."""
        if kind not in KINDS:
            raise DatasetError(f"unknown GNN kind {kind!r} (expected one of {KINDS})")
        widths = (int(hidden),) * int(layers) if np.isscalar(hidden) else tuple(int(h) for h in hidden)
        if not widths or min(widths) < 1:
            raise DatasetError(f"need at least one convolution with positive width (got hidden={hidden!r}, "
                               f"layers={layers!r})")
        use_attributes = bool(options.get("use_attributes", False))
        spec = cls(kind, ds.node_features(use_attributes).shape[1], widths, **options)
        if spec.readout not in READOUTS:
            raise DatasetError(f"unknown readout {spec.readout!r} (expected one of {READOUTS})")
        if spec.output_transformation not in OUTPUT_TRANSFORMATIONS:
            raise DatasetError(f"unknown output_transformation {spec.output_transformation!r} "
                               f"(expected one of {OUTPUT_TRANSFORMATIONS})")
        if spec.out_dim < 1:
            raise DatasetError(f"out_dim must be positive (got {spec.out_dim})")
        return spec


@dataclass(frozen=True)
class TUBatch:
    """The selected samples as one disjoint union graph (PyG's batching), as numpy arrays.

    ``nodes[i]`` is the dataset node behind batch node ``i``; ``batch[i]`` its
    position in the sample list; ``edge_index`` uses batch node ids.
    """

    samples: np.ndarray
    x: np.ndarray
    edge_index: np.ndarray
    batch: np.ndarray
    nodes: np.ndarray

    @property
    def n_nodes(self) -> int:
        return int(self.nodes.size)


def tu_batch(ds: TUDataset, samples=None, use_attributes: bool = False) -> TUBatch:
    """Concatenate the graphs of ``samples`` (default: all) in sample-list order."""
    samples = as_samples(samples, ds.n_graphs)
    nodes, node_copy, node_start = ds.nodes.take(samples)
    edges, edge_copy, _ = ds.edges.take(samples)
    # The copy of an edge for sample position k connects that position's copies of its nodes.
    offset = node_start[edge_copy]
    src, dst = ds.edge_index[:, edges]
    edge_index = np.stack([offset + ds.nodes.local[src], offset + ds.nodes.local[dst]])
    x = ds.node_features(use_attributes)[nodes]
    return TUBatch(samples, x, edge_index, node_copy, nodes)


def _layer_init(rng: np.random.Generator, out_dim: int, in_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A Linear layer's (weight, bias), bias uniform in +-1/sqrt(in) like torch.nn.Linear."""
    bound = 1.0 / np.sqrt(in_dim)
    return glorot(rng, (out_dim, in_dim)), rng.uniform(-bound, bound, size=out_dim)


class _Stack:
    """Layers in topological order, addressed by index."""

    def __init__(self):
        self.layers: list = []

    def add(self, layer) -> int:
        self.layers.append(layer)
        return len(self.layers) - 1


def _dense(name: str, n: int, source: int, weight: int, bias: int | None, transformation: str) -> NeuronLayer:
    """One neuron per node ``i`` reading node ``i`` of ``source`` through one weight."""
    return NeuronLayer(name, counts=np.ones(n, np.int64), input_layer=np.full(n, source),
                       input_ordinal=np.arange(n), input_weight=np.full(n, weight),
                       bias=None if bias is None else np.full(n, bias), transformation=transformation, copy=False)


def build_gnn(ds: TUDataset, spec: GNNSpec, samples=None, seed: int = 0) -> Graph:
    """The neuron graph of ``spec`` over ``samples`` (default: the whole dataset, in order)."""
    batch = tu_batch(ds, samples, spec.use_attributes)
    n = batch.n_nodes
    src, dst = batch.edge_index
    rng = np.random.default_rng(seed)
    weights = WeightTable()
    stack = _Stack()
    h = stack.add(FactLayer("x", batch.x, copy=False))
    in_dim = spec.in_dim

    in_degree = np.bincount(dst, minlength=n)
    isolated = np.flatnonzero(in_degree == 0)
    zero = None  # the fixed weight 0, created only if some node needs it

    def neighbours_or_zero() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(owner, source, weight) of every neighbour input; isolated nodes read themselves times 0."""
        nonlocal zero
        if isolated.size and zero is None:
            zero = weights.add("fixed.zero", 0.0, learnable=False)
        return (np.concatenate([dst, isolated]), np.concatenate([src, isolated]),
                np.concatenate([np.full(src.size, -1), np.full(isolated.size, zero if zero is not None else -1)]))

    if spec.kind == "gcn" and spec.normalize:
        # GCNConv (add_remaining_self_loops) gives every node exactly one self loop of weight 1:
        # a listed loop is replaced by it, not counted on top. Repeated edges count each time.
        listed = src != dst
        gcn_src, gcn_dst = (src, dst) if listed.all() else (src[listed], dst[listed])
        deg = np.bincount(gcn_dst, minlength=n) + 1
        # c_ij = 1/sqrt(deg_i deg_j) depends only on deg_i * deg_j: one fixed weight per product.
        products = np.concatenate([deg * deg, deg[gcn_dst] * deg[gcn_src]])
        norm_ids = weights.fixed_scalars("gcn_norm.deg", products, lambda p: 1.0 / np.sqrt(p))
        norm_self, norm_edge = norm_ids[:n], norm_ids[n:]

    last = len(spec.hidden)
    for k, width in enumerate(spec.hidden, start=1):
        act = spec.activation if k < last else "identity"
        conv = f"conv{k}"
        if spec.kind == "gcn":
            w, b = _layer_init(rng, width, in_dim)
            lin = stack.add(_dense(f"{conv}.lin", n, h, weights.add(f"{conv}.lin.weight", w), None, "identity"))
            if spec.normalize:
                owner = np.concatenate([np.arange(n), gcn_dst])
                source = np.concatenate([np.arange(n), gcn_src])
                weight = np.concatenate([norm_self, norm_edge])
            else:
                owner, source, weight = neighbours_or_zero()
            counts, source, weight = csr(owner, n, source, weight)
            h = stack.add(NeuronLayer(conv, counts, np.full(source.size, lin), source, weight,
                                      bias=np.full(n, weights.add(f"{conv}.bias", b)), transformation=act, copy=False))
        elif spec.kind == "sage":
            w_l, b_l = _layer_init(rng, width, in_dim)
            w_r, _ = _layer_init(rng, width, in_dim)
            owner, source, weight = neighbours_or_zero()
            counts, source, weight = csr(owner, n, source, weight)
            mean = stack.add(NeuronLayer(f"{conv}.mean", counts, np.full(source.size, h), source, weight,
                                         aggregation="mean", copy=False))
            i_l = weights.add(f"{conv}.lin_l.weight", w_l)
            i_b = weights.add(f"{conv}.lin_l.bias", b_l)
            i_r = weights.add(f"{conv}.lin_r.weight", w_r)
            nodes = np.arange(n)
            h = stack.add(NeuronLayer(
                conv, np.full(n, 2), input_layer=np.stack([np.full(n, mean), np.full(n, h)], 1).ravel(),
                input_ordinal=np.stack([nodes, nodes], 1).ravel(),
                input_weight=np.tile([i_l, i_r], n), bias=np.full(n, i_b), transformation=act, copy=False))
        else:  # gin
            self_weight = -1 if spec.eps == 0 else weights.add(f"{conv}.one_plus_eps", 1.0 + spec.eps,
                                                               learnable=False)
            owner = np.concatenate([np.arange(n), dst])
            source = np.concatenate([np.arange(n), src])
            weight = np.concatenate([np.full(n, self_weight), np.full(src.size, -1)])
            counts, source, weight = csr(owner, n, source, weight)
            agg = stack.add(NeuronLayer(f"{conv}.agg", counts, np.full(source.size, h), source, weight, copy=False))
            w1, b1 = _layer_init(rng, width, in_dim)
            w2, b2 = _layer_init(rng, width, width)
            mlp = stack.add(_dense(f"{conv}.mlp", n, agg, weights.add(f"{conv}.nn.0.weight", w1),
                                   weights.add(f"{conv}.nn.0.bias", b1), "relu"))
            h = stack.add(_dense(conv, n, mlp, weights.add(f"{conv}.nn.2.weight", w2),
                                 weights.add(f"{conv}.nn.2.bias", b2), act))
        in_dim = width

    # Readout: one pooling neuron per sample position (so repeated samples get their own).
    s = batch.samples.size
    counts, ordinal = csr(batch.batch, s, np.arange(n))
    pool = stack.add(NeuronLayer("pool", counts, np.full(n, h), ordinal, aggregation=spec.readout, copy=False))
    w, b = _layer_init(rng, spec.out_dim, in_dim)
    out = stack.add(_dense("out", s, pool, weights.add("lin.weight", w), weights.add("lin.bias", b),
                           spec.output_transformation))
    return Graph(stack.layers, weights.weights, np.full(s, out), np.arange(s))


def gcn(ds: TUDataset, hidden=16, layers: int = 2, *, normalize: bool = True, readout: str = "mean",
        output_transformation: str = "sigmoid", out_dim: int = 1, activation: str = "relu",
        use_attributes: bool = False, samples=None, seed: int = 0) -> Graph:
    """GCN (PyG ``GCNConv``, with or without normalization) over ``samples``; see the module doc."""
    spec = GNNSpec.create("gcn", ds, hidden, layers, normalize=normalize, readout=readout,
                          output_transformation=output_transformation, out_dim=out_dim,
                          activation=activation, use_attributes=use_attributes)
    return build_gnn(ds, spec, samples, seed)


def sage(ds: TUDataset, hidden=16, layers: int = 2, *, readout: str = "mean",
         output_transformation: str = "sigmoid", out_dim: int = 1, activation: str = "relu",
         use_attributes: bool = False, samples=None, seed: int = 0) -> Graph:
    """GraphSAGE (PyG ``SAGEConv``: mean of neighbours + root weight) over ``samples``."""
    spec = GNNSpec.create("sage", ds, hidden, layers, readout=readout,
                          output_transformation=output_transformation, out_dim=out_dim,
                          activation=activation, use_attributes=use_attributes)
    return build_gnn(ds, spec, samples, seed)


def gin(ds: TUDataset, hidden=16, layers: int = 2, *, eps: float = 0.0, readout: str = "mean",
        output_transformation: str = "sigmoid", out_dim: int = 1, activation: str = "relu",
        use_attributes: bool = False, samples=None, seed: int = 0) -> Graph:
    """GIN (PyG ``GINConv`` with a 2-layer MLP, fixed ``eps``) over ``samples``."""
    spec = GNNSpec.create("gin", ds, hidden, layers, eps=eps, readout=readout,
                          output_transformation=output_transformation, out_dim=out_dim,
                          activation=activation, use_attributes=use_attributes)
    return build_gnn(ds, spec, samples, seed)
