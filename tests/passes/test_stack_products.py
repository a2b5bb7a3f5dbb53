"""Shared-weight products of one value, concatenated, as one GEMM (compiler/passes/stack_products.py)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import datasets
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.kernels import choose_kernels
from neurovec.compiler.passes.stack_products import stack_products
from neurovec.compiler.pipeline import build_program
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import generate_source

from ..equivalence import assert_equivalent
from ..builders import Builder, assert_same_function
from .test_join_sums import sage_like

SETTINGS = Settings()


def side_by_side(reader="sum", n_products=2, n=4, width=3, out=2, seed=0, edges=None, counts=None, through=None):
    """h = tanh(x W) (n rows); products h Wk (one-row weights, out wide), concatenated; read by a
    fused sum over ``edges`` (``reader="sum"``) or a gather (``"gather"``); sigmoid output.
    With ``through=m``, each Vk is itself a product ``L @ A_k`` of one (1, m) row L (``out`` = 1)."""
    rng = np.random.default_rng(seed)
    b = Builder(seed)
    b.fact("x", rng.normal(size=(n, width)))
    b.weights("W", (width, width))
    b.linear("hw", "W", "x", w_layout="tile")
    b.transform("h", "hw", "tanh")
    if through is not None:
        b.weights("L", (1, through))
    products = []
    for k in range(n_products):
        if through is None:
            b.weights(f"V{k}", (out, width))
        else:
            b.weights(f"A{k}", (through, width))
            b.linear(f"V{k}", "L", f"A{k}")
        products.append(b.linear(f"p{k}", f"V{k}", "h", w_layout="tile"))
    b.concat("s", *products)
    rows = n * n_products
    edges = rng.integers(0, rows, 7) if edges is None else np.asarray(edges)
    if reader == "sum":
        counts = [3, 1, 3] if counts is None else counts
        b.gather("edges", "s", edges)
        b.reduce("r", "edges", counts, "sum")
    else:
        b.gather("r", "s", edges)
    b.transform("out", "r", "sigmoid")
    return choose_kernels(b.build("out"), Settings(reduce_kernel="sparse_mm"))


def test_two_products_are_one_grid_product_and_the_sum_reads_their_new_rows():
    before = side_by_side(edges=[0, 5, 7, 4, 3, 1, 6])
    assert before.node("r").attrs["kernel"] == "sparse_mm" and before.node("s").op is Op.CONCAT
    after = stack_products(before, SETTINGS)
    s = after.node("s")
    assert s.op is Op.LINEAR and s.count == 8 and s.shape == (2,)
    assert s.attrs == {"kind": "matmul", "w_layout": "tile", "x_layout": "interleave"}
    weights = after.node(s.srcs[0])
    assert weights.op is Op.CONCAT and weights.srcs == ("V0", "V1") and s.srcs[1] == "h"
    # Old row k * 4 + e (product k, row e of h) is new row e * 2 + k.
    assert after.constants[after.node("r").attrs["index"]].tolist() == [0, 3, 7, 1, 6, 2, 5]
    assert not {"p0", "p1"} & set(after.by_name())
    assert_same_function(before, after)


def test_a_gather_reader_is_renumbered_too():
    before = side_by_side("gather", n_products=3, edges=[11, 0, 4, 8, 8])
    after = stack_products(before, SETTINGS)
    assert after.node("s").op is Op.LINEAR and after.node("s").count == 12
    assert after.constants[after.node("r").attrs["index"]].tolist() == [11, 0, 1, 2, 2]
    assert_same_function(before, after)


def test_the_generated_code_is_one_gemm_read_row_major():
    after = stack_products(side_by_side(), SETTINGS)
    source = generate_source(after)
    assert "s = (h @ s_weights.view(4, 3).T).view(8, 2)" in source
    assert "s_weights = torch.stack([w['V00'], w['V10']])" in source
    assert "torch.cat" not in source and "matmul" not in source


def test_not_where_a_product_is_read_elsewhere_or_a_reader_needs_the_row_order():
    program = side_by_side()
    b = Builder()
    b.nodes, b.constants, b.weight_list = dict(program.by_name()), dict(program.constants), list(program.weights)
    b.add("both", "r", "r")
    b.gather("p0_rows", "p0", [0, 0, 1])  # p0 has a second reader
    b.concat("out2", "both", "p0_rows")
    shared = b.build("out2")
    assert stack_products(shared, SETTINGS) is shared
    b = Builder()
    b.nodes, b.constants, b.weight_list = dict(program.by_name()), dict(program.constants), list(program.weights)
    b.transform("t", "s", "tanh")  # reads the rows in their order: cannot be renumbered
    b.gather("out2", "t", [0, 1])
    ordered = b.build("out2")
    assert stack_products(ordered, SETTINGS) is ordered


@st.composite
def stacked_programs(draw):
    n, width, out = draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    k = draw(st.integers(2, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    counts = rng.integers(1, 4, draw(st.integers(1, 5)))
    edges = rng.integers(0, n * k, int(counts.sum()))
    reader = draw(st.sampled_from(["sum", "gather"]))
    if reader == "gather":
        edges = rng.integers(0, n * k, draw(st.integers(1, 8)))
    return side_by_side(reader, k, n, width, out, int(rng.integers(1 << 30)), edges, counts)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=stacked_programs())
def test_random_programs_of_its_shape_keep_their_function(before):
    after = stack_products(before, SETTINGS)
    assert after.node("s").op is Op.LINEAR
    assert_same_function(before, after, tol=1e-9)


def test_sage_last_layer_is_one_gemm(tu_dir):
    """MUTAG's SAGE: the readout's sparse sum reads both products of the hidden rows from one GEMM."""
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir, download=False), hidden=4)
    with_pass, without = build_program(graph, Settings()), build_program(graph, Settings(stack_products=False))
    gemms = lambda program: sum(n.op is Op.LINEAR and n.count > 1 for n in program.nodes)  # noqa: E731
    assert gemms(with_pass) == gemms(without) - 1
    grid = [n for n in with_pass.nodes if n.attrs.get("x_layout") == "interleave"]
    assert len(grid) == 1
    assert_equivalent(graph, neurovec.compile(graph, Settings(), dtype=torch.float64))


@pytest.mark.parametrize("preset", ["default", "unoptimized", "upward-00-free", "upward-17-aggressive"])
def test_sage_like_equals_the_reference(preset):
    graph = sage_like(seed=3)
    if preset == "default":
        assert any(n.attrs.get("x_layout") == "interleave" for n in build_program(graph, preset).nodes)
    assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


def test_sage_stacked_weights_are_one_product(tu_dir):
    """The stacked weights of SAGE's last layer, each the readout's ``lin.weight`` times a layer
    weight, are one product of it with both weights side by side (NOTE: [one product of stacked rows])."""
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir, download=False), hidden=4)
    module = neurovec.compile(graph, Settings(), dtype=torch.float64)
    assert "= w['lin.weight'] @ torch.cat([w['conv2.lin_l.weight'], w['conv2.lin_r.weight']], 1)" \
        "  # (2, 1, 4) as (1, 8)" in module.code, module.code
    assert "torch.stack(" not in module.code
    assert_equivalent(graph, module)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 5), width=st.integers(1, 4), through=st.integers(1, 4), k=st.integers(2, 3),
       seed=st.integers(0, 2**16), reader=st.sampled_from(["sum", "gather"]))
def test_stacked_row_products_are_one_product(n, width, through, k, seed, reader):
    """Weights that are products of one row with several matrices (NOTE: [one product of stacked
    rows]) are one product with the matrices side by side: the same function as each alone."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, n * k, 7 if reader == "sum" else 5)
    before = side_by_side(reader, k, n, width, 1, seed, edges, through=through)
    after = stack_products(before, SETTINGS)
    source = generate_source(after)
    matrices = ", ".join(f"w['A{j}0']" for j in range(k))
    assert f"= w['L0'] @ torch.cat([{matrices}], 1)  " in source, source
    assert "torch.stack(" not in source
    assert_same_function(before, after, tol=1e-9)
