"""Unit facts (thesis 5.2.8): one merged unit row, W . 1 = W, materialization check."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Node, Op
from neurovec.compiler.passes.unit_facts import merge_unit_facts, simplify_unit_linear
from neurovec.compiler.settings import Settings
from neurovec.sources.graph import FactLayer, Graph, NeuronLayer, Weight

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from .test_simplify_gathers import assert_same_function, fact, gather, program

RNG = np.random.default_rng(2)


def unit_fact(name, count):
    return fact(name, np.ones(count), fact_layer=name, unit=True)


def index(p, name):
    return p.constants[p.node(name).attrs["index"]].tolist()


def test_merge_shrinks_concats_and_reindexes_their_gathers():
    # The module docstring's example, plus a gather straight from a unit fact.
    a = RNG.normal(size=4)
    nodes = [unit_fact("f_u", 3), fact("f_a", a, fact_layer="a"), unit_fact("f_v", 2),
             Node("x_cat", Op.CONCAT, ("f_u", "f_a", "f_v"), 9, ()), gather("x", "x_cat", "i", 5, ()),
             gather("y", "f_v", "j", 3, ()), Node("out", Op.CONCAT, ("x", "y"), 8, ())]
    before = program(nodes, {"c_f_u": np.ones(3), "c_f_a": a, "c_f_v": np.ones(2),
                             "i": np.array([0, 2, 3, 6, 8]), "j": np.array([1, 0, 1])})
    after = merge_unit_facts(before, Settings())
    units = [n for n in after.nodes if n.op is Op.FACT and n.attrs.get("unit")]
    assert len(units) == 1 and units[0].count == 1 and not units[0].attrs["fact_layer"]
    unit = units[0].name
    assert after.node("x_cat").srcs == (unit, "f_a") and after.node("x_cat").count == 5
    assert index(after, "x") == [0, 0, 1, 4, 0]
    assert after.node("y").srcs == (unit,) and index(after, "y") == [0, 0, 0]
    assert "f_u" not in after.by_name() and "f_v" not in after.by_name()
    assert_same_function(before, after)
    assert merge_unit_facts(after, Settings()) is after  # merged already


def test_merge_keeps_other_readers_correct_and_leaves_dynamic_units():
    nodes = [unit_fact("f_u", 3), unit_fact("f_d", 3), Node("t", Op.TRANSFORM, ("f_u",), 3, (), {"fn": "exp"}),
             Node("out", Op.CONCAT, ("t", "f_d"), 6, ())]
    before = program(nodes, {"c_f_u": np.ones(3), "c_f_d": np.ones(3)})
    after = merge_unit_facts(before, Settings(dynamic_facts=("f_d",)))
    assert after.node("f_u").op is Op.TILE and after.node("f_u").attrs["times"] == 3
    assert after.node("f_d").op is Op.FACT  # dynamic: may hold other values at call time
    assert_same_function(before, after)


@pytest.mark.parametrize("w_layout,w_rows,n", [("full", 6, 6), ("tile", 2, 6), ("interleave", 3, 6),
                                               ("tile", 1, 6), ("tile", 6, 6)])
def test_unit_linear_becomes_its_weight_side(w_layout, w_rows, n):
    weights = [Weight(f"w{k}", RNG.normal(size=(3, 2))) for k in range(w_rows)]
    a = RNG.normal(size=2)
    x_rows = n if w_layout == "full" or w_rows in (1, n) else n // w_rows
    x_layout = "full" if w_layout == "full" or w_rows in (1, n) else ("interleave" if w_layout == "tile" else "tile")
    nodes = [Node("w", Op.WEIGHTS, (), w_rows, (3, 2), {"names": tuple(w.name for w in weights)}),
             unit_fact("f_u", 2), fact("f_a", a, fact_layer="a"),
             Node("cat", Op.CONCAT, ("f_u", "f_a"), 4, ()), gather("x", "cat", "i", x_rows, ()),
             Node("lin", Op.LINEAR, ("w", "x"), n, (3, 2), {"kind": "mul", "w_layout": w_layout,
                                                           "x_layout": x_layout}),
             Node("t", Op.TRANSFORM, ("lin",), n, (3, 2), {"fn": "tanh"})]
    before = program(nodes, {"c_f_u": np.ones(2), "c_f_a": a, "i": RNG.integers(0, 2, x_rows)}, weights)
    after = simplify_unit_linear(before, Settings())
    if w_rows == n or w_layout == "full":
        assert after.node("t").srcs == ("w",)
    else:
        assert after.node("lin").op is (Op.TILE if w_layout == "tile" else Op.INTERLEAVE)
    assert "x" not in after.by_name()
    assert_same_function(before, after)


def test_linear_mixing_units_and_values_is_left_alone():
    a = RNG.normal(size=2)
    nodes = [Node("w", Op.WEIGHTS, (), 1, (3,), {"names": ("w",)}), unit_fact("f_u", 2),
             fact("f_a", a, fact_layer="a"), Node("cat", Op.CONCAT, ("f_u", "f_a"), 4, ()),
             gather("x", "cat", "i", 4, ()),
             Node("lin", Op.LINEAR, ("w", "x"), 4, (3,), {"kind": "mul", "w_layout": "tile"})]
    before = program(nodes, {"c_f_u": np.ones(2), "c_f_a": a, "i": np.array([0, 2, 1, 3])},
                     [Weight("w", RNG.normal(size=3))])
    assert simplify_unit_linear(before, Settings()) is before
    # A gather reading only the unit rows of the CONCAT is all units (unless they are dynamic).
    before = program(nodes[:4] + [gather("x", "cat", "i", 4, ()), nodes[5]],
                     {"c_f_u": np.ones(2), "c_f_a": a, "i": np.array([0, 1, 0, 1])}, [Weight("w", np.ones(3))])
    assert simplify_unit_linear(before, Settings(dynamic_facts=("f_u",))) is before
    assert simplify_unit_linear(before, Settings()).node("lin").op is Op.TILE


def test_embedding_layer_on_units_compiles_to_the_weights():
    # A unit-fact embedding: every neuron is W_k . 1 for its own weight (thesis 5.2.8's use case).
    weights = [Weight(f"e{k}", RNG.normal(size=3)) for k in range(4)]
    layer = NeuronLayer("emb", counts=[1, 1, 1, 1], input_layer=[0, 0, 0, 0], input_ordinal=[0, 1, 2, 0],
                        input_weight=[0, 1, 2, 3], transformation="tanh")
    graph = Graph([FactLayer.units("u", 3), layer], weights, [1, 1, 1], [3, 0, 2])
    options = Settings.preset("unoptimized", merge_unit_facts=True, simplify_unit_linear=True,
                              simplify_gathers=True, transposed_reductions=True, preconcatenate=True)
    module = neurovec.compile(graph, options, dtype=torch.float64)
    assert not any(n.op is Op.LINEAR or n.op is Op.FACT for n in module.program.nodes)
    assert_equivalent(graph, module)


@pytest.mark.parametrize("switch", ["merge_unit_facts", "simplify_unit_linear"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(graph=graphs())
def test_random_graphs_equal_reference(switch, graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", **{switch: True})
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
