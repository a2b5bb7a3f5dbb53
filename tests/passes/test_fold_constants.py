"""Compile-time evaluation of what depends on static facts and fixed weights only."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes import fold_constants as fold_constants_module
from neurovec.compiler.passes.fold_constants import fold_constants
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import GraphError

from ..equivalence import assert_equivalent
from ..strategies import gnn_graphs, graphs
from ..test_equivalence import all_finite
from ..builders import Builder, assert_same_function

SETTINGS = Settings()


def constant_sum():
    """s = sum of gathered fixed-weight products of x, then a learnable product."""
    b = Builder()
    b.fact("x", [[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    b.weights("F", (2, 2), learnable=False, values=[np.array([[1.0, 0.5], [0.0, 2.0]])])
    b.linear("f", "F", "x", count=3, w_layout="tile", x_layout="full")
    b.gather("g", "f", [0, 1, 2, 2])
    b.reduce("s", "g", [3, 1])
    b.weights("W", (1, 2))
    b.linear("l", "W", "s", count=2, w_layout="tile", x_layout="full")
    return b


def test_constant_subprogram_becomes_one_fact():
    before = constant_sum().build("l")
    after = fold_constants(before, SETTINGS)
    s = after.node("s")
    assert s.op is Op.FACT and s.attrs["fact_layer"] is None
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]]) @ np.array([[1.0, 0.5], [0.0, 2.0]]).T
    np.testing.assert_array_equal(after.constants[s.attrs["const"]], [x[0] + x[1] + x[2], x[2]])
    assert {n.name for n in after.nodes} == {"s", "W", "l"}      # the chain under it is gone
    assert_same_function(before, after)


def test_dynamic_facts_are_not_folded():
    before = constant_sum().build("l").replace(dynamic_facts=("x",))
    assert fold_constants(before, SETTINGS) is before


def test_repeating_gathers_of_constants_stay():
    """A gather that repeats rows of a stored constant would only store more (labels: 3 rows, E edges)."""
    b = Builder()
    b.fact("x", [[1.0], [2.0]])
    b.gather("g", "x", [0, 1, 1, 0, 0])
    b.weights("W", (1, 1))
    b.linear("l", "W", "g", count=5, w_layout="tile", x_layout="full")
    before = b.build("l")
    assert fold_constants(before, SETTINGS) is before



def segmented_product(w_layout="interleave"):
    """A segmented product (two chunks of three rows, one weight each; or one weight for every row,
    ``w_layout="tile"``) over rows gathered from 2 facts."""
    b = Builder()
    b.fact("x", [[1.0, -2.0], [3.0, 0.5]])
    b.gather("g", "x", [0, 1, 1, 1, 0, 0])
    b.weights("W", (3, 2), k=2 if w_layout == "interleave" else 1)
    b.linear("l", "W", "g", count=6, w_layout=w_layout, x_layout="full")
    b.reduce("s", "l", [4, 2])
    return b.build("s")


def test_a_segmented_products_gathered_rows_are_folded():
    """NOTE: [folded product rows]: the product reads them (and keeps them) at every step anyway."""
    before = segmented_product()
    after = fold_constants(before, SETTINGS)
    g = after.node("g")
    assert g.op is Op.FACT and g.attrs["fact_layer"] is None and after.node("l").srcs == ("W", "g")
    np.testing.assert_array_equal(after.constants[g.attrs["const"]], np.array([[1.0, -2.0], [3.0, 0.5]])[[0, 1, 1, 1, 0, 0]])
    assert_same_function(before, after)


def test_gathered_rows_of_other_products_or_past_the_bound_stay(monkeypatch):
    before = segmented_product(w_layout="tile")
    assert fold_constants(before, SETTINGS) is before  # one weight for every row: not a segmented product
    monkeypatch.setattr(fold_constants_module, "PRODUCT_ROWS_VALUES", 11)  # 6 rows x 2 values: over the bound
    before = segmented_product()
    assert fold_constants(before, SETTINGS) is before

def gcn_graph():
    b = neurovec.GraphBuilder()
    w = b.weight("W", np.arange(6.0).reshape(3, 2) / 6)
    c = b.weight("c", 0.5, learnable=False)
    x = b.facts("x", np.array([[1.0, 0.0], [0.5, 2.0], [0.0, 1.0]]))
    lin = b.layer("lin")
    rows = [lin.neuron([(x[i], w)]) for i in range(3)]
    agg = b.layer("agg", aggregation="sum", transformation="relu")
    b.output(agg.neuron([(rows[0], c), (rows[1], None)]), agg.neuron([(rows[2], c), (rows[0], None)]))
    return b.build()


def test_a_folded_max_orders_its_zeros_as_the_program_would():
    # max{-0.0, 0.0} of facts is folded; an inverse later tells its zero's sign (1 / it = inf).
    # Evaluated alone, its zero's sign reached no inverse and the kernel returned the first zero.
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([-0.0, 0.0, 3.0]))
    h = b.layer("h", aggregation="max")
    ties, other = h.neuron([x[0], x[1]]), h.neuron([x[0], x[2]])
    v = b.weight("v", np.array(1.5))
    inverse = b.layer("inverse", aggregation="max", transformation="inverse")
    b.output(inverse.neuron([(ties, v)]), inverse.neuron([(other, v)]))
    graph = b.build()
    program = build_program(graph, "default")
    assert program.node("h_agg").op is Op.FACT  # folded
    assert neurovec.compile(graph, "default", dtype=torch.float64)().tolist() == [np.inf, 1 / 4.5]
    assert_equivalent(graph, neurovec.compile(graph, "default", dtype=torch.float64))


def test_first_aggregation_of_a_gcn_is_folded_and_its_facts_frozen():
    graph = gcn_graph()
    module = neurovec.compile(graph, dtype=torch.float64)
    reduces = [n for n in module.program.nodes if n.op is Op.REDUCE]
    assert reduces == []                                      # no sparse product left, forward or backward
    assert [n for n in module.program.nodes if n.op is Op.FACT and n.attrs["const"].startswith("folded_")]
    assert_equivalent(graph, module)
    with pytest.raises(GraphError, match="cannot be replaced"):
        module(facts={"x": torch.ones(3, 2)})
    dynamic = neurovec.compile(graph, Settings(dynamic_facts=("x",)), dtype=torch.float64)
    facts = {"x": torch.tensor([[2.0, 1.0], [0.0, -1.0], [1.0, 1.0]], dtype=torch.float64)}
    torch.testing.assert_close(dynamic(facts=facts), ReferenceModule(graph)(facts))


def test_sage_first_mean_on_mutag_is_folded(tu_dir):
    from neurovec.datasets import load_tu, sage
    graph = sage(load_tu("MUTAG", tu_dir), hidden=4)
    program = build_program(graph, SETTINGS)
    assert not [n for n in program.nodes if n.op is Op.REDUCE and n.layer == "conv1.mean"]
    assert_equivalent(graph, neurovec.compile(graph, dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=gnn_graphs())
def test_gnn_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, Settings(reorder_linear=False), dtype=torch.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, Settings.preset("unoptimized", fold_constants=True),
                                              dtype=torch.float64))


@pytest.mark.parametrize("chunk_values", [300, 40_000])
def test_folded_reduction_in_chunks_is_bit_identical(monkeypatch, tu_dir, chunk_values):
    """A folded reduction over gathered facts that is not a sum or mean is computed by the engine a
    run of whole segments at a time (NOTE: [folding in chunks]; shown here on a sum): with pieces
    of a few hundred values (runs of 100 rows of 3 features) or of a few runs, every constant of
    the program is byte for byte the one of the whole evaluation (PROTEINS GCN, its first aggregation over 17387 gathered rows)."""
    import numpy as np

    from neurovec import datasets
    from neurovec.compiler import Settings, build_program
    from neurovec.compiler.passes import fold_constants as fc
    data = datasets.load_tu("PROTEINS", tu_dir, download=False)
    graph = datasets.gcn(data, samples=np.arange(200))
    settings = Settings.preset("default", verify=False)
    monkeypatch.setattr(fc, "_gathered_sum", lambda sub, name: None)  # the engine's evaluation, as for a max
    whole = build_program(graph, settings)
    calls = []
    chunked = fc._in_chunks
    monkeypatch.setattr(fc, "_in_chunks", lambda sub, name: calls.append(name) or chunked(sub, name))
    evaluations = []
    evaluate = fc.backend.current().evaluate
    monkeypatch.setattr(fc.backend.current(), "evaluate", lambda p: evaluations.append(p) or evaluate(p))
    monkeypatch.setattr(fc, "CHUNK_VALUES", chunk_values)
    folded = build_program(graph, settings)
    assert calls and str(folded) == str(whole)
    pieces = [(p.nodes[0].count, p.nodes[-1].shape) for p in evaluations if len(p.nodes) == 2]  # FACT -> REDUCE
    assert {shape for _, shape in pieces} == {(3,)}  # whole rows
    assert sum(rows for rows, _ in pieces) == 17387 and len(pieces) == (2 if chunk_values == 40_000 else 174)
    assert folded.constants.keys() == whole.constants.keys()
    for key, array in whole.constants.items():
        assert folded.constants[key].dtype == array.dtype and folded.constants[key].tobytes() == array.tobytes(), key


def _engine_sums(facts, index, coef, counts):
    """What the engine's kernels give for a sum over gathered facts: the C++ segment sum (where
    every segment is non-empty) and torch's scatter_reduce, on the products the module makes."""
    from neurovec.engines import kernels
    x = torch.from_numpy(facts[index])
    if coef is not None:
        x = x * torch.from_numpy(coef).reshape((-1,) + (1,) * (x.dim() - 1))
    seg = torch.from_numpy(np.repeat(np.arange(counts.size), counts))
    sums = [kernels.scatter_reduce_native(x, seg, counts.size, "sum").numpy()]
    if counts.all():
        ptr = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]))
        sums.append(kernels.segment_reduce(x, ptr, seg, None, "sum").numpy())
    return sums


@pytest.mark.parametrize("trial", range(12))
def test_sequential_sums_are_the_engines_bit_for_bit(trial):
    """NOTE: [sequential sums]: the folded sum of gathered facts is, bit for bit, what the engine's
    kernels compute -- with -0.0 products (a segment of them sums to 0.0), infinities, values of
    very different sizes (the order of the additions shows), segments longer than a piece, and
    pieces of a few values or of everything."""
    from neurovec.compiler.passes.fold_constants import sequential_sums
    rng = np.random.default_rng(trial)
    counts = rng.choice([0, 1, 2, 3, 9, 40, 300], size=30)
    if trial % 2:
        counts[counts == 0] = 1
    width = (1, 3, 20, 2)[trial % 4]
    facts = rng.standard_normal((50, width)) * rng.choice([1.0, 1e12, 1e-12], size=(50, 1))
    facts[rng.random(facts.shape) < 0.1] = -0.0
    if trial % 4 == 0:
        facts[0, 0], facts[1, 0] = np.inf, -np.inf
    index = rng.integers(0, 50, counts.sum()).astype(np.int32)
    coef = rng.standard_normal(index.size) if trial % 3 else None
    if coef is not None:
        coef[rng.random(coef.size) < 0.1] = -0.0
    facts.setflags(write=False)  # as the program's constants are
    for chunk_values in (5, 100, 1 << 20):
        ours = sequential_sums(facts, index, coef, counts, chunk_values=chunk_values)
        for theirs in _engine_sums(facts, index, coef, counts):
            assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), chunk_values


@pytest.mark.parametrize("chunk_values", [7, 1 << 18])
def test_folded_sums_equal_the_engines_evaluation(monkeypatch, tu_dir, chunk_values):
    """PROTEINS GCN's first aggregation folded by ``sequential_sums`` (pieces of 7 values: every
    segment in pieces of a few entries) gives every constant of the program byte for byte as the
    engine's whole evaluation does, and so does the engine's fold kernel where it offers one
    (NOTE: [sequential sums in C++])."""
    from neurovec import datasets
    from neurovec.compiler.passes import fold_constants as fc
    data = datasets.load_tu("PROTEINS", tu_dir, download=False)
    graph = datasets.gcn(data, samples=np.arange(200))
    settings = Settings.preset("default", verify=False)
    kernel = build_program(graph, settings)  # the engine's kernel where it has one, else the same as ``folded``
    calls = []
    ours, engine_sums = fc.sequential_sums, fc._engine_sums
    monkeypatch.setattr(fc, "_engine_sums", lambda *a: None)
    monkeypatch.setattr(fc, "sequential_sums",
                        lambda *a, **k: calls.append(a[3].size) or ours(*a, chunk_values=chunk_values))
    folded = build_program(graph, settings)
    assert calls
    monkeypatch.setattr(fc, "_engine_sums", engine_sums)
    monkeypatch.setattr(fc, "_gathered_sum", lambda sub, name: None)
    whole = build_program(graph, settings)
    for program in (folded, kernel):
        assert str(program) == str(whole) and program.constants.keys() == whole.constants.keys()
        for key, array in whole.constants.items():
            assert program.constants[key].dtype == array.dtype and program.constants[key].tobytes() == array.tobytes(), key
