"""One GEMM per weight matrix instead of per-row products (compiler/passes/split_products.py)."""
import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.split_products import split_products
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()


def alternating(weights=2, rows=6):
    """Rows alternate between ``weights`` matrices; the inputs come from two values."""
    b = Builder()
    b.fact("a", np.linspace(-1, 1, 9).reshape(3, 3))
    b.fact("c", np.linspace(0, 2, 9).reshape(3, 3))
    b.transform("m", "c", "tanh")
    b.concat("cat", "a", "m")
    b.gather("x", "cat", [3, 0, 4, 1, 5, 2][:rows])            # m0 a0 m1 a1 m2 a2
    b.weights("W", (2, 3), k=weights)
    b.gather("w", "W", [k % weights for k in range(rows)])
    b.linear("l", "w", "x")
    return b.build("l")


def test_two_weights_become_two_shared_products():
    before = alternating()
    after = split_products(before, SETTINGS)
    products = [n for n in after.nodes if n.op is Op.LINEAR]
    assert len(products) == 2 and all(after.node(p.srcs[0]).count == 1 for p in products)
    # Each weight's rows are read from the value they come from, not through the CONCAT.
    assert sorted(after.node(p.srcs[1]).name for p in products) == ["a", "m"]
    assert "cat" not in after.by_name()
    assert_same_function(before, after)


def test_many_weights_are_left_alone():
    before = alternating(weights=6)
    after = split_products(before, SETTINGS.model_copy())
    assert len([n for n in after.nodes if n.op is Op.LINEAR]) == 6
    from neurovec.compiler.passes import split_products as module
    old, module.MAX_WEIGHTS = module.MAX_WEIGHTS, 5
    try:
        assert split_products(before, SETTINGS) is before
    finally:
        module.MAX_WEIGHTS = old


def test_sage_products_on_mutag_are_shared(tu_dir):
    from neurovec.datasets import load_tu, sage
    graph = sage(load_tu("MUTAG", tu_dir), hidden=4)
    program = build_program(graph, Settings(reorder_linear=False, fold_constants=False))
    nodes = program.by_name()
    products = [n for n in program.nodes if n.op is Op.LINEAR]
    assert products and all(nodes[n.srcs[0]].count == 1 for n in products)
    assert_equivalent(graph, neurovec.compile(graph, dtype=torch.float64))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", split_products=True)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs())
def test_gnn_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings(reorder_linear=False, fold_constants=False, sum_parts=False)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
