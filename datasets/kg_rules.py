"""Link prediction as rules: an RGCN encoder and a DistMult score written in ``neurovec.relational``.

The model of :mod:`neurovec.datasets.rgcn` and :mod:`neurovec.datasets.link_prediction`, as a
NeuraLogic template (PyNeuraLogic 0.9.2's syntax, NeuraLogic's semantics), grounded natively::

    h0(E)    :- W_emb ent(E).                                       % the entity embedding (one-hot facts)
    W_root,k hk(I) :- h{k-1}(I).                         [avg]      % root term
    W_k,t hk(I)    :- h{k-1}(J), _edge(J, t, I).         [avg]      % one rule per edge type t
    hk(I)    :- b_k node(I).                              [avg]      % the bias (node(E): a unit fact per entity)
    hk/1     [transformation = relu]                                % identity after the last layer
    rel(R)   :- W_rel relid(R).                                     % the relation embedding
    {ones} score(H, R, T) :- hL(H), rel(R), hL(T), _query(H, R, T).  [combination = elproduct]

NeuraLogic's semantics give, per edge type, the mean over that type's groundings (an
aggregation neuron per rule and head), times the rule's head weight, summed over the rules of a
head: exactly PyG's ``RGCNConv`` with ``aggr="mean"``, which also averages before it multiplies
(NeuraLogic's own ``neuralogic.nn.module.RGCNConv`` puts the weight in the body instead, one
product per grounding: the same function, more neurons); the bias is a rule over a unit fact per entity (PyNeuraLogic has no predicate offsets in
Python), whose rule neuron is ``b_k`` itself. The score is ``sum_k hL(H)[k] rel(R)[k] hL(T)[k]``: the elementwise product of the three
vectors, summed by a fixed row of ones. The queries are the triples to score, listed in the
hidden ``_query`` facts, so only they are grounded.

Constants are the ids themselves (ints: entity ``i``, edge type ``t``, inverse types ``R + t``) for
neurovec, which joins ints fastest; PyNeuraLogic's constants are strings, ``e<i>`` and ``r<t>``
(a name starting with a capital would be a variable there). Weight names are
those of the numpy template (``conv1.weight.3``, ``conv1.root``, ``conv1.bias``) and of
:class:`~neurovec.datasets.link_prediction.LinkPredictor` (``node_emb``, ``rel_emb``, transposed):
``values={name: array}`` gives them explicitly, shapes as neurovec multiplies them (out, in).

:func:`neuralogic_model` builds the same template and dataset in PyNeuraLogic (imported lazily),
for checking against NeuraLogic's own engine and for timing its grounding.
"""
from __future__ import annotations

import numpy as np

from ._common import DatasetError

__all__ = ["template", "facts", "queries", "initial_values", "neuralogic_model", "entity", "edge_type"]


def entity(i) -> np.ndarray:
    return np.char.add("e", np.asarray(i).astype(str))


def edge_type(t) -> np.ndarray:
    return np.char.add("r", np.asarray(t).astype(str))


def initial_values(n_entities: int, n_types: int, n_relations: int, dim: int, layers: int = 2,
                   seed: int = 0) -> dict:
    """Seeded weights for :func:`template` (and :func:`neuralogic_model`), by name, shapes (out, in)."""
    rng = np.random.default_rng(seed)
    bound = np.sqrt(6.0 / (2 * dim))
    values = {"node_emb": rng.normal(size=(dim, n_entities)), "rel_emb": rng.normal(size=(dim, n_relations))}
    for k in range(1, layers + 1):
        for t in range(n_types):
            values[f"conv{k}.weight.{t}"] = rng.uniform(-bound, bound, size=(dim, dim))
        values[f"conv{k}.root"] = rng.uniform(-bound, bound, size=(dim, dim))
        values[f"conv{k}.bias"] = rng.uniform(-0.1, 0.1, size=dim)
    return values


def _given(values: dict, name: str, shape: tuple) -> np.ndarray:
    if name not in values:
        raise DatasetError(f"kg_rules: no value for weight {name!r}")
    value = np.asarray(values[name], dtype=np.float64)
    if value.shape != shape:
        raise DatasetError(f"kg_rules: weight {name!r} has shape {value.shape}, expected {shape}")
    return value


def template(n_entities: int, n_types: int, n_relations: int, dim: int, layers: int = 2, values: dict | None = None,
             activation: str = "relu"):
    """The template of the module doc (a ``neurovec.relational.Template``); ``values`` default to
    :func:`initial_values` with seed 0."""
    from ..sources.relational import Aggregation, Combination, Metadata, R, Template, Transformation, V

    values = values or initial_values(n_entities, n_types, n_relations, dim, layers)
    act = {"relu": Transformation.RELU, "tanh": Transformation.TANH, "identity": Transformation.IDENTITY}[activation]

    def w(name, shape):
        return slice(name, _given(values, name, shape))

    t = Template()
    t += R.h0(V.E)[w("node_emb", (dim, n_entities))] <= R.ent(V.E)
    for k in range(1, layers + 1):
        head, prev = R.get(f"h{k}"), R.get(f"h{k - 1}")
        t += (head(V.I)[w(f"conv{k}.root", (dim, dim))] <= prev(V.I)) | Metadata(aggregation=Aggregation.AVG)
        for r in range(n_types):
            t += (head(V.I)[w(f"conv{k}.weight.{r}", (dim, dim))] <= (prev(V.J), R.hidden.edge(V.J, r, V.I))) | \
                Metadata(aggregation=Aggregation.AVG)
        t += (head(V.I) <= R.node(V.I)[w(f"conv{k}.bias", (dim,))]) | Metadata(aggregation=Aggregation.AVG)
        t += R.get(f"h{k}") / 1 | Metadata(transformation=act if k < layers else Transformation.IDENTITY)
    t += R.rel(V.R)[w("rel_emb", (dim, n_relations))] <= R.relid(V.R)
    last = R.get(f"h{layers}")
    t += (R.score(V.H, V.R, V.T)[slice("score.ones", np.ones((1, dim)))].fixed() <=
          (last(V.H), R.rel(V.R), last(V.T), R.hidden.query(V.H, V.R, V.T))) | \
        Metadata(combination=Combination.ELPRODUCT)
    return t


def facts(kg, triples, inverse: bool = True) -> dict:
    """The relations: ``ent`` (one-hot), ``node`` (unit), ``relid`` (one-hot), ``edge(J, t, I)`` (the training triples, and
    their inverses), ``query(H, R, T)`` (the triples to score)."""
    from ..sources.relational import Relation

    (src, dst), types = kg.message_edges(inverse)
    triples = np.unique(np.asarray(triples, dtype=np.int64).reshape(-1, 3), axis=0)  # a fact once; queries repeat
    entities = np.arange(kg.n_entities)
    return {"ent": Relation(entities, values=np.eye(kg.n_entities)), "node": Relation(entities),
            "relid": Relation(np.arange(kg.n_relations), values=np.eye(kg.n_relations)),
            "edge": Relation((src, types, dst)), "query": Relation((triples[:, 0], triples[:, 1], triples[:, 2]))}


def queries(triples):
    """One ``score(h, r, t)`` output per triple, in order."""
    from ..sources.relational import Query

    triples = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    # One example, the graph: relations without an example column hold in it, example 0.
    return Query("score", args=(triples[:, 0], triples[:, 1], triples[:, 2]), example=[0])


def neuralogic_model(kg, triples, dim: int, layers: int = 2, values: dict | None = None, inverse: bool = True,
                     activation: str = "relu"):
    """The same template and data in PyNeuraLogic: ``(model, dataset)``, one example (the graph), one query per
    triple (in order). Build with ``model.build(Settings(...))`` and ``model.build_dataset(dataset)``."""
    from neuralogic.core import Aggregation, Combination, Metadata, Model, R, Transformation, V
    from neuralogic.dataset import Dataset

    n_types = kg.n_relations * (2 if inverse else 1)
    values = values or initial_values(kg.n_entities, n_types, kg.n_relations, dim, layers)
    act = {"relu": Transformation.RELU, "tanh": Transformation.TANH, "identity": Transformation.IDENTITY}[activation]

    def w(name, shape):
        return _given(values, name, shape).tolist()

    model = Model()
    model += R.h0(V.E)[w("node_emb", (dim, kg.n_entities))] <= R.ent(V.E)
    for k in range(1, layers + 1):
        head, prev = R.get(f"h{k}"), R.get(f"h{k - 1}")
        model += (head(V.I)[w(f"conv{k}.root", (dim, dim))] <= prev(V.I)) | Metadata(aggregation=Aggregation.AVG)
        for r in range(n_types):
            model += (head(V.I)[w(f"conv{k}.weight.{r}", (dim, dim))] <=
                      (prev(V.J), R.hidden.edge(V.J, str(edge_type(r)), V.I))) | Metadata(aggregation=Aggregation.AVG)
        model += (head(V.I) <= R.node(V.I)[w(f"conv{k}.bias", (dim,))]) | Metadata(aggregation=Aggregation.AVG)
        model += R.get(f"h{k}") / 1 | Metadata(transformation=act if k < layers else Transformation.IDENTITY)
    model += R.rel(V.R)[w("rel_emb", (dim, kg.n_relations))] <= R.relid(V.R)
    last = R.get(f"h{layers}")
    model += (R.score(V.H, V.R, V.T)[np.ones((1, dim)).tolist()].fixed() <=
              (last(V.H), R.rel(V.R), last(V.T), R.hidden.query(V.H, V.R, V.T))) | \
        Metadata(combination=Combination.ELPRODUCT)
    (src, dst), types = kg.message_edges(inverse)
    triples = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    eye_e, eye_r = np.eye(kg.n_entities), np.eye(kg.n_relations)
    example = [R.ent(str(entity(i)))[eye_e[i].tolist()] for i in range(kg.n_entities)]
    example += [R.node(str(entity(i))) for i in range(kg.n_entities)]
    example += [R.relid(str(edge_type(r)))[eye_r[r].tolist()] for r in range(kg.n_relations)]
    example += [R.edge(str(a), str(t), str(b)) for a, t, b in zip(entity(src), edge_type(types), entity(dst))]
    distinct = np.unique(triples, axis=0)
    example += [R.query(str(h), str(r), str(t)) for h, r, t in
                zip(entity(distinct[:, 0]), edge_type(distinct[:, 1]), entity(distinct[:, 2]))]
    asked = [R.score(str(h), str(r), str(t)) for h, r, t in
             zip(entity(triples[:, 0]), edge_type(triples[:, 1]), entity(triples[:, 2]))]
    dataset = Dataset()
    dataset.add(asked, example)
    return model, dataset
