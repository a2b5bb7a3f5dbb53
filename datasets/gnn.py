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
* readout: ``pool_g = mean|sum|max_{i in g} h_i`` (one neuron per sample), then
  ``out_g = T(W pool_g + b)``, T = sigmoid or identity; outputs follow the sample list.
  **What the graph-level templates build by default:** a binary classifier, one
  sigmoid output per graph (``out_dim=1``, ``output_transformation="sigmoid"``,
  for ``binary_cross_entropy``). For PyG's habit (cross-entropy over classes) pass
  ``out_dim=ds.num_classes, output_transformation="identity"``.
* **node level** (``readout=None``, the default for a
  :class:`~neurovec.datasets.nodes.NodeDataset` such as Cora): no pooling and no
  ``lin``; ``layers`` convolutions, the last one mapping to ``out_dim`` (default: the
  dataset's number of classes) with no activation, one output per node, as PyG's
  ``torch_geometric.nn.models.GCN/GraphSAGE/GIN(in, hidden, layers, out)``. Outputs
  are logits (PyG's habit: ``F.cross_entropy(out[train], y[train])``).
  ``samples`` are then node ids: with ``subgraph="k-hop"`` (default) the graph holds
  their ``layers``-hop in-neighbourhood and GCN uses the whole graph's degrees, so
  each output equals the whole graph's; with ``subgraph="induced"`` (Cluster-GCN)
  only the edges among ``samples`` are kept and degrees are those of that subgraph.
* **dropout** (``dropout`` after every convolution but the last, ``input_dropout``
  on the input features): ``h * mask`` by a neuron layer ``prod`` of ``h`` and a fact
  layer ``dropout[p=P]:convK`` of the same shape, all ones in the graph (so the
  compiled module computes the eval-mode model). Input dropout only declares a
  fact layer ``dropout[p=P]:x`` (one row, read by nothing): the features layer
  ``x`` itself is replaced by ``x * mask`` at call time. :mod:`neurovec.dropout`
  declares those layers dynamic and feeds them fresh seeded masks in training
  (``neurovec.dropout.compile(graph)``); the PyG twin takes the same masks.

A neuron needs at least one input, so an isolated node's empty neighbour
aggregation (0 in PyG) is expressed as its own value times the fixed weight 0.

Weight names equal the parameter names of the PyG twin
(:mod:`neurovec.datasets.pyg_twins`): ``conv1.lin.weight``, ``conv1.bias``,
``conv2.lin_l.weight``, ``conv1.nn.0.weight``, ``lin.weight``, ...
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..sources.graph import FactLayer, Graph, NeuronLayer
from ._common import DatasetError, WeightTable, as_samples, csr, glorot
from .nodes import NodeDataset, check_nodes, induced_edges, k_hop
from .tu import TUDataset

__all__ = ["GNNSpec", "TUBatch", "NodeBatch", "tu_batch", "node_batch", "gcn", "sage", "gin", "build_gnn",
           "dropout_layer_name", "parse_dropout_layer", "SUBGRAPHS"]

KINDS = ("gcn", "sage", "gin")
READOUTS = ("mean", "sum", "max", None)
OUTPUT_TRANSFORMATIONS = ("sigmoid", "identity")
SUBGRAPHS = ("k-hop", "induced")
_DROPOUT = re.compile(r"^dropout\[p=([0-9.eE+-]+)\]:(.+)$")


def dropout_layer_name(p: float, what: str) -> str:
    """The name of the mask fact layer of a dropout of probability ``p`` on ``what``."""
    return f"dropout[p={p!r}]:{what}"


def parse_dropout_layer(name: str) -> tuple[float, str] | None:
    """``(p, what)`` for a dropout mask layer's name, else None."""
    match = _DROPOUT.match(name)
    return (float(match.group(1)), match.group(2)) if match else None


@dataclass(frozen=True)
class GNNSpec:
    """The hyperparameters shared by a GNN template and its PyG twin."""

    kind: str
    in_dim: int
    hidden: tuple[int, ...]         # the width of every convolution (node level: the last is out_dim)
    normalize: bool = True          # GCN only
    readout: str | None = "mean"    # None: node level, one output per node
    output_transformation: str = "sigmoid"
    out_dim: int = 1
    activation: str = "relu"        # between convolutions
    eps: float = 0.0                # GIN only
    use_attributes: bool = False
    dropout: float = 0.0            # after every convolution but the last
    input_dropout: float = 0.0      # on the input features
    subgraph: str = "k-hop"         # node level with samples: see the module doc

    @property
    def node_level(self) -> bool:
        return self.readout is None

    @classmethod
    def create(cls, kind: str, ds, hidden=16, layers: int = 2, **options) -> "GNNSpec":
        """Validate template arguments; ``hidden`` is one width or a list (then ``layers`` is ignored).

        Node level (``readout=None``): ``layers`` convolutions, the last one of width
        ``out_dim``; a list ``hidden`` gives the widths before it. ``out_dim`` None: the
        dataset's number of classes at node level, 1 (a sigmoid output) at graph level.
        """
        if kind not in KINDS:
            raise DatasetError(f"unknown GNN kind {kind!r} (expected one of {KINDS})")
        node_dataset = isinstance(ds, NodeDataset)
        if "readout" not in options and node_dataset:
            options["readout"] = None
        node_level = options.get("readout", "mean") is None
        if options.get("out_dim") is None:
            options["out_dim"] = getattr(ds, "num_classes", None) if node_level else 1
            if options["out_dim"] is None:
                raise DatasetError("out_dim: the dataset does not say how many classes it has; pass out_dim")
        if node_level and "output_transformation" not in options:
            options["output_transformation"] = "identity"
        if node_level and options.get("output_transformation") != "identity":
            raise DatasetError(f"a node-level model (readout=None) outputs its last convolution as is; got "
                               f"output_transformation={options['output_transformation']!r}, expected 'identity'")
        if np.isscalar(hidden):
            if int(layers) < 1:
                raise DatasetError(f"need at least one convolution (got layers={layers!r})")
            widths = (int(hidden),) * (int(layers) - (1 if node_level else 0))
        else:
            widths = tuple(int(h) for h in hidden)
        if node_level:
            widths = widths + (int(options["out_dim"]),)
        if not widths or min(widths) < 1:
            raise DatasetError(f"need at least one convolution with positive width (got hidden={hidden!r}, "
                               f"layers={layers!r})")
        use_attributes = bool(options.get("use_attributes", False))
        spec = cls(kind, ds.node_features(use_attributes).shape[1], widths, **options)
        for name in ("dropout", "input_dropout"):
            p = getattr(spec, name)
            if not 0.0 <= p < 1.0:
                raise DatasetError(f"{name} must be a probability in [0, 1) (got {p!r})")
        if spec.subgraph not in SUBGRAPHS:
            raise DatasetError(f"unknown subgraph {spec.subgraph!r} (expected one of {SUBGRAPHS})")
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


@dataclass(frozen=True)
class NodeBatch:
    """The nodes a node-level graph computes on, as numpy arrays.

    ``nodes[i]`` is the dataset node behind graph node ``i``; ``outputs[k]`` the graph node
    of the k-th output (the k-th sample); ``edge_index`` uses graph node ids; ``degree``
    GCN's degrees (self loop included) or None to count them in ``edge_index``.
    """

    x: np.ndarray
    edge_index: np.ndarray
    nodes: np.ndarray
    outputs: np.ndarray
    degree: np.ndarray | None = None

    @property
    def n_nodes(self) -> int:
        return int(self.nodes.size)


def gcn_degree(edge_index: np.ndarray, n: int) -> np.ndarray:
    """GCNConv's degree of every node: its in-edges that are not self loops, plus its one self loop."""
    src, dst = edge_index
    listed = src != dst
    return np.bincount(dst[listed] if not listed.all() else dst, minlength=n) + 1


def node_batch(ds: NodeDataset, samples=None, layers: int = 2, subgraph: str = "k-hop") -> NodeBatch:
    """The graph nodes and edges for the outputs of ``samples`` (node ids; None: every node in order)."""
    n = ds.n_nodes
    x = ds.x
    if samples is None:
        nodes = np.arange(n)
        return NodeBatch(x, ds.edge_index, nodes, nodes)
    samples = check_nodes(samples, n, "samples")
    seeds = np.unique(samples)
    degree = None
    if subgraph == "k-hop":
        nodes = k_hop(ds.edge_index, n, seeds, layers)
        degree = gcn_degree(ds.edge_index, n)[nodes]
    else:
        nodes = seeds
    edge_index, _ = induced_edges(ds.edge_index, n, nodes)
    position = np.empty(n, dtype=np.int64)
    position[nodes] = np.arange(nodes.size)
    return NodeBatch(x[nodes], edge_index, nodes, position[samples], degree)


#: GCN's normalisation 1/sqrt(deg_i deg_j) is one fixed weight per distinct degree product up to this many
#: products; beyond (skewed graphs: arxiv-like has 34k), it is factorised (NOTE: [GCN normalisation]).
MAX_NORM_PRODUCTS = 8192


def _by_owner(owner: np.ndarray, n_owners: int, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """``csr(owner, n_owners, *columns)``: the columns sorted by owner, stably (input order kept within
    an owner), and the counts. torch's stable sort of integers is a radix sort, about 3x numpy's
    (timsort for int64) on millions of edges; a stable order is unique, so the result is csr's."""
    import torch

    order = torch.sort(torch.from_numpy(np.ascontiguousarray(owner, dtype=np.int64)), stable=True).indices.numpy()
    counts = np.bincount(owner, minlength=n_owners)
    return (counts, *(np.asarray(c)[order] for c in columns))


def _few_products(deg: np.ndarray, src: np.ndarray, dst: np.ndarray, limit: int) -> bool:
    """Whether the degree products of the edges and self loops (``deg[dst] * deg[src]`` and ``deg**2``)
    take at most ``limit`` distinct values: counted over the distinct (degree, degree) pairs present,
    found with one bincount over the edges' pair codes, instead of a sort of every edge's product."""
    levels, level = np.unique(deg, return_inverse=True)  # over nodes, not edges
    d = levels.size
    if d * d > 1 << 24:  # too many pairs to count: sort the products instead
        return np.unique(np.concatenate([deg * deg, deg[dst] * deg[src]])).size <= limit
    present = np.flatnonzero(np.bincount(level[dst] * d + level[src], minlength=d * d))
    products = np.concatenate([levels * levels, levels[present // d] * levels[present % d]])
    return np.unique(products).size <= limit


def _gcn_norm(weights: WeightTable, src: np.ndarray, dst: np.ndarray, n: int, degree: np.ndarray | None):
    """GCN's inputs: (source, target, fixed weight id) of the edges that are not self loops and of one self
    loop per node, and the per-node fixed weight (None when each edge has it all; else the edges' weight
    ids are None: the node's weight is applied before the sum and after it).

    NOTE: [GCN normalisation] c_ij = 1/sqrt(deg_i deg_j) depends only on deg_i * deg_j, so by default
    each edge reads one fixed weight per distinct product. On skewed graphs the products number in the
    tens or hundreds of thousands (a Weight object each); there it is factorised: a layer before the sum
    multiplies node j by 1/sqrt(deg_j) (one weight per distinct degree), the edges from j read that row
    unweighted, and a layer after the sum multiplies node i by 1/sqrt(deg_i): the same values up to
    rounding (float64 within 1e-15 relative). The compiler would make the same program from 1/sqrt(deg_j)
    on every edge, but only after finding that the edges from j make one product between them.
    """
    # GCNConv (add_remaining_self_loops) gives every node exactly one self loop of weight 1:
    # a listed loop is replaced by it, not counted on top. Repeated edges count each time.
    listed = src != dst
    gcn_src, gcn_dst = (src, dst) if listed.all() else (src[listed], dst[listed])
    deg = np.bincount(gcn_dst, minlength=n) + 1 if degree is None else degree
    nodes = np.arange(n)
    sources, owners = np.concatenate([nodes, gcn_src]), np.concatenate([nodes, gcn_dst])
    if _few_products(deg, gcn_src, gcn_dst, MAX_NORM_PRODUCTS):
        products = np.concatenate([deg * deg, deg[gcn_dst] * deg[gcn_src]])
        norm_ids = weights.fixed_scalars("gcn_norm.deg", products, lambda p: 1.0 / np.sqrt(p))
        return sources, owners, norm_ids, None
    scale = weights.fixed_scalars("gcn_norm.inv_sqrt_deg", deg, lambda d: 1.0 / np.sqrt(d))
    return sources, owners, None, scale


def _dropout(stack: _Stack, p: float, what: str, h: int, n: int, width: int) -> int:
    """``h * mask``: a neuron per node multiplying (``prod``) its row of ``h`` and of a mask fact layer.

    On the input features (a fact layer) the mask layer is only declared, read by nothing:
    :class:`neurovec.dropout.Dropout` replaces the features themselves by ``x * mask`` at call
    time (NOTE: [input dropout] in :mod:`neurovec.dropout`).
    """
    if p == 0.0:
        return h
    mask = stack.add(FactLayer(dropout_layer_name(p, what), np.ones((1, 1) if isinstance(stack.layers[h], FactLayer)
                                                                       else (n, width)), copy=False))
    if isinstance(stack.layers[h], FactLayer):
        return h
    nodes = np.arange(n)
    return stack.add(NeuronLayer(f"{what}.dropout", np.full(n, 2), np.stack([np.full(n, h), np.full(n, mask)], 1).ravel(),
                                 np.repeat(nodes, 2), aggregation="prod", copy=False))


def build_gnn(ds, spec: GNNSpec, samples=None, seed: int = 0) -> Graph:
    """The neuron graph of ``spec`` over ``samples`` (default: the whole dataset, in order).

    ``ds`` is a TU dataset (samples are graphs) or a :class:`NodeDataset` (samples are nodes).
    """
    if isinstance(ds, NodeDataset):
        if not spec.node_level:
            raise DatasetError("a NodeDataset is one graph: build it at node level (readout=None)")
        batch = node_batch(ds, samples, len(spec.hidden), spec.subgraph)
        x, (src, dst), n, degree = batch.x, batch.edge_index, batch.n_nodes, batch.degree
    else:
        batch = tu_batch(ds, samples, spec.use_attributes)
        x, (src, dst), n, degree = batch.x, batch.edge_index, batch.n_nodes, None
    rng = np.random.default_rng(seed)
    weights = WeightTable()
    stack = _Stack()
    h = stack.add(FactLayer("x", x, copy=False))
    h = _dropout(stack, spec.input_dropout, "x", h, n, spec.in_dim)
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
        gcn_source, gcn_owner, gcn_weight, gcn_scale = _gcn_norm(weights, src, dst, n, degree)

    sorted_inputs: dict[str, tuple] = {}

    def inputs_once(key: str, make) -> tuple[np.ndarray, ...]:
        """``csr(*make())``, made once: every convolution reads the same adjacency, and its layers share
        these (read-only) arrays instead of sorting and holding one copy each."""
        if key not in sorted_inputs:
            owner, *columns = make()
            sorted_inputs[key] = _by_owner(owner, n, *columns)
        return sorted_inputs[key]

    last = len(spec.hidden)
    for k, width in enumerate(spec.hidden, start=1):
        act = spec.activation if k < last else "identity"
        conv = f"conv{k}"
        if spec.kind == "gcn":
            w, b = _layer_init(rng, width, in_dim)
            lin = stack.add(_dense(f"{conv}.lin", n, h, weights.add(f"{conv}.lin.weight", w), None, "identity"))
            if spec.normalize and gcn_scale is not None:  # NOTE: [GCN normalisation], factorised
                # Each node's row scaled by its own 1/sqrt(deg) once, then summed over the edges unweighted:
                # the products are the ones an edge would make (bit for bit), made once per node, not per edge.
                counts, source = inputs_once("gcn", lambda: (gcn_owner, gcn_source))
                bias = weights.add(f"{conv}.bias", b)
                scaled = stack.add(NeuronLayer(f"{conv}.scaled", np.ones(n, np.int64), np.full(n, lin), np.arange(n),
                                               gcn_scale, copy=False))
                agg = stack.add(NeuronLayer(f"{conv}.agg", counts, np.full(source.size, scaled), source, copy=False))
                h = stack.add(NeuronLayer(conv, np.ones(n, np.int64), np.full(n, agg), np.arange(n), gcn_scale,
                                          bias=np.full(n, bias), transformation=act, copy=False))
            else:
                counts, source, weight = (inputs_once("gcn", lambda: (gcn_owner, gcn_source, gcn_weight)) if spec.normalize
                                          else inputs_once("neighbours", neighbours_or_zero))
                bias = weights.add(f"{conv}.bias", b)  # (after inputs_once: the fixed zero comes first)
                h = stack.add(NeuronLayer(conv, counts, np.full(source.size, lin), source, weight,
                                          bias=np.full(n, bias), transformation=act, copy=False))
        elif spec.kind == "sage":
            w_l, b_l = _layer_init(rng, width, in_dim)
            w_r, _ = _layer_init(rng, width, in_dim)
            counts, source, weight = inputs_once("neighbours", neighbours_or_zero)
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
            counts, source, weight = inputs_once(f"gin{self_weight}", lambda: (
                np.concatenate([np.arange(n), dst]), np.concatenate([np.arange(n), src]),
                np.concatenate([np.full(n, self_weight), np.full(src.size, -1)])))
            agg = stack.add(NeuronLayer(f"{conv}.agg", counts, np.full(source.size, h), source, weight, copy=False))
            w1, b1 = _layer_init(rng, width, in_dim)
            w2, b2 = _layer_init(rng, width, width)
            mlp = stack.add(_dense(f"{conv}.mlp", n, agg, weights.add(f"{conv}.nn.0.weight", w1),
                                   weights.add(f"{conv}.nn.0.bias", b1), "relu"))
            h = stack.add(_dense(conv, n, mlp, weights.add(f"{conv}.nn.2.weight", w2),
                                 weights.add(f"{conv}.nn.2.bias", b2), act))
        if k < last:
            h = _dropout(stack, spec.dropout, conv, h, n, width)
        in_dim = width

    if spec.node_level:
        outputs = batch.outputs
        return Graph(stack.layers, weights.weights, np.full(outputs.size, h), outputs)
    # Readout: one pooling neuron per sample position (so repeated samples get their own).
    s = batch.samples.size
    counts, ordinal = csr(batch.batch, s, np.arange(n))
    pool = stack.add(NeuronLayer("pool", counts, np.full(n, h), ordinal, aggregation=spec.readout, copy=False))
    w, b = _layer_init(rng, spec.out_dim, in_dim)
    out = stack.add(_dense("out", s, pool, weights.add("lin.weight", w), weights.add("lin.bias", b),
                           spec.output_transformation))
    return Graph(stack.layers, weights.weights, np.full(s, out), np.arange(s))


class _Auto:
    """The default of ``readout``: ``"mean"`` for TU datasets, None (node level) for a NodeDataset."""

    def __repr__(self) -> str:
        return "<mean for graphs, None for a NodeDataset>"


AUTO = _Auto()


def _options(**options) -> dict:
    if options.get("readout") is AUTO:
        del options["readout"]
    return options


def gcn(ds, hidden=16, layers: int = 2, *, normalize: bool = True, readout=AUTO,
        output_transformation: str | None = None, out_dim: int | None = None, activation: str = "relu",
        dropout: float = 0.0, input_dropout: float = 0.0, subgraph: str = "k-hop",
        use_attributes: bool = False, samples=None, seed: int = 0) -> Graph:
    """GCN (PyG ``GCNConv``, with or without normalization) over ``samples``; see the module doc.

    Graph level (TU datasets; ``readout`` "mean", "sum" or "max"): a binary classifier by
    default, one sigmoid output per graph. Node level (a NodeDataset, or ``readout=None``):
    one logit vector per node, ``out_dim`` = the number of classes by default.
    """
    spec = GNNSpec.create("gcn", ds, hidden, layers, **_options(
        normalize=normalize, readout=readout, out_dim=out_dim, activation=activation, dropout=dropout,
        input_dropout=input_dropout, subgraph=subgraph, use_attributes=use_attributes,
        **({} if output_transformation is None else {"output_transformation": output_transformation})))
    return build_gnn(ds, spec, samples, seed)


def sage(ds, hidden=16, layers: int = 2, *, readout=AUTO, output_transformation: str | None = None,
         out_dim: int | None = None, activation: str = "relu", dropout: float = 0.0, input_dropout: float = 0.0,
         subgraph: str = "k-hop", use_attributes: bool = False, samples=None, seed: int = 0) -> Graph:
    """GraphSAGE (PyG ``SAGEConv``: mean of neighbours + root weight) over ``samples``; see :func:`gcn`."""
    spec = GNNSpec.create("sage", ds, hidden, layers, **_options(
        readout=readout, out_dim=out_dim, activation=activation, dropout=dropout, input_dropout=input_dropout,
        subgraph=subgraph, use_attributes=use_attributes,
        **({} if output_transformation is None else {"output_transformation": output_transformation})))
    return build_gnn(ds, spec, samples, seed)


def gin(ds, hidden=16, layers: int = 2, *, eps: float = 0.0, readout=AUTO, output_transformation: str | None = None,
        out_dim: int | None = None, activation: str = "relu", dropout: float = 0.0, input_dropout: float = 0.0,
        subgraph: str = "k-hop", use_attributes: bool = False, samples=None, seed: int = 0) -> Graph:
    """GIN (PyG ``GINConv`` with a 2-layer MLP, fixed ``eps``) over ``samples``; see :func:`gcn`."""
    spec = GNNSpec.create("gin", ds, hidden, layers, **_options(
        eps=eps, readout=readout, out_dim=out_dim, activation=activation, dropout=dropout,
        input_dropout=input_dropout, subgraph=subgraph, use_attributes=use_attributes,
        **({} if output_transformation is None else {"output_transformation": output_transformation})))
    return build_gnn(ds, spec, samples, seed)
