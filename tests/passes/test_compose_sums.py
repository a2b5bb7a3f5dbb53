"""A sum or mean of a fused sum's rows becomes one sparse sum (compiler/passes/compose_sums.py)."""
import numpy as np
import torch
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import datasets
from neurovec.benchmarks.tasks import replicate_tu
from neurovec.compiler.ir import Op
from neurovec.compiler.passes import compose_sums as compose_sums_module
from neurovec.compiler.passes.compose_sums import _merge_repeated_columns, compose_sums
from neurovec.compiler.passes.kernels import choose_kernels
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()


def summed_twice(outer="mean", bias=True, inner="sum", outer_counts=(2, 1, 1)):
    """h = tanh(x W); a = sums of h over 4 segments (a fused sparse sum); p = means of (a + c)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("W", (2, 2))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    b.gather("edges", "h", [4, 0, 1, 2, 2, 3, 0])
    b.reduce("a", "edges", [2, 3, 1, 1], inner)
    src = "a"
    if bias:
        b.weights("c", (2,))
        b.add("ab", "a", "c")
        src = "ab"
    b.reduce("p", src, list(outer_counts), outer)
    b.transform("out", "p", "sigmoid")
    return choose_kernels(b.build("out"), Settings())


def test_mean_of_a_biased_sum_is_one_sparse_sum_then_the_bias():
    before = summed_twice()
    assert "index" in before.node("a").attrs  # a fused sparse sum
    after = compose_sums(before, SETTINGS)
    summed = after.node("p_sum")
    assert summed.op is Op.REDUCE and "index" in summed.attrs and summed.srcs == ("h",)
    assert after.node("p").op is Op.ADD and after.node("p").srcs == ("p_sum", "c")
    assert "a" not in after.by_name() and "ab" not in after.by_name()
    # Segment 0 averages rows 0 and 1 of a: their 2 + 3 edges (to h rows 4 0 and 1 2 2), each
    # with 1/2; the two edges to row 2 are one entry with 1/2 + 1/2.
    assert after.constants[summed.attrs["counts"]].tolist() == [4, 1, 1]
    assert after.constants[summed.attrs["index"]].tolist() == [0, 1, 2, 4, 3, 0]
    assert after.constants[summed.attrs["coef"]].tolist() == [0.5, 0.5, 1.0, 0.5, 1.0, 1.0]
    assert_same_function(before, after)


def test_inner_mean_and_outer_sum():
    before = summed_twice(outer="sum", bias=False, inner="mean")
    after = compose_sums(before, SETTINGS)
    p = after.node("p")
    assert p.op is Op.REDUCE and p.srcs == ("h",)
    assert after.constants[p.attrs["index"]].tolist() == [0, 1, 2, 4, 3, 0]
    assert after.constants[p.attrs["coef"]].tolist() == [0.5, 1 / 3, 2 / 3, 0.5, 1.0, 1.0]
    assert_same_function(before, after)


def test_not_through_a_bias_under_a_sum_nor_where_it_adds_entries():
    assert compose_sums(summed_twice(outer="sum"), SETTINGS).node("p").srcs == ("ab",)  # sum(a + c) != sum(a) + c
    # Every row of p reads both rows of a: 4 x 10 distinct entries, more than the 10 + 8 of the two.
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 20).reshape(10, 2))
    b.gather("edges", "x", list(range(10)))
    b.reduce("a", "edges", [5, 5], "sum")
    b.gather("many", "a", [0, 1] * 4)
    b.reduce("p", "many", [2, 2, 2, 2], "sum")
    before = choose_kernels(b.build("p"), Settings(reduce_kernel="sparse_mm"))
    assert compose_sums(before, SETTINGS) is before


def test_entries_of_one_row_that_read_the_same_column_are_merged():
    """p's row reads a's row 0 six times (edges to x rows 0 1 2 3 4 0 1 2): one entry per
    column x of the product, its coefficient the sum of the merged ones (3 x 2 for rows 0-2)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("W", (2, 2))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    b.gather("edges", "h", [0, 1, 2, 3, 4, 0, 1, 2])
    b.reduce("a", "edges", [8], "sum")
    b.gather("many", "a", [0] * 6)
    b.reduce("p", "many", [3, 3], "sum")
    b.transform("out", "p", "sigmoid")
    before = choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))
    after = compose_sums(before, SETTINGS)
    p = after.node("p")
    assert p.op is Op.REDUCE and p.srcs == ("h",)
    assert after.constants[p.attrs["counts"]].tolist() == [5, 5]  # 3 x 8 entries before merging
    assert after.constants[p.attrs["index"]].tolist() == [0, 1, 2, 3, 4] * 2
    assert after.constants[p.attrs["coef"]].tolist() == [6.0, 6.0, 6.0, 3.0, 3.0] * 2
    assert_same_function(before, after, tol=1e-12)


def test_not_over_a_strided_reduction():
    """A "strided" sum's segment j is rows j, j + n, ... of its input, not consecutive rows."""
    program = summed_twice(outer="sum", bias=False, outer_counts=(2, 2))
    nodes = tuple(n.with_(attrs=dict(n.attrs, kernel="strided")) if n.name == "p" else n for n in program.nodes)
    before = program.replace(nodes=nodes)
    assert compose_sums(before, SETTINGS) is before


def test_fires_on_gcn_with_continuous_features(tu_dir):
    graph = datasets.gcn(replicate_tu(datasets.load_tu("MUTAG", tu_dir, download=False), 1, first_copy=True),
                         hidden=4)
    with_pass = build_program(graph, Settings())
    without = build_program(graph, Settings(compose_sums=False))
    reductions = [n for n in without.nodes if n.op is Op.REDUCE]
    assert len([n for n in with_pass.nodes if n.op is Op.REDUCE]) == len(reductions) - 1
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))


@st.composite
def two_sums(draw):
    """Random programs of the pass's shape: a fused sum or mean over random edges of
    tanh(x W), perhaps a one-row bias, perhaps a gather of its rows, then a sum or mean
    (under a sum, the bias stays: the pass must leave that alone)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, width = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    b = Builder(seed=int(rng.integers(1 << 30)))
    b.fact("x", rng.normal(size=(n, width)))
    b.weights("W", (width, width))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    inner = draw(st.sampled_from(["sum", "mean"]))
    inner_counts = rng.integers(1, 4, draw(st.integers(1, 6)))  # compiled programs have no empty segment
    b.gather("edges", "h", rng.integers(0, n, int(inner_counts.sum())))
    b.reduce("a", "edges", inner_counts, inner)
    outer = draw(st.sampled_from(["sum", "mean"]))
    src = "a"
    if draw(st.booleans()):
        b.weights("c", (width,))
        src = b.add("ab", "a", "c")
    if draw(st.booleans()):
        src = b.gather("rows", src, rng.integers(0, len(inner_counts), draw(st.integers(1, 8))))
    rows = b.nodes[src].count
    cuts = np.sort(rng.integers(0, rows + 1, draw(st.integers(0, 3))))
    outer_counts = np.diff(np.concatenate([[0], cuts, [rows]]))
    outer_counts = outer_counts[outer_counts > 0]
    b.reduce("p", src, outer_counts, outer)
    b.transform("out", "p", "sigmoid")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=two_sums())
def test_random_programs_of_its_shape_keep_their_function(before):
    after = compose_sums(before, SETTINGS)
    assert_same_function(before, after, tol=1e-9)


def merged_by_a_stable_sort(columns, coef, lengths):
    """What the pass must give, the plain way: entries stably sorted by (row, column), then the
    coefficients of each run of equal entries summed by ``np.add.reduceat``."""
    rows = np.repeat(np.arange(lengths.size), lengths)
    order = np.lexsort((columns, rows))  # stable
    keys = np.stack([rows[order], columns[order]])
    starts = np.flatnonzero(np.concatenate([[True], np.any(keys[:, 1:] != keys[:, :-1], axis=0)]))
    return keys[1, starts], np.bincount(keys[0, starts], minlength=lengths.size), np.add.reduceat(coef[order], starts)


@st.composite
def entries(draw):
    """Rows (some empty) of entries whose columns repeat; their spans narrow (the uint16 keys) or
    wide (over 2^16: the int64 keys); coefficients with repeats, signed zeros and mixed magnitudes
    so that the summation order shows in the bits."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(0, draw(st.integers(1, 30)), draw(st.integers(1, 12)))
    assume(lengths.sum() > 0)
    n = int(lengths.sum())
    width = draw(st.sampled_from([3, 40, 70_000, 2**31 - 1]))
    columns = rng.integers(0, width, n).astype(draw(st.sampled_from([np.int32, np.int64])))
    coef = rng.choice([0.1, 1e16, -1e16, 1.0, -0.0, 0.0, 1 / 3], n) * rng.choice([1.0, 1 + 2**-40], n)
    return columns, coef, lengths


@settings(max_examples=200, deadline=None)
@given(case=entries())
def test_repeated_columns_merge_as_a_stable_sort_merges_them(case):
    """Bit for bit: the same entries, in the same order, with the same sums (NOTE: [merging in chunks])."""
    columns, coef, lengths = case
    index, counts, merged = _merge_repeated_columns(columns, coef.copy(), lengths)
    expected = merged_by_a_stable_sort(columns, coef, lengths)
    assert index.tolist() == expected[0].tolist() and counts.tolist() == expected[1].tolist()
    assert merged.view(np.int64).tolist() == expected[2].view(np.int64).tolist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=two_sums(), chunk=st.integers(1, 5))
def test_rows_merged_a_few_at_a_time_give_the_same_matrix(before, chunk):
    """Chunks of whole rows (NOTE: [merging in chunks]) change no bit of the composed matrix."""
    whole = compose_sums(before, SETTINGS)
    old = compose_sums_module.CHUNK_ENTRIES
    compose_sums_module.CHUNK_ENTRIES = chunk
    try:
        chunked = compose_sums(before, SETTINGS)
    finally:
        compose_sums_module.CHUNK_ENTRIES = old
    assert [n for n in chunked.nodes] == [n for n in whole.nodes]
    assert chunked.constants.keys() == whole.constants.keys()
    for key, value in whole.constants.items():
        assert chunked.constants[key].dtype == value.dtype and chunked.constants[key].tobytes() == value.tobytes()


def gcn_readout(n_samples=12, seed=0) -> neurovec.Graph:
    """relu(x W + b) per node; a GCN-like identity layer summing neighbours through V (1, hidden)
    with fixed factors; a mean of it per sample and a bias: the pattern of GCN's last layer."""
    rng = np.random.default_rng(seed)
    b = neurovec.GraphBuilder()
    sizes = rng.integers(1, 6, n_samples)
    x = b.facts("x", rng.normal(size=(int(sizes.sum()), 3)))
    W, bias = b.weight("W", rng.normal(size=(4, 3))), b.weight("b", rng.normal(size=4))
    V, c = b.weight("V", rng.normal(size=(1, 4))), b.weight("c", rng.normal(size=1))
    factors = [b.weight(f"f{k}", value, learnable=False) for k, value in enumerate([0.5, 0.25, 1.0])]
    h, g = b.layer("h", transformation="relu"), b.layer("g")
    out = b.layer("out", aggregation="mean", transformation="sigmoid")
    hs = [h.neuron([(x[i], W)], bias=bias) for i in range(int(sizes.sum()))]
    start, outputs = 0, []
    for size in sizes:
        nodes = range(start, start + size)
        gs = [g.neuron([(hs[int(j)], V) for j in rng.choice(nodes, int(rng.integers(1, 4)))], bias=c)
              for _ in nodes]
        outputs.append(out.neuron(gs))
        start += size
    b.output(*outputs)
    return b.build()


def test_fires_on_the_gcn_readout_pattern():
    graph = gcn_readout()
    reductions = lambda program: sum(n.op is Op.REDUCE for n in program.nodes)  # noqa: E731
    assert reductions(build_program(graph, Settings())) < reductions(build_program(graph, Settings(compose_sums=False)))


@pytest.mark.parametrize("preset", neurovec.list_presets())
def test_gcn_readout_equals_the_reference_under_every_preset(preset):
    graph = gcn_readout()
    assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs() | graphs())
def test_random_graphs_keep_their_function(graph):
    assume(all_finite(graph))
    before = build_program(graph, Settings(compose_sums=False))
    after = compose_sums(before, SETTINGS)
    assert_same_function(before, after, tol=1e-9)
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))
