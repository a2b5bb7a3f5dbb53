"""Node-level GCN and GraphSAGE over one graph, whole or one rank's rows at a time.

    model = NodeGNN("gcn", x, edge_index, widths=(16, 7), seed=0)
    graph = model.graph()                           # the whole neuron graph (one process)
    plan = plan_rank(model, parts, rank)            # a rank's rows only: the whole graph is never built

One output per node: the last convolution's values (logits). Semantics are PyG's
(``edge_index[0]`` = source, ``edge_index[1]`` = target; ``act`` = ReLU after every
convolution but the last), as in :mod:`neurovec.datasets.gnn`:

* **GCN** (``GCNConv``): ``convK.lin_i = W h_i``, then ``convK_i = act(sum_{j in N(i) + i}
  c_ij convK.lin_j + b)`` with the fixed scalars ``c_ij = 1/sqrt(deg_i deg_j)``
  (degrees counting the self loop; a listed self loop is replaced by the one added,
  a repeated edge counts each time).
* **SAGE** (``SAGEConv``, mean): ``convK.mean_i = mean_{j in N(i)} h_j`` (an isolated
  node reads itself times the fixed weight 0, PyG's empty mean), then
  ``convK_i = act(W_l convK.mean_i + W_r h_i + b_l)``.

Weight names are the PyG twin's (``conv1.lin.weight``, ``conv1.bias``,
``conv2.lin_l.weight``, ...), initial values seeded (Glorot weights, biases uniform
in +-1/sqrt(fan in)), so every rank builds the same weights.

:class:`NodeGNN` is also a plan source (:mod:`neurovec.partition.plan`): it builds
the rows a rank owns from the edge list, in bulk, with each neuron's inputs in
exactly the order of the whole graph's, so a partitioned model computes the same
sums in the same order.
"""
from __future__ import annotations

import numpy as np

from ..datasets._common import WeightTable, glorot
from ..sources.graph import FactLayer, Graph, NeuronLayer
from .partitioner import PartitionError, sorted_unique
from .plan import Rows

__all__ = ["KINDS", "NodeGNN"]

KINDS = ("gcn", "sage")


def _layer_init(rng: np.random.Generator, out_dim: int, in_dim: int) -> tuple[np.ndarray, np.ndarray]:
    bound = 1.0 / np.sqrt(in_dim)
    return glorot(rng, (out_dim, in_dim)), rng.uniform(-bound, bound, size=out_dim)


class NodeGNN:
    """A node-level GCN or SAGE over ``x`` (n x features) and ``edge_index`` (2 x E); module doc."""

    def __init__(self, kind: str, x: np.ndarray, edge_index: np.ndarray, widths=(16, 7), seed: int = 0,
                 activation: str = "relu"):
        if kind not in KINDS:
            raise PartitionError(f"kind: unknown node-level model {kind!r} (expected one of {KINDS})")
        x = np.asarray(x)
        if x.ndim != 2:
            raise PartitionError(f"x: expected a (nodes, features) matrix (got shape {x.shape})")
        edge_index = np.asarray(edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2 or (edge_index.size and edge_index.dtype.kind not in "iu"):
            raise PartitionError(f"edge_index: expected (2, E) integer node ids (got shape {edge_index.shape}, "
                                 f"{edge_index.dtype})")
        n = x.shape[0]
        if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= n):
            bad = int(edge_index.min()) if edge_index.min() < 0 else int(edge_index.max())
            raise PartitionError(f"edge_index: node id {bad} is outside 0..{n - 1} (x has {n} rows)")
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise PartitionError(f"widths: need at least one convolution of positive width (got {widths})")
        self.kind, self.x, self.n_nodes, self.widths, self.activation = kind, x, n, widths, activation
        self.src, self.dst = np.asarray(edge_index, dtype=np.int64)  # no copy of int64 input
        self._build_weights(seed)
        self._layers()

    # -- the layer skeleton and weights -------------------------------------------------------

    def _neighbour_edges(self, mask: np.ndarray | None = None) -> np.ndarray:
        """The edges a neighbour aggregation reads (GCN: listed self loops left out), optionally
        only those where ``mask`` (one flag per edge) holds: their ids, in listed order."""
        if self.kind == "sage":
            return np.arange(self.src.size) if mask is None else np.flatnonzero(mask)
        keep = self.src != self.dst
        if mask is not None:
            keep &= mask
        return np.flatnonzero(keep)

    def _build_weights(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        table = WeightTable()
        n = self.n_nodes
        self._weight_ids: list[dict[str, int]] = []
        self._zero = None
        if self.kind == "gcn":
            # GCNConv: one self loop per node (listed ones replaced), c_ij = 1/sqrt(deg_i deg_j): one fixed
            # weight per distinct degree product, looked up per edge when a rank's rows are built.
            edges = self._neighbour_edges()
            self.degree = np.bincount(self.dst[edges], minlength=n) + 1
            self._products = sorted_unique(np.concatenate([self.degree * self.degree,
                                                           self.degree[self.dst[edges]] * self.degree[self.src[edges]]]))
            del edges
            first = len(table.weights)
            for p in self._products.tolist():
                table.add(f"gcn_norm.deg{p}", 1.0 / np.sqrt(p), learnable=False)
            self._product_weight = first + np.arange(self._products.size)
        else:
            self._isolated = np.bincount(self.dst, minlength=n) == 0
            if self._isolated.any():
                self._zero = table.add("fixed.zero", 0.0, learnable=False)
        in_dim = self.x.shape[1]
        for k, width in enumerate(self.widths, start=1):
            if self.kind == "gcn":
                w, b = _layer_init(rng, width, in_dim)
                self._weight_ids.append({"lin": table.add(f"conv{k}.lin.weight", w),
                                         "bias": table.add(f"conv{k}.bias", b)})
            else:
                w_l, b_l = _layer_init(rng, width, in_dim)
                w_r, _ = _layer_init(rng, width, in_dim)
                self._weight_ids.append({"l": table.add(f"conv{k}.lin_l.weight", w_l),
                                         "b": table.add(f"conv{k}.lin_l.bias", b_l),
                                         "r": table.add(f"conv{k}.lin_r.weight", w_r)})
            in_dim = width
        self.weights = tuple(table.weights)

    def _layers(self) -> None:
        names, shapes, facts, infos = ["x"], [(self.x.shape[1],)], [True], [{"unit": False}]
        last = len(self.widths)
        for k, width in enumerate(self.widths, start=1):
            act = self.activation if k < last else "identity"
            if self.kind == "gcn":
                names += [f"conv{k}.lin", f"conv{k}"]
                infos += [{"aggregation": "sum", "transformation": "identity"},
                          {"aggregation": "sum", "transformation": act}]
            else:
                names += [f"conv{k}.mean", f"conv{k}"]
                infos += [{"aggregation": "mean", "transformation": "identity"},
                          {"aggregation": "sum", "transformation": act}]
            shapes += [(width,) if self.kind == "gcn" else shapes[-1], (width,)]
            facts += [False, False]
        self.names, self.shapes, self.facts, self._infos = tuple(names), tuple(shapes), tuple(facts), infos
        self.sizes = tuple(self.n_nodes for _ in names)
        self.output_layer = np.full(self.n_nodes, len(names) - 1, np.int64)
        self.output_ordinal = np.arange(self.n_nodes, dtype=np.int64)

    # -- the plan source protocol ---------------------------------------------------------------

    def layer_info(self, index: int) -> dict:
        return self._infos[index]

    def layer_reads(self):
        for index in range(1, len(self.names)):
            k, second = divmod(index - 1, 2)  # conv k+1: first layer (lin / mean), second (the conv)
            h = 0 if k == 0 else 2 * k        # the convolution's input: x or the previous conv
            if second == 0:
                yield index, h
            else:
                yield index, index - 1
                if self.kind == "sage":
                    yield index, h

    def owners(self, parts: np.ndarray, world_size: int) -> dict[int, np.ndarray]:
        return {index: parts for index in range(1, len(self.names))}

    def _norm(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The fixed weight of c_ij for each edge ``src -> dst`` (a self loop: ``i -> i``)."""
        return self._product_weight[np.searchsorted(self._products, self.degree[dst] * self.degree[src])]

    def crossing(self, owners: dict[int, np.ndarray]) -> set[tuple[int, int]]:
        """Which layers read others across ranks: the neighbour aggregations, where an edge is cut."""
        parts = owners[1]
        if not np.any(parts[self.src] != parts[self.dst]):  # self loops never cross
            return set()
        if self.kind == "gcn":  # conv k reads conv k.lin of its neighbours
            return {(2 * k + 2, 2 * k + 1) for k in range(len(self.widths))}
        return {(2 * k + 1, 2 * k) for k in range(1, len(self.widths))}  # conv k.mean reads conv k-1 (not x)

    def sent(self, layer: int, owners: dict[int, np.ndarray], rank: int) -> tuple[np.ndarray, np.ndarray]:
        parts = owners[1]
        mask = np.flatnonzero((parts[self.src] == rank) & (parts[self.dst] != rank))  # never a self loop
        keys = sorted_unique(parts[self.dst[mask]] * np.int64(self.n_nodes) + self.src[mask])
        return keys // self.n_nodes, keys % self.n_nodes

    def fact_rows(self, index: int, rows: np.ndarray) -> np.ndarray:
        return self.x[rows]

    def rows(self, index: int, rows: np.ndarray) -> Rows:
        """Layer ``index``'s neurons ``rows`` (ascending) with their inputs, as the whole graph orders them."""
        k, second = divmod(index - 1, 2)
        h = 0 if k == 0 else 2 * k
        ids = self._weight_ids[k]
        m = rows.size
        none = np.full(m, -1, np.int64)
        if self.kind == "gcn" and second == 0:      # lin_i = W h_i
            return Rows(rows, np.ones(m, np.int64), np.full(m, h), rows, np.full(m, ids["lin"]), none)
        if self.kind == "sage" and second == 1:     # W_l mean_i + W_r h_i + b
            return Rows(rows, np.full(m, 2, np.int64), np.repeat([index - 1, h], m).reshape(2, m).T.ravel(),
                        np.repeat(rows, 2), np.tile([ids["l"], ids["r"]], m), np.full(m, ids["b"]))
        # A neighbour aggregation: self loop first (GCN), then the in-edges in listed order.
        wanted = np.zeros(self.n_nodes, bool)
        wanted[rows] = True
        edges = self._neighbour_edges(wanted[self.dst])
        owner, source = self.dst[edges], self.src[edges]
        del edges
        if self.kind == "gcn":
            read = index - 1
            edge_weight = np.concatenate([self._norm(rows, rows), self._norm(source, owner)])
            owner = np.concatenate([rows, owner])
            source = np.concatenate([rows, source])
        else:
            read = h
            edge_weight = np.full(owner.size, -1, np.int64)
            if self._zero is not None:
                lonely = rows[self._isolated[rows]]
                owner = np.concatenate([owner, lonely])
                source = np.concatenate([source, lonely])
                edge_weight = np.concatenate([edge_weight, np.full(lonely.size, self._zero)])
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.n_nodes)[rows]
        bias = np.full(m, ids["bias"]) if self.kind == "gcn" else none
        return Rows(rows, counts, np.full(order.size, read), source[order], edge_weight[order], bias)

    # -- the whole graph -------------------------------------------------------------------------

    def graph(self) -> Graph:
        """The whole neuron graph (every node's neurons), for one process."""
        everything = np.arange(self.n_nodes)
        layers = [FactLayer("x", self.x)]
        for index in range(1, len(self.names)):
            r = self.rows(index, everything)
            info = self._infos[index]
            layers.append(NeuronLayer(self.names[index], r.counts, r.input_layer, r.input_ordinal, r.input_weight,
                                      r.bias, info["aggregation"], info["transformation"], copy=False))
        return Graph(layers, self.weights, self.output_layer, self.output_ordinal)
