"""Families of one-constant rules (``W_e emb(A) :- type(A, e)`` for every ``e``) are grounded in one pass and
assembled whole; the graph must be the one that grounding the rules one at a time gives, array for array."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from neurovec.sources.relational import Metadata, Query, R, Relation, Template, V, ground
from neurovec.sources.relational.template import Aggregation, Transformation

from .relational_cases import (KINDS, assert_families_give_one_rule_at_a_time, draw_family, relation,
                               sqlite_database, weight)
from .test_relational import assert_same_graph


def _facts(rng, n_examples: int, n_nodes: int, repeated: bool) -> tuple[dict, dict]:
    """``a(X)`` with values; ``t(X, K)`` (or ``t(X, X, K)``) unit facts, a node may have several kinds or none;
    returns the relations and the same facts per example for the brute-force oracle."""
    worlds, a, t = {}, [], []
    for e in range(n_examples):
        world = {}
        for x in range(n_nodes):
            world[("a", (x,))] = round(float(rng.normal()), 3)
            a.append((e, (x,), world[("a", (x,))]))
            for k in KINDS[:3]:
                if x == 0 or rng.random() < 0.45:
                    args = (x, x, k) if repeated else (x, k)
                    world[("t", args)] = 1.0
                    t.append((e, args))
            if repeated and rng.random() < 0.3:   # t(X, Y, K) with Y != X: no grounding of t(X, X, K)
                world[("t", (x, x + 1, "k0"))] = 1.0
                t.append((e, (x, x + 1, "k0")))
        worlds[e] = world
    return {"a": relation(a, [r[2] for r in a]), "t": relation(t)}, worlds


def _template(draw, repeated: bool) -> Template:
    """A family over ``t`` and its variations (another rule of the head, weights, offsets, aggregations). The first
    kind occurs at node 0 of every example (q is derived)."""
    family = draw_family(draw)
    t = Template()
    if draw(st.booleans()):   # another rule of the head before the family
        t += R.h(V.X)[weight(draw)] <= R.a(V.X)
    for r, k in enumerate(family.kinds):
        literal = R.t(V.X, V.X, k) if repeated else R.t(V.X, k)
        if r == family.literal_weight:
            literal = literal[weight(draw)]
        head = R.h(V.X)[weight(draw)] if family.head_weights else R.h(V.X)
        body = (literal, weight(draw)) if r == family.offset else literal
        t += (head <= body) | Metadata(aggregation=family.aggregation)
    if draw(st.booleans()):   # and one after it
        t += R.h(V.X) <= R.a(V.X)[weight(draw)]
    t += R.h / 1 | Metadata(transformation=draw(st.sampled_from([Transformation.TANH, Transformation.IDENTITY])))
    t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    return t


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(0, 2 ** 31), st.integers(1, 3), st.integers(1, 5), st.booleans())
def test_families_give_the_graph_of_one_rule_at_a_time(data, seed, n_examples, n_nodes, repeated):
    template = _template(data.draw, repeated)
    relations, worlds = _facts(np.random.default_rng(seed), n_examples, n_nodes, repeated)
    examples = sorted({int(e) for e in relations["a"].example})
    found = assert_families_give_one_rule_at_a_time(template, relations, worlds,
                                                    queries=(R.q, Query("q", example=examples[-1:])))
    for grounding in found:
        assert any(g.family for stage in grounding.stages for g in stage.groundings), \
            "the family was not grounded as one"


def test_an_embedding_family_is_one_atom_layer():
    """An embedding family: one atom layer whose inputs are the unit fact with each rule's head weight, no other
    neurons."""
    relations = {"t": Relation((np.array([0, 0, 1, 2, 2, 3]), np.array(["c", "h", "c", "o", "h", "n"])),
                               example=[0, 0, 0, 1, 1, 1])}
    t = Template()
    for k in "chon":
        t += R.emb(V.A)[f"W_{k}": (2,)] <= R.t(V.A, k)
    t += R.emb / 1 | Metadata(transformation=Transformation.TANH)
    t += R.q[1, 2] <= R.emb(V.A)
    grounding = ground(t, relations, R.q)
    (family,) = [g for stage in grounding.stages for g in stage.groundings if g.family]
    assert [r.index for r in family.family] == [0, 1, 2, 3] and family.size == 6
    emb = grounding.graph.layer("emb")
    names = [grounding.graph.weights[w].name for w in emb.input_weight]
    assert emb.counts.tolist() == [2, 1, 2, 1] and names == ["W_c", "W_h", "W_c", "W_h", "W_o", "W_n"]
    assert set(emb.input_layer.tolist()) == {0}   # the unit fact (rules in template order within an atom)
    assert [layer.name for layer in grounding.graph.layers] == ["unit", "emb", "rule4:q:avg", "q"]


def test_families_in_sql_give_the_arrays_graph(tmp_path):
    """The SQL grounder joins a family once too (its rows say whose they are): the same graph as from arrays, for a
    family kept whole, one taken apart (a literal weight), and without pruning."""
    relations, _ = _facts(np.random.default_rng(7), 3, 5, repeated=False)
    database = sqlite_database(tmp_path / "kinds.db", relations, {"a": ("x",), "t": ("x", "k")})
    for literal_weight in (False, True):
        t = Template()
        t += R.h(V.X)[0.5] <= R.a(V.X)
        for k in ("k2", "k0", "k3", "k1"):
            literal = R.t(V.X, k)[1.5] if literal_weight and k == "k0" else R.t(V.X, k)
            t += R.h(V.X)[f"W_{k}": 2.0] <= literal
        t += R.h / 1 | Metadata(transformation=Transformation.TANH)
        t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
        for prune in (True, False):
            in_sql = ground(t, database, R.q, prune=prune)
            assert any(g.family for stage in in_sql.stages for g in stage.groundings)
            assert_same_graph(in_sql.graph, ground(t, relations, R.q, prune=prune).graph)
