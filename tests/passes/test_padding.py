"""Reordering and padding of linear ops (thesis 5.2.4-5.2.5): plans, rewritten programs, random graphs."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes import padding
from neurovec.compiler.indexing import SideRows
from neurovec.compiler.passes.linear_broadcast import broadcast_linear
from neurovec.compiler.passes.padding import plan_rows, reorder_and_pad
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from .test_linear_broadcast import assert_same_function, linear_program, rows_of


def options(strategy: str, broadcasting: bool = True) -> Settings:
    return Settings.preset("unoptimized", linear_padding=strategy, linear_broadcasting=broadcasting)


def index_of(program, name):
    return program.constants[program.node(name).attrs["index"]].tolist()


def test_left_sorts_by_weight_pads_and_reindexes_the_reader():
    # The module docstring's example.
    before = linear_program([1, 0, 1], [5, 6, 7], reader=[0, 2, 1], counts=[2, 1])
    after = reorder_and_pad(before, options("left"))
    lin = after.node("lin")
    assert lin.count == 4 and after.node("g").srcs == ("lin",)
    assert index_of(after, lin.srcs[0]) == [0, 0, 1, 1]
    assert index_of(after, lin.srcs[1]) == [6, 6, 5, 7]  # row 1 pads the group of weight 0
    assert index_of(after, "g") == [2, 3, 0]  # the padded row 1 is never read
    assert_same_function(before, after)
    broadcast = broadcast_linear(after, options("left"))
    lin = broadcast.node("lin")
    assert lin.attrs["w_layout"] == "interleave" and broadcast.node(lin.srcs[0]).count == 2
    assert_same_function(before, broadcast)


def test_gather_back_when_a_reduce_reads_the_rows():
    before = linear_program([1, 0, 1, 0], [5, 6, 7, 8], counts=[3, 1])
    after = reorder_and_pad(before, options("left"))
    back = after.node("lin")  # the old name now belongs to the gather into the old row order
    assert back.op is Op.GATHER and back.srcs == ("lin_padded",) and back.count == 4
    assert index_of(after, "lin") == [2, 0, 3, 1]
    assert after.node("r").srcs == ("lin",)
    assert_same_function(before, after)


def test_output_keeps_its_row_order():
    base = linear_program([1, 0, 1, 0], [8, 6, 7, 5])
    before = base.replace(nodes=base.nodes[:-1], output="lin")
    after = reorder_and_pad(before, options("right"))
    assert after.output == "lin" and after.node("lin").op is Op.GATHER
    assert_same_function(before, after)


def test_concat_reader_is_reindexed():
    before = linear_program([1, 0, 1], [2, 3, 4], reader="concat", counts=[1, 3, 1])
    after = reorder_and_pad(before, options("left"))
    assert after.node("cat").count == 6 and after.node("lin").count == 4 and after.node("g").count == 5
    assert index_of(after, "g") == [4, 2, 5, 0, 1]  # lin's rows at 2 + position, "other" unmoved
    assert_same_function(before, after)


def test_advanced_blocks_for_skewed_counts():
    # weight 0 used 6 times, weight 1 three times: blocks (0, 0, 1) of 3 rows, no padding at all;
    # plain left padding would need 12 rows.
    w = [0, 1, 0, 0, 1, 0, 0, 0, 1]
    before = linear_program(w, [5, 2, 7, 1, 8, 3, 6, 4, 0], n_values=12, reader=list(range(9)))
    left = reorder_and_pad(before, options("left"))
    advanced = reorder_and_pad(before, options("advanced"))
    assert left.node("lin").count == 12 and advanced.node("lin").count == 9
    assert index_of(advanced, advanced.node("lin").srcs[0]) == [0] * 6 + [1] * 3
    broadcast = broadcast_linear(advanced, options("advanced"))
    lin = broadcast.node("lin")
    assert lin.attrs["w_layout"] == "interleave" and index_of(broadcast, lin.srcs[0]) == [0, 0, 1]
    assert_same_function(before, broadcast)
    assert reorder_and_pad(before, options("auto")).node("lin").count == 9  # auto finds it too


def test_both_pairs_every_weight_with_every_value():
    before = linear_program([0, 1, 1, 0], [1, 0, 1, 0], reader=[3, 2, 1, 0])
    after = broadcast_linear(reorder_and_pad(before, options("auto")), options("auto"))
    lin = after.node("lin")
    assert (lin.attrs["w_layout"], lin.attrs["x_layout"]) == ("interleave", "tile")
    assert lin.srcs == ("W", "X")  # both gathers are gone: the grid is W x X itself
    assert_same_function(before, after)


def test_auto_reorders_into_identity_gathers_without_broadcasting():
    # Like SAGE: rows alternate between two weights and two halves of the values.
    before = linear_program([0, 1, 0, 1], [0, 2, 1, 3], reader=[0, 1, 2, 3])
    after = reorder_and_pad(before, options("auto", broadcasting=False))
    assert index_of(after, after.node("lin").srcs[0]) == [0, 0, 1, 1]
    assert after.node("lin").srcs[1] == "X"  # the values are read in order: no gather
    assert_same_function(before, after)


def test_auto_leaves_alone_what_does_not_pay():
    before = linear_program([0, 1, 2, 3], [3, 2, 1, 0], counts=[4])
    assert reorder_and_pad(before, options("auto")) is before
    assert reorder_and_pad(before, options("none")) is before


def test_forced_strategy_that_would_explode_is_skipped(monkeypatch):
    monkeypatch.setattr(padding, "_SLACK_ROWS", 0)
    w = [0] * 20 + list(range(1, 11))  # padding every weight to 20 rows: 220 rows for 30
    before = linear_program(w, list(range(30)), reader=list(range(30)))
    assert reorder_and_pad(before, options("left")) is before


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 12), k_w=st.integers(1, 4), k_x=st.integers(1, 6))
def test_plans_keep_every_pair(data, n, k_w, k_x):
    w = np.array(data.draw(st.lists(st.integers(0, k_w - 1), min_size=n, max_size=n)))
    x = np.array(data.draw(st.lists(st.integers(0, k_x - 1), min_size=n, max_size=n)))
    for plan in plan_rows(SideRows("W", w, k_w), SideRows("X", x, k_x),
                          ("left", "right", "both", "advanced-left", "advanced-right"), 10 * n):
        # Distinct new rows; "both" also merges equal (weight, value) pairs, each is one grid cell.
        distinct = len(np.unique(np.stack([w, x]), axis=1).T) if plan.strategy == "both" else n
        assert plan.rows >= distinct and len(np.unique(plan.position)) == distinct
        np.testing.assert_array_equal(plan.w_index[plan.position], w)
        np.testing.assert_array_equal(plan.x_index[plan.position], x)
        assert plan.w_index.max() < k_w and plan.x_index.max() < k_x


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(2, 12), k_w=st.integers(1, 4), k_x=st.integers(1, 6),
       broadcasting=st.booleans())
def test_unpadded_plans_cost_at_least_the_bound(data, n, k_w, k_x, broadcasting):
    # NOTE: [unpadded plans]: every reordering of the rows, under every layout, costs at least the
    # bound that lets "auto" skip making them.
    w = np.array(data.draw(st.lists(st.integers(0, k_w - 1), min_size=n, max_size=n)))
    x = np.array(data.draw(st.lists(st.integers(0, k_x - 1), min_size=n, max_size=n)))
    order = np.array(data.draw(st.permutations(range(n))))
    w_rows, x_rows = SideRows("W", w, k_w), SideRows("X", x, k_x)
    floor = (padding._Groups(w_rows).cheapest_unpadded(n, k_w)
             + padding._Groups(x_rows).cheapest_unpadded(n, k_x))
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    reordered = padding.RowPlan("any", n, position, w[order], x[order])
    plans = [reordered] + [p for p in plan_rows(w_rows, x_rows, ("left", "right", "both", "advanced-left",
                                                                  "advanced-right"), 10 * n)
                          if p.rows == n and p.strategy != "both"]  # "both" merges equal pairs: no reordering
    for plan in plans:
        assert padding.plan_cost(plan, w_rows, x_rows, broadcasting, True) >= floor, plan.strategy


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(2, 12), reader=st.sampled_from(["gather", "reduce", "concat"]))
def test_auto_chooses_the_same_without_the_unpadded_plans(data, n, reader):
    w = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    x = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    read = {"gather": data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8)), "reduce": None,
            "concat": "concat"}[reader]
    before = linear_program(w, x, n_weights=3, n_values=5, reader=read)
    with_bound = reorder_and_pad(before, options("auto"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(padding._Groups, "cheapest_unpadded", lambda self, rows, count: 0)  # every plan made
        without = reorder_and_pad(before, options("auto"))
    assert with_bound.nodes == without.nodes
    assert with_bound.constants.keys() == without.constants.keys()
    for key, array in with_bound.constants.items():
        np.testing.assert_array_equal(array, without.constants[key])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(2, 10),
       strategy=st.sampled_from(["left", "right", "both", "advanced", "auto"]),
       reader=st.sampled_from(["gather", "reduce", "concat"]))
def test_rewritten_programs_compute_the_same(data, n, strategy, reader):
    w = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    x = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    read = {"gather": data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8)), "reduce": None,
            "concat": "concat"}[reader]
    before = linear_program(w, x, n_weights=3, n_values=5, reader=read)
    after = broadcast_linear(reorder_and_pad(before, options(strategy)), options(strategy))
    assert_same_function(before, after)


@pytest.mark.parametrize("strategy", ["left", "right", "both", "advanced", "auto"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(graph=graphs())
def test_random_graphs_equal_reference(strategy, graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, options(strategy), dtype=torch.float64))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_padding_alone(graph):
    assume(all_finite(graph))
    module = neurovec.compile(graph, options("auto", broadcasting=False), dtype=torch.float64)
    assert_equivalent(graph, module)


def test_rows_of_sees_through_the_rewrite():
    after = reorder_and_pad(linear_program([1, 0, 1], [5, 6, 7], reader=[0, 2, 1]), options("left"))
    assert rows_of(after, after.node("lin").srcs[0]).index.tolist() == [0, 0, 1, 1]
