"""A sum of two shared-weight products of static facts as one GEMM (compiler/passes/fuse_fact_products.py)."""
import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec import datasets
from neurovec.compiler.passes.fuse_fact_products import fuse_fact_products
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()


def two_products(reader="tanh", dynamic=(), bias=False):
    """y = reader(x @ A.T + m @ B.T) over facts x and m; with ``bias``, y = (x @ A.T + m @ B.T) + C."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 15).reshape(5, 3))
    b.fact("m", np.linspace(2, -1, 10).reshape(5, 2))
    b.weights("A", (4, 3))
    b.weights("B", (4, 2))
    b.linear("ax", "A", "x", w_layout="tile")
    b.linear("bm", "B", "m", w_layout="tile")
    b.add("s", "ax", "bm")
    if bias:
        b.weights("C", (4,))
        b.add("y", "s", "C")
    else:
        b.transform("y", "s", reader)
    return b.build("y").replace(dynamic_facts=dynamic)


def test_one_product_over_the_facts_side_by_side():
    before = two_products()
    after = fuse_fact_products(before, SETTINGS)
    key = after.node("s").attrs["hcat"]
    np.testing.assert_array_equal(after.constants[key], np.hstack([before.constants["c_x"], before.constants["c_m"]]))
    code = CompiledModule(after, torch.float64).code
    # Five rows: the weights side by side, transposed once (their layout costs nothing at this size).
    assert f"s = self.{key} @ torch.cat([w['A0'], w['B0']], 1).T" in code and "ax =" not in code
    assert_same_function(before, after)


def test_gathered_products_read_their_facts_gathered():
    """Deduplicated sides (products on distinct rows, gathered back): the constant holds the gathered facts."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 6).reshape(2, 3))
    b.fact("m", np.linspace(2, -1, 6).reshape(3, 2))
    b.weights("A", (4, 3))
    b.weights("B", (4, 2))
    b.linear("ax", "A", "x", w_layout="tile")
    b.linear("bm", "B", "m", w_layout="tile")
    b.gather("ga", "ax", [0, 1, 1, 0, 1])
    b.gather("gb", "bm", [2, 2, 0, 1, 0])
    b.add("s", "ga", "gb")
    b.transform("y", "s", "relu")
    before = b.build("y")
    after = fuse_fact_products(before, SETTINGS)
    key = after.node("s").attrs["hcat"]
    np.testing.assert_array_equal(after.constants[key], np.hstack([before.constants["c_x"][[0, 1, 1, 0, 1]],
                                                                   before.constants["c_m"][[2, 2, 0, 1, 0]]]))
    code = CompiledModule(after, torch.float64).code
    assert "index_select" not in code and "ax =" not in code and f"self.{key} @" in code
    assert_same_function(before, after)


def test_not_for_dynamic_facts_nor_where_the_zero_sign_matters():
    before = two_products(dynamic=("x",))
    assert fuse_fact_products(before, SETTINGS) is before
    before = two_products(reader="inverse")
    assert fuse_fact_products(before, SETTINGS) is before


def test_sage_first_layer_is_one_gemm(tu_dir):
    """With continuous features (nothing merges) the first layer reads the features and their folded means."""
    from neurovec.benchmarks.tasks import replicate_tu
    graph = datasets.sage(replicate_tu(datasets.load_tu("MUTAG", tu_dir, download=False), 1, first_copy=True), hidden=4)
    module = neurovec.compile(graph, dtype=torch.float64)
    # With the bias: torch.addmm(b, facts, weights); 3371 rows: a row-major right side (NOTE: [weight gradient layout]).
    assert "self.hcat_conv1_agg, torch.cat([w['conv1.lin_l.weight'].T, w['conv1.lin_r.weight'].T]))" in module.code
    assert_equivalent(graph, module)
    # With labels, the products on the distinct rows, gathered back: the same single GEMM.
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir, download=False), hidden=4)
    module = neurovec.compile(graph, dtype=torch.float64)
    assert "self.hcat_conv1_agg, torch.cat([w['conv1.lin_l.weight'], w['conv1.lin_r.weight']], 1).T)" in module.code
    assert_equivalent(graph, module)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs())
def test_random_gnn_graphs(graph):
    assume(all_finite(graph))
    for options in (Settings(), Settings(compose_gathers=False, reorder_linear=False)):
        assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
