"""Node-level GCN and GraphSAGE over one graph, whole or one rank's rows at a time.

    model = NodeGNN("gcn", x, edge_index, widths=(16, 7), seed=0)
    graph = model.graph()                           # the whole neuron graph (one process)
    plan = plan_rank(model, parts, rank)            # a rank's rows only: the whole graph is never built

One output per node: the last convolution's values (logits). Semantics are PyG's
(``edge_index[0]`` = source, ``edge_index[1]`` = target; ``act`` = ReLU after every
convolution but the last), as in :mod:`neurovec.datasets.gnn`:

* **GCN** (``GCNConv``): ``act(sum_{j in N(i) + i} c_ij W h_j + b)`` with
  ``c_ij = d_i d_j``, ``d_i = 1/sqrt(deg_i)`` (degrees counting the self loop; a listed
  self loop is replaced by the one added, a repeated edge counts each time), as PyG's
  ``gcn_norm`` computes it. The normalisation is factored per node, so that its fixed
  weights are one per distinct degree (hundreds), not one per distinct product
  ``deg_i deg_j`` (277k on a quarter of products-like: a buffer each in every compiled
  program)::

      convK.lin_i = W h_i
      convK.src_j = d_j convK.lin_j                       # the row other ranks read
      convK_i     = act(sum_{j in N(i) + i} d_i convK.src_j + b)

  This equals ``datasets.gcn``'s ``1/sqrt(deg_i deg_j)`` to rounding (1e-16 relative).
* **SAGE** (``SAGEConv``, mean): ``convK.mean_i = mean_{j in N(i)} h_j`` (an isolated
  node reads itself times the fixed weight 0, PyG's empty mean), then
  ``convK_i = act(W_l convK.mean_i + W_r h_i + b_l)``.

Weight names are the PyG twin's (``conv1.lin.weight``, ``conv1.bias``,
``conv2.lin_l.weight``, ...), initial values seeded (Glorot weights, biases uniform
in +-1/sqrt(fan in), drawn in the order of :mod:`neurovec.datasets.gnn`), so every
rank builds the same weights.

A *shard* (``partition.shards``): one rank's edges (the in-edges of its nodes and the
edges from its nodes to other ranks') and the feature rows it reads (``x_ids``) of an
``n_nodes`` graph, with ``cut`` saying whether any edge of the whole graph is cut: the
rank's rows are then exactly the whole graph's, and no rank ever loads the whole graph.

:class:`NodeGNN` is also a plan source (:mod:`neurovec.partition.plan`): it builds
the rows a rank owns from an in-edge CSR made once, in bulk, with each neuron's
inputs in exactly the order of the whole graph's (self loop first, then the
in-edges as listed), so a partitioned model computes the same sums in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..datasets._common import WeightTable, glorot
from ..sources.graph import FactLayer, Graph, NeuronLayer
from .partitioner import PartitionError, sorted_unique
from .plan import Rows, select_edges

__all__ = ["KINDS", "NodeGNN"]

KINDS = ("gcn", "sage")


def _layer_init(rng: np.random.Generator, out_dim: int, in_dim: int) -> tuple[np.ndarray, np.ndarray]:
    bound = 1.0 / np.sqrt(in_dim)
    return glorot(rng, (out_dim, in_dim)), rng.uniform(-bound, bound, size=out_dim)


@dataclass(frozen=True)
class _Layer:
    """One neuron layer of the template: what each of its neurons reads (``role``), from which layers."""

    name: str
    role: str            # "dense" (W h_i), "scale" (d_i h_i), "gcn" (sum of d_i src_j), "mean", "sage"
    reads: tuple[int, ...]
    shape: tuple[int, ...]
    aggregation: str = "sum"
    transformation: str = "identity"
    weights: tuple[int, ...] = ()   # learnable weight indices the role uses
    bias: int = -1


class NodeGNN:
    """A node-level GCN or SAGE over ``x`` (n x features) and ``edge_index`` (2 x E); module doc."""

    def __init__(self, kind: str, x: np.ndarray, edge_index: np.ndarray, widths=(16, 7), seed: int = 0,
                 activation: str = "relu", *, x_ids: np.ndarray | None = None, n_nodes: int | None = None,
                 cut: bool | None = None):
        if kind not in KINDS:
            raise PartitionError(f"kind: unknown node-level model {kind!r} (expected one of {KINDS})")
        x = np.asarray(x)
        if x.ndim != 2:
            raise PartitionError(f"x: expected a (nodes, features) matrix (got shape {x.shape})")
        edge_index = np.asarray(edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2 or (edge_index.size and edge_index.dtype.kind not in "iu"):
            raise PartitionError(f"edge_index: expected (2, E) integer node ids (got shape {edge_index.shape}, "
                                 f"{edge_index.dtype})")
        n = x.shape[0] if n_nodes is None else int(n_nodes)
        if x_ids is not None:  # a shard: x holds only the rows x_ids (ascending) of an n_nodes graph
            x_ids = np.asarray(x_ids, dtype=np.int64)
            if x_ids.shape != (x.shape[0],) or (x_ids.size and (np.any(x_ids[1:] <= x_ids[:-1]) or x_ids[-1] >= n)):
                raise PartitionError(f"x_ids: expected {x.shape[0]} ascending node ids below {n}, one per row of x")
        elif x.shape[0] != n:
            raise PartitionError(f"x: {x.shape[0]} rows for a graph of n_nodes={n} (pass x_ids for a shard)")
        if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= n):
            bad = int(edge_index.min()) if edge_index.min() < 0 else int(edge_index.max())
            raise PartitionError(f"edge_index: node id {bad} is outside 0..{n - 1} (x has {n} rows)")
        self.x_ids, self._cut = x_ids, cut
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise PartitionError(f"widths: need at least one convolution of positive width (got {widths})")
        self.kind, self.x, self.n_nodes, self.widths, self.activation = kind, x, n, widths, activation
        self.src, self.dst = np.asarray(edge_index, dtype=np.int64)  # no copy of int64 input
        # The edges each node reads, grouped by node in listed order (GCN: listed self loops left out).
        edges = np.flatnonzero(self.src != self.dst) if kind == "gcn" else np.arange(self.src.size)
        in_degree = np.bincount(self.dst[edges], minlength=n)
        self._in_edges = edges[np.argsort(self.dst[edges], kind="stable")].astype(
            np.int32 if self.src.size < 2**31 else np.int64)
        del edges
        self._in_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(in_degree, out=self._in_ptr[1:])
        table = WeightTable()
        if kind == "gcn":  # d_i = 1/sqrt(deg_i): one fixed weight per distinct degree
            degrees, self._degree_weight = np.unique(in_degree + 1, return_inverse=True)
            self._degree_weight = self._degree_weight.reshape(-1) + len(table.weights)
            for d in degrees.tolist():
                table.add(f"gcn_norm.d{d}", 1.0 / np.sqrt(d), learnable=False)
            self._zero = None
        else:  # an isolated node's empty mean is 0: it reads itself times the fixed 0
            self._zero = table.add("fixed.zero", 0.0, learnable=False) if np.any(in_degree == 0) else None
        self._layers = self._template(table, seed)
        self.weights = tuple(table.weights)
        self.names = ("x",) + tuple(layer.name for layer in self._layers)
        self.shapes = ((x.shape[1],),) + tuple(layer.shape for layer in self._layers)
        self.facts = (True,) + (False,) * len(self._layers)
        self.sizes = (n,) * len(self.names)
        self.output_layer = np.full(n, len(self.names) - 1, np.int64)
        self.output_ordinal = np.arange(n, dtype=np.int64)

    def _template(self, table: WeightTable, seed: int) -> list[_Layer]:
        """The neuron layers (index = position + 1, after the fact layer ``x`` at 0) and their weights."""
        rng = np.random.default_rng(seed)
        layers: list[_Layer] = []
        h, in_dim = 0, self.x.shape[1]
        for k, width in enumerate(self.widths, start=1):
            act = self.activation if k < len(self.widths) else "identity"
            first = len(layers) + 1
            if self.kind == "gcn":
                w, b = _layer_init(rng, width, in_dim)
                lin, bias = table.add(f"conv{k}.lin.weight", w), table.add(f"conv{k}.bias", b)
                layers += [_Layer(f"conv{k}.lin", "dense", (h,), (width,), weights=(lin,)),
                           _Layer(f"conv{k}.src", "scale", (first,), (width,)),
                           _Layer(f"conv{k}", "gcn", (first + 1,), (width,), transformation=act, bias=bias)]
            else:
                w_l, b_l = _layer_init(rng, width, in_dim)
                w_r, _ = _layer_init(rng, width, in_dim)
                ids = (table.add(f"conv{k}.lin_l.weight", w_l), table.add(f"conv{k}.lin_r.weight", w_r))
                bias = table.add(f"conv{k}.lin_l.bias", b_l)
                layers += [_Layer(f"conv{k}.mean", "mean", (h,), (in_dim,), aggregation="mean"),
                           _Layer(f"conv{k}", "sage", (first, h), (width,), transformation=act, weights=ids,
                                  bias=bias)]
            h, in_dim = len(layers), width
        return layers

    # -- the plan source protocol ---------------------------------------------------------------

    def layer_info(self, index: int) -> dict:
        if index == 0:
            return {"unit": False}
        layer = self._layers[index - 1]
        return {"aggregation": layer.aggregation, "transformation": layer.transformation}

    def layer_reads(self):
        for index, layer in enumerate(self._layers, start=1):
            for s in layer.reads:
                yield index, s

    def owners(self, parts: np.ndarray, world_size: int) -> dict[int, np.ndarray]:
        return {index: parts for index in range(1, len(self.names))}

    def crossing(self, owners: dict[int, np.ndarray]) -> set[tuple[int, int]]:
        """Which layers read others across ranks: the neighbour aggregations of computed rows, where an
        edge is cut (a neighbour's facts are constants every rank keeps). A shard sees only its own
        edges: ``cut`` (given) says for every rank alike."""
        parts = owners[1]
        cut = self._cut if self._cut is not None else bool(np.any(parts[self.src] != parts[self.dst]))
        if not cut:  # self loops never cross
            return set()
        return {(index, layer.reads[0]) for index, layer in enumerate(self._layers, start=1)
                if layer.role in ("gcn", "mean") and layer.reads[0] != 0}

    def sent(self, layer: int, owners: dict[int, np.ndarray], rank: int) -> tuple[np.ndarray, np.ndarray]:
        parts = owners[1]
        mask = np.flatnonzero((parts[self.src] == rank) & (parts[self.dst] != rank))  # never a self loop
        keys = sorted_unique(parts[self.dst[mask]] * np.int64(self.n_nodes) + self.src[mask])
        return keys // self.n_nodes, keys % self.n_nodes

    def fact_rows(self, index: int, rows: np.ndarray) -> np.ndarray:
        if self.x_ids is None:
            return self.x[rows]
        positions = np.searchsorted(self.x_ids, rows)
        found = self.x_ids[np.minimum(positions, self.x_ids.size - 1)] if self.x_ids.size else rows + 1
        if np.any(found != rows):
            raise PartitionError("x: this shard holds no features for some node a rank reads (x_ids is missing it)")
        return self.x[positions]

    def rows(self, index: int, rows: np.ndarray) -> Rows:
        """Layer ``index``'s neurons ``rows`` (ascending) with their inputs, as the whole graph orders them."""
        layer = self._layers[index - 1]
        m = rows.size
        none = np.full(m, -1, np.int64)
        one = np.ones(m, np.int64)
        if layer.role == "dense":    # W h_i
            return Rows(rows, one, np.full(m, layer.reads[0]), rows, np.full(m, layer.weights[0]), none)
        if layer.role == "scale":    # d_i lin_i
            return Rows(rows, one, np.full(m, layer.reads[0]), rows, self._degree_weight[rows], none)
        if layer.role == "sage":     # W_l mean_i + W_r h_i + b
            return Rows(rows, np.full(m, 2, np.int64), np.tile(np.array(layer.reads), m), np.repeat(rows, 2),
                        np.tile(np.array(layer.weights), m), np.full(m, layer.bias))
        # A neighbour aggregation: self loop first (GCN), then the in-edges in listed order (an
        # isolated SAGE node: itself times the fixed 0), from the in-edge CSR in bulk.
        n_in = self._in_ptr[rows + 1] - self._in_ptr[rows]
        source_in = self.src[self._in_edges[select_edges(self._in_ptr, rows)]]
        extra = one if layer.role == "gcn" else (n_in == 0).astype(np.int64)
        counts = n_in + extra
        own = (np.cumsum(counts) - counts)[extra == 1]  # the slot of the self loop / the lonely self read
        others = np.ones(int(counts.sum()), bool)
        others[own] = False
        source = np.empty(others.size, np.int64)
        source[own] = rows[extra == 1]
        source[others] = source_in
        if layer.role == "gcn":      # every input weighted by the reader's d_i
            weight = np.repeat(self._degree_weight[rows], counts)
            bias = np.full(m, layer.bias)
        else:
            weight = np.full(others.size, -1, np.int64)
            weight[own] = -1 if self._zero is None else self._zero
            bias = none
        return Rows(rows, counts, np.full(source.size, layer.reads[0]), source, weight, bias)

    # -- the whole graph -------------------------------------------------------------------------

    def graph(self) -> Graph:
        """The whole neuron graph (every node's neurons), for one process."""
        everything = np.arange(self.n_nodes)
        layers = [FactLayer("x", self.x)]
        for index, spec in enumerate(self._layers, start=1):
            r = self.rows(index, everything)
            layers.append(NeuronLayer(spec.name, r.counts, r.input_layer, r.input_ordinal, r.input_weight, r.bias,
                                      spec.aggregation, spec.transformation, copy=False))
        return Graph(layers, self.weights, self.output_layer, self.output_ordinal)
