"""Ready-made templates: the GNNs of ``datasets.gnn`` and the Mutagenesis models of ``datasets.relational`` as rules.

Each function returns ``(template, facts, queries)``; ``template.ground(facts, queries)`` builds the graph.
Weight names equal those of the hand-written templates (and of the PyG twins), so ``values={name: array}``
reproduces any of their weights exactly; names not given are drawn from ``seed``.

TU graphs are relations over node ids, with one example per graph::

    feature(I)    the node's feature vector (one-hot labels, optionally attributes first)
    edge(J, I)    a message from J to I (unit facts)
    norm(J, I)    GCN's 1/sqrt(deg_i deg_j), self-loops included (deg counts them)
    loop(J, I)    the edges and a self-loop at every node (GIN's sum over the node and its neighbours)

Mutagenesis is read straight from the database ``datasets.create_database`` writes (:func:`mutagenesis_facts`).
"""
from __future__ import annotations

import numpy as np

from .data import Query, Relation
from .sql import Database, SQLRelation
from .template import Aggregation, Combination, Metadata, R, Template, TemplateError, Transformation, V

__all__ = ["tu_facts", "tu_queries", "gcn", "sage", "gin", "mutagenesis", "mutagenesis_facts",
           "mutagenesis_database", "mutagenesis_queries", "MUTAGENESIS_SQL", "ATOM_ELEMENTS"]


def tu_facts(ds, use_attributes: bool = False, norm: bool = False, zero_self_loops: bool = False,
             loops: bool = False, edges: bool = True) -> dict:
    """The relations of a :class:`neurovec.datasets.TUDataset`: ``feature``, ``edge`` (not with ``edges=False``);
    with ``norm`` also ``norm``, with ``loops`` also ``loop`` (the edges and a self-loop at every node).

    ``zero_self_loops`` adds ``edge(i, i)`` with value 0 for every node without incoming edges (the hand-written
    GCN without normalization reads such a node times 0, so that it still has a value)."""
    graph = ds.graph_of_node
    src, dst = ds.edge_index
    nodes = np.arange(ds.n_nodes)
    facts = {"feature": Relation(nodes, values=ds.node_features(use_attributes), example=graph)}
    if zero_self_loops:
        isolated = np.flatnonzero(np.bincount(dst, minlength=ds.n_nodes) == 0)
        facts["edge"] = Relation((np.concatenate([src, isolated]), np.concatenate([dst, isolated])),
                                 values=np.concatenate([np.ones(src.size), np.zeros(isolated.size)]),
                                 example=graph[np.concatenate([src, isolated])])
    elif edges:
        facts["edge"] = Relation((src, dst), example=graph[src])
    if loops:
        facts["loop"] = Relation((np.concatenate([src, nodes]), np.concatenate([dst, nodes])),
                                 example=graph[np.concatenate([src, nodes])])
    if norm:
        degree = np.bincount(dst, minlength=ds.n_nodes) + 1            # the self-loop counts
        j, i = np.concatenate([src, nodes]), np.concatenate([dst, nodes])
        facts["norm"] = Relation((j, i), values=1.0 / np.sqrt(degree[i] * degree[j]), example=graph[j])
    return facts


def tu_queries(ds, samples=None) -> Query:
    """One ``predict`` per graph of ``samples`` (default: all, in order)."""
    samples = np.arange(ds.n_graphs) if samples is None else np.asarray(samples).reshape(-1)
    return Query("predict", example=samples)


def _widths(hidden, layers: int) -> tuple:
    return (int(hidden),) * int(layers) if np.isscalar(hidden) else tuple(int(h) for h in hidden)


def _readout(template: Template, source: str, width: int, readout: str, output_transformation: str,
             out_dim: int, values: dict) -> None:
    """``predict = T(W . readout_i h(i) + b)`` with the PyG twin's ``lin`` weights."""
    aggregation = {"mean": Aggregation.AVG, "sum": Aggregation.SUM}[readout]
    template += (R.predict[_w("lin.weight", values, (out_dim, width))] <= R.get(source)(V.X)) | \
        Metadata(aggregation=aggregation)
    template += R.predict / 0 | Metadata(offset=_w("lin.bias", values, (out_dim,)),
                                         transformation=_TRANSFORM[output_transformation])


_TRANSFORM = {"sigmoid": Transformation.SIGMOID, "identity": Transformation.IDENTITY, "relu": Transformation.RELU,
              "tanh": Transformation.TANH}


def _w(name: str, values: dict | None, shape: tuple):
    """A named weight: the given value, or just its shape (random from the grounding's seed)."""
    value = (values or {}).get(name)
    if value is not None and np.shape(value) != shape:
        raise TemplateError(f"weight {name!r}: expected shape {shape} (got {np.shape(value)})")
    return slice(name, np.asarray(value, dtype=np.float64) if value is not None else shape)


def gcn(ds, hidden=16, layers: int = 2, *, normalize: bool = True, readout: str = "mean",
        output_transformation: str = "sigmoid", out_dim: int = 1, activation: str = "relu",
        use_attributes: bool = False, samples=None, values: dict | None = None):
    """``datasets.gcn`` as rules: ``conv_k(I) = act(W_k . sum_J h(J) * norm(J, I) + b_k)``."""
    widths = _widths(hidden, layers)
    in_dim = ds.node_features(use_attributes).shape[1]
    template, source = Template(), "feature"
    edge = "norm" if normalize else "edge"
    for k, width in enumerate(widths, start=1):
        conv = f"conv{k}"
        act = activation if k < len(widths) else "identity"
        template += (R.get(conv)(V.I)[_w(f"{conv}.lin.weight", values, (width, in_dim))] <=
                     (R.get(source)(V.J), R.get(edge)(V.J, V.I))) | \
            Metadata(combination=Combination.PRODUCT, aggregation=Aggregation.SUM)
        template += R.get(conv) / 1 | Metadata(offset=_w(f"{conv}.bias", values, (width,)),
                                               transformation=_TRANSFORM[act])
        source, in_dim = conv, width
    _readout(template, source, in_dim, readout, output_transformation, out_dim, values)
    facts = tu_facts(ds, use_attributes, norm=normalize, zero_self_loops=not normalize, edges=not normalize)
    return template, facts, tu_queries(ds, samples)


def sage(ds, hidden=16, layers: int = 2, *, readout: str = "mean", output_transformation: str = "sigmoid",
         out_dim: int = 1, activation: str = "relu", use_attributes: bool = False, samples=None,
         values: dict | None = None):
    """``datasets.sage`` as rules: ``conv_k(I) = act(W_l . avg_J h(J) + W_r . h(I) + b)`` over ``_edge(J, I)``."""
    widths = _widths(hidden, layers)
    in_dim = ds.node_features(use_attributes).shape[1]
    template, source = Template(), "feature"
    for k, width in enumerate(widths, start=1):
        conv = f"conv{k}"
        act = activation if k < len(widths) else "identity"
        template += (R.get(conv)(V.I)[_w(f"{conv}.lin_l.weight", values, (width, in_dim))] <=
                     (R.get(source)(V.J), R.hidden.edge(V.J, V.I))) | Metadata(aggregation=Aggregation.AVG)
        template += R.get(conv)(V.I)[_w(f"{conv}.lin_r.weight", values, (width, in_dim))] <= R.get(source)(V.I)
        template += R.get(conv) / 1 | Metadata(offset=_w(f"{conv}.lin_l.bias", values, (width,)),
                                               transformation=_TRANSFORM[act])
        source, in_dim = conv, width
    _readout(template, source, in_dim, readout, output_transformation, out_dim, values)
    return template, tu_facts(ds, use_attributes), tu_queries(ds, samples)


def gin(ds, hidden=16, layers: int = 2, *, eps: float = 0.0, readout: str = "mean",
        output_transformation: str = "sigmoid", out_dim: int = 1, activation: str = "relu",
        use_attributes: bool = False, samples=None, values: dict | None = None):
    """``datasets.gin`` as rules: ``agg_k(I) = (1 + eps) h(I) + sum_J h(J)``, then a two-layer MLP."""
    widths = _widths(hidden, layers)
    in_dim = ds.node_features(use_attributes).shape[1]
    template, source = Template(), "feature"
    for k, width in enumerate(widths, start=1):
        conv, agg, mlp = f"conv{k}", f"conv{k}_agg", f"conv{k}_mlp"
        act = activation if k < len(widths) else "identity"
        if eps == 0:  # one rule over the edges and self-loops: one aggregation neuron per node
            template += (R.get(agg)(V.I) <= (R.get(source)(V.J), R.hidden.loop(V.J, V.I))) | \
                Metadata(aggregation=Aggregation.SUM)
        else:
            template += R.get(agg)(V.I) <= R.get(source)(V.I)[slice(f"{conv}.one_plus_eps", 1.0 + eps)].fixed()
            template += (R.get(agg)(V.I) <= (R.get(source)(V.J), R.hidden.edge(V.J, V.I))) | \
                Metadata(aggregation=Aggregation.SUM)
        template += R.get(mlp)(V.I)[_w(f"{conv}.nn.0.weight", values, (width, in_dim))] <= R.get(agg)(V.I)
        template += R.get(mlp) / 1 | Metadata(offset=_w(f"{conv}.nn.0.bias", values, (width,)),
                                              transformation=Transformation.RELU)
        template += R.get(conv)(V.I)[_w(f"{conv}.nn.2.weight", values, (width, width))] <= R.get(mlp)(V.I)
        template += R.get(conv) / 1 | Metadata(offset=_w(f"{conv}.nn.2.bias", values, (width,)),
                                               transformation=_TRANSFORM[act])
        source, in_dim = conv, width
    _readout(template, source, in_dim, readout, output_transformation, out_dim, values)
    return template, tu_facts(ds, use_attributes, loops=eps == 0), tu_queries(ds, samples)


# -- Mutagenesis -------------------------------------------------------------------------------------------------
ATOM_ELEMENTS = ("br", "c", "cl", "f", "h", "i", "n", "o")


def mutagenesis_facts(ds) -> dict:
    """Relations of a loaded :class:`neurovec.datasets.Mutagenesis` (:func:`mutagenesis_database` reads the same
    from the database): ``atom_type(A, T)``, ``bond(X, Y, B)`` (both directions), ``bond_type(B, T)``; one example
    per molecule (its index); atoms are their indices, bonds ``n_atoms + `` their index."""
    x, y, bond = ds.directed
    elements = np.asarray(ds.element_names)[ds.atom_element]
    # Atoms, bonds and molecules by their indices (the dataset's order): integer constants join fastest.
    n_atoms = ds.n_atoms
    return {"atom_type": Relation((np.arange(n_atoms), elements), example=ds.atom_molecule),
            "bond": Relation((x, y, n_atoms + bond), example=ds.atom_molecule[x]),
            "bond_type": Relation((n_atoms + np.arange(ds.n_bonds), ds.bond_type_values[ds.bond_type]),
                                  example=ds.bond_molecule)}


# The same relations, read by the database (the schema of ``datasets.create_database``); a bond's constant is
# "atom1-atom2" of its row, chlorine and bromine are told apart by their type as ``datasets.load_mutagenesis`` does.
_ELEMENT = ("CASE WHEN a.element = 'c' AND a.type = 93 THEN 'cl' WHEN a.element = 'b' AND a.type = 94 THEN 'br' "
            "ELSE a.element END")
MUTAGENESIS_SQL = {
    "atom_type": f"SELECT a.atom_id AS atom, {_ELEMENT} AS element, a.molecule_id AS molecule FROM atom a",
    "bond": "SELECT b.atom1_id AS x, b.atom2_id AS y, b.atom1_id || '-' || b.atom2_id AS bond, "
            "a.molecule_id AS molecule FROM bond b JOIN atom a ON a.atom_id = b.atom1_id UNION ALL "
            "SELECT b.atom2_id, b.atom1_id, b.atom1_id || '-' || b.atom2_id, a.molecule_id "
            "FROM bond b JOIN atom a ON a.atom_id = b.atom1_id",
    "bond_type": "SELECT b.atom1_id || '-' || b.atom2_id AS bond, b.type AS type, a.molecule_id AS molecule "
                 "FROM bond b JOIN atom a ON a.atom_id = b.atom1_id",
}


def mutagenesis_database(url_or_path):
    """The Mutagenesis relations of a database written by ``datasets.create_database``, grounded in SQL."""
    return Database(url_or_path, {
        "atom_type": SQLRelation(MUTAGENESIS_SQL["atom_type"], ("atom", "element"), example="molecule"),
        "bond": SQLRelation(MUTAGENESIS_SQL["bond"], ("x", "y", "bond"), example="molecule"),
        "bond_type": SQLRelation(MUTAGENESIS_SQL["bond_type"], ("bond", "type"), example="molecule")})


def mutagenesis_queries(ds, samples=None, by_id: bool = False) -> Query:
    """One ``predict`` per molecule of ``samples`` (default all): examples by index (as :func:`mutagenesis_facts`
    numbers them), or by molecule id (``by_id``, as the database names them)."""
    ids = np.asarray(ds.molecule_ids) if by_id else np.arange(ds.n_molecules)
    return Query("predict", example=ids if samples is None else ids[np.asarray(samples).reshape(-1)])


def mutagenesis(elements, bond_types, architecture: str = "simple", dim: int = 3, bond_dim: int | None = None, *,
                layers: int = 3, aggregation: str = "mean", activation: str = "tanh",
                values: dict | None = None) -> Template:
    """Thesis 6.3 "simple" and "dims" (``datasets.mutagenesis_template``) as rules, over ``atom_type(A, T)``,
    ``bond(X, Y, B)`` and ``bond_type(B, T)``::

        W_e atom_embed(A) :- atom_type(A, e).     for every element e   (an embedding: W_e . 1)
        W_t bond_embed(B) :- bond_type(B, t).     for every bond type t
        layer_k(X) :- W_x h(X), W_y h(Y), _bond(X, Y, B), [W_b] bond_embed(B)[, bond(X, Y, B)].
        W_out predict :- layer_K(X).

    "dims" makes bond embeddings ``bond_dim`` long and maps them with ``W_b``; its explicit ``bond(X, Y, B)`` is
    a fact of value 1, broadcast over the sum (NeuraLogic's reading; the hand-written graph stores it as a vector
    of ones). All neurons but the output use ``activation``.
    """
    if architecture not in ("simple", "dims"):
        raise TemplateError(f"unknown architecture {architecture!r} (expected 'simple' or 'dims')")
    dims = architecture == "dims"
    bond_dim = (bond_dim or 1) if dims else dim
    act = _TRANSFORM[activation]
    agg = {"mean": Aggregation.AVG, "sum": Aggregation.SUM, "max": Aggregation.MAX}[aggregation]
    rng_free = values or {}
    template = Template()
    for e in elements:
        template += R.atom_embed(V.A)[_w(f"atom_embed.{e}", rng_free, (dim,))] <= R.atom_type(V.A, e)
    for t in bond_types:
        template += R.bond_embed(V.B)[_w(f"bond_embed.type{t}", rng_free, (bond_dim,))] <= R.bond_type(V.B, int(t))
    template += R.atom_embed / 1 | Metadata(transformation=act)
    template += R.bond_embed / 1 | Metadata(transformation=act)
    previous = "atom_embed"
    for k in range(1, layers + 1):
        head = f"layer{k}"
        body = [R.get(previous)(V.X)[_w(f"{head}.atom_x", rng_free, (dim, dim))],
                R.get(previous)(V.Y)[_w(f"{head}.atom_y", rng_free, (dim, dim))]]
        if dims:
            body += [R.bond_embed(V.B)[_w(f"{head}.bond", rng_free, (dim, bond_dim))], R.bond(V.X, V.Y, V.B)]
        else:
            body += [R.hidden.bond(V.X, V.Y, V.B), R.bond_embed(V.B)]
        template += (R.get(head)(V.X) <= body) | Metadata(transformation=act, aggregation=agg)
        template += R.get(head) / 1 | Metadata(transformation=act)
        previous = head
    template += (R.predict[_w("out.weight", rng_free, (1, dim))] <= R.get(previous)(V.X)) | \
        Metadata(aggregation=Aggregation.AVG)
    template += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    return template
