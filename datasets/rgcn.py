"""RGCN (relational graph convolution) templates, built in bulk as pre-grouped neuron graphs.

One convolution, as PyG's ``RGCNConv`` defines it (``aggr="mean"``, its default; ``"sum"`` too)::

    conv_i = act( W_root . h_i  +  sum_r  mean_{j in N_r(i)} W_r . h_j  +  b )

``N_r(i)`` are the sources of the edges of type ``r`` into ``i``; a type with no such edge adds
nothing (PyG's empty mean is 0). With ``num_bases`` B, ``W_r = sum_b comp[r, b] V_b``
(basis decomposition). ``act`` is ReLU between convolutions and the identity after the last.

The neuron graph of one convolution ``k`` (layer names in brackets):

* ``convK.rel``: one neuron per (target node, relation type) pair that has edges: the mean
  (or sum) of its sources' values, no weight. PyG computes the same ``propagate`` per relation
  before multiplying by ``W_r``;
* without bases, ``convK``: one neuron per node, the sum of ``W_r . rel_(i, r)`` over its pairs,
  ``W_root . h_i`` and the bias ``b``;
* with bases, ``convK.basis``: one neuron per (node, basis) of the nodes with edges, the sum
  of ``comp[r, b] * rel_(i, r)`` over the node's pairs; then ``convK`` sums ``V_b . basis_(i, b)``,
  the root term and the bias. (``sum_r W_r a_r = sum_b V_b sum_r comp[r, b] a_r``: the same
  function, products in another order.)

A node that has neither edges nor a root term reads itself times a fixed zero matrix,
``convK.zero`` (a neuron needs an input; PyG gives it 0 plus the bias).

Weight names follow the PyG twin's parameters (:mod:`neurovec.datasets.kg_twins`): relation
weights ``convK.weight.R`` (the twin's ``convK.weight[R]``, transposed: neurovec multiplies
``W . x`` with ``W`` of shape (out, in), PyG ``x @ W`` with (in, out)), basis weights
``convK.weight.B`` with scalars ``convK.comp.R.B``, ``convK.root`` and ``convK.bias``.

Two uses (:func:`rgcn`): entity classification on a graph with node features (the outputs
are the last convolution's rows of the chosen nodes: class logits), and the encoder of link
prediction (:func:`rgcn_encoder`): the node embeddings are a fact layer ``x`` that the caller
replaces at every call (``Settings(dynamic_facts=("x",))``), so that one compiled module serves
every training step while the embeddings, a torch parameter, learn.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sources.graph import FactLayer, Graph, NeuronLayer
from ._common import DatasetError, WeightTable, csr, glorot

__all__ = ["RGCNSpec", "rgcn", "rgcn_encoder", "relation_pairs", "AGGREGATIONS", "ACTIVATIONS"]

AGGREGATIONS = ("mean", "sum")
ACTIVATIONS = ("relu", "tanh", "identity")


@dataclass(frozen=True)
class RGCNSpec:
    """The hyperparameters shared by the RGCN template and its PyG twin."""

    in_dim: int
    hidden: tuple[int, ...]
    n_relations: int
    num_bases: int | None = None
    aggr: str = "mean"
    root_weight: bool = True
    bias: bool = True
    activation: str = "relu"

    @classmethod
    def create(cls, in_dim: int, n_relations: int, hidden=16, layers: int = 2, **options) -> "RGCNSpec":
        """Validate the template's arguments; ``hidden`` is one width or a list (then ``layers`` is ignored)."""
        widths = (int(hidden),) * int(layers) if np.isscalar(hidden) else tuple(int(h) for h in hidden)
        if not widths or min(widths) < 1:
            raise DatasetError(f"need at least one convolution with positive width (got hidden={hidden!r}, "
                               f"layers={layers!r})")
        spec = cls(int(in_dim), widths, int(n_relations), **options)
        if spec.in_dim < 1 or spec.n_relations < 1:
            raise DatasetError(f"in_dim and n_relations must be positive (got {spec.in_dim}, {spec.n_relations})")
        if spec.num_bases is not None and spec.num_bases < 1:
            raise DatasetError(f"num_bases must be positive (got {spec.num_bases})")
        if spec.aggr not in AGGREGATIONS:
            raise DatasetError(f"unknown aggr {spec.aggr!r} (expected one of {AGGREGATIONS})")
        if spec.activation not in ACTIVATIONS:
            raise DatasetError(f"unknown activation {spec.activation!r} (expected one of {ACTIVATIONS})")
        return spec


def relation_pairs(edge_index: np.ndarray, edge_type: np.ndarray, n_nodes: int, n_relations: int):
    """Group the edges by (target, type): ``(pair_node, pair_type, counts, sources)``.

    Pairs are numbered in (target, type) order; ``counts[p]`` edges of pair ``p`` follow each
    other in ``sources`` (in their input order). Whole-array: one stable sort of the edges.
    """
    src, dst = edge_index
    key = dst * n_relations + edge_type
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_key[1:] != sorted_key[:-1]])) if key.size else \
        np.zeros(0, np.int64)
    pair_key = sorted_key[starts]
    counts = np.diff(np.concatenate([starts, [key.size]])).astype(np.int64)
    return pair_key // n_relations, pair_key % n_relations, counts, src[order]


def _check_edges(edge_index, edge_type, n_nodes: int, n_relations: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    edge_index = np.asarray(edge_index)
    edge_type = np.asarray(edge_type)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2 or edge_type.shape != (edge_index.shape[1],):
        raise DatasetError(f"{where}: edge_index must be (2, E) and edge_type (E,) (got {edge_index.shape} and "
                           f"{edge_type.shape})")
    if not (np.issubdtype(edge_index.dtype, np.integer) and np.issubdtype(edge_type.dtype, np.integer)):
        raise DatasetError(f"{where}: edge_index and edge_type must be integer arrays (got {edge_index.dtype}, "
                           f"{edge_type.dtype})")
    bad = np.flatnonzero((edge_index < 0).any(0) | (edge_index >= n_nodes).any(0))
    if bad.size:
        raise DatasetError(f"{where}: edge {int(bad[0])} joins node {edge_index[:, bad[0]].tolist()}, outside the "
                           f"{n_nodes} nodes")
    bad = np.flatnonzero((edge_type < 0) | (edge_type >= n_relations))
    if bad.size:
        raise DatasetError(f"{where}: edge {int(bad[0])} has relation type {int(edge_type[bad[0]])}, but the "
                           f"template has {n_relations} relation types (0..{n_relations - 1})")
    return edge_index.astype(np.int64), edge_type.astype(np.int64)


def _init(rng: np.random.Generator, spec: RGCNSpec, k: int, in_dim: int, width: int) -> dict:
    """Initial values of convolution ``k`` (PyG's shapes: relation weights (in, out), glorot; zero bias)."""
    count = spec.num_bases if spec.num_bases is not None else spec.n_relations
    bound = np.sqrt(6.0 / (in_dim + width))  # glorot over each (in, out) block, as PyG's glorot of the 3-D tensor
    values = {"weight": rng.uniform(-bound, bound, size=(count, in_dim, width))}
    if spec.num_bases is not None:
        values["comp"] = glorot(rng, (spec.n_relations, spec.num_bases))
    if spec.root_weight:
        values["root"] = glorot(rng, (in_dim, width))
    if spec.bias:
        values["bias"] = np.zeros(width)
    return values


def rgcn(x: np.ndarray | None, edge_index, edge_type, spec: RGCNSpec, *, n_nodes: int | None = None,
         nodes=None, seed: int = 0, values: dict | None = None, fact_name: str = "x") -> Graph:
    """The neuron graph of ``spec`` over a typed graph; outputs: the last convolution's rows of ``nodes`` (default all).

    ``x`` (n, in_dim) node features; ``None`` gives a fact layer of zeros of that shape to be replaced
    at call time (``n_nodes`` then says how many nodes). ``values``: initial weight values by the PyG
    twin's parameter names (``{"conv1.weight": (R, in, out) array, ...}``), else drawn from ``seed``.
    """
    if x is None:
        if n_nodes is None:
            raise DatasetError("rgcn: give node features x, or n_nodes for features replaced at call time")
        x = np.zeros((int(n_nodes), spec.in_dim))
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != spec.in_dim:
        raise DatasetError(f"rgcn: x must be (nodes, {spec.in_dim}) (got {x.shape})")
    n = x.shape[0]
    edge_index, edge_type = _check_edges(edge_index, edge_type, n, spec.n_relations, "rgcn")
    pair_node, pair_type, pair_counts, pair_sources = relation_pairs(edge_index, edge_type, n, spec.n_relations)
    n_pairs = pair_node.size
    has_pairs = np.bincount(pair_node, minlength=n) > 0
    rng = np.random.default_rng(seed)
    weights = WeightTable()
    layers: list = [FactLayer(fact_name, x, copy=False)]
    h, in_dim = 0, spec.in_dim
    nodes_all = np.arange(n)
    for k, width in enumerate(spec.hidden, start=1):
        conv = f"conv{k}"
        init = _init(rng, spec, k, in_dim, width)
        if values:
            init.update({name.split(".", 1)[1]: np.asarray(v, dtype=np.float64) for name, v in values.items()
                         if name.startswith(conv + ".")})
        _check_shapes(init, spec, conv, in_dim, width)
        # (target, type) means, no weight: PyG's propagate per relation.
        rel = len(layers)
        layers.append(NeuronLayer(f"{conv}.rel", pair_counts, np.full(pair_sources.size, h), pair_sources,
                                  aggregation=spec.aggr, copy=False))
        owner, source_layer, source, weight = [], [], [], []
        count = spec.num_bases if spec.num_bases is not None else spec.n_relations
        ids = np.array([weights.add(f"{conv}.weight.{r}", init["weight"][r].T) for r in range(count)], np.int64)
        if spec.num_bases is None:
            owner.append(pair_node), source_layer.append(np.full(n_pairs, rel)), source.append(np.arange(n_pairs))
            weight.append(ids[pair_type])
        else:
            b_count = spec.num_bases
            comp = np.array([[weights.add(f"{conv}.comp.{r}.{b}", init["comp"][r, b]) for b in range(b_count)]
                             for r in range(spec.n_relations)], np.int64).reshape(spec.n_relations, b_count)
            # convK.basis: a neuron per (node with pairs, basis b): sum_r comp[r, b] * rel_(i, r).
            with_pairs = np.flatnonzero(has_pairs)
            basis_of_node = np.full(n, -1, np.int64)
            basis_of_node[with_pairs] = np.arange(with_pairs.size)
            basis_owner = (basis_of_node[pair_node][:, None] * b_count + np.arange(b_count)).ravel()
            basis_source = np.repeat(np.arange(n_pairs), b_count)
            basis_weight = comp[pair_type].ravel()
            counts, basis_source, basis_weight = csr(basis_owner, with_pairs.size * b_count, basis_source, basis_weight)
            basis = len(layers)
            layers.append(NeuronLayer(f"{conv}.basis", counts, np.full(basis_source.size, rel), basis_source,
                                      basis_weight, aggregation="sum", copy=False))
            owner.append(np.repeat(with_pairs, b_count))
            source_layer.append(np.full(with_pairs.size * b_count, basis))
            source.append(np.arange(with_pairs.size * b_count))
            weight.append(np.tile(ids, with_pairs.size))
        if spec.root_weight:
            root = weights.add(f"{conv}.root", init["root"].T)
            owner.append(nodes_all), source_layer.append(np.full(n, h)), source.append(nodes_all)
            weight.append(np.full(n, root))
        else:
            lonely = np.flatnonzero(~has_pairs)
            if lonely.size:  # a node without edges and without a root term: its own input times a zero matrix
                zero = weights.add(f"{conv}.zero", np.zeros((width, in_dim)), learnable=False)
                owner.append(lonely), source_layer.append(np.full(lonely.size, h)), source.append(lonely)
                weight.append(np.full(lonely.size, zero))
        bias = np.full(n, weights.add(f"{conv}.bias", init["bias"])) if spec.bias else None
        owner = np.concatenate(owner)
        counts, source_layer, source, weight = csr(owner, n, np.concatenate(source_layer), np.concatenate(source),
                                                   np.concatenate(weight))
        act = spec.activation if k < len(spec.hidden) else "identity"
        layers.append(NeuronLayer(conv, counts, source_layer, source, weight, bias, aggregation="sum",
                                  transformation=act, copy=False))
        h, in_dim = len(layers) - 1, width
    out = np.arange(n) if nodes is None else np.asarray(nodes, dtype=np.int64).reshape(-1)
    if out.size and (out.min() < 0 or out.max() >= n):
        raise DatasetError(f"rgcn: output nodes must be in 0..{n - 1}")
    return Graph(layers, weights.weights, np.full(out.size, h), out)


def _check_shapes(init: dict, spec: RGCNSpec, conv: str, in_dim: int, width: int) -> None:
    count = spec.num_bases if spec.num_bases is not None else spec.n_relations
    expected = {"weight": (count, in_dim, width), "root": (in_dim, width), "bias": (width,)}
    if spec.num_bases is not None:
        expected["comp"] = (spec.n_relations, spec.num_bases)
    for name, shape in expected.items():
        if name in init and init[name].shape != shape:
            raise DatasetError(f"weight {conv}.{name}: expected shape {shape} (got {init[name].shape})")


def rgcn_encoder(kg, hidden=16, layers: int = 2, *, num_bases: int | None = None, seed: int = 0,
                 values: dict | None = None, inverse: bool = True, aggr: str = "mean",
                 n_relations: int | None = None) -> Graph:
    """The RGCN encoder of link prediction over ``kg``'s training triples (with inverse edges).

    Its input is the fact layer ``x`` of shape (n_entities, ``hidden``), zeros here: compile with
    ``Settings(dynamic_facts=("x",))`` and pass the embeddings at every call, ``module(facts={"x": emb})``.
    Its outputs are every entity's encoding, (n_entities, last width). ``n_relations``: the
    relation count the template was made for (a trained model's); a knowledge graph with another
    count is an error naming the file and line of the first relation the template does not know.
    """
    edge_index, edge_type = kg.message_edges(inverse)
    n_types = kg.n_relations * (2 if inverse else 1)
    if n_relations is not None and n_relations != kg.n_relations:
        raise DatasetError(_relation_count_message(kg, n_relations))
    widths = (int(hidden),) * int(layers) if np.isscalar(hidden) else tuple(int(h) for h in hidden)
    spec = RGCNSpec.create(widths[0], n_types, widths, num_bases=num_bases, aggr=aggr)
    return rgcn(None, edge_index, edge_type, spec, n_nodes=kg.n_entities, seed=seed, values=values)


def _relation_count_message(kg, n_relations: int) -> str:
    if kg.n_relations > n_relations:
        extra = kg.relations[n_relations]
        rows = np.flatnonzero(kg.train[:, 1] == n_relations)
        where = kg.where("train", int(rows[0])) if rows.size else f"{kg.name} train"
        return (f"{where}: relation {str(extra)!r} is relation number {n_relations + 1}, but the template has "
                f"{n_relations} relations (the knowledge graph has {kg.n_relations}); load it with the template's "
                "relation vocabulary, load_kg(..., relations=...), to see which relations differ")
    path = kg.sources.get("train", (None,))[0] or f"{kg.name} train"
    return (f"{path}: the knowledge graph has {kg.n_relations} relations, but the template has {n_relations}; "
            "load it with the template's relation vocabulary, load_kg(..., relations=...)")
