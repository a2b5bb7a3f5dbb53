"""Fixed scalar factors into the reduction's per-edge coefficients (compiler/passes/coefficients.py)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.coefficients import reduce_coefficients
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import GraphError

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

# Only this pass of the algebra group, so its result is visible.
ONLY = Settings(reorder_linear=False, fold_constants=False)


def normalised_sum():
    """h = tanh(x); r_j = sum of fixed c_e * h[src_e] (GCN's normalisation)."""
    b = Builder()
    b.fact("x", np.arange(8.0).reshape(4, 2) / 8)
    b.transform("h", "x", "tanh")
    b.gather("hx", "h", [0, 1, 1, 2, 3])
    b.weights("c", (), k=3, learnable=False, values=[0.5, 0.25, 2.0])
    b.gather("cw", "c", [0, 1, 2, 2, 0])
    b.linear("p", "cw", "hx")
    b.reduce("r", "p", [2, 3])
    return b


def test_fixed_factors_become_coefficients():
    before = normalised_sum().build("r")
    after = reduce_coefficients(before, ONLY)
    r = after.node("r")
    assert after.constants[r.attrs["coef"]].tolist() == [0.5, 0.25, 2.0, 2.0, 0.5]
    assert not [n for n in after.nodes if n.op is Op.LINEAR]
    assert after.constants[after.node(r.srcs[0]).attrs["index"]].tolist() == [0, 1, 1, 2, 3]
    assert_same_function(before, after)


def test_mean_becomes_a_weighted_sum():
    b = normalised_sum()
    b.nodes["r"] = b.nodes["r"].with_(attrs={**b.nodes["r"].attrs, "aggregation": "mean"})
    before = b.build("r")
    after = reduce_coefficients(before, ONLY)
    r = after.node("r")
    assert r.attrs["aggregation"] == "sum"
    np.testing.assert_allclose(after.constants[r.attrs["coef"]], [0.25, 0.125, 2 / 3, 2 / 3, 0.5 / 3])
    assert_same_function(before, after)


def test_learnable_factors_and_other_aggregations_are_left_alone():
    b = normalised_sum()
    del b.nodes["r"]
    b.weights("d", (), k=3)
    b.gather("dw", "d", [0, 1, 2, 2, 0])
    b.linear("q", "dw", "hx")
    b.reduce("s", "q", [2, 3])
    b.reduce("m", "p", [2, 3], aggregation="max")
    b.concat("both", "s", "m")
    program = b.build("both")
    assert reduce_coefficients(program, ONLY) is program


def test_zero_factor_times_inf_stays_nan():
    """0 * inf is NaN: the isolated-node artefact's zero factors must not be dropped."""
    b = neurovec.GraphBuilder()
    zero = b.weight("zero", 0.0, learnable=False)
    one = b.weight("one", 1.0, learnable=False)
    x = b.facts("x", np.array([[0.0, 1.0], [2.0, 3.0]]))
    h = b.layer("h", transformation="inverse")           # 1/0 = inf
    h0, h1 = h.neuron([(x[0], None)]), h.neuron([(x[1], None)])
    layer = b.layer("l", aggregation="sum")
    b.output(layer.neuron([(h0, zero), (h1, one)]), layer.neuron([(h1, zero)]))
    graph = b.build()
    expected = ReferenceModule(graph, torch.float64)().detach()
    assert torch.isnan(expected[0, 0])
    program = build_program(graph, ONLY)
    assert any("coef" in n.attrs for n in program.nodes)
    torch.testing.assert_close(neurovec.compile(graph, ONLY, dtype=torch.float64)().detach(), expected,
                               equal_nan=True)


def scalar_fact_graph():
    """A learnable vector weight times scalar facts: the facts are the fixed factors."""
    b = neurovec.GraphBuilder()
    v = b.weight("v", np.array([1.0, -2.0]))
    c = b.facts("c", np.array([0.5, 3.0]))
    layer = b.layer("l", aggregation="sum", transformation="tanh")
    b.output(layer.neuron([(c[0], v), (c[1], v)]), layer.neuron([(c[1], v)]))
    return b.build()


def test_static_scalar_facts_are_used_and_frozen():
    graph = scalar_fact_graph()
    module = neurovec.compile(graph, ONLY, dtype=torch.float64)
    assert any("coef" in n.attrs for n in module.program.nodes)
    assert_equivalent(graph, module)
    with pytest.raises(GraphError, match="cannot be replaced"):
        module(facts={"c": torch.ones(2)})


def test_dynamic_scalar_facts_are_not_used():
    graph = scalar_fact_graph()
    options = ONLY.model_copy(update={"dynamic_facts": ("c",)})
    module = neurovec.compile(graph, options, dtype=torch.float64)
    assert not any("coef" in n.attrs for n in module.program.nodes)
    facts = {"c": torch.tensor([2.0, -1.0], dtype=torch.float64)}
    torch.testing.assert_close(module(facts=facts), ReferenceModule(graph)(facts))


def test_gcn_normalisation_on_mutag(tu_dir):
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir), hidden=4)
    program = build_program(graph, ONLY)
    # The 1/sqrt(deg deg) factors are no longer multiplied per edge and step.
    assert not [n for n in program.nodes if n.op is Op.LINEAR and n.attrs["kind"] == "mul"]
    assert [n for n in program.nodes if n.op is Op.REDUCE and "coef" in n.attrs]
    assert_equivalent(graph, neurovec.compile(graph, ONLY, dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs())
def test_gnn_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, ONLY, dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, Settings.preset("unoptimized", reduce_coefficients=True),
                                              dtype=torch.float64))


def scaled_after_the_sum(scales):
    """s_j = d[k_j] * r_j, r the normalised sum above, d fixed scalars (GCN's factorised target side)."""
    b = normalised_sum()
    b.weights("d", (), k=2, learnable=False, values=scales)
    b.gather("dw", "d", [1, 0])
    b.linear("s", "dw", "r")
    b.transform("out", "s", "tanh")
    return b.build("out")


def test_a_positive_factor_after_the_sum_goes_into_its_coefficients():
    """GCN's 1/sqrt(deg_i) after the sum: no product over the rows left, each edge's c_e * d_i."""
    before = scaled_after_the_sum([0.5, 4.0])
    after = reduce_coefficients(before, ONLY)
    s = after.node("s")
    assert s.op is Op.REDUCE and not [n for n in after.nodes if n.op in (Op.LINEAR, Op.WEIGHTS)]
    assert after.constants[s.attrs["coef"]].tolist() == [0.5 * 4, 0.25 * 4, 2.0 * 0.5, 2.0 * 0.5, 0.5 * 0.5]
    assert_same_function(before, after)


@pytest.mark.parametrize("scales", [[-0.5, 4.0], [0.0, 4.0], [np.inf, 4.0]])
def test_a_factor_that_is_not_positive_and_finite_stays_after_the_sum(scales):
    """-d * (+0.0) is -0.0 but a sum of -d-weighted terms from +0.0 is not; 0 * inf and inf * 0 are NaN."""
    after = reduce_coefficients(scaled_after_the_sum(scales), ONLY)
    assert after.node("s").op is Op.LINEAR and after.node("r").op is Op.REDUCE


def layers_over_one_graph(edges):
    """Three GCN-like layers over 4 nodes: each scales its rows by the fixed per-node c (a gather
    of 3 values), then sums them over the edges ``edges[k]`` (6 edges into 4 segments)."""
    b = Builder()
    b.fact("x", np.arange(8.0).reshape(4, 2) / 8)
    b.weights("c", (), k=3, learnable=False, values=[0.5, 0.25, 2.0])
    value = "x"
    for k, index in enumerate(edges):
        b.transform(f"h{k}", value, "tanh")
        b.gather(f"cw{k}", "c", [0, 1, 2, 2])
        b.linear(f"p{k}", f"cw{k}", f"h{k}")
        b.gather(f"e{k}", f"p{k}", index)
        value = b.reduce(f"r{k}", f"e{k}", [1, 2, 1, 2])
    return b.build(value)


def test_layers_over_one_graph_share_their_coefficients():
    """The per-edge factors (edges read more rows than the scalar side has) of a layer with the same
    edges and factors as an earlier one are the earlier one's array, not a new gather; a layer
    with other edges gets its own."""
    one, other = [3, 0, 1, 1, 2, 0], [3, 0, 1, 1, 2, 1]
    before = layers_over_one_graph([one, list(one), other])
    after = reduce_coefficients(before, ONLY)
    coefs = [after.constants[after.node(f"r{k}").attrs["coef"]] for k in range(3)]
    assert coefs[1] is coefs[0] and not coefs[0].flags.writeable
    assert coefs[2] is not coefs[0]
    assert coefs[0].tolist() == [2.0, 0.5, 0.25, 0.25, 2.0, 0.5]
    assert coefs[2].tolist() == [2.0, 0.5, 0.25, 0.25, 2.0, 0.25]
    assert_same_function(before, after)
