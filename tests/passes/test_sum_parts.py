"""Sums of whole values as additions (compiler/passes/sum_parts.py)."""
import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.sum_parts import sum_parts
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()


def pairs(kernel=None, aggregation="sum", index=(0, 3, 1, 4, 2, 5), product=True):
    """Sums of rows of a (a matrix product, unless not ``product``) and c."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 6).reshape(3, 2))
    if product:
        b.weights("W", (2, 2))
        b.linear("a", "W", "x", count=3, w_layout="tile", x_layout="full")
    else:
        b.transform("a", "x", "tanh")
    b.transform("c", "x", "exp")
    b.concat("cat", "a", "c")
    b.gather("rows", "cat", list(index))
    b.reduce("s", "rows", [len(index) // 3] * 3, aggregation=aggregation)
    if kernel:
        b.nodes["s"] = b.nodes["s"].with_(attrs={**b.nodes["s"].attrs, "kernel": kernel})
    return b.build("s")


def test_sum_of_two_values_in_order_is_an_addition():
    before = pairs(kernel="dense")
    after = sum_parts(before, SETTINGS)
    s = after.node("s")
    assert s.op is Op.ADD and set(s.srcs) == {"a", "c"}
    assert_same_function(before, after)


def test_strided_rows_and_gathered_terms():
    # strided: rows t * n + j; here term 0 reads c reversed (a gather), term 1 reads a in order.
    before = pairs(kernel="strided", index=(5, 4, 3, 0, 1, 2))
    after = sum_parts(before, SETTINGS)
    s = after.node("s")
    assert s.op is Op.ADD and after.node(s.srcs[0]).op is Op.GATHER and s.srcs[1] == "a"
    assert_same_function(before, after)


def test_other_sums_are_left_alone():
    mixed = pairs(index=(0, 3, 1, 4, 5, 2))      # neuron 2's first input comes from c, the others' from a
    assert sum_parts(mixed, SETTINGS) is mixed
    maximum = pairs(aggregation="max")
    assert sum_parts(maximum, SETTINGS) is maximum


def test_no_addition_that_could_be_negative_zero():
    """-0.0 + -0.0 is -0.0, the neuron's sum (from +0.0) is +0.0: without a matrix product
    among the terms (a sum from +0.0 itself) the reduction stays."""
    plain = pairs(kernel="dense", product=False)
    assert sum_parts(plain, SETTINGS) is plain
    b = neurovec.GraphBuilder()
    zero = b.weight("z", np.array([-0.0, 1.0]), learnable=False)
    one = b.unit_facts("one", 1)
    h = b.layer("h", aggregation="sum", transformation="inverse")
    b.output(h.neuron([(one[0], zero), (one[0], zero)]))
    graph = b.build()
    expected = neurovec.ReferenceModule(graph, torch.float64)()
    assert expected[0, 0] == float("inf")
    torch.testing.assert_close(neurovec.compile(graph, dtype=torch.float64)(), expected)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", sum_parts=True, transposed_reductions=True)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs())
def test_gnn_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings(reorder_linear=False, fold_constants=False)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
