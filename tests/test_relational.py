"""neurovec.relational: templates grounded by joins, checked against a brute-force grounder.

The oracle below grounds a template the slow, obvious way (every substitution of every rule, per example, then
NeuraLogic's neuron semantics evaluated recursively in Python), for tiny random data. The join-based grounder's
graph, run by the reference engine and compiled under presets, must give its numbers.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.relational import (C, Metadata, Query, R, Relation, Template, TemplateError, V, ground)
from neurovec.sources.relational.template import (Aggregation, Combination, Constant, Transformation, Variable,
                                                  WeightSpec)

from .equivalence import assert_equivalent


def outputs(graph, preset=None) -> np.ndarray:
    if preset is None:
        return ReferenceModule(graph, torch.float64)().detach().numpy()
    return neurovec.compile(graph, preset, dtype=torch.float64)().detach().numpy()


# -- the brute-force oracle (scalar values and weights) -----------------------------------------------------------
_T = {"identity": lambda x: x, "sigmoid": lambda x: 1 / (1 + math.exp(-x)), "tanh": math.tanh,
      "relu": lambda x: max(x, 0.0), "reverse": lambda x: 1 - x}
_C = {"sum": sum, "avg": lambda v: sum(v) / len(v), "max": max, "min": min, "product": math.prod,
      "count": len}


def _name(function, default):
    return function.name if function is not None else default


def brute_force(template: Template, facts: dict, example_queries: list) -> list:
    """NeuraLogic's value of each (example, predicate, args) query; ``facts``: example -> {(pred, args): value}."""
    out = []
    for example, predicate, args in example_queries:
        world = facts[example]
        constants = sorted({c for (_, a) in world for c in a} |
                           {t.value for r in template.rules for lit in [r.head, *r.body] for t in lit.terms
                            if isinstance(t, Constant)}, key=str)
        true = set(world)
        groundings = {}
        changed = True
        while changed:  # the least model, by trying every substitution
            changed = False
            for rule in template.rules:
                names = sorted({v for lit in rule.body for v in lit.variables})
                for values in itertools.product(constants, repeat=len(names)):
                    sub = dict(zip(names, values))
                    term = lambda t: sub[t.name] if isinstance(t, Variable) else t.value  # noqa: E731
                    ok = True
                    for lit in rule.body:
                        args_ = tuple(term(t) for t in lit.terms)
                        if lit.special:
                            a, b = args_
                            ok &= {"neq": a != b, "eq": a == b}[lit.name]
                        else:
                            ok &= (lit.name, args_) in true
                    if not ok:
                        continue
                    head = (rule.head.name, tuple(term(t) for t in rule.head.terms))
                    inputs = tuple((lit.name, tuple(term(t) for t in lit.terms)) for lit in rule.literals)
                    key = (rule.index, head)
                    if inputs not in groundings.setdefault(key, []):
                        groundings[key].append(inputs)
                    if head not in true:
                        true.add(head)
                        changed = True

        def value(atom, seen=()):
            assert atom not in seen, "cycle"
            rules = [r for r in template.rules if (r.index, atom) in groundings]
            if not rules:
                return world[atom]
            inputs, weighted = [], False
            for rule in rules:
                rule_values = []
                for g in groundings[(rule.index, atom)]:
                    xs = []
                    for lit, a in zip(rule.literals, g):
                        v = value(a, seen + (atom,))
                        if lit.function is not None:
                            v = _T[lit.function.name](v)
                        xs.append(float(lit.weight.value) * v if lit.weight is not None else v)
                    if rule.offset is not None:
                        xs = [float(rule.offset.value)] + xs
                    rule_values.append(_T[_name(rule.metadata.transformation, "identity")](
                        _C[_name(rule.metadata.combination, "sum")](xs)))
                agg = _C[_name(rule.metadata.aggregation, "avg")](rule_values)
                if rule.head.weight is not None:
                    agg, weighted = float(rule.head.weight.value) * agg, True
                inputs.append(agg)
            spec = template.predicates.get(f"{atom[0]}/{len(atom[1])}")
            meta = spec.metadata if spec is not None else Metadata()
            if weighted and meta.offset is not None:
                inputs = [float(meta.offset)] + inputs
            return _T[_name(meta.transformation, "identity")](_C[_name(meta.combination, "sum")](inputs))

        out.append(value((predicate, args)))
    return out


# -- templates over random data -----------------------------------------------------------------------------------
def _world(rng, n_examples, n_nodes):
    """Random a(X), b(X, Y) (directed, acyclic: X < Y), c(X) facts per example."""
    facts, rows = {}, {"a": [], "b": [], "c": []}
    for e in range(n_examples):
        world = {}
        for x in range(n_nodes):
            if rng.random() < 0.8:
                world[("a", (x,))] = round(float(rng.normal()), 3)
            if rng.random() < 0.5:
                world[("c", (x,))] = round(float(rng.normal()), 3)
            for y in range(x + 1, n_nodes):
                if rng.random() < 0.4:
                    world[("b", (x, y))] = round(float(rng.normal()), 3)
        world[("a", (0,))] = world[("a", (1,))] = 0.5  # every example derives something
        world[("b", (0, 1))] = world[("c", (0,))] = 1.0
        facts[e] = world
        for (p, args), v in world.items():
            rows[p].append((e, args, v))
    relations = {p: Relation(tuple(np.array([r[1][k] for r in rs], np.int64) for k in range(len(rs[0][1]))),
                             values=[r[2] for r in rs], example=[r[0] for r in rs]) for p, rs in rows.items() if rs}
    return facts, relations


def _templates(draw):
    w = lambda: round(draw(st.floats(-1.5, 1.5)), 2)  # noqa: E731
    comb = draw(st.sampled_from([Combination.SUM, Combination.AVG, Combination.MAX, Combination.PRODUCT]))
    agg = draw(st.sampled_from([Aggregation.AVG, Aggregation.SUM, Aggregation.MAX, Aggregation.MIN,
                                Aggregation.COUNT]))
    act = draw(st.sampled_from([Transformation.TANH, Transformation.SIGMOID, Transformation.IDENTITY]))
    t = Template()
    kind = draw(st.sampled_from(["two-hop", "recursive", "hidden", "offsets"]))
    if kind == "two-hop":
        t += (R.h(V.X)[w()] <= (R.a(V.Y)[w()], R.b(V.X, V.Y), R.special.neq(V.X, V.Y))) | \
            Metadata(combination=comb, aggregation=agg, transformation=act)
        t += (R.h(V.X) <= (R.c(V.X)[w()], ~R.a(V.X))) | Metadata(transformation=act)
        t += R.g(V.X) <= (R.h(V.X), R.h(V.Y), R.b(V.X, V.Y))
        t += (R.q <= R.g(V.X)) | Metadata(aggregation=Aggregation.SUM)
        t += (R.q[w()] <= R.h(V.X)) | Metadata(aggregation=agg)
    elif kind == "recursive":   # along b (acyclic): each atom's level is its longest path
        t += R.r(V.X) <= R.a(V.X)[w()]
        t += (R.r(V.Y)[w()] <= (R.r(V.X), R.b(V.X, V.Y)[w()])) | Metadata(combination=comb, aggregation=agg,
                                                                           transformation=act)
        t += (R.q <= R.r(V.X)) | Metadata(aggregation=Aggregation.SUM)
    elif kind == "hidden":      # a variable only in a hidden literal: groundings merge
        t += (R.h(V.X) <= (R.a(V.X)[w()], R.hidden.b(V.X, V.Y))) | Metadata(aggregation=agg)
        t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.AVG, transformation=act)
    else:
        t += (R.h(V.X)[w()] <= (R.a(V.X)[w()], R.c(V.X), w())) | Metadata(combination=comb, aggregation=agg,
                                                                          transformation=act)
        t += R.h(V.X) <= R.a(V.X)
        t += R.h / 1 | Metadata(offset=w(), combination=draw(st.sampled_from([Combination.SUM, Combination.MAX])),
                                transformation=act)
        t += (R.q <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    return t


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(0, 2 ** 31), st.integers(1, 3), st.integers(2, 5))
def test_grounding_equals_brute_force(data, seed, n_examples, n_nodes):
    template = _templates(data.draw)
    facts, relations = _world(np.random.default_rng(seed), n_examples, n_nodes)
    expected = brute_force(template, facts, [(e, "q", ()) for e in range(n_examples)])
    for prune in (True, False):
        graph = ground(template, relations, R.q, prune=prune).graph
        np.testing.assert_allclose(outputs(graph).reshape(-1), expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(outputs(graph, "default").reshape(-1), expected, rtol=0, atol=1e-9)


def test_presets_and_gradients_on_a_grounded_graph():
    rng = np.random.default_rng(3)
    _, relations = _world(rng, 3, 5)
    t = Template()
    t += (R.h(V.X)[rng.normal(size=(3,))] <= (R.a(V.Y)[rng.normal(size=(3,))], R.b(V.X, V.Y))) | \
        Metadata(transformation=Transformation.TANH)
    t += R.h(V.X)[rng.normal(size=(3,))] <= R.c(V.X)
    t += R.h / 1 | Metadata(offset=rng.normal(size=3), transformation=Transformation.SIGMOID)
    t += R.q[rng.normal(size=(1, 3))] <= R.h(V.X)
    graph = t.ground(relations, R.q)
    for preset in ("unoptimized", "default", neurovec.list_presets()[-1]):
        assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


def test_an_unweighted_one_rule_atom_is_its_aggregation_neuron():
    """With pruning, tanh(avg(rule neurons)) is one layer (as the hand-written templates build it), not an
    aggregation layer plus an atom layer of one input each; the numbers are NeuraLogic's (prune=False keeps its
    neurons one for one). A second rule, a head weight or prune=False keep the atom layer."""
    rng = np.random.default_rng(5)
    _, relations = _world(rng, 3, 5)
    t = Template()
    t += (R.h(V.X) <= (R.a(V.Y)[rng.normal(size=2)], R.b(V.X, V.Y))) | \
        Metadata(aggregation=Aggregation.AVG, transformation=Transformation.SIGMOID)
    t += R.h / 1 | Metadata(transformation=Transformation.TANH)
    t += (R.q[rng.normal(size=(1, 2))] <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    merged = ground(t, relations, R.q).graph
    layers = {layer.name: layer for layer in merged.layers}
    assert (layers["h"].aggregation, layers["h"].transformation) == ("mean", "tanh")
    assert not any(name.endswith(":h:avg") for name in layers)
    kept = ground(t, relations, R.q, prune=False).graph
    assert any(layer.name.endswith(":h:avg") for layer in kept.layers)
    np.testing.assert_allclose(outputs(merged), outputs(kept), rtol=0, atol=0)
    t += R.h(V.X)[rng.normal(size=2)] <= R.c(V.X)
    two_rules = ground(t, relations, R.q).graph
    assert {layer.name: layer for layer in two_rules.layers}["h"].aggregation == "sum"


def test_nine_tenths_example_by_hand():
    """NeuraLogic's numbers for a small program (checked with PyNeuraLogic: model.test gives 3.15)."""
    t = Template()
    t += R.h(V.X) <= (R.a(V.X), R.b(V.X, V.Y))
    t += R.h(V.X) <= R.c(V.X)
    t += R.q <= R.h(V.X)
    relations = {"a": Relation(["x"], values=[0.7]), "b": Relation((["x", "x"], ["y", "z"]), values=[0.2, 1.0]),
                 "c": Relation(["x", "w"], values=[2.0, 3.0])}
    # h(x) = avg(0.7 + 0.2, 0.7 + 1.0) + 2.0 = 3.3, h(w) = 3.0, q = avg(3.3, 3.0)
    assert outputs(t.ground(relations, R.q)).item() == pytest.approx(3.15, abs=1e-12)


# -- syntax -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("item, shape, has_value", [
    (2.0, (), True), ((3,), (3,), False), ((3, 1), (3,), False), ((1, 3), (1, 3), False), ((2, 3), (2, 3), False),
    ((1,), (), False), ((1, 1), (), False), ([1.0, 2.0], (2,), True), ([[1.0, 2.0]], (1, 2), True),
    ([[1.0], [2.0]], (2, 1), True), (np.eye(2), (2, 2), True),
])
def test_weight_notations(item, shape, has_value):
    spec = WeightSpec.parse(item)
    assert spec.shape == shape and (spec.value is not None) == has_value and spec.learnable


def test_named_and_fixed_weights_are_shared():
    lit = R.a(V.X)["w": (3, 3)]
    assert lit.weight.name == "w" and lit.weight.shape == (3, 3)
    assert R.a(V.X)["w": 3, 3].weight.shape == (3, 3)
    assert not R.a(V.X)[2.0].fixed().weight.learnable
    t = Template()
    t += R.h(V.X) <= (R.a(V.X)["w": [1.0, 2.0]], R.b(V.X, V.Y)["w": (2,)])
    t += R.q <= R.h(V.X)
    graph = t.ground({"a": Relation([1, 2]), "b": Relation(([1], [2]))}, R.q)
    assert [w.name for w in graph.weights] == ["w"]


def test_terms_and_printing():
    assert R.a("X", "y", 3).terms == (Variable("X"), Constant("y"), Constant(3))
    assert V.x == Variable("X") and C.Foo == Constant("foo")
    rule = (R.h(V.X)[2.0] <= (R.a(V.X)[1.5], R.hidden.e(V.X, V.Y), R.special.neq(V.X, V.Y), 0.25)) | \
        [Aggregation.MAX, Transformation.TANH]
    assert str(rule) == "2.0 h(X) :- 1.5 a(X), _e(X, Y), @neq(X, Y), 0.25. [transformation=tanh, aggregation=max]"
    body = R.a(V.X) * R.b(V.X)
    assert (R.h(V.X) <= body).metadata.combination == Combination.ELPRODUCT


def test_queries_by_pattern_and_table():
    t = Template()
    t += R.h(V.X)[2.0] <= R.a(V.X)
    relations = {"a": Relation([3, 1, 2], values=[0.3, 0.1, 0.2], example=["e1", "e1", "e2"])}
    # all derived h atoms, per example (sorted), by constant
    np.testing.assert_allclose(outputs(t.ground(relations, R.h(V.X))).reshape(-1), [0.2, 0.6, 0.4])
    np.testing.assert_allclose(outputs(t.ground(relations, Query("h", args=[[2, 3]], example=["e2", "e1"]))
                                       ).reshape(-1), [0.4, 0.6])
    both = t.ground(relations, [Query("h", args=[[1, 3]], example="e1"), Query("h", args=[[2]], example="e2")])
    np.testing.assert_allclose(outputs(both).reshape(-1), [0.2, 0.6, 0.4])


def test_template_facts_are_embeddings():
    """Weighted template facts are learnable values, shared by every example (NeuraLogic: 12.5, see below)."""
    t = Template()
    t += R.emb(C.x)[[1.0, 2.0]]
    t += R.emb(C.y)[[3.0, 4.0]]
    t += R.h(V.X) <= (R.emb(V.X)[[[1.0, 0.5], [0.0, 1.0]]], R.n(V.X))
    t += R.q[[[1.0, 2.0]]] <= R.h(V.X)
    graph = t.ground({"n": Relation(["x", "y", "z"], example=[0, 0, 1]), "m": Relation(["x"], example=[1])},
                     Query("q", example=[0]))
    assert outputs(graph).item() == pytest.approx(12.5)
    assert {w.name for w in graph.weights if w.learnable} >= {"fact:emb(x)", "fact:emb(y)"}


def test_dataframes_give_the_same_graph():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"src": ["a", "b", "c"], "dst": ["b", "c", "a"], "g": [1, 1, 2], "w": [0.5, 1.5, 2.0]})
    nodes = pd.DataFrame({"node": ["a", "b", "c"], "g": [1, 1, 2], "x0": [1.0, 2.0, 3.0], "x1": [0.0, 1.0, 0.5]})
    t = Template()
    t += (R.h(V.X)[np.ones((2, 2))] <= (R.f(V.Y), R.e(V.Y, V.X))) | Metadata(combination=Combination.PRODUCT)
    t += R.q[[[1.0, -1.0]]] <= R.h(V.X)
    from_frames = t.ground({"e": Relation.from_frame(frame, ["src", "dst"], values="w", example="g"),
                            "f": Relation.from_frame(nodes, "node", values=["x0", "x1"], example="g")}, R.q)
    from_arrays = t.ground({"e": Relation((np.array(["a", "b", "c"]), np.array(["b", "c", "a"])),
                                          values=[0.5, 1.5, 2.0], example=[1, 1, 2]),
                            "f": Relation(np.array(["a", "b", "c"]), values=[[1.0, 0.0], [2.0, 1.0], [3.0, 0.5]],
                                          example=[1, 1, 2])}, R.q)
    assert_same_graph(from_frames, from_arrays)


def assert_same_graph(a, b):
    assert [type(x).__name__ for x in a.layers] == [type(x).__name__ for x in b.layers]
    for x, y in zip(a.layers, b.layers):
        assert x.name == y.name
        if hasattr(x, "values"):
            np.testing.assert_array_equal(x.values, y.values)
        else:
            for field in ("counts", "input_layer", "input_ordinal", "input_weight", "bias"):
                np.testing.assert_array_equal(getattr(x, field), getattr(y, field), err_msg=f"{x.name}.{field}")
            assert (x.aggregation, x.transformation) == (y.aggregation, y.transformation)
    assert [(w.name, w.learnable) for w in a.weights] == [(w.name, w.learnable) for w in b.weights]
    for w, v in zip(a.weights, b.weights):
        np.testing.assert_array_equal(w.value, v.value)
    np.testing.assert_array_equal(a.output_layer, b.output_layer)
    np.testing.assert_array_equal(a.output_ordinal, b.output_ordinal)


# -- recursion ----------------------------------------------------------------------------------------------------
def _chains(lengths):
    src, dst, example, starts = [], [], [], []
    for e, n in enumerate(lengths):
        nodes = [f"n{e}_{i}" for i in range(n)]
        src += nodes[:-1]
        dst += nodes[1:]
        example += [e] * (n - 1)
        starts.append(nodes[0])
    return {"start": Relation(starts, example=list(range(len(lengths)))),
            "edge": Relation((src, dst), example=example)}


def _reach(depth=None):
    t = Template()
    t += R.reach(V.X)[[1.0, -0.5]] <= R.start(V.X)
    t += (R.reach(V.Y)[[[0.5, 1.0], [-1.0, 0.25]]] <= (R.reach(V.X), R.edge(V.X, V.Y))) | \
        Metadata(transformation=Transformation.TANH)
    t += R.reach / 1 | Metadata(transformation=Transformation.TANH, depth=depth)
    t += (R.q[[[1.0, 2.0]]] <= R.reach(V.X)) | Metadata(aggregation=Aggregation.SUM)
    return t


def test_recursion_to_the_fixed_point_has_one_level_per_step():
    """Chains of different lengths per example (thesis Fig. 5.6): levels align at the start of the chains."""
    grounding = ground(_reach(), _chains([2, 5, 1, 4]), R.q)
    names = [layer.name for layer in grounding.graph.layers]
    assert [n for n in names if n.startswith("reach")] == [f"reach@{k}" for k in range(5)]
    reach = np.array([1.0, -0.5])
    expected = []
    for n in [2, 5, 1, 4]:
        values = [np.tanh(reach)]
        for _ in range(n - 1):
            values.append(np.tanh(np.array([[0.5, 1.0], [-1.0, 0.25]]) @ np.tanh(values[-1] + 1)))
        expected.append(sum(np.array([1.0, 2.0]) @ v for v in values))
    np.testing.assert_allclose(outputs(grounding.graph).reshape(-1), expected, rtol=0, atol=1e-12)


def test_recursion_unrolled_to_a_declared_depth_on_a_cycle():
    relations = {"start": Relation(["a"]), "edge": Relation((["a", "b"], ["b", "a"]))}
    with pytest.raises(TemplateError, match="recursion with no fixed point"):
        ground(_reach(), relations, R.q)
    graph = ground(_reach(depth=3), relations, R.q).graph
    w, head = np.array([[0.5, 1.0], [-1.0, 0.25]]), np.array([1.0, -0.5])
    a, b = np.tanh(head), None          # round 0: only the rule without recursion
    for _ in range(3):                  # round t reads round t - 1
        a, b = np.tanh(head + (w @ np.tanh(b + 1) if b is not None else 0)), np.tanh(w @ np.tanh(a + 1))
    assert outputs(graph).item() == pytest.approx(np.array([1.0, 2.0]) @ (a + b), abs=1e-12)


# -- equal to the hand-written templates --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mutag(tu_dir):
    from neurovec.datasets import load_tu
    return load_tu("MUTAG", data_dir=tu_dir, download=False)


@pytest.mark.parametrize("kind, options", [
    ("gcn", {}), ("gcn", {"normalize": False, "readout": "sum"}), ("sage", {}), ("gin", {}),
    ("gin", {"eps": 0.25, "hidden": [8, 4]}), ("gcn", {"samples": [5, 3, 3, 17], "out_dim": 2}),
])
def test_gnn_templates_equal_the_hand_written_ones(mutag, kind, options):
    from neurovec import datasets
    from neurovec.sources.relational import models
    options = {"hidden": 8, **options}
    hand = getattr(datasets, kind)(mutag, **options)
    values = {w.name: w.value for w in hand.weights if w.learnable}
    template, relations, queries = getattr(models, kind)(mutag, values=values, **options)
    graph = template.ground(relations, queries)
    for preset in ("unoptimized", "default"):
        np.testing.assert_allclose(outputs(graph, preset), outputs(hand, preset), rtol=0, atol=1e-9)


@pytest.mark.parametrize("architecture", ["simple", "dims"])
def test_mutagenesis_templates_equal_the_hand_written_ones(mutagenesis_dir, architecture):
    from neurovec import datasets
    from neurovec.sources.relational import models
    ds = datasets.load_mutagenesis(mutagenesis_dir)
    samples = [0, 7, 3, 150, 7]
    hand = datasets.mutagenesis_template(ds, architecture, dim=3, bond_dim=2, samples=samples)
    values = {w.name: w.value for w in hand.weights}
    template = models.mutagenesis(ds.element_names, ds.bond_type_values, architecture, dim=3, bond_dim=2,
                                  values=values)
    graph = template.ground(models.mutagenesis_facts(ds), models.mutagenesis_queries(ds, samples))
    for preset in ("unoptimized", "default"):
        np.testing.assert_allclose(outputs(graph, preset), outputs(hand, preset), rtol=0, atol=1e-9)


# -- bad templates ------------------------------------------------------------------------------------------------
def _ground(rules, relations=None, queries=R.q, **options):
    t = Template()
    t += rules
    relations = relations or {"a": Relation([1, 2], values=[0.5, 1.0]), "b": Relation(([1], [2]))}
    return ground(t, relations, queries, **options)


def test_error_unbound_head_variable():
    with pytest.raises(TemplateError, match=r"rule 0 `h\(X, Z\) :- a\(X\)\.`: unbound head variable Z"):
        _ground([R.h(V.X, V.Z) <= R.a(V.X), R.q <= R.h(V.X, V.Y)])


def test_error_unknown_predicate():
    with pytest.raises(TemplateError, match=r"rule 0 `h\(X\) :- a\(X\), nope\(X\)\.`: unknown predicate nope/1"):
        _ground([R.h(V.X) <= (R.a(V.X), R.nope(V.X)), R.q <= R.h(V.X)])


def test_error_arity_mismatch():
    with pytest.raises(TemplateError, match=r"rule 0 `h\(X\) :- b\(X\)\.`: arity mismatch: b has 1 arguments here, "
                                            r"but 2 in the data's relation 'b'"):
        _ground([R.h(V.X) <= R.b(V.X), R.q <= R.h(V.X)])


def test_error_weight_shapes_do_not_fit():
    with pytest.raises(TemplateError, match=r"rule 0 `\{2, 3\} h\(X\) :- \{4, 4\} f\(X\)\.`: weight shapes do not "
                                            r"fit: weight \{4, 4\} of shape \(4, 4\) times f with values of shape "
                                            r"\(3,\)"):
        _ground([R.h(V.X)[2, 3] <= R.f(V.X)[4, 4], R.q <= R.h(V.X)],
                {"f": Relation([1, 2], values=np.ones((2, 3)))})
    with pytest.raises(TemplateError, match=r"rule 1 .*weight shapes do not fit: weight 'w' has shape \(3,\) here"):
        _ground([R.h(V.X) <= R.a(V.X)["w": (2,)], R.g(V.X) <= R.a(V.X)["w": (3,)], R.q <= R.h(V.X)])


def test_error_recursion_without_fixed_point():
    with pytest.raises(TemplateError, match=r"recursion with no fixed point: the ground atom r\(\d\) in example 0 "
                                            r"depends on itself through rule 0 .* declare a depth"):
        _ground([R.r(V.Y) <= (R.r(V.X), R.e(V.X, V.Y)), R.r(V.X) <= R.a(V.X), R.q <= R.r(V.X)],
                {"a": Relation([1]), "e": Relation(([1, 2], [2, 1]))})


def test_error_query_matching_nothing():
    with pytest.raises(TemplateError, match=r"query q in example 'm2' \(output 1\) matches nothing: the template "
                                            r"derives no such atom of q"):
        _ground([R.q <= R.a(V.X)], {"a": Relation([1], example=["m1"]), "z": Relation([1], example=["m2"])},
                Query("q", example=["m1", "m2"]))
    with pytest.raises(TemplateError, match=r"query h\(X\) matches nothing"):
        _ground([R.h(V.X) <= (R.a(V.X), R.special.neq(V.X, V.X))], queries=R.h(V.X))


@pytest.mark.parametrize("rules, match", [
    ([(R.h(V.X) <= R.a(V.X)) | Metadata(combination=Combination.CONCAT), R.q <= R.h(V.X)],
     r"rule 0 .*combination concat is not supported; neurovec would need concatenation"),
    ([R.h(V.X) <= R.a(V.X), R.h / 1 | Metadata(depth=2), R.q <= R.h(V.X)],
     r"depth=2 is declared, but h/1 is not recursive"),
    ([(R.h(V.X) <= R.f(V.X)) | Metadata(aggregation=Aggregation.MAX), R.q <= R.h(V.X)],
     r"aggregation max of \(3,\) values is not supported"),
    ([R.q[[1.0, 2.0]] <= R.a(V.X), R.q / 0 | Metadata(offset=[0.5, 0.1, 0.2])],
     r"predicate q/0 \[offset=\[0.5, 0.1, 0.2\]\]: weight shapes do not fit: the offset has shape \(3,\)"),
])
def test_other_template_errors(rules, match):
    with pytest.raises(TemplateError, match=match):
        _ground(rules, {"a": Relation([1]), "f": Relation([1], values=np.ones((1, 3)))})


def test_bad_relations_and_metadata_name_what_is_wrong():
    """Each was vague: a bare "columns have different lengths [2, 3]", "values contain NaN or inf", an unknown
    aggregation string accepted until grounding blamed a predicate, strings joined with ints reported as "query q
    matches nothing"."""
    with pytest.raises(TemplateError, match=r"different lengths \(argument 0 3, argument 1 2, example 3\): every "
                                            r"column holds one entry per fact"):
        Relation(([1, 2, 3], [1, 2]), example=[0, 0, 0])
    with pytest.raises(TemplateError, match=r"different lengths \(argument 0 3, values 2\)"):
        Relation([1, 2, 3], values=[1.0, 2.0])
    with pytest.raises(TemplateError, match=r"row 1 \(the fact \(7\)\) has a NaN or inf value \(\[nan, 1.0\]\), "
                                            r"and 1 row\(s\) in all.*drop those facts or fill them in"):
        Relation([5, 7], values=[[0.0, 1.0], [np.nan, 1.0]])
    with pytest.raises(TemplateError, match=r"relation values must be numbers"):
        Relation([5, 7], values=["a", 1.0])
    with pytest.raises(TemplateError, match=r"Metadata\(aggregation='avgx'\): not an aggregation; use one of "
                                            r"Aggregation.AVG, .* \(or its name: avg, max"):
        Metadata(aggregation="avgx")
    with pytest.raises(TemplateError, match=r"Metadata\(transformation=.*'max', kind='aggregation'.*not a "
                                            r"transformation; use one of Transformation.SIGMOID"):
        Metadata(transformation=Aggregation.MAX)
    with pytest.raises(TemplateError, match=r"Metadata\(depth=1.5\): expected a whole number"):
        Metadata(depth=1.5)
    assert Metadata(aggregation="avg", transformation="TANH") == Metadata(aggregation=Aggregation.AVG,
                                                                          transformation=Transformation.TANH)
    with pytest.raises(TemplateError, match=r"rule 0 `q :- a\(X\), b\(Y, X\).`: variable X joins argument 0 of "
                                            r"relation a/1 \(strings\) with argument 1 of relation b/2 \(ints\); an "
                                            r"int never equals a string"):
        _ground([R.q <= (R.a(V.X), R.b(V.Y, V.X))], {"a": Relation(["1", "2"]), "b": Relation(([1, 2], [1, 2]))})
    # Columns of different types that no variable joins are fine.
    _ground([R.q <= (R.a(V.X), R.b(V.Y, V.X))], {"a": Relation([1, 2]), "b": Relation((["u", "v"], [1, 2]))})


def test_explicit_query_without_examples_in_the_data():
    """With no example column anywhere, the data is one example: Query("h", args=...) needs no example=0 (it was
    refused, saying "the data has examples"); with example columns the message names the relations that have them."""
    t = Template()
    t += R.h(V.X)[2.0] <= R.a(V.X)
    graph = ground(t, {"a": Relation([1, 2])}, Query("h", args=[[2, 1]])).graph
    assert graph.output_layer.size == 2
    with pytest.raises(TemplateError, match=r"query h/1: say in which examples \(example=...\): relations "
                                            r"\['a/1'\] have an example column"):
        ground(t, {"a": Relation([1, 2], example=[0, 1])}, Query("h", args=[[2, 1]]))


def test_error_duplicate_fact():
    with pytest.raises(TemplateError, match=r"relation a/1: the fact a\(1\) is given twice in example 0"):
        _ground([R.q <= R.a(V.X)], {"a": Relation([1, 1], example=[0, 0])})


def test_error_duplicate_fact_of_a_relation_without_examples():
    """A relation without an example column holds in every example: a fact given twice is named in the first."""
    t = Template()
    t += R.q <= (R.a(V.X, V.Y), R.b(V.X))
    facts = {"a": Relation(([3, 1, 2, 2, 1], ["x", "y", "z", "z", "w"])), "b": Relation([1, 2], example=[5, 7])}
    with pytest.raises(TemplateError, match=r"relation a/2: the fact a\(2, z\) is given twice in example 5"):
        ground(t, facts, R.q)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 31), st.integers(1, 40), st.integers(0, 60), st.booleans())
def test_column_index_join_equals_the_key_join(seed, n_values, n_left, unique):
    """The CSR join on (example, one column) gives the sort-merge join's pairs in its order, and is refused when a
    value occurs in two examples."""
    from neurovec.sources.relational.joins import ColumnIndex, join
    rng = np.random.default_rng(seed)
    home = rng.integers(0, 4, n_values)                      # each value lives in one example
    column = rng.permutation(n_values) if unique else rng.integers(0, n_values, 2 * n_values)
    example = home[column]
    left_value = rng.integers(0, n_values, n_left)
    left_example = np.where(rng.random(n_left) < 0.8, home[left_value], rng.integers(0, 4, n_left))
    index = ColumnIndex.build(column, example, n_values)
    got = index.join(left_example, left_value, right_unique=unique)
    if got[0] is None:   # every left row once, in order
        assert unique
        got = (np.arange(n_left), got[1])
    expected = join(left_example * n_values + left_value, example * n_values + column, right_unique=unique)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    if n_values > 1 and column.size > 1:
        shared = column.copy()
        shared[:2] = column[0]
        mixed = example.copy()
        mixed[:2] = [0, 1]
        assert ColumnIndex.build(shared, mixed, n_values) is None


def test_the_plan_is_kept_on_the_template_until_it_changes():
    """Grounding a template again (other data, same schemas and seed) reuses its plan; another seed, other value
    shapes or a new rule plan again."""
    t = Template()
    t += R.h(V.X)[1, 1] <= R.a(V.X)
    t += R.q <= R.h(V.X)
    relations = {"a": Relation([1, 2], values=[[0.5], [1.0]])}
    first = t.ground(relations, R.q)
    plan = t._plan[-1]
    again = t.ground({"a": Relation([3], values=[[2.0]])}, R.q)
    assert t._plan[-1] is plan
    assert [w.value.tolist() for w in again.weights] == [w.value.tolist() for w in first.weights]
    t.ground(relations, R.q, seed=1)
    assert t._plan[-1] is not plan
    plan = t._plan[-1]
    t.ground({"a": Relation([1, 2], values=[0.5, 1.0])}, R.q, seed=1)
    assert t._plan[-1] is not plan
    t += R.q <= R.a(V.X)
    both = t.ground(relations, R.q)
    assert len(both.layers) > len(first.layers)
    wide = Template()
    wide += R.g(V.X) <= R.a(V.X)
    relations = {"a": Relation([1, 2], values=[[0.5, 1.0], [1.0, 2.0]])}
    for bias in ([0.5, 1.0], [0.25, 2.0]):  # settings holding arrays: a new one is a new plan (== gives no bool)
        wide += R.g / 1 | Metadata(offset=slice("g.bias", np.asarray(bias)))
        plan = getattr(wide, "_plan", (None,))[-1]
        graph = wide.ground(relations, R.g(V.X))
        assert wide._plan[-1] is not plan
        assert [w.value.tolist() for w in graph.weights if w.name == "g.bias"] == [bias]


@pytest.mark.parametrize("high", [3, 1 << 16, 1 << 20, (1 << 48) - 1, 1 << 50])
@pytest.mark.parametrize("size", [0, 5, 300, 5000])
def test_stable_order_is_a_stable_argsort(high, size):
    # The radix sort of the joins (16 bits a pass) against numpy's merge sort: equal keys keep their order, keys
    # of 1, 2 and 3 passes, beyond 48 bits and negative ones (numpy's sort).
    from neurovec.sources.relational.joins import stable_order
    rng = np.random.default_rng(size + high % 97)
    key = rng.integers(0, high, size) if size else np.zeros(0, np.int64)
    key[: size // 3] = key[size // 3: 2 * (size // 3)]   # ties
    for keys in (key, key - high // 2):
        assert np.array_equal(stable_order(keys), np.argsort(keys, kind="stable"))
