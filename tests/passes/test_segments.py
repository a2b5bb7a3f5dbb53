"""Scatter to segment / dense / strided reductions (thesis 5.2.2, 5.2.9)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Node, Op
from neurovec.compiler.passes.segments import scatter_to_segment
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from .test_simplify_gathers import assert_same_function, fact, gather, program

RNG = np.random.default_rng(1)
ALL = Settings.preset("unoptimized", segment_reductions=True, dense_reductions=True, transposed_reductions=True)


def reduce_(name, src, count, counts_key, aggregation="sum", shape=(4,)):
    return Node(name, Op.REDUCE, (src,), count, shape, {"aggregation": aggregation, "counts": counts_key})


def test_scatter_becomes_segment_or_dense():
    x = RNG.normal(size=(6, 4))
    for counts, switches, kernel in [([1, 3, 2], {}, "segment"), ([2, 2, 2], {}, "dense"),
                                     ([2, 2, 2], {"dense_reductions": False}, "segment"),
                                     ([1, 3, 2], {"segment_reductions": False}, "scatter")]:
        before = program([fact("x", x), reduce_("r", "x", 3, "k", "max")], {"c_x": x, "k": np.array(counts)})
        after = scatter_to_segment(before, ALL.model_copy(update=switches))
        assert after.node("r").attrs.get("kernel", "scatter") == kernel
        assert_same_function(before, after)


@pytest.mark.parametrize("aggregation", ["sum", "mean", "max", "min", "prod"])
def test_all_counts_one_is_the_identity(aggregation):
    x = RNG.normal(size=(3, 4))
    nodes = [fact("x", x), reduce_("r", "x", 3, "k", aggregation), Node("t", Op.TRANSFORM, ("r",), 3, (4,),
                                                                        {"fn": "tanh"})]
    before = program(nodes, {"c_x": x, "k": np.ones(3, dtype=np.int64)})
    after = scatter_to_segment(before, ALL)
    assert [n.op for n in after.nodes] == [Op.FACT, Op.TRANSFORM] and "k" not in after.constants
    assert_same_function(before, after)


def test_transposed_reduction_drops_an_interleaving_gather():
    # The module docstring's example: neuron j reduces rows j and j + 3 of f_h.
    h = RNG.normal(size=(6, 4))
    nodes = [fact("f", h), Node("f_h", Op.TRANSFORM, ("f",), 6, (4,), {"fn": "sigmoid"}),
             gather("x", "f_h", "i", 6, (4,)), reduce_("a", "x", 3, "k", "max")]
    before = program(nodes, {"c_f": h, "i": np.array([0, 3, 1, 4, 2, 5]), "k": np.array([2, 2, 2])})
    after = scatter_to_segment(before, ALL)
    a = after.node("a")
    assert a.srcs == ("f_h",) and a.attrs["kernel"] == "strided" and "x" not in after.by_name()
    assert_same_function(before, after)


def test_transposed_reduction_over_a_slice_of_a_longer_source():
    # Segments read rows (j, j + 4, j + 8) of a 12-row source in j-major order.
    h = RNG.normal(size=(14, 4))
    index = np.arange(12).reshape(3, 4).T.ravel() + 2  # [2, 6, 10, 3, 7, 11, ...]
    nodes = [fact("f", h), Node("t", Op.TRANSFORM, ("f",), 14, (4,), {"fn": "exp"}),
             gather("x", "t", "i", 12, (4,)), reduce_("a", "x", 4, "k", "mean")]
    before = program(nodes, {"c_f": h, "i": index, "k": np.full(4, 3)})
    after = scatter_to_segment(before, ALL)
    a = after.node("a")
    src = after.node(a.srcs[0])
    assert a.attrs["kernel"] == "strided" and src.op is Op.SLICE and src.attrs == {"start": 2, "stop": 14, "step": 1}
    assert_same_function(before, after)


def test_no_transposition_when_it_does_not_help_or_the_gather_is_shared():
    h = RNG.normal(size=(6, 4))
    index = np.array([4, 1, 0, 5, 2, 3])  # random either way
    nodes = [fact("f", h), gather("x", "f", "i", 6, (4,)), reduce_("a", "x", 3, "k")]
    before = program(nodes, {"c_f": h, "i": index, "k": np.full(3, 2)})
    assert scatter_to_segment(before, ALL).node("a").attrs["kernel"] == "dense"
    shared = nodes[:2] + [reduce_("a", "x", 3, "k"), Node("out", Op.CONCAT, ("a", "x"), 9, (4,))]
    before = program(shared, {"c_f": h, "i": np.array([0, 3, 1, 4, 2, 5]), "k": np.full(3, 2)})
    after = scatter_to_segment(before, ALL)
    assert after.node("a").attrs["kernel"] == "dense" and after.node("a").srcs == ("x",)
    assert_same_function(before, after)


def test_transposition_without_dense_reductions():
    h = RNG.normal(size=(6, 4))
    nodes = [fact("f", h), Node("t", Op.TRANSFORM, ("f",), 6, (4,), {"fn": "relu"}),
             gather("x", "t", "i", 6, (4,)), reduce_("a", "x", 3, "k")]
    before = program(nodes, {"c_f": h, "i": np.array([0, 3, 1, 4, 2, 5]), "k": np.full(3, 2)})
    options = Settings.preset("unoptimized", transposed_reductions=True)
    assert scatter_to_segment(before, options).node("a").attrs["kernel"] == "strided"


@pytest.mark.parametrize("switch", ["segment_reductions", "dense_reductions", "transposed_reductions"])
@settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(graph=graphs())
def test_random_graphs_equal_reference(switch, graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", **{switch: True})
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
