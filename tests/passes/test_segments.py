"""Scatter to segment / dense / strided reductions (thesis 5.2.2, 5.2.9)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Node, Op
from neurovec.compiler.passes.segments import scatter_to_segment
from neurovec.compiler.settings import Settings
from neurovec.sources.graph import Weight

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from .test_simplify_gathers import assert_same_function, fact, gather, program

RNG = np.random.default_rng(1)
ALL = Settings.preset("unoptimized", transposed_reductions=True)


def reduce_(name, src, count, counts_key, aggregation="sum", shape=(4,)):
    return Node(name, Op.REDUCE, (src,), count, shape, {"aggregation": aggregation, "counts": counts_key})


def test_scatter_becomes_segment_or_dense():
    x = RNG.normal(size=(6, 4))
    for counts, kernel in [([1, 3, 2], "segment"), ([2, 2, 2], "dense")]:
        before = program([fact("x", x), reduce_("r", "x", 3, "k", "max")], {"c_x": x, "k": np.array(counts)})
        after = scatter_to_segment(before, ALL)
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


def test_transposition_of_a_chain_of_indexing_ops():
    h = RNG.normal(size=(6, 4))
    nodes = [fact("f", h), Node("t", Op.TRANSFORM, ("f",), 6, (4,), {"fn": "relu"}),
             gather("x", "t", "i", 6, (4,)), reduce_("a", "x", 3, "k")]
    before = program(nodes, {"c_f": h, "i": np.array([0, 3, 1, 4, 2, 5]), "k": np.full(3, 2)})
    options = Settings.preset("unoptimized", transposed_reductions=True)
    assert scatter_to_segment(before, options).node("a").attrs["kernel"] == "strided"


def sage_like(broadcast: bool):
    """A SAGE-like layer: neuron j sums W_l . mean_j + W_r . h_j; inputs read from CONCAT(h, mean)."""
    n = 4
    h, mean = RNG.normal(size=(n, 3)), RNG.normal(size=(n, 3))
    weights = [Weight("l", RNG.normal(size=(2, 3))), Weight("r", RNG.normal(size=(2, 3)))]
    pairs = np.stack([np.arange(n) + n, np.arange(n)], 1).ravel()  # [mean_0, h_0, mean_1, h_1, ...]
    nodes = [fact("h", h), fact("mean", mean), Node("cat", Op.CONCAT, ("h", "mean"), 2 * n, (3,)),
             gather("x", "cat", "i", 2 * n, (3,)), Node("W", Op.WEIGHTS, (), 2, (2, 3), {"names": ("l", "r")})]
    if broadcast:
        nodes.append(Node("lin", Op.LINEAR, ("W", "x"), 2 * n, (2,), {"kind": "matmul", "w_layout": "tile"}))
        constants = {}
    else:
        nodes += [gather("w", "W", "iw", 2 * n, (2, 3)), Node("lin", Op.LINEAR, ("w", "x"), 2 * n, (2,),
                                                               {"kind": "matmul"})]
        constants = {"iw": np.tile([0, 1], n)}
    nodes.append(reduce_("a", "lin", n, "k", shape=(2,)))
    return program(nodes, {"c_h": h, "c_mean": mean, "i": pairs, "k": np.full(n, 2), **constants}, weights)


@pytest.mark.parametrize("broadcast", [True, False])
def test_transposed_reduction_through_a_linear(broadcast):
    # Thesis 5.2.9: the pairs [mean_j, h_j] are two interleaved blocks; reading the blocks
    # whole (CONCAT(mean, h)) and reducing strided drops the gather of values (and weights).
    before = sage_like(broadcast)
    after = scatter_to_segment(before, ALL)
    a, lin = after.node("a"), after.node("lin")
    assert a.attrs["kernel"] == "strided"
    x = after.node(lin.srcs[1])
    assert x.op is Op.CONCAT and x.srcs == ("mean", "h")
    if broadcast:
        assert lin.srcs[0] == "W" and lin.attrs["w_layout"] == "interleave"
    else:
        w = after.node(lin.srcs[0])
        assert w.op is Op.INTERLEAVE and w.srcs == ("W",) and w.attrs["times"] == 4
    assert not any(n.op is Op.GATHER for n in after.nodes)
    assert_same_function(before, after)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", transposed_reductions=True)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
