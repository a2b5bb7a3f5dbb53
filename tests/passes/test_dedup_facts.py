"""Fact deduplication (thesis 5.2.6): one row per distinct fact value, readers reindexed."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.dedup import dedup_facts, iso_compress
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import GraphError

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function, index_of

SETTINGS = Settings()
ONE_HOT = np.eye(3)[[0, 1, 0, 2, 1, 0]]  # 6 rows, 3 distinct


def fact_program():
    b = Builder()
    b.fact("x", ONE_HOT)
    b.fact("y", [[5.0, 5.0]] * 2)
    b.weights("W", (2, 3))
    b.gather("w", "W", [0] * 6)
    b.gather("v", "x", [5, 4, 3, 2, 1, 0])
    b.linear("lin", "w", "v")
    b.concat("cat", "lin", "y")
    b.gather("g", "cat", [0, 6, 2, 7, 5])
    b.reduce("r", "g", [2, 3])
    return b.build("r")


def test_distinct_rows_in_order_of_first_appearance():
    before = fact_program()
    after = dedup_facts(before, SETTINGS)
    x = after.node("x")
    assert x.count == 3 and x.attrs["fact_layer"] is None
    np.testing.assert_array_equal(after.constants[x.attrs["const"]], np.eye(3))
    assert index_of(after, "v") == [0, 1, 2, 0, 1, 0]
    # Through the CONCAT: y's two equal rows became one, and the gather after it composes.
    assert after.node("y").count == 1 and after.node("cat").count == 7
    assert index_of(after, "g") == [0, 6, 2, 6, 5]
    assert_same_function(before, after)


def test_unread_rows_are_dropped():
    b = Builder()
    b.fact("x", [[1.0], [2.0], [1.0], [3.0]])
    b.gather("g", "x", [2, 3, 0])
    b.transform("t", "g", "tanh")
    before = b.build("t")
    after = dedup_facts(before, SETTINGS)
    np.testing.assert_array_equal(after.constants[after.node("x").attrs["const"]], [[1.0], [3.0]])
    assert index_of(after, "g") == [0, 1, 0]
    assert_same_function(before, after)


def test_fact_read_directly_gets_a_gather():
    b = Builder()
    b.fact("x", [[1.0], [1.0], [2.0]])
    b.transform("t", "x", "exp")
    before = b.build("t")
    after = dedup_facts(before, SETTINGS)
    # The elementwise op shrinks along; the output is restored by a gather.
    assert after.node("t").count == 2
    out = after.node(after.output)
    assert out.op is Op.GATHER and index_of(after, after.output) == [0, 0, 1]
    assert_same_function(before, after)


def test_dynamic_facts_and_distinct_facts_are_left_alone():
    program = fact_program()
    assert dedup_facts(program, Settings(dynamic_facts=("x", "y"))) is program
    b = Builder()
    b.fact("x", np.eye(2))
    b.transform("t", "x")
    distinct = b.build("t")
    assert dedup_facts(distinct, SETTINGS) is distinct


def test_dynamic_fact_can_still_be_replaced():
    b = neurovec.GraphBuilder()
    w = b.weight("w", [[2.0, 0.0], [0.0, 3.0]])
    x = b.facts("x", np.ones((2, 2)))
    layer = b.layer("l", aggregation="sum")
    b.output(layer.neuron([(x[0], w), (x[1], w)]))
    graph = b.build()
    dynamic = neurovec.compile(graph, Settings(dynamic_facts=("x",)))
    torch.testing.assert_close(dynamic(facts={"x": torch.tensor([[1.0, 0.0], [0.0, 1.0]])}),
                               torch.tensor([[2.0, 3.0]]))
    static = neurovec.compile(graph, Settings.preset("unoptimized", dedup_facts=True))
    with pytest.raises(GraphError, match="not declared dynamic"):
        static(facts={"x": torch.ones(2, 2)})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, Settings.preset("unoptimized", dedup_facts=True),
                                              dtype=torch.float64))


def test_mutag_one_hot_features_shrink_to_seven_rows(tu_dir):
    from neurovec.compiler.pipeline import build_program
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir), normalize=False)
    program = build_program(graph, Settings.preset("unoptimized", dedup_facts=True))
    assert program.node("f_x").count == 7  # thesis Fig. 6.9: x is (7, 7)
    assert_equivalent(graph, CompiledModule(program, torch.float64))


def test_iso_compression_takes_the_distinct_facts_from_dedup_facts(monkeypatch):
    """Facts that dedup_facts found distinct bit for bit and left alone are not hashed again by
    iso_compression (fact y, with two equal rows, is), and the program is the one iso_compression
    makes when it hashes them itself."""
    from neurovec.compiler.passes import dedup
    b = Builder()
    b.fact("x", [[1.0, 2.0], [-0.0, 2.0], [0.0, 2.0]])  # distinct by their bytes
    b.fact("y", [[5.0, 5.0]] * 2)
    b.weights("W", (2, 2))
    b.gather("w", "W", [0] * 5)
    b.gather("v", "x", [0, 1, 2, 2, 1])
    b.linear("lin", "w", "v")
    b.reduce("r", "lin", [2, 3])
    b.gather("u", "y", [0, 1])
    b.reduce("s", "u", [1, 1])
    b.concat("out", "r", "s")
    program = b.build("out")
    hashed = []
    original = dedup.first_equal_rows
    monkeypatch.setattr(dedup, "first_equal_rows", lambda values: hashed.append(values.shape) or original(values))
    both = Settings.preset("unoptimized", dedup_facts=True, iso_compression=True)
    after = dedup.deduplicate(program, both)
    assert sorted(hashed) == [(1, 2), (2, 2), (3, 2)]  # by dedup_facts: x and y; by iso: y (one row now)
    hashed.clear()
    again = iso_compress(dedup_facts(program, SETTINGS), SETTINGS)  # two passes: nothing handed over
    assert sorted(hashed) == [(1, 2), (2, 2), (3, 2), (3, 2)]
    assert str(after) == str(again) and all(np.array_equal(after.constants[k], again.constants[k]) for k in again.constants)
