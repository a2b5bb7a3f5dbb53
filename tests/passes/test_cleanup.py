"""Clean-up passes (thesis 5.2.10): identities and chains, pre-concatenation, dead code."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Node, Op
from neurovec.compiler.passes.cleanup import preconcatenate, remove_identity
from neurovec.compiler.settings import Settings
from neurovec.sources.graph import Weight

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from .test_simplify_gathers import assert_same_function, fact, gather, program

RNG = np.random.default_rng(3)
X = RNG.normal(size=(4, 3))


def tanh(src, count=4):
    return Node("out", Op.TRANSFORM, (src,), count, (3,), {"fn": "tanh"})


@pytest.mark.parametrize("op_node,constants", [
    (Node("y", Op.TRANSFORM, ("x",), 4, (3,), {"fn": "identity"}), {}),
    (Node("y", Op.CONCAT, ("x",), 4, (3,)), {}),
    (Node("y", Op.REDUCE, ("x",), 4, (3,), {"aggregation": "max", "counts": "k"}), {"k": np.ones(4, int)}),
    (Node("y", Op.TILE, ("x",), 4, (3,), {"times": 1}), {}),
    (Node("y", Op.INTERLEAVE, ("x",), 4, (3,), {"times": 1}), {}),
    (Node("y", Op.SLICE, ("x",), 4, (3,), {"start": 0, "stop": 4, "step": 1}), {}),
    (gather("y", "x", "i", 4), {"i": np.arange(4)}),
])
def test_identities_disappear(op_node, constants):
    before = program([fact("x", X), op_node, tanh("y")], {"c_x": X, **constants})
    after = remove_identity(before, Settings())
    assert [(n.op, n.srcs) for n in after.nodes] == [(Op.FACT, ()), (Op.TRANSFORM, ("x",))]
    assert set(after.constants) == {"c_x"}
    assert_same_function(before, after)


def test_gather_chains_merge_into_one_gather():
    nodes = [fact("x", X), Node("s", Op.SLICE, ("x",), 2, (3,), {"start": 1, "stop": 4, "step": 2}),
             Node("t", Op.TILE, ("s",), 6, (3,), {"times": 3}), gather("g", "t", "i", 5), tanh("g", 5)]
    before = program(nodes, {"c_x": X, "i": np.array([5, 0, 2, 3, 1])})
    after = remove_identity(before, Settings())
    assert after.node("g").srcs == ("x",)
    assert after.constants[after.node("g").attrs["index"]].tolist() == [3, 1, 1, 3, 3]
    assert [n.name for n in after.nodes] == ["x", "g", "out"]  # the chain is gone
    assert_same_function(before, after)
    # ... and a composed identity goes entirely
    nodes = [fact("x", X), gather("a", "x", "i", 4), gather("b", "a", "j", 4), tanh("b")]
    before = program(nodes, {"c_x": X, "i": np.array([2, 0, 3, 1]), "j": np.array([1, 3, 0, 2])})
    after = remove_identity(before, Settings())
    assert [n.name for n in after.nodes] == ["x", "out"] and after.node("out").srcs == ("x",)


def test_repeated_tiles_interleaves_and_slices_collapse():
    nodes = [fact("x", X), Node("a", Op.TILE, ("x",), 8, (3,), {"times": 2}),
             Node("b", Op.TILE, ("a",), 24, (3,), {"times": 3}),
             Node("c", Op.INTERLEAVE, ("b",), 48, (3,), {"times": 2}),
             Node("d", Op.INTERLEAVE, ("c",), 96, (3,), {"times": 2}),
             Node("e", Op.SLICE, ("d",), 12, (3,), {"start": 5, "stop": 53, "step": 4}),
             Node("f", Op.SLICE, ("e",), 4, (3,), {"start": 1, "stop": 12, "step": 3}), tanh("f")]
    before = program(nodes, {"c_x": X})
    after = remove_identity(before, Settings())
    assert after.node("b").attrs["times"] == 6 and after.node("b").srcs == ("x",)
    assert after.node("d").attrs["times"] == 4 and after.node("d").srcs == ("b",)
    assert after.node("f").attrs == {"start": 9, "stop": 46, "step": 12} and after.node("f").srcs == ("d",)
    assert_same_function(before, after)


def test_preconcatenate_facts_and_weights():
    a, b = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 3))
    weights = [Weight("p", RNG.normal(size=3)), Weight("q", RNG.normal(size=3), learnable=False),
               Weight("r", RNG.normal(size=3))]
    nodes = [fact("a", a, fact_layer="a"), fact("b", b, fact_layer="b"),
             Node("fcat", Op.CONCAT, ("a", "b"), 5, (3,)),
             Node("wp", Op.WEIGHTS, (), 1, (3,), {"names": ("p",)}),
             Node("wqr", Op.WEIGHTS, (), 2, (3,), {"names": ("q", "r")}),
             Node("wcat", Op.CONCAT, ("wp", "wqr"), 3, (3,)),
             Node("out", Op.CONCAT, ("fcat", "wcat"), 8, (3,))]
    before = program(nodes, {"c_a": a, "c_b": b}, weights)
    after = preconcatenate(before, Settings())
    assert after.node("fcat").op is Op.FACT and not after.node("fcat").attrs["fact_layer"]
    assert after.node("wcat").op is Op.WEIGHTS and after.node("wcat").attrs["names"] == ("p", "q", "r")
    assert after.node("out").op is Op.CONCAT  # facts with weights: never
    assert [n.name for n in after.nodes] == ["fcat", "wcat", "out"]
    assert_same_function(before, after)


def test_no_preconcatenation_of_shared_dynamic_or_repeated_inputs():
    a = RNG.normal(size=(2, 3))
    weights = [Weight("p", RNG.normal(size=3))]
    cases = [
        # a weight twice in one WEIGHTS node: a duplicated parameter
        [Node("wp", Op.WEIGHTS, (), 1, (3,), {"names": ("p",)}), Node("wp2", Op.WEIGHTS, (), 1, (3,), {"names": ("p",)}),
         Node("out", Op.CONCAT, ("wp", "wp2"), 2, (3,))],
        # an input read elsewhere too
        [fact("a", a, fact_layer="a"), fact("b", a, fact_layer="b"), Node("cat", Op.CONCAT, ("a", "b"), 4, (3,)),
         Node("t", Op.TRANSFORM, ("a",), 2, (3,), {"fn": "exp"}), Node("out", Op.CONCAT, ("cat", "t"), 6, (3,))],
    ]
    for nodes in cases:
        before = program(nodes, {n.attrs["const"]: a for n in nodes if n.op is Op.FACT}, weights)
        assert preconcatenate(before, Settings()) is before
    nodes = [fact("a", a, fact_layer="a"), fact("b", a, fact_layer="b"), Node("cat", Op.CONCAT, ("a", "b"), 4, (3,)),
             tanh("cat", 4)]
    before = program(nodes, {"c_a": a, "c_b": a})
    assert preconcatenate(before, Settings(dynamic_facts=("b",))) is before
    assert preconcatenate(before, Settings()).node("cat").op is Op.FACT


def test_preconcatenate_drops_what_nothing_reads():
    # with nothing to pre-concatenate: a dead node, an unread input fact and an unread constant
    nodes = [fact("x", X), fact("y", X, fact_layer="y"), Node("dead", Op.TRANSFORM, ("x",), 4, (3,), {"fn": "exp"}),
             tanh("x")]
    after = preconcatenate(program(nodes, {"c_x": X, "c_y": X, "unread": X}), Settings())
    assert [n.name for n in after.nodes] == ["x", "out"] and set(after.constants) == {"c_x"}


@pytest.mark.parametrize("switch", ["remove_identity", "preconcatenate"])
@settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(graph=graphs())
def test_random_graphs_equal_reference(switch, graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", **{switch: True})
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
