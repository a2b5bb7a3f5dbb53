"""Deduplication of linear ops and aggregations, with downward gather propagation (thesis 5.2.6)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.compiler.ir import Op, Program, read_only
from neurovec.compiler.passes.dedup import dedup_aggregations, dedup_linear
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule

from ..builders import Builder, assert_same_function, index_of, ops
from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite

SETTINGS = Settings()


def gcn_layer(x_index, edge_index, counts, n_facts=3, bias=None) -> Builder:
    """FACT -> dense LINEAR (one weight) -> REDUCE (1 per row) -> GATHER (edges) -> REDUCE -> ADD -> relu."""
    b = Builder()
    b.fact("x", np.eye(n_facts))
    b.weights("W", (4, n_facts))
    n = len(x_index)
    b.gather("lin_x", "x", x_index)
    b.gather("lin_w", "W", np.zeros(n, np.int64))
    b.linear("lin", "lin_w", "lin_x")
    b.reduce("lin_agg", "lin", np.ones(n, np.int64))
    b.gather("conv_x", "lin_agg", edge_index)
    b.reduce("conv_agg", "conv_x", counts)
    m = len(counts)
    b.weights("B", (4,), k=2)
    b.gather("conv_b", "B", np.zeros(m, np.int64) if bias is None else bias)
    b.add("conv_biased", "conv_agg", "conv_b")
    b.transform("conv", "conv_biased", "relu")
    return b


# -- dedup_linear ----------------------------------------------------------------------------------------

def test_dedup_linear_computes_distinct_pairs_then_gathers():
    b = gcn_layer(x_index=[0, 1, 0, 2, 1, 0], edge_index=[0, 1, 2, 3, 4, 5, 1], counts=[2, 2, 3])
    before = b.build("conv")
    after = dedup_linear(before, SETTINGS)
    # The LINEAR runs on the 3 distinct (weight, fact) pairs; the REDUCE reads them back in order.
    assert after.node("lin").count == 3
    assert after.node("lin").srcs[1] == "x"  # the fact rows in order: the gather is gone
    restore = after.node("lin_agg").srcs[0]
    assert after.node(restore).op is Op.GATHER and index_of(after, restore) == [0, 1, 0, 2, 1, 0]
    assert_same_function(before, after)


def test_dedup_linear_composes_into_a_reading_gather():
    b = Builder()
    b.fact("x", [[1.0, 2.0], [3.0, 4.0]])
    b.weights("W", (3, 2), k=2)
    b.gather("w", "W", [0, 1, 0, 0])
    b.gather("v", "x", [1, 1, 1, 1])
    b.linear("lin", "w", "v")
    b.gather("g", "lin", [3, 2, 1, 0, 0])
    b.reduce("r", "g", [2, 3])
    before = b.build("r")
    after = dedup_linear(before, SETTINGS)
    assert after.node("lin").count == 2
    assert index_of(after, "g") == [0, 0, 1, 0, 0]  # no new gather: the reader's index composed
    assert ops(after).count("GATHER") <= ops(before).count("GATHER")
    assert_same_function(before, after)


def test_dedup_linear_nothing_to_do_returns_same_program():
    b = Builder()
    b.fact("x", [[1.0], [2.0]])
    b.weights("W", (1,), k=1)
    b.gather("w", "W", [0, 0])
    b.gather("v", "x", [0, 1])
    b.linear("lin", "w", "v")
    program = b.build("lin")
    assert dedup_linear(program, SETTINGS) is program


def test_dedup_linear_keeps_distinct_learnable_weights_apart():
    # Two different weights with equal values are different functions: never merged.
    b = Builder()
    b.fact("x", [[1.0, 2.0]])
    b.weights("W", (2,), k=2, values=[np.ones(2), np.ones(2)])
    b.gather("w", "W", [0, 1, 1])
    b.gather("v", "x", [0, 0, 0])
    b.linear("lin", "w", "v")
    b.reduce("r", "lin", [1, 2])
    before = b.build("r")
    after = dedup_linear(before, SETTINGS)
    assert after.node("lin").count == 2
    assert_same_function(before, after)


# -- dedup_aggregations ----------------------------------------------------------------------------------

def test_dedup_aggregations_groups_as_multisets_and_propagates_down():
    # Neurons 0, 1 and 3 aggregate the same multiset; neuron 2 differs.
    b = gcn_layer(x_index=[0, 1, 2], edge_index=[0, 1, 1, 0, 2, 2, 0, 1], counts=[2, 2, 2, 2])
    b.gather("out", "conv", [3, 2, 1, 0, 2])
    before = b.build("out")
    after = dedup_aggregations(before, SETTINGS)
    assert after.node("conv_agg").count == 2
    assert index_of(after, "conv_x") == [0, 1, 2, 2]
    # The bias gather and the relu shrink along; the reading gather composes the reindexing.
    assert after.node("conv_biased").count == 2 and after.node("conv").count == 2
    assert index_of(after, "conv_b") == [0, 0]
    assert index_of(after, "out") == [0, 1, 0, 0, 1]
    assert_same_function(before, after)


def test_mean_merges_multisets_up_to_scale_sum_does_not():
    # mean{a, a, b, b} = mean{a, b} = mean{b, a}; as sums they are different values.
    for aggregation, rows in (("mean", 2), ("sum", 3)):
        b = gcn_layer(x_index=[0, 1, 2], edge_index=[0, 0, 1, 1, 0, 1, 1, 0, 2], counts=[4, 2, 2, 1])
        b.nodes["conv_agg"].attrs["aggregation"] = aggregation
        before = b.build("conv")
        after = dedup_aggregations(before, SETTINGS)
        assert after.node("conv_agg").count == rows
        assert_same_function(before, after)


def test_dedup_aggregations_stops_at_a_bias_that_differs():
    b = gcn_layer(x_index=[0, 1, 2], edge_index=[0, 1, 1, 0], counts=[2, 2], bias=[0, 1])
    before = b.build("conv")
    after = dedup_aggregations(before, SETTINGS)
    assert after.node("conv_agg").count == 1
    restore = after.node("conv_biased").srcs[0]
    assert after.node(restore).op is Op.GATHER and index_of(after, restore) == [0, 0]
    assert after.node("conv").count == 2 and after.output == "conv"
    assert_same_function(before, after)


def test_dedup_aggregations_output_keeps_its_order():
    b = gcn_layer(x_index=[0, 1, 2], edge_index=[2, 0, 2, 2], counts=[1, 1, 1, 1])
    before = b.build("conv")
    after = dedup_aggregations(before, SETTINGS)
    out = after.node(after.output)
    assert out.op is Op.GATHER and index_of(after, after.output) == [0, 1, 0, 0]
    assert_same_function(before, after)


def test_unread_rows_are_dropped():
    b = gcn_layer(x_index=[0, 1, 2, 0], edge_index=[0, 1, 2, 3], counts=[1, 1, 1, 1])
    b.gather("out", "conv", [1, 2])
    before = b.build("out")
    after = dedup_aggregations(before, SETTINGS)
    assert after.node("conv").count == 2 and after.node("conv_agg").count == 2
    assert after.node("lin_agg").count == 2  # upstream rows only the dropped ones read go too
    assert_same_function(before, after)


def test_an_index_reads_every_row_only_where_it_alone_does():
    """_drop_unused_rows checks an index shared by several nodes (one stored array: the vectorizer's
    ``_compacted``) once. Node a is read in full by two gathers together; node b, as long, by one of
    them only: b's unread rows still go (an index that reads every row together with another is not
    taken for one that does alone)."""
    b = Builder()
    b.fact("y", 2 * np.eye(4))
    b.gather("gb", "y", [0, 1, 2, 3])
    b.transform("b", "gb", "tanh")  # first in the program: the sweep (latest first) meets a before b
    b.fact("x", np.eye(4))
    b.gather("ga", "x", [0, 1, 2, 3])
    b.transform("a", "ga", "relu")
    b.gather("a_lo", "a", [0, 1])
    b.gather("a_hi", "a", [2, 3])
    b.gather("b_lo", "b", [0, 1])
    shared = read_only(np.array([0, 1], np.int32))  # stored as it is: one array object for both gathers
    b.constants["i_a_lo"] = b.constants["i_b_lo"] = shared
    b.concat("out", "a_lo", "a_hi", "b_lo")
    before = b.build("out")
    assert before.constants["i_a_lo"] is before.constants["i_b_lo"]
    after = dedup_aggregations(before, SETTINGS)
    assert after.node("a").count == 4 and after.node("b").count == 2
    assert_same_function(before, after)


def test_max_with_repeated_rows_keeps_gradients():
    # max over {a, a} and {a, b}: ties split the gradient; merged groups must keep that.
    b = Builder()
    b.weights("W", (), k=2, values=[np.array(1.5), np.array(1.5)])
    b.fact("one", [[1.0]])
    b.gather("w", "W", [0, 0, 0, 1, 0, 0])
    b.gather("x", "one", [0, 0, 0, 0, 0, 0])
    b.linear("lin", "w", "x")
    b.reduce("m", "lin", [2, 2, 2], "max")
    before = b.build("m")
    after = dedup_aggregations(dedup_linear(before, SETTINGS), SETTINGS)
    assert after.node("m").count == 2
    assert_same_function(before, after)


# -- random graphs -----------------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    options = Settings.preset("unoptimized", dedup_linear=True, dedup_aggregations=True)
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))


def test_mutag_gcn_linear_runs_on_distinct_rows(tu_dir):
    from neurovec.compiler.pipeline import build_program
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir), normalize=False)
    program = build_program(graph, Settings.preset("unoptimized", dedup_facts=True, dedup_linear=True,
                                                    dedup_aggregations=True))
    # One-hot atom types: 7 distinct rows, so the first linear op computes 7 products, not 3371.
    assert program.node("conv1_lin_lin").count == 7
    assert program.node("conv1_agg").count < 3371
    assert_equivalent(graph, CompiledModule(program, torch.float64))


ALL_STEPS = Settings.preset("unoptimized", dedup_facts=True, iso_compression=True, dedup_linear=True,
                            dedup_aggregations=True)


def _steps_apart(program: Program, settings: Settings) -> Program:
    """The four steps of ``deduplicate`` as four passes: each labels every node afresh."""
    from neurovec.compiler.passes.dedup import dedup_facts, iso_compress
    for step, switch in ((dedup_facts, "dedup_facts"), (iso_compress, "iso_compression"),
                         (dedup_linear, "dedup_linear"), (dedup_aggregations, "dedup_aggregations")):
        if getattr(settings, switch):
            program = step(program, settings)
    return program


def test_labels_pass_from_iso_to_the_dedup_steps(monkeypatch):
    from neurovec.compiler.passes import dedup
    b = gcn_layer(x_index=[0, 1, 2], edge_index=[0, 1, 1, 2, 2], counts=[2, 2, 1])  # nothing to merge
    program = b.build("conv")
    calls = []
    original = dedup.first_equal_multisets
    monkeypatch.setattr(dedup, "first_equal_multisets", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert dedup.deduplicate(program, SETTINGS) is program
    in_one_pass = len(calls)
    calls.clear()
    assert _steps_apart(program, SETTINGS) is program
    assert in_one_pass < len(calls)  # apart, dedup_aggregations hashes the aggregations again


def _same_program(a: Program, b: Program) -> bool:
    return str(a) == str(b) and a.constants.keys() == b.constants.keys() and all(
        np.array_equal(a.constants[k], b.constants[k]) for k in a.constants)


def test_rows_iso_found_distinct_are_not_labelled_again(monkeypatch, tu_dir):
    # PROTEINS with continuous features: iso_compression merges a few neighbourhoods (and so re-marks
    # the facts as constants); every layer end it leaves has distinct rows, and dedup's finer labels
    # of them are every row its own, without hashing the aggregations' inputs again.
    from neurovec import datasets
    from neurovec.benchmarks.tasks import replicate_tu
    from neurovec.compiler import vectorize
    from neurovec.compiler.passes import dedup
    data = replicate_tu(datasets.load_tu("PROTEINS", tu_dir), 1, first_copy=True)
    program = vectorize(datasets.gcn(data, samples=np.arange(40)))
    calls = []
    original = dedup.first_equal_multisets
    monkeypatch.setattr(dedup, "first_equal_multisets", lambda *a, **k: calls.append(1) or original(*a, **k))
    labelled = dedup.iso_compress(program, SETTINGS)
    assert labelled is not program and labelled.node("f_x").attrs["fact_layer"] is None
    by_iso = len(calls)
    calls.clear()
    one_pass = dedup.deduplicate(program, SETTINGS.model_copy(update={"dedup_facts": False}))
    assert len(calls) == by_iso  # the dedup steps hashed no aggregation
    calls.clear()
    apart = dedup_aggregations(dedup_linear(labelled, SETTINGS), SETTINGS)
    assert len(calls) > 0  # labelled afresh, the aggregations are hashed ...
    assert _same_program(one_pass, apart)  # ... to the same end


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(tricky_values=True), dynamic=st.booleans())
def test_one_labelling_pass_makes_the_program_of_the_steps_apart(graph, dynamic):
    # Labels and distinct marks handed from step to step (iso_compression's coarser labelling to
    # dedup's finer one) give the program that labelling every step afresh gives.
    from neurovec.compiler import vectorize
    from neurovec.compiler.passes.dedup import deduplicate
    from neurovec.sources.graph import FactLayer
    facts = tuple(layer.name for layer in graph.layers if isinstance(layer, FactLayer))
    settings_ = ALL_STEPS.model_copy(update={"dynamic_facts": facts[:1] if dynamic else ()})
    program = vectorize(graph).replace(dynamic_facts=settings_.dynamic_facts)
    assert _same_program(deduplicate(program, settings_), _steps_apart(program, settings_))


def test_labelling_is_linear_in_depth():
    # A chain with skip connections: each layer sums the one before (twice) and the one before that.
    # The label hand-over of 20a7f92 re-walked every path below a node for each node it checked:
    # exponential in depth (16 layers 0.16 s, 28 layers 16 s). The labels computed now grow linearly.
    from neurovec.compiler import vectorize
    from neurovec.compiler.passes import dedup
    from ..strategies import deep_chain

    def labelled(depth):
        counted = []
        original = dedup.RowIds._compute

        def counting(self, node, *args):
            counted.append(node.name)
            return original(self, node, *args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dedup.RowIds, "_compute", counting)
            program = vectorize(deep_chain(depth, weighted_layers=1))
            dedup.deduplicate(program, ALL_STEPS)
        return len(counted), len(program.nodes)

    small, nodes_small = labelled(10)
    large, nodes_large = labelled(40)
    assert large <= 2 * small * nodes_large / nodes_small


def test_labels_are_freed_when_a_pass_returns(freed_by_refcounting):
    # The labels (edge-sized arrays) and the editor refer to each other: unless the pass breaks that
    # cycle, they outlive it until the garbage collector runs (hundreds of MB at 100x PROTEINS).
    from neurovec.compiler.passes import dedup
    freed_by_refcounting.record(dedup.RowIds)
    program = gcn_layer(x_index=[0, 1, 2, 0], edge_index=[0, 1, 3, 2], counts=[2, 2]).build("conv")
    dedup.deduplicate(program, SETTINGS)
    assert len(freed_by_refcounting.made) == 3 and freed_by_refcounting.alive() == []


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_pair_of_gathered_sides_reads_them_a_chunk_at_a_time(data):
    from neurovec.compiler import grouping
    from neurovec.compiler.passes.dedup import _pair
    chunk = data.draw(st.sampled_from([1, 3, 64, 1 << 18]))
    a_bound, b_bound = data.draw(st.integers(1, 50)), data.draw(st.integers(1, 2**40))
    a = np.array(data.draw(st.lists(st.integers(0, a_bound - 1), min_size=1, max_size=30)), np.int32)
    b = np.array(data.draw(st.lists(st.integers(0, b_bound - 1), min_size=1, max_size=30)), np.int64)
    n = data.draw(st.integers(0, 40))
    a_rows = np.array(data.draw(st.lists(st.integers(0, a.size - 1), min_size=n, max_size=n)), np.int64)
    b_rows = np.array(data.draw(st.lists(st.integers(0, b.size - 1), min_size=n, max_size=n)), np.int32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grouping, "CHUNK", chunk)
        pairs, bound = _pair(a, a_bound, b, b_bound, a_rows, b_rows)
    assert bound == a_bound * b_bound and pairs.size == n
    assert pairs.tolist() == [int(a[i]) * b_bound + int(b[j]) for i, j in zip(a_rows, b_rows)]
    assert _pair(a[a_rows], a_bound, b[b_rows], b_bound)[0].tolist() == pairs.tolist()
    # NOTE: [decided pairs]: where one side decides the other, its labels label the pairs, exactly.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grouping, "CHUNK", chunk)
        decided, decided_bound = _pair(a, a_bound, b, b_bound, a_rows, b_rows, decide=True)
    assert decided.size == n and (n == 0 or 0 <= decided.min() <= decided.max() < decided_bound)
    assert grouping.first_rows(decided, decided_bound).tolist() == grouping.first_rows(pairs).tolist()


def test_decided_pairs_label_gcn_products_by_their_source(monkeypatch):
    """GCN's per-edge products of a coefficient decided by the edge's source (NOTE: [decided pairs])
    are grouped by the source's labels, a table of one slot per source row, not hashed as pairs;
    where the coefficient is not decided by the source, as pairs. The programs are those of the
    pairs either way."""
    from neurovec.compiler import grouping
    from neurovec.compiler.passes import dedup
    rng = np.random.default_rng(3)
    src = rng.integers(0, 2000, 3000)  # 30 x 2000 possible pairs: above the 4 x 3000 of a table
    for decided in (True, False):
        coef = src % 30 if decided else rng.integers(0, 30, src.size)
        b = Builder()
        b.fact("x", rng.standard_normal((2000, 2)))
        b.weights("w", (), k=30, learnable=False, values=[np.array(v + 1.0) for v in range(30)])
        b.gather("xs", "x", src)
        b.gather("ws", "w", coef)
        b.linear("l", "ws", "xs", kind="mul")
        b.reduce("s", "l", [3] * 1000)
        program = b.build("s")
        bounds = []
        first_rows, key_representatives = grouping.first_rows, grouping.key_representatives
        monkeypatch.setattr(dedup, "first_rows", lambda k, bound=None: bounds.append(bound) or first_rows(k, bound))
        monkeypatch.setattr(dedup, "key_representatives",
                            lambda k, bound=None: bounds.append(bound) or key_representatives(k, bound))
        result = dedup.dedup_linear(program, SETTINGS)
        monkeypatch.setattr(dedup, "_decides", lambda *args: False)
        assert _same_program(dedup.dedup_linear(program, SETTINGS), result)
        monkeypatch.undo()
        assert result.node("l").count < 3000 and (2000 in bounds) == decided


def test_labels_in_chunks_merge_as_whole_labels(monkeypatch, tu_dir):
    """iso_compression and dedup label a LINEAR over gathers a chunk of rows at a time: with
    chunks of 1, 7 and 64 rows the programs are the ones of a single chunk."""
    from neurovec.compiler import grouping
    from neurovec.compiler.passes.dedup import dedup_facts
    from neurovec.compiler.passes.dedup import iso_compress
    from neurovec.compiler.vectorizer import vectorize
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir))

    def passes():
        program = dedup_facts(vectorize(graph), SETTINGS)
        for step in (iso_compress, dedup_linear, dedup_aggregations):
            program = step(program, SETTINGS)
        return program

    whole = passes()
    assert whole.node("conv1_agg").count < graph.layers[1].counts.size  # something merged
    for chunk in (1, 7, 64):
        monkeypatch.setattr(grouping, "CHUNK", chunk)
        assert _same_program(passes(), whole)


def test_recent_pairs_are_given_again_only_for_equal_arguments(monkeypatch):
    """NOTE: [repeated labellings]: a call with arguments equal to the last one's (other objects) gets a copy
    of its value without computing it; a call with any argument different computes it."""
    from neurovec.compiler.passes import dedup as dd
    monkeypatch.setattr(dd, "_RECENT_ROWS", 4)
    calls = []

    def _pair(*args):
        calls.append(args)
        return dd._pair(*args)

    recent = dd._Recent()
    rng = np.random.default_rng(0)
    a, b, rows = rng.integers(0, 5, 7), rng.integers(0, 9, 50), rng.integers(0, 7, 50)
    first = recent(_pair, 50, a, 5, b, 9, rows, None, False)
    again = recent(_pair, 50, a.copy(), 5, b.copy(), 9, rows.copy(), None, False)
    assert len(calls) == 1 and again[1] == first[1] and np.array_equal(again[0], first[0])
    assert not first[0].flags.writeable and again[0].flags.writeable  # the kept value stays as it is
    changed = rows.copy()
    changed[-1] = (changed[-1] + 1) % 7
    for args in [(a, 5, b, 9, changed, None, False), (a, 5, b, 9, rows, None, True), (a, 6, b, 9, rows, None, True)]:
        recent(_pair, 50, *args)
    assert len(calls) == 4
    recent(_pair, 3, a, 6, b[:3], 9, rows[:3], None, True)  # below _RECENT_ROWS: computed, not kept
    recent(_pair, 3, a, 6, b[:3], 9, rows[:3], None, True)
    assert len(calls) == 6
