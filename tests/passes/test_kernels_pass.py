"""The kernel pass: fused sparse sums after a gather and large gathers as sums (where the engine runs
them best), ``kernel="auto"`` for the engine to choose the rest, forced choices; the program does not
depend on whether the compiling machine has the C++ kernels."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.compiler.ir import Node, Op, Program
from neurovec.compiler.passes.kernels import choose_kernels
from neurovec.compiler.settings import Settings
from neurovec.engines import native
from neurovec.engines.torch_module import CompiledModule

from ..equivalence import assert_equivalent
from ..strategies import graphs
from ..test_equivalence import all_finite


def gather_reduce(counts, aggregation="sum"):
    x = np.random.default_rng(0).normal(size=(5, 3))
    index = np.random.default_rng(1).integers(0, 5, int(np.sum(counts)))
    nodes = (Node("x", Op.FACT, (), 5, (3,), {"const": "cx"}),
             Node("g", Op.GATHER, ("x",), index.size, (3,), {"index": "idx"}),
             Node("r", Op.REDUCE, ("g",), len(counts), (3,),
                  {"aggregation": aggregation, "counts": "cnt", "kernel": "scatter"}))
    return Program(nodes, {"cx": x, "idx": index, "cnt": np.asarray(counts)}, (), "r")


def run(program):
    return CompiledModule(program, torch.float64)().detach()


@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_sum_after_gather_fuses_into_sparse_mm(aggregation):
    before = gather_reduce([1, 4, 2], aggregation)
    after = choose_kernels(before, Settings())
    assert [n.op for n in after.nodes] == [Op.FACT, Op.REDUCE]
    reduce = after.nodes[-1]
    assert reduce.attrs["kernel"] == "auto" and reduce.srcs == ("x",) and reduce.attrs["index"] == "idx"
    if native.available():  # the engine's choice
        assert "gather_sum(x, self.csr_r)" in CompiledModule(after).code
    torch.testing.assert_close(run(after), run(before), rtol=1e-12, atol=1e-12)


def test_equal_counts_and_max_are_left_to_the_engine():
    # Small equal-count sums stay unfused (the engine runs them dense), a max is no sparse sum.
    for program in (gather_reduce([2, 2, 2]), gather_reduce([1, 3, 2], "max")):
        after = choose_kernels(program, Settings())
        assert after.node("r").attrs["kernel"] == "auto" and "index" not in after.node("r").attrs
        assert after.node("g").op is Op.GATHER
    code = CompiledModule(choose_kernels(gather_reduce([2, 2, 2]), Settings())).code
    assert "dense_reduce(g, 2, 'sum')" in code


def test_the_program_does_not_depend_on_the_compiling_machine(monkeypatch, tu_dir):
    # Kernel choice is the engine's: a machine without g++ makes the very program one with it makes.
    from neurovec import datasets
    from neurovec.compiler import build_program
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir), samples=np.arange(30))
    with_kernels = build_program(graph)
    monkeypatch.setattr(native, "available", lambda: False)
    without = build_program(graph)
    assert str(without) == str(with_kernels) and all(
        np.array_equal(without.constants[k], with_kernels.constants[k]) for k in with_kernels.constants)
    assert any(n.op is Op.REDUCE and "index" in n.attrs for n in without.nodes)


def test_forced_kernels_fall_back_where_they_cannot_apply():
    program = gather_reduce([1, 3, 2], "max")
    for forced, expected in [("scatter", "scatter"), ("dense", "segment"), ("sparse_mm", "segment")]:
        after = choose_kernels(program, Settings(reduce_kernel=forced))
        assert after.nodes[-1].attrs["kernel"] == expected
        torch.testing.assert_close(run(after), run(program), rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(graph=graphs(), kernel=st.sampled_from(["auto", "scatter", "segment", "dense", "sparse_mm"]))
def test_random_graphs_under_every_kernel(graph, kernel):
    from hypothesis import assume
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, Settings(reduce_kernel=kernel), dtype=torch.float64))


@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_sparse_mm_with_constant_coefficients(aggregation):
    """A fused REDUCE with a ``coef`` attr (per-edge constants) multiplies each edge
    by its coefficient before the sum (the mean still divides by the counts)."""
    rng = np.random.default_rng(2)
    x, index, coef, counts = rng.normal(size=(5, 3)), np.array([0, 1, 1, 4, 2, 2, 3]), rng.normal(size=7), [2, 3, 2]
    nodes = (Node("x", Op.FACT, (), 5, (3,), {"const": "cx"}),
             Node("r", Op.REDUCE, ("x",), 3, (3,), {"aggregation": aggregation, "counts": "cnt", "kernel": "sparse_mm",
                                                    "index": "idx", "coef": "cf"}))
    module = CompiledModule(Program(nodes, {"cx": x, "idx": index, "cnt": np.array(counts), "cf": coef}, (), "r"),
                            torch.float64)
    rows = np.split(coef[:, None] * x[index], np.cumsum(counts)[:-1])
    expected = np.stack([r.sum(0) if aggregation == "sum" else r.mean(0) for r in rows])
    np.testing.assert_allclose(module().numpy(), expected, rtol=1e-12, atol=1e-12)


def gather_of_product(rows=5000, sources=4000, width=16, inverse=False, learnable=True):
    """%h = w * x (a learnable scalar, so %h needs a gradient), %g = GATHER(%h), output %g
    (or 1 / %g: then the gathered -0.0 row must stay -0.0)."""
    from neurovec.sources.graph import Weight
    rng = np.random.default_rng(3)
    x = rng.normal(size=(sources, width))
    x[0] = -0.0  # a -0.0 row, gathered below
    index = rng.integers(0, sources, rows)
    index[:3] = 0
    nodes = [Node("x", Op.FACT, (), sources, (width,), {"const": "cx"}),
             Node("w", Op.WEIGHTS, (), 1, (), {"names": ["w"]}),
             Node("h", Op.LINEAR, ("w", "x"), sources, (width,), {"kind": "mul", "w_layout": "tile"}),
             Node("g", Op.GATHER, ("h",), rows, (width,), {"index": "idx"})]
    if inverse:
        nodes.append(Node("o", Op.TRANSFORM, ("g",), rows, (width,), {"fn": "inverse"}))
    weight = Weight("w", np.array(1.5), learnable=learnable)
    return Program(tuple(nodes), {"cx": x, "idx": index}, (weight,), nodes[-1].name)


def outputs_and_grads(program):
    module = CompiledModule(program, torch.float64)
    out = module()
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum(),
                                [p for p in module.parameters()]) if out.requires_grad else ()
    return out.detach(), grads, module.code


def test_large_gather_needing_a_gradient_becomes_a_fused_sum():
    before = gather_of_product()
    after = choose_kernels(before, Settings())
    g = after.node("g")
    assert g.op is Op.REDUCE and g.attrs["kernel"] == "auto" and g.attrs["index"] == "idx"
    out, grads, code = outputs_and_grads(after)
    out_ref, grads_ref, _ = outputs_and_grads(before)
    assert "gather_sum(h, self.csr_g)" in code or not native.available()
    # A one-entry sum copies its row (up to the sign of a zero: 0.0 + -0.0 is +0.0, which no
    # inverse reads here); the backward adds the same terms as index_add.
    assert out_ref[0, 0].item() == 0 and torch.signbit(out_ref[0, 0])
    torch.testing.assert_close(out.abs(), out_ref.abs(), rtol=0, atol=0)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["small", "narrow", "constant", "inverse", "forced"])
def test_gathers_that_stay_index_select(case):
    program = {"small": lambda: gather_of_product(rows=100, sources=50),
               "narrow": lambda: gather_of_product(width=2, rows=50_000),
               "constant": lambda: gather_of_product(learnable=False),
               "inverse": lambda: gather_of_product(inverse=True),
               "forced": gather_of_product}[case]()
    settings = Settings(reduce_kernel="segment") if case == "forced" else Settings()
    after = choose_kernels(program, settings)
    assert after.node("g").op is Op.GATHER
    if case == "inverse":  # 1 / -0.0 = -inf: the sign survives
        out, _, _ = outputs_and_grads(after)
        assert torch.isneginf(out[:3, 0]).all()


def fact_products_added(rows=5000, sources=4000, width=16):
    """s = (m @ W.T)[idx] + x @ V.T over static facts m, x (GraphSAGE's first layer, the mean folded):
    fuse_fact_products' form, one addmm over [m[idx] | x]."""
    rng = np.random.default_rng(5)
    nodes = [Node("m", Op.FACT, (), sources, (width,), {"const": "cm"}),
             Node("x", Op.FACT, (), rows, (width,), {"const": "cx"}),
             Node("W", Op.WEIGHTS, (), 1, (width, width), {"names": ["W"]}),
             Node("V", Op.WEIGHTS, (), 1, (width, width), {"names": ["V"]}),
             Node("mw", Op.LINEAR, ("W", "m"), sources, (width,), {"kind": "matmul", "w_layout": "tile"}),
             Node("g", Op.GATHER, ("mw",), rows, (width,), {"index": "idx"}),
             Node("xv", Op.LINEAR, ("V", "x"), rows, (width,), {"kind": "matmul", "w_layout": "tile"}),
             Node("s", Op.ADD, ("g", "xv"), rows, (width,), {})]
    from neurovec.sources.graph import Weight
    weights = (Weight("W", rng.normal(size=(width, width))), Weight("V", rng.normal(size=(width, width))))
    constants = {"cm": rng.normal(size=(sources, width)), "cx": rng.normal(size=(rows, width)),
                 "idx": rng.integers(0, sources, rows)}
    return Program(tuple(nodes), constants, weights, "s")


def test_a_gather_that_fuse_fact_products_takes_stays_a_gather():
    """As a sum it would hide the side-by-side product from fuse_fact_products (and then
    join_sums concatenated both products instead: a copy of every row each step)."""
    program = fact_products_added()
    assert choose_kernels(program, Settings()).node("g").op is Op.GATHER
    assert choose_kernels(program, Settings(fuse_fact_products=False)).node("g").op is Op.REDUCE \
        or not native.available()
