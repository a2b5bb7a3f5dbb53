"""Linear broadcasting (thesis 5.2.3): periods of index sequences, rewritten programs, random graphs."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.compiler.ir import Node, Op, Program, linear_grid
from neurovec.compiler.indexing import SideRows, best_layout, interleave_count, resolve_rows, tile_period
from neurovec.compiler.passes.linear_broadcast import broadcast_linear
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import Weight

from ..equivalence import assert_equivalent, outputs_and_grads
from ..strategies import graphs
from ..test_equivalence import all_finite

SETTINGS = Settings.preset("unoptimized", linear_broadcasting=True)


# -- helpers shared with test_padding ------------------------------------------------------------

def linear_program(w_index, x_index, *, n_weights=None, n_values=None, w_shape=(3, 2), x_shape=(2,),
                   kind="matmul", reader=None, counts=None, seed=0) -> Program:
    """``WEIGHTS -> GATHER -> LINEAR <- GATHER <- FACT``, then the LINEAR's reader(s).

    ``reader``: None (a REDUCE reads the LINEAR directly, as from the Vectorizer), an index array
    (a GATHER reads it first, as after dedup), or ``"concat"`` (CONCAT with another value, then a
    GATHER that undoes the concatenation order). ``counts`` are the REDUCE's segment sizes.
    """
    rng = np.random.default_rng(seed)
    w_index, x_index = np.asarray(w_index, np.int64), np.asarray(x_index, np.int64)
    n_weights = n_weights or int(w_index.max()) + 1
    n_values = n_values or int(x_index.max()) + 1
    weights = tuple(Weight(f"w{k}", rng.normal(size=w_shape)) for k in range(n_weights))
    out_shape = (w_shape[0],) if kind == "matmul" else np.broadcast_shapes(w_shape, x_shape)
    constants = {"c_X": rng.normal(size=(n_values,) + x_shape), "i_w": w_index, "i_x": x_index}
    nodes = [
        Node("W", Op.WEIGHTS, (), n_weights, w_shape, {"names": tuple(w.name for w in weights)}),
        Node("X", Op.FACT, (), n_values, x_shape, {"const": "c_X", "fact_layer": "X", "unit": False}),
        Node("lw", Op.GATHER, ("W",), len(w_index), w_shape, {"index": "i_w"}),
        Node("lx", Op.GATHER, ("X",), len(x_index), x_shape, {"index": "i_x"}),
        Node("lin", Op.LINEAR, ("lw", "lx"), len(w_index), out_shape, {"kind": kind}),
    ]
    read = "lin"
    if isinstance(reader, str) and reader == "concat":
        other = rng.normal(size=(2,) + out_shape)
        constants["c_other"] = other
        n = len(w_index)
        constants["i_g"] = np.concatenate([np.arange(2, 2 + n), [0, 1]])  # lin's rows first again
        nodes += [Node("other", Op.FACT, (), 2, out_shape, {"const": "c_other", "fact_layer": None}),
                  Node("cat", Op.CONCAT, ("other", "lin"), n + 2, out_shape),
                  Node("g", Op.GATHER, ("cat",), n + 2, out_shape, {"index": "i_g"})]
        read = "g"
    elif reader is not None:
        constants["i_g"] = np.asarray(reader, np.int64)
        nodes.append(Node("g", Op.GATHER, ("lin",), len(reader), out_shape, {"index": "i_g"}))
        read = "g"
    rows = nodes[-1].count
    counts = np.asarray(counts if counts is not None else [rows], np.int64)
    constants["cnt"] = counts
    nodes.append(Node("r", Op.REDUCE, (read,), len(counts), out_shape,
                      {"aggregation": "sum", "counts": "cnt"}))
    program = Program(tuple(nodes), constants, weights, "r")
    program.verify()
    return program


def assert_same_function(before: Program, after: Program) -> None:
    """Same outputs and same gradients w.r.t. every weight (float64)."""
    after.verify()
    out_a, grads_a = outputs_and_grads(CompiledModule(before, torch.float64))
    out_b, grads_b = outputs_and_grads(CompiledModule(after, torch.float64))
    torch.testing.assert_close(out_b, out_a, rtol=1e-12, atol=1e-12)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-12, atol=1e-12)


def rows_of(program: Program, name: str) -> SideRows:
    return resolve_rows(program.by_name(), program.constants, name)


# -- periods ---------------------------------------------------------------------------------------

def brute_tile_period(index):
    n = len(index)
    return next(p for p in range(1, n + 1) if n % p == 0 and all(index[e] == index[e % p] for e in range(n)))


def brute_interleave_count(index):
    n = len(index)
    return next(c for c in range(1, n + 1) if n % c == 0 and all(index[e] == index[(e // (n // c)) * (n // c)]
                                                                  for e in range(n)))


@pytest.mark.parametrize("index,tile,interleave", [
    ([0, 0, 0, 0], 1, 1), ([0, 1, 0, 1, 0, 1], 2, 6), ([0, 1, 2, 0, 1, 2], 3, 6), ([4, 4, 7, 7, 9, 9], 6, 3),
    ([1, 2, 1, 2, 1, 2, 1, 2], 2, 8), ([0, 0, 1, 1, 0, 0, 1, 1], 4, 4), ([5], 1, 1), ([0, 1, 1, 0], 4, 4)])
def test_periods(index, tile, interleave):
    index = np.array(index)
    assert tile_period(index) == tile
    assert interleave_count(index) == interleave


@settings(max_examples=300, deadline=None)
@given(base=st.lists(st.integers(0, 2), min_size=1, max_size=6), times=st.integers(1, 6),
       mode=st.sampled_from(["tile", "repeat", "raw"]))
def test_periods_match_brute_force(base, times, mode):
    make = {"tile": np.tile, "repeat": np.repeat, "raw": lambda b, t: np.array(b)}[mode]
    index = make(np.array(base), times)
    assert tile_period(index) == brute_tile_period(index)
    assert interleave_count(index) == brute_interleave_count(index)


def reconstruct(layout, n):
    """The (weight row, value row) of every product row under a layout (NOTE [LINEAR broadcasting])."""
    w = Node("w", Op.FACT, (), len(layout.w_index), ())
    x = Node("x", Op.FACT, (), len(layout.x_index), ())
    node = Node("y", Op.LINEAR, ("w", "x"), n, (), {"kind": "mul", "w_layout": layout.w_layout,
                                                      "x_layout": layout.x_layout})
    g1, g2 = linear_grid(node, w, x)
    e = np.arange(n)
    row = {"full": e, "tile": e % g2, "interleave": e // g2}
    return layout.w_index[row[layout.w_layout]], layout.x_index[row[layout.x_layout]]


@settings(max_examples=300, deadline=None)
@given(w_base=st.lists(st.integers(0, 3), min_size=1, max_size=4),
       x_base=st.lists(st.integers(0, 3), min_size=1, max_size=4),
       w_mode=st.sampled_from(["tile", "repeat"]), x_mode=st.sampled_from(["tile", "repeat", "raw"]))
def test_best_layout_reads_the_same_rows(w_base, x_base, w_mode, x_mode):
    # Build sides of equal length n = len(w_base) * len(x_base) with all kinds of repetition.
    k_w, k_x = len(w_base), len(x_base)
    w_index = np.tile(w_base, k_x) if w_mode == "tile" else np.repeat(w_base, k_x)
    x_index = (np.tile(x_base, k_w) if x_mode == "tile" else np.repeat(x_base, k_w) if x_mode == "repeat"
               else np.resize(x_base[::-1] + x_base, k_w * k_x))
    layout = best_layout(SideRows("W", w_index, 4), SideRows("X", x_index, 4))
    w_rows, x_rows = reconstruct(layout, len(w_index))
    np.testing.assert_array_equal(w_rows, w_index)
    np.testing.assert_array_equal(x_rows, x_index)
    assert layout.cost <= 2 * len(w_index)


# -- rewritten programs ----------------------------------------------------------------------------

def test_one_shared_weight_becomes_one_gemm():
    before = linear_program([0] * 6, [3, 1, 4, 1, 5, 2], counts=[2, 4])
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert lin.srcs == ("W", "lx") and lin.attrs["w_layout"] == "tile" and lin.attrs["x_layout"] == "full"
    assert "lw" not in after.by_name() and "i_w" not in after.constants  # the weight gather is gone
    assert "lin = lx @ w['w0'].T" in CompiledModule(after).code  # the one weight, in place
    assert_same_function(before, after)


def test_one_shared_weight_row_among_several():
    before = linear_program([2] * 4, [0, 1, 2, 3], n_weights=3)
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert after.node(lin.srcs[0]).op is Op.GATHER and after.node(lin.srcs[0]).count == 1
    assert lin.srcs[1] == "lx" and lin.attrs["x_layout"] == "full"  # a full side stays as it is
    assert_same_function(before, after)


def test_one_value_many_weights():
    before = linear_program([0, 1, 2, 3], [0] * 4, n_values=1, kind="mul", w_shape=(2,), x_shape=())
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert lin.srcs == ("lw", "X") and lin.attrs["x_layout"] in ("tile", "interleave")
    assert after.node("X").count == 1 and lin.attrs["w_layout"] == "full"
    assert_same_function(before, after)


def test_smallest_tile_period():
    before = linear_program([0, 1] * 4, [7, 3, 2, 5, 0, 1, 6, 4])
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert lin.attrs["w_layout"] == "tile" and after.node(lin.srcs[0]).count == 2
    assert_same_function(before, after)


def test_interleave_weights():
    before = linear_program([1, 1, 1, 0, 0, 0], [2, 3, 0, 1, 4, 5])
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert lin.attrs["w_layout"] == "interleave" and lin.attrs["x_layout"] == "full"
    np.testing.assert_array_equal(after.constants[after.node(lin.srcs[0]).attrs["index"]], [1, 0])
    assert_same_function(before, after)


def test_tile_and_interleave_together():
    # weights (0, 1, 2) repeated twice, each value repeated three times: an outer product over (2, 3).
    before = linear_program([0, 1, 2] * 2, [4, 4, 4, 1, 1, 1], kind="mul", w_shape=(2,), x_shape=(2,))
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert (lin.attrs["w_layout"], lin.attrs["x_layout"]) == ("tile", "interleave")
    assert after.node(lin.srcs[0]).count == 3 and after.node(lin.srcs[1]).count == 2
    assert_same_function(before, after)


def test_resolves_chains_of_row_selections():
    # A TILE of a gather: the side repeats only when the chain is composed.
    base = linear_program([0, 1, 0], [0, 1, 2])
    nodes = list(base.nodes)
    nodes.insert(3, Node("lw_tiled", Op.TILE, ("lw",), 6, (3, 2), {"times": 2}))
    nodes = [n.with_(count=6) if n.name in ("lin", "lx") else n for n in nodes]
    nodes = [n.with_(srcs=("lw_tiled", "lx")) if n.name == "lin" else n for n in nodes]
    constants = {**base.constants, "i_x": np.array([0, 1, 2, 2, 1, 0]), "cnt": np.array([6])}
    before = base.replace(nodes=tuple(nodes), constants=constants)
    before.verify()
    assert rows_of(before, "lw_tiled").index.tolist() == [0, 1, 0, 0, 1, 0]
    after = broadcast_linear(before, SETTINGS)
    lin = after.node("lin")
    assert lin.attrs["w_layout"] == "tile" and after.node(lin.srcs[0]).count == 3
    assert "lw_tiled" not in after.by_name() and "lw" not in after.by_name()
    assert_same_function(before, after)


def test_nothing_repeats_nothing_changes():
    before = linear_program([0, 1, 1, 0, 2], [0, 1, 2, 3, 4])
    assert broadcast_linear(before, SETTINGS) is before


def test_already_broadcast_is_left_alone():
    once = broadcast_linear(linear_program([0] * 4, [1, 0, 2, 3]), SETTINGS)
    assert broadcast_linear(once, SETTINGS) is once


# -- whole graphs ----------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, SETTINGS, dtype=torch.float64))


def test_gcn_weight_gathers_disappear(tu_dir):
    from neurovec import datasets
    graph = datasets.gcn(datasets.load_tu("MUTAG", tu_dir, download=False), normalize=False)
    program = neurovec.compiler.build_program(graph, SETTINGS)
    weights = {n.name for n in program.nodes if n.op is Op.WEIGHTS}
    # Thesis Fig. 6.9: no gather of a weight matrix is left; the biases are not linear sides.
    assert not [n for n in program.nodes if n.op is Op.GATHER and n.srcs[0] in weights and n.shape != (16,)
                and n.shape != (1,)]
    for lin in (n for n in program.nodes if n.op is Op.LINEAR):
        assert lin.srcs[0] in weights and lin.attrs["w_layout"] == "tile"
    module = neurovec.compile(graph, SETTINGS, dtype=torch.float64)
    reference = neurovec.compile(graph, "unoptimized", dtype=torch.float64)
    torch.testing.assert_close(module(), reference(), rtol=1e-12, atol=1e-12)


def test_weight_runs_split_into_one_gemm_per_run():
    """GraphSAGE's shape: lin_r on a few root rows, lin_l on many mean rows -> two GEMMs and a CONCAT."""
    rng = np.random.default_rng(3)
    weights = (Weight("l", rng.normal(size=(4, 3))), Weight("r", rng.normal(size=(4, 3))))
    index = np.array([1] * 41 + [0] * 60)  # no common period: no broadcast layout fits
    nodes = (Node("x", Op.FACT, (), 101, (3,), {"const": "cx"}),
             Node("w", Op.WEIGHTS, (), 2, (4, 3), {"names": ("l", "r")}),
             Node("lin_w", Op.GATHER, ("w",), 101, (4, 3), {"index": "iw"}),
             Node("lin", Op.LINEAR, ("lin_w", "x"), 101, (4,), {"kind": "matmul"}))
    before = Program(nodes, {"cx": rng.normal(size=(101, 3)), "iw": index}, weights, "lin")
    after = broadcast_linear(before, Settings())
    runs = [n for n in after.nodes if n.op is Op.LINEAR]
    assert [r.count for r in runs] == [41, 60] and all(r.attrs["w_layout"] == "tile" for r in runs)
    assert after.node("lin").op is Op.CONCAT
    assert not [n for n in after.nodes if n.op is Op.GATHER and n.count == 101]  # no per-row weight gather
    run = lambda p: CompiledModule(p, torch.float64)().detach()  # noqa: E731
    torch.testing.assert_close(run(after), run(before), rtol=1e-12, atol=1e-12)
    # Many short runs stay as they are: one GEMM each would cost more than the gather.
    short = before.replace(constants={**before.constants, "iw": (np.arange(101) // 3) % 2})
    assert not [n for n in broadcast_linear(short, Settings()).nodes if n.op is Op.CONCAT]
