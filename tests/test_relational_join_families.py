"""Join families: rules of one body shape that differ in one constant (the rule per edge type of an RGCN,
``W_t h(Y) :- a(X), _e(X, t, Y)``) are joined once for all their constants and assembled in whole arrays; the graph
must be the one that grounding the rules one at a time gives, array for array, and the SQL grounder's (which joins
them one by one), except that a family's aggregation neurons are one layer, not one per rule
(``relational_cases.with_join_family_layers`` merges the per-rule layers of those)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neurovec.sources.relational import Metadata, R, Relation, Template, V, ground
from neurovec.sources.relational.template import Aggregation, Transformation

from .relational_cases import (KINDS, assert_families_give_one_rule_at_a_time, draw_family, one_rule_at_a_time,
                               relation, sqlite_database, weight, with_join_family_layers)
from .test_relational import assert_same_graph, outputs


def _facts(rng, n_examples: int, n_nodes: int) -> tuple[dict, dict]:
    """``a(X)`` with values, ``e(X, K, Y)`` unit facts (k3 never occurs), ``b(Z, X)`` unit facts; the relations and
    the same facts per example for the brute-force oracle."""
    worlds, a, e, b = {}, [], [], []
    for ex in range(n_examples):
        world = {}
        for x in range(n_nodes):
            world[("a", (x,))] = round(float(rng.normal()), 3)
            a.append((ex, (x,), world[("a", (x,))]))
            for y in range(n_nodes):
                for k in KINDS[:3]:
                    if rng.random() < 0.3:
                        world[("e", (x, k, y))] = 1.0
                        e.append((ex, (x, k, y)))
                if rng.random() < 0.3:
                    world[("b", (x, y))] = 1.0
                    b.append((ex, (x, y)))
        if ("e", (0, "k0", n_nodes - 1)) not in world:   # every example has an edge
            world[("e", (0, "k0", n_nodes - 1))] = 1.0
            e.append((ex, (0, "k0", n_nodes - 1)))
        worlds[ex] = world

    relations = {"a": relation(a, [r[2] for r in a]), "e": relation(e)}
    if b:
        relations["b"] = relation(b)
    return relations, worlds


def _template(draw, with_b: bool) -> tuple[Template, int]:
    """A join family over ``e``'s kinds and its variations: repeated kinds (which end a family), head weights, a
    literal weight or an offset on one rule, the aggregation, the body order, a visible edge literal (two inputs),
    a comparison, a variable only in a hidden literal (duplicate groundings), other rules of the head around it."""
    family = draw_family(draw)
    edge_first, visible = draw(st.booleans()), draw(st.booleans())
    extra = draw(st.sampled_from(["none", "neq", "hidden"] + (["b"] if with_b else [])))
    t = Template()
    if draw(st.booleans()):   # another rule of the head before the family
        t += R.h(V.Y)[weight(draw)] <= R.a(V.Y)
    for r, k in enumerate(family.kinds):
        source = R.a(V.X)[weight(draw)] if r == family.literal_weight else R.a(V.X)
        edge = R.e(V.X, k, V.Y) if visible else R.hidden.e(V.X, k, V.Y)
        body = [edge, source] if edge_first else [source, edge]
        if extra == "neq":
            body.append(R.special.neq(V.X, V.Y))
        elif extra == "b":   # Z occurs only here: several groundings with the same inputs are one
            body.append(R.hidden.b(V.Z, V.X))
        if r == family.offset:
            body.append(weight(draw))
        head = R.h(V.Y)[weight(draw)] if family.head_weights else R.h(V.Y)
        t += (head <= tuple(body)) | Metadata(aggregation=family.aggregation)
    if draw(st.booleans()):   # and one after it
        t += R.h(V.Y) <= R.a(V.Y)[weight(draw)]
    t += R.h / 1 | Metadata(transformation=draw(st.sampled_from([Transformation.TANH, Transformation.IDENTITY])))
    t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    return t, len(family.kinds)


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(0, 2 ** 31), st.integers(1, 3), st.integers(1, 4))
def test_join_families_give_the_graph_of_one_rule_at_a_time(data, seed, n_examples, n_nodes):
    relations, worlds = _facts(np.random.default_rng(seed), n_examples, n_nodes)
    template, _ = _template(data.draw, "b" in relations)
    assert_families_give_one_rule_at_a_time(template, relations, worlds, may_fail=True)


def test_an_rgcn_layer_is_one_join_and_assembled_whole():
    """The rule per edge type of an RGCN layer is one join family, kept whole: an aggregation layer per edge type
    (where some head has two groundings), named and ordered as one rule at a time gives them."""
    src, kind, dst = np.array([0, 1, 2, 0, 3, 1]), np.array([0, 0, 1, 1, 2, 0]), np.array([1, 1, 1, 2, 2, 3])
    relations = {"a": Relation(np.arange(4), values=np.arange(4.0) + 1), "e": Relation((src, kind, dst))}
    t = Template()
    t += R.h(V.Y)[0.5] <= R.a(V.Y)
    for k in range(3):
        t += (R.h(V.Y)[f"W_{k}": 1.0 + k] <= (R.a(V.X), R.hidden.e(V.X, k, V.Y))) | \
            Metadata(aggregation=Aggregation.AVG)
    t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    grounding = ground(t, relations, R.q)
    (family,) = [g for stage in grounding.stages for g in stage.groundings if g.family]
    assert family.joined and [r.index for r in family.family] == [1, 2, 3] and family.size == 6
    names = [layer.name for layer in grounding.graph.layers]
    assert names == ["a", "rule1:h:avg", "h", "q"]   # only type 0 has a head (1) with two groundings
    with pytest.MonkeyPatch.context() as patch:
        one_rule_at_a_time(patch)
        assert_same_graph(grounding.graph, with_join_family_layers(ground(t, relations, R.q).graph, grounding.graph))
    # h(1) = 0.5 * 2 + 1 * mean(a(0), a(1)) + 2 * a(2); h(2) = 0.5 * 3 + 2 * a(0) + 3 * a(3); ...
    h = {0: 0.5, 1: 0.5 * 2 + 1 * 1.5 + 2 * 3, 2: 0.5 * 3 + 2 * 1 + 3 * 4, 3: 0.5 * 4 + 1 * 2}
    np.testing.assert_allclose(outputs(grounding.graph).reshape(-1), [sum(h.values())], rtol=1e-12)


def test_join_families_in_sql_give_the_arrays_graph(tmp_path):
    """The SQL grounder joins the rules one by one: the same graph as the arrays' join family, pruned or not."""
    relations, _ = _facts(np.random.default_rng(3), 3, 5)
    database = sqlite_database(tmp_path / "edges.db", relations, {"a": ("x",), "e": ("x", "k", "y")})
    t = Template()
    t += R.h(V.Y)[0.5] <= R.a(V.Y)
    for k in ("k2", "k0", "k3", "k1"):
        t += (R.h(V.Y)[f"W_{k}": 2.0] <= (R.a(V.X), R.hidden.e(V.X, k, V.Y))) | Metadata(aggregation=Aggregation.AVG)
    t += R.h / 1 | Metadata(transformation=Transformation.TANH)
    t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    for prune in (True, False):
        in_arrays = ground(t, relations, R.q, prune=prune)
        assert any(g.joined for stage in in_arrays.stages for g in stage.groundings)
        assert_same_graph(in_arrays.graph, with_join_family_layers(ground(t, database, R.q, prune=prune).graph,
                                                                   in_arrays.graph))


@pytest.mark.parametrize("second_input", [False, True])
def test_a_join_family_joined_from_another_literal_is_sorted_by_rule(second_input):
    """When the join starts from another literal than the constant's (here ``a(X)``, far smaller than the dense edges),
    the groundings come out by head, all rules mixed: they are sorted by rule, then head and inputs, as one rule at a
    time gives them."""
    n = 6
    src, kind, dst = (g.reshape(-1) for g in np.meshgrid(np.arange(n), np.arange(3), np.arange(n), indexing="ij"))
    keep = (src * 7 + kind * 3 + dst) % 4 != 0
    relations = {"a": Relation(np.arange(n), values=np.arange(n) * 0.25 - 0.5),
                 "e": Relation((src[keep], kind[keep], dst[keep]))}
    t = Template()
    for k in (2, 0, 1):
        body = (R.a(V.X), R.hidden.e(V.X, k, V.Y)) + ((R.a(V.Y),) if second_input else ())
        t += (R.h(V.X)[f"W_{k}": 1.0 + k] <= body) | Metadata(aggregation=Aggregation.SUM)
    t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    grounding = ground(t, relations, R.q)
    (family,) = [g for stage in grounding.stages for g in stage.groundings if g.family]
    assert family.joined and family.size > 0
    with pytest.MonkeyPatch.context() as patch:
        one_rule_at_a_time(patch)
        assert_same_graph(grounding.graph, with_join_family_layers(ground(t, relations, R.q).graph, grounding.graph))
