"""Biases added as their one row (compiler/passes/broadcast_adds.py) and single weights out of
their stacks (compiler/passes/unstack_weights.py)."""
import numpy as np
import torch

import neurovec
from neurovec.compiler.ir import Op
from neurovec.compiler.passes.broadcast_adds import broadcast_adds
from neurovec.compiler.passes.unstack_weights import unstack_weights
from neurovec.compiler.settings import Settings
from neurovec.engines.torch_module import CompiledModule

from ..equivalence import assert_equivalent
from .test_dedup import Builder, assert_same_function

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


def test_single_weight_read_by_an_op_that_needs_its_axis():
    """A single weight that a CONCAT reads keeps its leading axis (no row in place)."""
    b = Builder()
    b.weights("A", (2,))
    b.weights("C", (2,))
    b.concat("cat", "A", "C")
    b.fact("x", np.ones((2, 2)))
    b.add("y", "x", "cat")
    b.add("z", "y", "A")                        # A is also read as a bias: still not a row
    program = b.build("z")
    module = CompiledModule(program, torch.float64)
    assert "torch.stack([w['A0']])" in module.code
    assert_same_function(program, program)
