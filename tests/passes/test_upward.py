"""Upward gather propagation (thesis 5.2.7): gathers move into the nodes that produce their input."""
import sys
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.compiler.ir import Op, Program
from neurovec.compiler import row_planner
from neurovec.compiler.indexing import is_regular_index
from neurovec.compiler.passes.upward import propagate_gathers_up
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.row_planner import MAX_CONCAT_RUNS
from neurovec.compiler.rewrite import eliminate_dead_code
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function, index_of

FREE = Settings.preset("upward-00-free")
UNLIMITED = Settings.preset("upward-17-aggressive")


def irregular_gathers(program: Program) -> list[str]:
    """Gathers that unlimited upward growth should have removed: every irregular gather except
    the documented exception, one that reads a CONCAT in more than ``MAX_CONCAT_RUNS`` runs."""
    program = eliminate_dead_code(program)
    nodes = program.by_name()

    def concat_runs(node) -> int:
        counts = [nodes[p].count for p in nodes[node.srcs[0]].srcs]
        part = np.searchsorted(np.cumsum(counts), program.constants[node.attrs["index"]], side="right")
        return 1 + int(np.count_nonzero(np.diff(part)))

    return [n.name for n in program.nodes if n.op is Op.GATHER and not is_regular_index(
        program.constants[n.attrs["index"]], nodes[n.srcs[0]].count)
        and not (nodes[n.srcs[0]].op is Op.CONCAT and concat_runs(n) > MAX_CONCAT_RUNS)]


def layer(b: Builder, name: str, src: str, edges, counts, fn="sigmoid"):
    """``fn(sum of src[edges] per segment + bias)``: GATHER -> REDUCE -> ADD -> TRANSFORM."""
    b.layer = name
    b.gather(f"{name}_x", src, edges)
    b.reduce(f"{name}_agg", f"{name}_x", counts)
    b.weights(f"{name}_B", b.nodes[src].shape)
    b.gather(f"{name}_b", f"{name}_B", [0] * len(counts))
    b.add(f"{name}_biased", f"{name}_agg", f"{name}_b")
    b.transform(name, f"{name}_biased", fn)
    b.layer = None
    return name


def two_layers(output_index, first_edges=(0, 1, 2, 2, 3), first_counts=(2, 1, 2)):
    b = Builder()
    b.fact("x", np.arange(8.0).reshape(4, 2) / 4, layer="x")
    layer(b, "h", "x", list(first_edges), list(first_counts))
    layer(b, "q", "h", [0, 1, 2, 1], [1, 1, 2], fn="tanh")
    b.gather("output", "q", output_index)
    return b


def test_a_reordering_gather_moves_up_for_free():
    before = two_layers([2, 0, 1]).build("output")
    assert irregular_gathers(before) == ["h_x", "q_x", "output"]
    after = propagate_gathers_up(before, FREE)
    assert after.output == "q" and after.node("q").count == 3
    # The permutation went through q's segments and into q's input gather; on top of h it
    # would duplicate h's rows (q reads h's row 1 twice), so it stops there.
    assert after.constants[after.node("q_agg").attrs["counts"]].tolist() == [2, 1, 1]
    assert index_of(after, "q_x") == [2, 1, 0, 1]
    assert irregular_gathers(after) == ["h_x", "q_x"]
    assert_same_function(before, after)


def test_a_permutation_reaches_the_facts_for_free():
    b = two_layers([0, 1, 2], first_edges=(3, 1, 0, 2), first_counts=(1, 1, 2))
    b.constants["i_q_x"] = np.array([2, 0, 1, 0])
    before = b.build("output")
    after = propagate_gathers_up(before, FREE)
    # h_x only reorders x: it is folded into the fact, which stops being a replaceable input.
    assert "h_x" not in after.by_name() and after.node("x").attrs["fact_layer"] is None
    assert_same_function(before, after)


def test_free_does_not_duplicate_rows():
    before = two_layers([2, 0, 1, 1]).build("output")
    after = propagate_gathers_up(before, FREE)
    assert after.node(after.output).op is Op.GATHER and after.node("q").count == 3
    assert_same_function(before, after)


@pytest.mark.parametrize("growth_abs,growth_rel,moves", [
    (0, 1.0, True),    # q: 3 -> 5 rows <= 3 * 2; h: 3 -> 4 <= 6; x: 4 -> 6 <= 8
    (0, 0.5, False),   # q: 3 -> 5 > 4.5
    (2, 0.0, True),    # 5 <= 3 + 2, h 4 <= 5, x 6 <= 6
    (1, 0.0, False),
])
def test_growth_limits(growth_abs, growth_rel, moves):
    before = two_layers([2, 0, 1, 1, 2]).build("output")
    options = Settings(upward_growth_abs=growth_abs, upward_growth_rel=growth_rel)
    after = propagate_gathers_up(before, options)
    assert (after.output == "q") is moves
    if moves:
        assert after.node("q").count == 5
    assert_same_function(before, after)


@pytest.mark.parametrize("depth,top", [(0, "q"), (1, "h"), (2, "x"), (None, "x")])
def test_max_depth_counts_layers(depth, top):
    # The output gather duplicates: it crosses q (layer 1), then h (layer 2), then folds into x.
    before = two_layers([2, 0, 1, 1, 2]).build("output")
    after = propagate_gathers_up(before, Settings(upward_growth_abs=None, upward_max_depth=depth))
    remaining = irregular_gathers(after)
    if top == "x":
        assert remaining == []
    elif top == "h":
        assert after.node("q").count == 5 and remaining == ["q_x"]
    else:
        assert after.node("q").count == 3 and after.node(after.output).op is Op.GATHER
    assert_same_function(before, after)


def test_through_a_concat_by_runs_of_parts():
    b = Builder()
    b.fact("a", [[1.0], [2.0]], layer=None)
    b.fact("c", [[3.0], [4.0], [5.0]], layer=None)
    b.concat("cat", "a", "c")
    b.gather("g", "cat", [1, 0, 4, 4, 2, 0])  # runs: a a | c c c | a
    b.transform("out", "g", "exp")
    before = b.build("out")
    after = propagate_gathers_up(before, UNLIMITED)
    assert after.node("cat").op is Op.CONCAT and len(after.node("cat").srcs) == 3
    assert irregular_gathers(after) == []
    assert_same_function(before, after)


def test_linear_keeps_a_broadcast_weight_and_folds_repeated_weights():
    b = Builder()
    b.fact("x", [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    b.weights("W", (2, 2), k=1)
    b.weights("V", (2,), k=2)
    b.gather("v", "x", [2, 0, 1, 1])
    b.linear("lin", "W", "v", w_layout="tile")
    b.gather("bias", "V", [0, 1, 1, 0])
    b.add("out", "lin", "bias")
    b.gather("read", "out", [3, 3, 0, 1])
    before = b.build("read")
    after = propagate_gathers_up(before, UNLIMITED)
    assert after.node("lin").srcs[0] == "W" and after.node("lin").attrs["w_layout"] == "tile"
    assert irregular_gathers(after) == []
    # V's rows [0, 0, 0, 1]: a stack that names V0 three times (gradients add up).
    stacks = [n for n in after.nodes if n.op is Op.WEIGHTS and n.count == 4]
    assert [s.attrs["names"] for s in stacks] == [("V0", "V0", "V0", "V1")]
    assert_same_function(before, after)


def test_a_constant_repetition_of_one_weight_stays_a_regular_gather():
    b = Builder()
    b.weights("B", (3,), k=2)
    b.gather("b", "B", [1, 1, 1, 1])
    b.fact("x", [[1.0, 2.0, 3.0]] * 4, layer=None)
    b.add("out", "x", "b")
    before = b.build("out")
    after = propagate_gathers_up(before, UNLIMITED)
    # One stack of B1, repeated by a gather that becomes a tile later -- not a stack of 4 names.
    assert [n.attrs["names"] for n in after.nodes if n.op is Op.WEIGHTS] == [("B1",)]
    assert irregular_gathers(after) == []
    assert_same_function(before, after)


def test_dynamic_facts_keep_their_gather():
    before = two_layers([2, 0, 1, 1, 2]).build("output")
    after = propagate_gathers_up(before, Settings.preset("upward-17-aggressive", dynamic_facts=("x",)))
    assert after.node("x").attrs["fact_layer"] == "x" and after.node("x").count == 4
    assert irregular_gathers(after) == ["h_x"]
    assert_same_function(before, after)


def test_shared_nodes_are_copied_only_when_growth_allows():
    b = two_layers([2, 0, 1])
    b.gather("again", "h", [1, 1, 0])
    b.concat("both", "output", "again")
    before = b.build("both")
    free = propagate_gathers_up(before, FREE)
    assert free.node("h").count == 3  # h is read twice: not copied for free
    unlimited = propagate_gathers_up(before, UNLIMITED)
    assert irregular_gathers(unlimited) == []
    assert_same_function(before, free)
    assert_same_function(before, unlimited)


@pytest.mark.parametrize("transposed", [True, False])
def test_equal_segments_from_alternating_parts_become_a_strided_reduction(transposed):
    # GraphSAGE: every node sums W_l . mean_i and W_r . h_i, read alternately from CONCAT(h, mean).
    b = Builder()
    b.fact("h", [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    b.transform("mean", "h", "tanh")
    b.concat("cat", "h", "mean")
    b.gather("x", "cat", [3, 0, 4, 1, 5, 2])
    b.weights("W", (2, 2), k=2)
    b.gather("w", "W", [0, 1, 0, 1, 0, 1])
    b.linear("lin", "w", "x")
    b.reduce("agg", "lin", [2, 2, 2])
    before = b.build("agg")
    after = propagate_gathers_up(before, Settings.preset("upward-00-free", transposed_reductions=transposed))
    if transposed:  # element 0 of every segment, then element 1: each part in one run
        assert after.node("agg").attrs["kernel"] == "strided"
        assert after.node("lin").srcs[1] == "cat" and after.node("cat").srcs == ("mean", "h")
        assert irregular_gathers(after) == []
    else:
        assert after is before
    assert_same_function(before, after)


def test_nothing_to_do_returns_same_program():
    b = Builder()
    b.fact("x", [[1.0], [2.0]])
    b.transform("t", "x")
    program = b.build("t")
    assert propagate_gathers_up(program, UNLIMITED) is program


@st.composite
def upward_settings(draw):
    return Settings.preset(
        "unoptimized", upward=True, upward_growth_abs=draw(st.sampled_from([0, 10, None])),
        upward_growth_rel=draw(st.sampled_from([0.0, 0.5, None])),
        upward_max_depth=draw(st.sampled_from([None, 0, 1, 2])),
        dynamic_facts=draw(st.sampled_from([(), ("fact0",), ("unit0", "fact1")])))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), options=upward_settings())
def test_random_graphs_equal_reference(graph, options):
    assume(all_finite(graph))
    facts = {layer.name for layer in graph.layers if isinstance(layer, neurovec.FactLayer)}
    options = options.model_copy(update={"dynamic_facts": tuple(n for n in options.dynamic_facts if n in facts)})
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))


def unlimited_growth(before_linear: bool = False) -> Settings:
    return Settings.preset("unoptimized", upward=True, upward_growth_abs=None, iso_compression=True,
                           dedup_facts=True, dedup_linear=True, dedup_aggregations=True,
                           linear_broadcasting=True, upward_before_linear=before_linear)


def test_a_gather_that_would_read_a_concat_in_many_runs_stays_where_it_is():
    # The output repeats neuron 0 four times; neuron 0 sums rows of four different CONCAT parts
    # (the vectorizer's input groups), so computing its rows in place of the output gather
    # would read the CONCAT in 17 runs, over MAX_CONCAT_RUNS. The gather does not move at all:
    # moved up to the CONCAT it would stay irregular there and the layer would grow. (Found by
    # test_unlimited_growth_leaves_no_irregular_gather, whose premise missed this case.)
    b = neurovec.GraphBuilder()
    x, y = b.facts("x", np.array([[0.125, -0.25]])), b.facts("y", np.array([0.5]))
    w0, w1 = (b.weight(f"w{k}", np.array(v), learnable=False) for k, v in enumerate([0.75, -0.5]))
    w2 = b.weight("w2", np.array([0.25, 1.5]), learnable=False)
    h = b.layer("h")
    n0 = h.neuron([(x[0], w0), x[0], (x[0], w1), x[0]])
    n1, n2 = h.neuron([x[0]]), h.neuron([x[0], (y[0], w2)])
    b.output(n0, n0, n0, n0, n1, n2, b.layer("g").neuron([n0]))
    graph = b.build()
    program = build_program(graph, unlimited_growth())
    assert irregular_gathers(program) == [program.output]
    with mock.patch.object(row_planner, "MAX_CONCAT_RUNS", 17):
        assert irregular_gathers(build_program(graph, unlimited_growth())) == []
    assert_equivalent(graph, CompiledModule(program, torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), before_linear=st.booleans())
def test_unlimited_growth_leaves_no_irregular_gather(graph, before_linear):
    """Unlimited growth, and no limit on the runs through a CONCAT, fold every gather away. (With
    the limit, a gather stays wherever moving it would need too many runs further up: see
    test_a_gather_that_would_read_a_concat_in_many_runs_stays_where_it_is.)"""
    assume(all_finite(graph))
    with mock.patch.object(row_planner, "MAX_CONCAT_RUNS", sys.maxsize):
        program = build_program(graph, unlimited_growth(before_linear))
    assert irregular_gathers(program) == []
    assert_equivalent(graph, CompiledModule(program, torch.float64))


def test_mutag_gcn_default_and_aggressive(tu_dir):
    """Thesis Fig. 6.9 and 6.10 (2-layer GCN without normalization on MUTAG)."""
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir), normalize=False)
    # The thesis' passes only (the algebra passes fold the first layer away).
    thesis = dict(reduce_coefficients=False, reorder_linear=False, fold_constants=False)
    default = build_program(graph, Settings(**thesis))
    nodes = default.by_name()
    assert nodes["f_x"].count == 7
    assert not [n for n in default.nodes if n.op is Op.GATHER and nodes[n.srcs[0]].op is Op.WEIGHTS]
    first = [n for n in default.nodes if n.op is Op.LINEAR][0]
    assert first.srcs[1] == "f_x" and first.count == 7  # the linear op runs before any gather
    aggressive = build_program(graph, UNLIMITED.model_copy(update=thesis))
    assert [n for n in aggressive.nodes if n.op is Op.GATHER] == []
    assert aggressive.by_name()["f_x"].count == 18298  # as in the thesis
    for program in (default, aggressive):
        assert_equivalent(graph, CompiledModule(program, torch.float64))


def test_regular_index_is_decided_on_the_whole_index():
    # is_regular_index looks at a prefix and the last row first: an index regular there and
    # irregular in between must still be irregular, and a long regular one regular.
    index = np.arange(0, 3 * 20_000, 3)
    assert is_regular_index(index, 60_000)
    broken = index.copy()
    broken[10_000], broken[10_001] = broken[10_001], broken[10_000]  # same ends, same prefix
    assert not is_regular_index(broken, 60_000)


@pytest.mark.parametrize("preset", ["default", "upward-17-aggressive"])
def test_planners_are_freed_by_refcounting(preset, freed_by_refcounting, tu_dir):
    """A RowPlanner's plans close over the planner: kept after planning, they hold it (with the
    editor and its constants, 0.5 GB on products-like at 1/4) in a cycle that only the cyclic
    collector frees. RowPlanner.close drops them: with the collector off, every planner is gone."""
    freed_by_refcounting.record(row_planner.RowPlanner)
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir))
    program = build_program(graph, Settings.preset(preset))
    del program
    assert freed_by_refcounting.made, "no planner was made: the test checks nothing"
    assert freed_by_refcounting.alive() == []
