"""A gather of a fused sum's rows becomes rows of its sparse matrix (compiler/passes/compose_gathers.py)."""
import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec import datasets
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.compose_gathers import compose_gathers
from neurovec.compiler.passes.kernels import choose_kernels
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from .test_dedup import Builder, assert_same_function, evaluate

SETTINGS = Settings()


def aggregated_then_gathered(index, aggregation="sum"):
    """h = tanh(x); s = sums of h over 3 segments (as a fused sparse sum); y = s[index]."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("W", (2, 2))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    b.gather("edges", "h", [4, 0, 1, 2, 2, 3])
    b.reduce("s", "edges", [2, 3, 1], aggregation)
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


def test_a_gather_that_saves_work_stays():
    """Six readers of the 3-edge segment: composing would add 12 edges for a 6-row gather."""
    before = aggregated_then_gathered([1] * 6)
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
