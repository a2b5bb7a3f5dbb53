"""Commuting shared products with reductions (compiler/passes/reorder_linear.py)."""
import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.reorder_linear import pull_linear_up, push_linear_down
from neurovec.compiler.indexing import is_constant
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings
from neurovec.engines.reference import ReferenceModule

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()
NO_FOLD = Settings(fold_constants=False)


def widening(width_in=2, width_out=5, inputs="tanh"):
    """r_j = sum_e (W h)[src_e] with W (width_out x width_in) shared."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 4 * width_in).reshape(4, width_in))
    b.transform("h", "x", inputs) if inputs else None
    b.weights("W", (width_out, width_in))
    b.linear("l", "W", "h" if inputs else "x", count=4, w_layout="tile", x_layout="full")
    b.gather("g", "l", [0, 1, 1, 2, 3, 3, 0])
    b.reduce("r", "g", [3, 4])
    return b


def test_widening_product_moves_after_the_sum():
    before = widening().build("r").replace(dynamic_facts=("x",))   # not a constant
    after = pull_linear_up(before, SETTINGS)
    r = after.node("r")
    assert r.op is Op.LINEAR and r.shape == (5,)
    inner = after.node(r.srcs[1])
    assert inner.op is Op.REDUCE and inner.shape == (2,)     # the sum runs 2 wide
    assert_same_function(before, after)


def test_narrowing_product_stays_before_the_sum():
    before = widening(width_in=5, width_out=2).build("r").replace(dynamic_facts=("x",))
    assert pull_linear_up(before, SETTINGS) is before
    static = before.replace(dynamic_facts=())   # but over constants it moves, for folding
    assert pull_linear_up(static, SETTINGS).node("r").op is Op.LINEAR


def test_product_of_constants_moves_even_when_not_wider():
    """Then the sum over the facts is a constant for fold_constants (here W: 2 -> 2)."""
    before = widening(width_in=2, width_out=2, inputs=None).build("r")
    after = pull_linear_up(before, SETTINGS)
    assert after.node("r").op is Op.LINEAR
    assert is_constant(after, after.by_name()) >= {"x", after.node("r").srcs[1]}
    assert_same_function(before, after)


def readout(shared_twice=False):
    """z = V h (4 -> 4), a = sum over edges, + bias, pooled by a mean, then W (4 -> 1)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 12).reshape(4, 3))
    b.weights("U", (4, 3))
    b.linear("hl", "U", "x", count=4, w_layout="tile", x_layout="full")
    b.transform("h", "hl", "tanh")
    b.weights("V", (4, 4))
    b.linear("z", "V", "h", count=4, w_layout="tile", x_layout="full")
    b.gather("zg", "z", [0, 1, 2, 3, 3, 1])
    b.reduce("a", "zg", [2, 1, 3])
    b.weights("B", (4,), k=2)
    b.gather("bias", "B", [1, 1, 1])
    b.add("ab", "a", "bias")
    b.reduce("pool", "ab", [1, 2], aggregation="mean")
    b.weights("W", (1, 4))
    b.linear("out", "W", "pool", count=2, w_layout="tile", x_layout="full")
    if shared_twice:
        b.transform("t", "a", "relu")          # the aggregation is read twice: it keeps its width
        b.reduce("tr", "t", [3])
        b.linear("tl", "W", "tr", count=1)
        b.concat("both", "out", "tl")
        return b.build("both")
    return b.build("out")


def test_narrowing_product_moves_to_the_inputs():
    before = readout()
    after = push_linear_down(before, SETTINGS)
    nodes = after.by_name()
    assert nodes["a"].shape == nodes["pool"].shape == nodes["ab"].shape == (1,)   # all 1 wide now
    assert nodes["z"].op is Op.LINEAR and nodes["z"].shape == (1,) and nodes["z"].srcs[1] == "h"
    merged = nodes[nodes["z"].srcs[0]]
    assert merged.op is Op.LINEAR and merged.count == 1 and merged.shape == (1, 3 + 1)   # W V: (1 x 4)
    assert_same_function(before, after)


def test_values_read_twice_keep_their_width():
    before = readout(shared_twice=True)
    after = push_linear_down(before, SETTINGS)
    assert after.node("a").shape == (4,)
    assert after.node("pool").shape == (1,)    # the pool alone still moves the product
    assert_same_function(before, after)


def test_gcn_on_mutag_aggregates_narrow_rows(tu_dir):
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir), hidden=16)
    program = build_program(graph, NO_FOLD)
    widths = [n.shape for n in program.nodes if n.op is Op.REDUCE]
    assert widths and all(shape in ((7,), (1,)) for shape in widths)   # never 16 wide
    assert_equivalent(graph, neurovec.compile(graph, NO_FOLD, dtype=torch.float64))


def test_dynamic_facts_still_replaceable():
    b = neurovec.GraphBuilder()
    w = b.weight("W", np.arange(6.0).reshape(3, 2) / 6)
    x = b.facts("x", np.ones((3, 2)))
    lin = b.layer("lin")
    rows = [lin.neuron([(x[i], w)]) for i in range(3)]
    agg = b.layer("agg", aggregation="mean", transformation="tanh")
    b.output(agg.neuron([(rows[0], None), (rows[1], None)]), agg.neuron([(rows[2], None), (rows[0], None)]))
    graph = b.build()
    module = neurovec.compile(graph, Settings(dynamic_facts=("x",)), dtype=torch.float64)
    assert [n for n in module.program.nodes if n.op is Op.REDUCE][0].shape == (2,)   # pulled, not folded
    facts = {"x": torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 0.0]], dtype=torch.float64)}
    torch.testing.assert_close(module(facts=facts), ReferenceModule(graph)(facts))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs())
def test_gnn_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, NO_FOLD, dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", reorder_linear=True, reduce_coefficients=True)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))
