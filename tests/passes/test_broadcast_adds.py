"""Biases added as their one row (compiler/passes/broadcast_adds.py) and single weights out of
their stacks (compiler/passes/unstack_weights.py)."""
import numpy as np
import torch

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.broadcast_adds import broadcast_adds, merge_row_adds
from neurovec.compiler.passes.unstack_weights import unstack_weights
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule

from ..equivalence import assert_equivalent
from ..builders import Builder, assert_same_function
from .test_fuse_fact_products import two_products

SETTINGS = Settings()


def biased(times=4):
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 8).reshape(4, 2))
    b.transform("h", "x", "tanh")
    b.weights("B", (2,), k=2)
    b._add("b1", Op.SLICE, ("B",), 1, (2,), start=1, stop=2, step=1)
    b._add("rep", Op.TILE, ("b1",), times, (2,), times=times)
    b.add("y", "h", "rep")
    return b.build("y")


def test_repeated_bias_is_broadcast():
    before = biased()
    after = broadcast_adds(before, SETTINGS)
    assert after.node("y").srcs == ("h", "b1") and "rep" not in after.by_name()
    assert_same_function(before, after)


def test_single_weight_leaves_its_stack():
    before = biased()
    after = unstack_weights(before, SETTINGS)
    b1 = after.node("b1")
    assert b1.op is Op.WEIGHTS and b1.attrs["names"] == ("B1",) and "B" not in after.by_name()
    assert_same_function(before, after)


def test_generated_code_uses_weights_in_place(tu_dir):
    from neurovec.datasets import gcn, load_tu
    graph = gcn(load_tu("MUTAG", tu_dir), hidden=4)
    module = neurovec.compile(graph, dtype=torch.float64)
    assert "torch.stack" not in module.code and ".repeat(" not in module.code
    assert "torch.addmm(w['conv1.bias'], " in module.code and "w['conv1.lin.weight'].T" in module.code
    assert_equivalent(graph, module)


def test_single_weights_stacked_by_a_concat():
    """Single weights that a CONCAT reads are stacked as rows (no ``torch.stack([w])`` each, then a cat)."""
    b = Builder()
    b.weights("A", (2,))
    b.weights("C", (2,))
    b.concat("cat", "A", "C")
    b.fact("x", np.ones((2, 2)))
    b.add("y", "x", "cat")
    b.add("z", "y", "A")                        # A is also read as a bias: still not a row
    program = b.build("z")
    module = CompiledModule(program, torch.float64)
    assert "cat = torch.stack([w['A0'], w['C0']])" in module.code and "torch.cat" not in module.code
    assert "z = y + w['A0']" in module.code
    assert_same_function(program, program)


def two_row_additions(inverse=False):
    """y = tanh(x) + V c + d (V a (2, 3) weight, c (3,), d (2,): a bias moved past a linear map,
    then another bias), read by a sigmoid (or an inverse)."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 8).reshape(4, 2))
    b.transform("h", "x", "tanh")
    b.weights("V", (2, 3))
    b.weights("c", (3,))
    b.weights("d", (2,))
    b.linear("Vc", "V", "c")
    b.add("hv", "h", "Vc")
    b.add("y", "hv", "d")
    b.transform("out", "y", "inverse" if inverse else "sigmoid")
    return b.build("out")


def test_two_row_additions_are_one():
    before = two_row_additions()
    after = merge_row_adds(before, SETTINGS)
    y = after.node("y")
    row = after.node(y.srcs[1])
    assert y.srcs[0] == "h" and row.op is Op.ADD and row.count == 1 and row.srcs == ("Vc", "d")
    assert "hv" not in after.by_name()
    assert_same_function(before, after)
    code = CompiledModule(after).code
    assert "torch.addmv(w['d0'], w['V0'], w['c0'])" in code and code.count(" + ") == 1
    # An inverse can tell the zero addmv may give from the sum's (NOTE: [bias in the GEMM]).
    assert "addmv" not in CompiledModule(merge_row_adds(two_row_additions(inverse=True), SETTINGS)).code


def test_merged_row_additions_equal_the_reference_under_every_preset():
    """Sums of relu(x W + b) V over two nodes, plus c, averaged per sample, plus d: the sum and
    the mean are composed, c moves past the mean and then meets d."""
    rng = np.random.default_rng(0)
    b = neurovec.GraphBuilder()
    x = b.facts("x", rng.normal(size=(6, 3)))
    W, bias = b.weight("W", rng.normal(size=(2, 3))), b.weight("b", rng.normal(size=2))
    V, c = b.weight("V", rng.normal(size=(1, 2))), b.weight("c", rng.normal(size=1))
    h, mid = b.layer("h", transformation="relu"), b.layer("mid")
    out = b.layer("out", aggregation="mean", transformation="sigmoid")
    hs = [h.neuron([(x[i], W)], bias=bias) for i in range(6)]
    mids = [mid.neuron([(hs[(i + k) % 6], V) for k in range(1 + i % 3)], bias=c) for i in range(6)]
    d = b.weight("d", rng.normal(size=1))
    b.output(out.neuron(mids[:2], bias=d), out.neuron(mids[2:], bias=d), out.neuron(mids[:2], bias=d))
    graph = b.build()
    assert "w['c'] + w['d']" in neurovec.compile(graph).code
    for preset in neurovec.list_presets():
        assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


def sum_plus_product_plus_bias():
    """y = (a + h @ V.T) + b: a a value of the rows, b a one-row bias."""
    b = Builder()
    b.fact("x", np.linspace(-1, 1, 12).reshape(4, 3))
    b.transform("a", "x", "tanh")
    b.transform("h", "x", "sigmoid")
    b.weights("V", (3, 3))
    b.linear("hv", "V", "h", w_layout="tile")
    b.add("s", "a", "hv")
    b.weights("B", (3,))
    b.add("y", "s", "B")
    return b.build("y")


def test_a_bias_after_a_sum_goes_to_its_product_term():
    """(a + h V) + b is a + (h V + b): the inner one is torch.addmm (GraphSAGE's own-node product)."""
    before = sum_plus_product_plus_bias()
    after = merge_row_adds(before, SETTINGS)
    y = after.node("y")
    inner = after.node(y.srcs[1])
    assert y.srcs[0] == "a" and inner.op is Op.ADD and inner.srcs == ("hv", "B") and "s" not in after.by_name()
    assert_same_function(before, after)
    assert "torch.addmm(" in CompiledModule(after).code


def test_a_bias_stays_outside_what_fuse_fact_products_takes():
    """Over static facts the sum is left for fuse_fact_products (one addmm with the bias); over a
    dynamic fact it never is, so the bias goes to a product term as anywhere else
    (``ir.fact_product_sides``, the one test of that form)."""
    before = two_products(bias=True)
    assert merge_row_adds(before, SETTINGS) is before
    before = two_products(dynamic=("x",), bias=True)
    after = merge_row_adds(before, SETTINGS)
    assert after.node(after.node("y").srcs[1]).srcs == ("bm", "C")
    assert_same_function(before, after)
