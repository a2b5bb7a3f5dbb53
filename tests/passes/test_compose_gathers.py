"""A gather of a fused sum's rows becomes rows of its sparse matrix (compiler/passes/compose_gathers.py)."""
import numpy as np
import torch
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import datasets
from neurovec.compiler.ir import Op
from neurovec.compiler.passes import compose_gathers as compose_gathers_pass
from neurovec.compiler.passes.compose_gathers import compose_gathers
from neurovec.compiler.passes.kernels import choose_kernels
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function, evaluate

SETTINGS = Settings()


def summed(aggregation="sum", edges=(4, 0, 1, 2, 2, 3), counts=(2, 3, 1)) -> Builder:
    """A program up to s = sums of tanh(x W) (5 rows) over ``edges`` into ``len(counts)`` segments
    (``aggregation``; a fused sparse sum)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("W", (2, 2))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    b.gather("edges", "h", list(edges))
    b.reduce("s", "edges", list(counts), aggregation)
    return b


def aggregated_then_gathered(index, aggregation="sum"):
    """h = tanh(x); s = sums of h over 3 segments (as a fused sparse sum); y = s[index]."""
    b = summed(aggregation)
    b.gather("y", "s", index)
    b.transform("out", "y", "sigmoid")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


def test_gather_of_a_fused_sum_becomes_its_rows():
    before = aggregated_then_gathered([0, 1, 1, 2], "mean")
    assert before.node("s").attrs["kernel"] == "sparse_mm"
    after = compose_gathers(before, SETTINGS)
    y = after.node("y")
    assert y.op is Op.REDUCE and y.srcs == ("h",) and "s" not in after.by_name()
    assert after.constants[y.attrs["counts"]].tolist() == [2, 3, 3, 1]
    assert after.constants[y.attrs["index"]].tolist() == [4, 0, 1, 2, 2, 1, 2, 2, 3]
    # The same sums in the same order: bitwise equal outputs.
    assert torch.equal(evaluate(after)[0], evaluate(before)[0])
    assert_same_function(before, after)


def test_a_gather_that_saves_work_stays(monkeypatch):
    """Six readers of the 3-edge segment: composing would add 12 edges for a 6-row gather,
    which is worth it only for the cost of the gather op itself (GATHER_OP_ENTRIES)."""
    before = aggregated_then_gathered([1] * 6)
    assert compose_gathers(before, SETTINGS) is not before
    monkeypatch.setattr(compose_gathers_pass, "GATHER_OP_ENTRIES", 10)  # 12 > 6 + 10 // 2
    assert compose_gathers(before, SETTINGS) is before


def test_per_edge_coefficients_follow_their_edges():
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 8).reshape(4, 2))
    b.weights("W", (2, 2))
    b.linear("hw", "W", "x", w_layout="tile")
    b.gather("edges", "hw", [3, 0, 1, 2])
    b.reduce("s", "edges", [1, 3])
    b.gather("y", "s", [1, 0])
    program = b.build("y")
    node = program.node("s")
    constants = dict(program.constants, coef=np.array([0.5, 2.0, -1.0, 3.0]))
    nodes = tuple(n.with_(attrs=dict(n.attrs, coef="coef")) if n.name == "s" else n for n in program.nodes)
    before = choose_kernels(program.replace(nodes=nodes, constants=constants), Settings(reduce_kernel="sparse_mm"))
    assert before.node(node.name).attrs["kernel"] == "sparse_mm"
    after = compose_gathers(before, SETTINGS)
    y = after.node("y")
    assert after.constants[y.attrs["coef"]].tolist() == [2.0, -1.0, 3.0, 0.5]
    assert torch.equal(evaluate(after)[0], evaluate(before)[0])
    assert_same_function(before, after)


def two_sums_then_gathered(edges2, output="y"):
    """Two layers over one graph: s sums rows of tanh(x W) over 5 segments; s2 sums rows of
    tanh(s) over the edges ``edges2`` and the same segments (with s's edges: one matrix); a
    gather y reads s2; ``output`` is y, or sigmoid of y's rows."""
    b = summed(edges=(4, 0, 1, 2, 2, 3, 0), counts=(2, 1, 1, 2, 1))
    b.transform("h2", "s", "tanh")
    b.gather("edges2", "h2", edges2)
    b.reduce("s2", "edges2", [2, 1, 1, 2, 1])
    b.gather("y", "s2", [0, 1, 1, 3])
    b.transform("out", "y", "sigmoid")
    return choose_kernels(b.build(output), Settings(reduce_kernel="sparse_mm"))


def test_a_gather_stays_where_composing_would_unshare_a_matrix(monkeypatch):
    """s and s2 read their sources through one matrix, which the module builds once. Composing
    the output gather y into s2 would make a second matrix of 6 edges: more than the 4 rows it
    saves. Where s2's matrix is its own (one edge differs), composing adds -1 edges and is made,
    and so it is where y is not the output (later passes may join s2 into a new matrix anyway).
    (Without the gather op's own cost, which makes any gather this small worth composing.)"""
    monkeypatch.setattr(compose_gathers_pass, "GATHER_OP_ENTRIES", 0)
    shared = two_sums_then_gathered([4, 0, 1, 2, 2, 3, 0])
    assert compose_gathers(shared, SETTINGS) is shared
    inside = two_sums_then_gathered([4, 0, 1, 2, 2, 3, 0], output="out")
    assert compose_gathers(inside, SETTINGS).node("y").op is Op.REDUCE
    own = two_sums_then_gathered([4, 0, 1, 2, 2, 3, 1])
    after = compose_gathers(own, SETTINGS)
    assert after.node("y").op is Op.REDUCE
    assert torch.equal(evaluate(after)[0], evaluate(own)[0])
    assert_same_function(own, after)


def gathered_through(index, n_ops=2):
    """s = sums of tanh(x W) over 3 segments (fused); t = sigmoid(s + c) (n_ops row-wise ops); y = t[index]."""
    b = summed()
    value = "s"
    if n_ops >= 1:
        b.weights("c", (2,))
        value = b.add("sc", "s", "c")
    if n_ops >= 2:
        value = b.transform("t", value, "sigmoid")
    b.gather("y", value, index)
    b.transform("out", "y", "tanh")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


def test_a_gather_after_row_wise_ops_picks_the_sums_rows_before_them():
    """The outputs of a deduplicated readout: sigmoid(sum + bias) of the distinct samples, then a gather."""
    before = gathered_through([0, 1, 2, 1])
    after = compose_gathers(before, SETTINGS)
    assert [n.op for n in after.nodes[-4:]] == [Op.REDUCE, Op.ADD, Op.TRANSFORM, Op.TRANSFORM]
    y = after.node("y")
    assert y.op is Op.TRANSFORM and y.attrs["fn"] == "sigmoid" and y.count == 4
    biased = after.node(y.srcs[0])
    assert biased.op is Op.ADD and biased.srcs[1] == "c"
    summed = after.node(biased.srcs[0])
    assert summed.op is Op.REDUCE and summed.srcs == ("h",)
    assert after.constants[summed.attrs["counts"]].tolist() == [2, 3, 1, 3]
    assert not {"s", "sc", "t"} & set(after.by_name())
    assert torch.equal(evaluate(after)[0], evaluate(before)[0])  # the same ops on the same rows
    assert_same_function(before, after)


def test_row_wise_ops_on_many_more_rows_stay_before_the_gather():
    """Eight rows from three: two ops on five rows more cost more than the gather of eight."""
    before = gathered_through([0, 1, 2, 0, 1, 2, 2, 2][:8], n_ops=2)
    before_one = gathered_through([2, 0, 1, 2, 2, 2, 2, 2], n_ops=1)
    assert compose_gathers(before, SETTINGS) is before
    assert compose_gathers(before_one, SETTINGS) is not before_one  # one op: 5 <= 8


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_ops=st.integers(0, 2), index=st.lists(st.integers(0, 2), min_size=1, max_size=8))
def test_gathers_through_row_wise_ops_keep_every_bit(n_ops, index):
    before = gathered_through(index, n_ops)
    after = compose_gathers(before, SETTINGS)
    assert torch.equal(evaluate(after)[0], evaluate(before)[0])
    assert_same_function(before, after, tol=1e-12)


def duplicated_samples() -> neurovec.Graph:
    """A GCN-like model over samples of which some are equal: deduplication computes each distinct
    output once and gathers them into the declared order (sigmoid(mean + bias) first)."""
    rng = np.random.default_rng(1)
    b = neurovec.GraphBuilder()
    x = b.facts("x", rng.normal(size=(4, 3)))
    W, bias = b.weight("W", rng.normal(size=(2, 3))), b.weight("b", rng.normal(size=2))
    V, c = b.weight("V", rng.normal(size=(1, 2))), b.weight("c", rng.normal(size=1))
    h = b.layer("h", transformation="relu")
    g = b.layer("g", aggregation="sum")
    out = b.layer("out", aggregation="mean", transformation="sigmoid")
    hs = [h.neuron([(x[i], W)], bias=bias) for i in range(4)]
    samples = [[0, 1], [2, 3], [1, 2, 3], [0, 1], [2, 3], [0, 1]]
    outputs = []
    for nodes in samples:
        gs = [g.neuron([(hs[j], V) for j in nodes], bias=c) for _ in nodes]
        outputs.append(out.neuron(gs))
    b.output(*outputs)
    return b.build()


def test_fires_on_the_outputs_of_duplicated_samples():
    graph = duplicated_samples()
    without = build_program(graph, Settings(compose_gathers=False))
    program = build_program(graph, Settings())
    assert without.node(without.output).op is Op.GATHER
    assert program.node(program.output).op is not Op.GATHER


@pytest.mark.parametrize("preset", neurovec.list_presets())
def test_duplicated_samples_equal_the_reference_under_every_preset(preset):
    assert_equivalent(duplicated_samples(), neurovec.compile(duplicated_samples(), preset, dtype=torch.float64))


def test_fires_on_sage(tu_dir):
    """SAGE's deduplicated neighbour means, gathered back to the nodes: the gather goes."""
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir, download=False), hidden=4)
    with_pass = build_program(graph, Settings())
    without = build_program(graph, Settings(compose_gathers=False))
    gathers = [n for n in without.nodes if n.op is Op.GATHER and without.node(n.srcs[0]).op is Op.REDUCE]
    assert gathers and not any(n.op is Op.GATHER and with_pass.node(n.srcs[0]).op is Op.REDUCE
                               for n in with_pass.nodes)
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs() | graphs())
def test_random_graphs_keep_their_function(graph):
    """On the programs the default pipeline leaves, the pass changes no output bit."""
    assume(all_finite(graph))
    before = build_program(graph, Settings(compose_gathers=False))
    after = compose_gathers(before, SETTINGS)
    assert_same_function(before, after, tol=1e-9)
    assert torch.equal(evaluate(after)[0], evaluate(before)[0])
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))
