"""Gather simplification (thesis 5.2.1): index plans, rewritten programs, random graphs."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import neurovec
from neurovec.compiler.ir import Node, Op, Program
from neurovec.compiler.gather_plans import plan_index
from neurovec.compiler.passes.simplify_gathers import simplify_gathers
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import Weight

from ..equivalence import assert_equivalent, outputs_and_grads
from ..strategies import graphs
from ..test_equivalence import all_finite

RNG = np.random.default_rng(0)


# -- helpers shared by the pass tests ------------------------------------------------------------


def fact(name, values, **attrs):
    return Node(name, Op.FACT, (), values.shape[0], values.shape[1:], {"const": f"c_{name}", **attrs})


def gather(name, src, index_key, count, shape=(3,)):
    return Node(name, Op.GATHER, (src,), count, shape, {"index": index_key})


def program(nodes, constants, weights=(), output=None):
    p = Program(tuple(nodes), dict(constants), tuple(weights), output or nodes[-1].name)
    p.verify()
    return p


def assert_same_function(before: Program, after: Program):
    """Both programs verify and compute the same outputs and weight gradients (float64)."""
    after.verify()
    out_b, grad_b = outputs_and_grads(CompiledModule(before, torch.float64))
    out_a, grad_a = outputs_and_grads(CompiledModule(after, torch.float64))
    torch.testing.assert_close(out_a, out_b, rtol=1e-12, atol=1e-12)
    for name, g in grad_b.items():
        if g is None or grad_a[name] is None:
            assert g is None or grad_a[name] is None or not torch.any(g if grad_a[name] is None else grad_a[name])
        else:
            torch.testing.assert_close(grad_a[name], g, rtol=1e-12, atol=1e-12)


def ops(p: Program):
    return [(n.op, n.srcs) for n in p.nodes]


# -- plans ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index,n,expected", [
    ([0, 1, 2, 3], 4, ("id",)),
    ([0, 1, 2], 4, ("slice", 0, 3, 1)),
    ([3, 5, 7], 9, ("slice", 3, 8, 2)),
    ([2], 4, ("slice", 2, 3, 1)),
    ([0], 1, ("id",)),
    ([4, 4, 4], 9, ("tile", 3, ("slice", 4, 5, 1))),
    ([0, 1, 2, 0, 1, 2], 6, ("tile", 2, ("slice", 0, 3, 1))),
    ([0, 1, 2, 0, 1, 2], 3, ("tile", 2, ("id",))),
    ([0, 0, 1, 1, 2, 2], 3, ("interleave", 2, ("id",))),
    ([0, 0, 1, 1, 0, 0, 1, 1], 2, ("interleave", 2, ("tile", 2, ("id",)))),
    ([1, 1, 1, 3, 3, 3], 5, ("interleave", 3, ("slice", 1, 4, 2))),
])
def test_plans(index, n, expected):
    assert plan_index(np.array(index), n) == expected


def test_plans_that_stay_gathers():
    plan = plan_index(np.array([2, 0, 1]), 3)
    assert plan[0] == "gather" and plan[1].tolist() == [2, 0, 1]
    plan = plan_index(np.array([2, 0, 2, 0]), 3)  # a tile of a reordering
    assert plan[0] == "tile" and plan[1] == 2 and plan[2][0] == "gather" and plan[2][1].tolist() == [2, 0]
    plan = plan_index(np.array([3, 2, 1]), 4)  # a negative step: torch has no reversed slice
    assert plan[0] == "gather"


class _CountingNumpy:
    """numpy, counting the elements that ``array_equal`` and ``diff`` read."""

    def __init__(self):
        self.read = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def array_equal(self, a, b):
        self.read += min(np.size(a), np.size(b))
        return np.array_equal(a, b)

    def diff(self, a, *args, **kwargs):
        self.read += np.size(a)
        return np.diff(a, *args, **kwargs)


def test_plans_read_a_large_index_a_few_times_only(monkeypatch):
    # Linear work, counted instead of timed: the sequence and repetition checks look at 1024 rows
    # (and one row per candidate) before they read the whole index. Here the plan reads a quarter
    # of it; whole-index checks read it 1.75 times over, and comparing every repetition candidate
    # (one per divisor of the length, 112 here) in full about 24 times.
    from neurovec.compiler import gather_plans, indexing

    counting = _CountingNumpy()
    for module in (gather_plans, indexing):  # the plans, and the repetition checks they call
        monkeypatch.setattr(module, "np", counting)
    perm = RNG.permutation(500_000)
    index = np.tile(np.repeat(perm, 4), 3)
    plan = plan_index(index, 500_000)
    assert counting.read <= index.size
    assert plan[:2] == ("interleave", 4) and plan[2][:2] == ("tile", 3)
    assert plan[2][2][0] == "gather" and np.array_equal(plan[2][2][1], perm)


# -- rewritten programs ----------------------------------------------------------------------------------


def test_repeated_range_becomes_tile_of_slice_or_of_the_source():
    x6, x3 = RNG.normal(size=(6, 3)), RNG.normal(size=(3, 3))
    for x, expected in ((x6, [Op.FACT, Op.SLICE, Op.TILE]), (x3, [Op.FACT, Op.TILE])):
        before = program([fact("x", x), gather("g", "x", "i", 6)], {"c_x": x, "i": np.array([0, 1, 2, 0, 1, 2])})
        after = simplify_gathers(before, Settings())
        assert [n.op for n in after.nodes] == expected
        assert after.node("g").attrs["times"] == 2 and "i" not in after.constants
        assert_same_function(before, after)


def test_identity_gather_disappears_and_readers_are_rewired():
    x = RNG.normal(size=(4, 3))
    nodes = [fact("x", x), gather("g", "x", "i", 4), Node("t", Op.TRANSFORM, ("g",), 4, (3,), {"fn": "tanh"})]
    before = program(nodes, {"c_x": x, "i": np.arange(4)})
    after = simplify_gathers(before, Settings())
    assert ops(after) == [(Op.FACT, ()), (Op.TRANSFORM, ("x",))]
    assert_same_function(before, after)
    # ... also when the gather is the output: the output becomes its source
    before = program(nodes[:2], {"c_x": x, "i": np.arange(4)})
    assert simplify_gathers(before, Settings()).output == "x"


def test_gather_of_gather_composes():
    x = RNG.normal(size=(5, 3))
    nodes = [fact("x", x), gather("a", "x", "ia", 4), gather("b", "a", "ib", 6)]
    before = program(nodes, {"c_x": x, "ia": np.array([4, 0, 3, 1]), "ib": np.array([1, 1, 0, 3, 2, 2])})
    after = simplify_gathers(before, Settings())
    assert ops(after) == [(Op.FACT, ()), (Op.GATHER, ("x",))]
    assert after.constants[after.node("b").attrs["index"]].tolist() == [0, 0, 4, 1, 3, 3]
    assert_same_function(before, after)


def test_gather_of_tile_slice_interleave_is_replanned_on_the_source():
    x = RNG.normal(size=(6, 3))
    nodes = [fact("x", x), Node("s", Op.SLICE, ("x",), 3, (3,), {"start": 0, "stop": 6, "step": 2}),
             Node("t", Op.TILE, ("s",), 6, (3,), {"times": 2}),
             Node("r", Op.INTERLEAVE, ("t",), 12, (3,), {"times": 2}),
             gather("g", "r", "i", 6)]
    # r = x[0, 0, 2, 2, 4, 4, 0, 0, ...]; g reads r[0, 2, 4, 6, 8, 10] = x[0, 2, 4, 0, 2, 4]
    before = program(nodes, {"c_x": x, "i": np.arange(0, 12, 2)})
    after = simplify_gathers(before, Settings())
    assert [n.op for n in after.nodes] == [Op.FACT, Op.SLICE, Op.TILE]
    out = after.node(after.output)
    assert out.op is Op.TILE and out.attrs["times"] == 2
    inner = after.node(out.srcs[0])
    assert inner.srcs == ("x",) and (inner.attrs["start"], inner.attrs["step"]) == (0, 2)
    assert_same_function(before, after)


def test_gather_reading_one_part_of_a_concat():
    a, b = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 3))
    nodes = [fact("a", a), fact("b", b), Node("cat", Op.CONCAT, ("a", "b"), 5, (3,)),
             gather("g", "cat", "i", 6)]
    before = program(nodes, {"c_a": a, "c_b": b, "i": np.array([3, 4, 2, 3, 4, 2])})
    after = simplify_gathers(before, Settings())
    assert all(n.op is not Op.CONCAT for n in after.nodes)
    g = after.node("g")
    assert g.op is Op.TILE and after.node(g.srcs[0]).op is Op.GATHER and after.node(g.srcs[0]).srcs == ("b",)
    assert_same_function(before, after)


def test_gather_of_a_concat_in_blocks_becomes_a_concat_of_parts():
    # Thesis 5.2.9: [b, a] read through CONCAT(a, b) is CONCAT(b, a); per-part plans apply too.
    a, b = RNG.normal(size=(3, 3)), RNG.normal(size=(4, 3))
    nodes = [fact("a", a), fact("b", b), Node("cat", Op.CONCAT, ("a", "b"), 7, (3,)), gather("g", "cat", "i", 9)]
    before = program(nodes, {"c_a": a, "c_b": b, "i": np.array([3, 4, 5, 6, 0, 1, 2, 4, 4])})
    after = simplify_gathers(before, Settings())
    g = after.node("g")
    assert g.op is Op.CONCAT and g.srcs[:2] == ("b", "a")
    assert after.node(g.srcs[2]).op is Op.TILE  # the block [4, 4]: a tile of b[1:2]
    assert_same_function(before, after)
    # Blocks that need gathers themselves: one gather is cheaper than gathers + CONCAT.
    before = program(nodes, {"c_a": a, "c_b": b, "i": np.array([5, 3, 6, 4, 2, 0, 1, 1, 2])})
    assert simplify_gathers(before, Settings()) is before


def test_single_input_concat_disappears():
    x = RNG.normal(size=(3, 3))
    nodes = [fact("x", x), Node("cat", Op.CONCAT, ("x",), 3, (3,)),
             Node("t", Op.TRANSFORM, ("cat",), 3, (3,), {"fn": "relu"})]
    before = program(nodes, {"c_x": x})
    after = simplify_gathers(before, Settings())
    assert ops(after) == [(Op.FACT, ()), (Op.TRANSFORM, ("x",))]


def test_shared_gather_is_not_recomputed_inside_a_chain():
    # y is read twice; tiling y must not become TILE(GATHER(x)) (a second copy of y's gather).
    x = RNG.normal(size=(5, 3))
    nodes = [fact("x", x), gather("y", "x", "i", 3), Node("t", Op.TILE, ("y",), 6, (3,), {"times": 2}),
             Node("u", Op.TRANSFORM, ("y",), 3, (3,), {"fn": "exp"}),
             Node("out", Op.CONCAT, ("t", "u"), 9, (3,))]
    before = program(nodes, {"c_x": x, "i": np.array([4, 0, 2])})
    assert simplify_gathers(before, Settings()) is before


def test_unchanged_program_is_returned_as_is():
    x = RNG.normal(size=(3, 3))
    before = program([fact("x", x), gather("g", "x", "i", 3)], {"c_x": x, "i": np.array([2, 0, 1])})
    assert simplify_gathers(before, Settings()) is before


def test_weight_gathers_keep_gradients():
    weights = [Weight("a", RNG.normal(size=3)), Weight("b", RNG.normal(size=3)),
               Weight("c", RNG.normal(size=3), learnable=False)]
    nodes = [Node("w", Op.WEIGHTS, (), 3, (3,), {"names": ("a", "b", "c")}), gather("g", "w", "i", 6),
             Node("t", Op.TRANSFORM, ("g",), 6, (3,), {"fn": "sigmoid"})]
    before = program(nodes, {"i": np.array([1, 1, 1, 2, 2, 2])}, weights)
    after = simplify_gathers(before, Settings())
    assert after.node("g").op is Op.INTERLEAVE
    assert_same_function(before, after)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_random_graphs_equal_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, Settings.preset("unoptimized", simplify_gathers=True),
                                              dtype=torch.float64))


def test_tile_found_beyond_the_compared_prefix():
    # _tile_factor compares a prefix of each candidate repetition first: a sequence that repeats
    # only past that prefix is no tile, and a long one that repeats throughout is.
    rng = np.random.default_rng(3)
    period = rng.integers(0, 50, 5000)
    assert plan_index(np.tile(period, 4), 50)[:2] == ("tile", 4)
    almost = np.tile(period, 4)
    almost[-1] = (almost[-1] + 1) % 50  # the last copy differs in its last row only
    assert plan_index(almost, 50)[0] == "gather"
