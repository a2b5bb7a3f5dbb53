"""A fused sum plus another term of its rows is one sparse sum (compiler/passes/join_sums.py)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import datasets
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.join_sums import join_sums
from neurovec.compiler.passes.kernels import choose_kernels
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()


def mean_plus(second="gather", aggregation="mean"):
    """h = tanh(x W) (5 rows), g = x V (5 rows); a = means of h over 3 segments (fused);
    s = a + (g gathered to 3 rows | the 3-row sum itself | a fused sum of g) ; out = sigmoid(s)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("W", (2, 2))
    b.weights("V", (2, 2))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    b.linear("g", "V", "x", w_layout="tile")
    b.gather("edges", "h", [4, 0, 1, 2, 2, 3])
    b.reduce("a", "edges", [2, 3, 1], aggregation)
    if second == "gather":
        b.gather("other", "g", [3, 0, 3])
    elif second == "value":
        b.gather("three", "g", [0, 1, 2])
        b.transform("other", "three", "tanh")  # a computed value of the addition's 3 rows
    else:  # a fused sum over the same source as a
        b.gather("edges2", "h", [1, 1, 0])
        b.reduce("other", "edges2", [1, 1, 1], "sum")
    b.add("s", "a", "other")
    b.transform("out", "s", "sigmoid")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


def test_a_mean_plus_a_gather_is_one_sparse_sum_over_both_sources():
    before = mean_plus()
    assert before.node("a").attrs["kernel"] == "sparse_mm" and before.node("other").op is Op.GATHER
    after = join_sums(before, SETTINGS)
    s = after.node("s")
    assert s.op is Op.REDUCE and s.attrs["kernel"] == "sparse_mm" and s.attrs["aggregation"] == "sum"
    sources = after.node(s.srcs[0])
    assert sources.op is Op.CONCAT and sources.srcs == ("h", "g") and sources.count == 10
    # Row j: a's entries (each 1/count), then the gathered row of g (shifted past h's 5 rows).
    assert after.constants[s.attrs["counts"]].tolist() == [3, 4, 2]
    assert after.constants[s.attrs["index"]].tolist() == [4, 0, 5 + 3, 1, 2, 2, 5 + 0, 3, 5 + 3]
    assert after.constants[s.attrs["coef"]].tolist() == [0.5, 0.5, 1.0, 1 / 3, 1 / 3, 1 / 3, 1.0, 1.0, 1.0]
    assert not {"a", "other"} & set(after.by_name())
    assert_same_function(before, after)


def test_a_value_of_the_rows_is_its_own_term():
    before = mean_plus("value", "sum")
    after = join_sums(before, SETTINGS)
    s = after.node("s")
    assert s.op is Op.REDUCE and after.node(s.srcs[0]).srcs == ("h", "other")
    assert after.constants[s.attrs["index"]].tolist() == [4, 0, 5, 1, 2, 2, 6, 3, 7]
    assert "coef" not in s.attrs  # two plain sums
    assert_same_function(before, after)


def test_two_sums_over_one_source_need_no_concatenation():
    after = join_sums(mean_plus("sum", "sum"), SETTINGS)
    s = after.node("s")
    assert s.srcs == ("h",) and not any(n.op is Op.CONCAT for n in after.nodes)
    assert after.constants[s.attrs["index"]].tolist() == [4, 0, 1, 1, 2, 2, 1, 3, 0]
    assert_same_function(mean_plus("sum", "sum"), after)


def test_not_without_a_fused_sum_nor_over_an_empty_mean():
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("W", (2, 2))
    b.linear("h", "W", "x", w_layout="tile")
    b.gather("p", "h", [0, 1])
    b.gather("q", "h", [2, 2])
    b.add("s", "p", "q")
    two_gathers = b.build("s")
    assert join_sums(two_gathers, SETTINGS) is two_gathers
    empty = mean_plus()
    nodes = tuple(n.with_(attrs=dict(n.attrs, counts="empty", index="empty_index")) if n.name == "a" else n
                  for n in empty.nodes)
    constants = dict(empty.constants, empty=np.array([2, 0, 4]), empty_index=np.array([4, 0, 1, 2, 2, 3]))
    empty = empty.replace(nodes=nodes, constants=constants)
    empty.verify()
    assert join_sums(empty, SETTINGS) is empty


@st.composite
def sums_plus_terms(draw):
    """Random programs of the pass's shape: a fused sum or mean of tanh(x W) over random edges
    plus a gather, a value or another fused sum, read by a sigmoid."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, width, rows = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    b = Builder(seed=int(rng.integers(1 << 30)))
    b.fact("x", rng.normal(size=(n, width)))
    b.weights("W", (width, width))
    b.weights("V", (width, width))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    b.linear("g", "V", "x", w_layout="tile")

    def fused(name, source):
        counts = rng.integers(1, 4, rows)
        b.gather(f"{name}_edges", source, rng.integers(0, n, int(counts.sum())))
        return b.reduce(name, f"{name}_edges", counts, draw(st.sampled_from(["sum", "mean"])))

    first = fused("a", "h")
    kind = draw(st.sampled_from(["gather", "value", "fused same", "fused other"]))
    if kind == "gather":
        second = b.gather("other", "g", rng.integers(0, n, rows))
    elif kind == "value":
        b.gather("picked", "g", rng.integers(0, n, rows))
        second = b.transform("other", "picked", "tanh")
    else:
        second = fused("other", "h" if kind == "fused same" else "g")
    if draw(st.booleans()):
        first, second = second, first
    b.add("s", first, second)
    b.transform("out", "s", "sigmoid")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=sums_plus_terms())
def test_random_programs_of_its_shape_keep_their_function(before):
    after = join_sums(before, SETTINGS)
    if after.node("s").op is Op.ADD:  # declined: only a concatenation of two sources to gain
        sums = [before.node(t) for t in before.node("s").srcs if before.node(t).op is Op.REDUCE]
        assert len({before.node(t).srcs[0] for t in before.node("s").srcs}) == 2
        assert all(np.all(before.constants[t.attrs["counts"]] == 1) for t in sums)
    else:
        assert after.node("s").op is Op.REDUCE
    assert_same_function(before, after, tol=1e-9)


def gather_plus_product(same_value: bool):
    """s = (x V)[i] as a one-row-per-segment sparse sum (a gather as a sum) + (h U) or (x U)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 10).reshape(5, 2))
    b.weights("V", (2, 2))
    b.weights("U", (2, 2))
    b.linear("xv", "V", "x", w_layout="tile")
    b.gather("rows", "xv", [4, 0, 1, 1, 3])
    b.reduce("a", "rows", [1, 1, 1, 1, 1], "sum")
    if same_value:
        b.linear("own", "U", "x", w_layout="tile")
    else:
        b.transform("h", "x", "tanh")
        b.linear("own", "U", "h", w_layout="tile")
    b.add("s", "a", "own")
    b.transform("out", "s", "sigmoid")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


def test_a_gather_as_a_sum_plus_a_product_of_another_value_stays_an_addition():
    """Joined, it would concatenate both (n, F) products only to read each row once (SAGE's
    first two layers on arxiv-like: a 324,886 x 128 copy a step); the addition reads them in place."""
    before = gather_plus_product(same_value=False)
    assert before.node("a").attrs["kernel"] == "sparse_mm"
    after = join_sums(before, SETTINGS)
    assert after.node("s").op is Op.ADD and not any(n.op is Op.CONCAT for n in after.nodes)


def test_a_gather_as_a_sum_plus_a_product_of_the_same_value_is_still_joined():
    """Two products of one value: stack_products makes them one GEMM, so the join copies nothing."""
    before = gather_plus_product(same_value=True)
    after = join_sums(before, SETTINGS)
    assert after.node("s").op is Op.REDUCE
    assert after.node(after.node("s").srcs[0]).srcs == ("xv", "own")
    assert_same_function(before, after)


def test_sage_last_layer_and_readout_are_one_sparse_sum(tu_dir):
    """SAGE's mean plus the node's own term, joined, then composed with the readout's mean."""
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir, download=False), hidden=4)
    sparse = lambda program: sum(n.op is Op.REDUCE for n in program.nodes)  # noqa: E731
    with_pass = build_program(graph, Settings())
    assert sparse(with_pass) < sparse(build_program(graph, Settings(join_sums=False)))
    assert sparse(with_pass) == 1
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))


def sage_like(n_samples=10, seed=0) -> neurovec.Graph:
    """relu(x W + b) per node; g = mean of neighbours times V plus the node times U (SAGE's
    layer); a mean per sample and a sigmoid output."""
    rng = np.random.default_rng(seed)
    b = neurovec.GraphBuilder()
    sizes = rng.integers(1, 6, n_samples)
    x = b.facts("x", rng.normal(size=(int(sizes.sum()), 3)))
    W, bias = b.weight("W", rng.normal(size=(4, 3))), b.weight("b", rng.normal(size=4))
    V, U, c = (b.weight("V", rng.normal(size=(1, 4))), b.weight("U", rng.normal(size=(1, 4))),
               b.weight("c", rng.normal(size=1)))
    h = b.layer("h", transformation="relu")
    m = b.layer("m", aggregation="mean")
    g = b.layer("g")
    out = b.layer("out", aggregation="mean", transformation="sigmoid")
    hs = [h.neuron([(x[i], W)], bias=bias) for i in range(int(sizes.sum()))]
    start, outputs = 0, []
    for size in sizes:
        nodes = range(start, start + size)
        gs = []
        for i in nodes:
            mean = m.neuron([hs[int(j)] for j in rng.choice(nodes, int(rng.integers(1, 4)))])
            gs.append(g.neuron([(mean, V), (hs[i], U)], bias=c))
        outputs.append(out.neuron(gs))
        start += size
    b.output(*outputs)
    return b.build()


@pytest.mark.parametrize("preset", neurovec.list_presets())
def test_sage_like_equals_the_reference_under_every_preset(preset):
    graph = sage_like()
    assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs() | graphs())
def test_random_graphs_keep_their_function(graph):
    assume(all_finite(graph))
    before = build_program(graph, Settings(join_sums=False, compose_sums=False))
    after = join_sums(before, SETTINGS)
    assert_same_function(before, after, tol=1e-9)
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))
