"""A sparse sum plus a row bias as one operator call, ``gather_sum(x, csr, bias)``
(NOTE: [bias in the sparse sum] in engines/torch_module.py)."""
from __future__ import annotations

import contextlib

import pytest
import torch

import neurovec
from neurovec import datasets
from neurovec.benchmarks.tasks import FEATURES, DataCache, make_task
from neurovec.engines import kernels as K
from neurovec.engines import native, ops, runtime, torch_module

from .equivalence import assert_equivalent, outputs_and_grads

F64 = torch.float64
needs_operators = pytest.mark.skipif(not native.available(), reason=f"C++ kernels not built: {native.build_info}")


def csr(with_values: bool, index_dtype=torch.int64) -> runtime.CSRIndices:
    values = [0.5, 1.5, -1.0, 2.0, 0.25] if with_values else None
    gs = K.GatherSum.from_index([0, 2, 2, 1, 0], [2, 3], 3, values, dtype=F64)
    indices = runtime.CSRIndices(gs)
    for name in ("ptr", "index", "t_ptr", "t_col"):
        setattr(indices, name, getattr(indices, name).to(index_dtype))
    return indices


@pytest.mark.parametrize("path", ["operators", "torch"])
@pytest.mark.parametrize("with_values", [False, True])
def test_biased_gather_sum_is_the_sum_plus_the_bias_bitwise(path, with_values):
    """Both paths (the C++ operator, pure torch) give
    exactly ``gather_sum(x) + bias``, and its gradients (second order too)."""
    if path == "operators" and not native.available():
        pytest.skip(f"C++ kernels not built: {native.build_info}")
    mode = {"operators": contextlib.nullcontext, "torch": native.disabled}[path]
    indices = csr(with_values)
    x = torch.randn(3, 4, 2, dtype=F64, requires_grad=True)
    bias = torch.randn(4, 2, dtype=F64, requires_grad=True)
    with mode():
        y = runtime.gather_sum(x, indices, bias)
        assert torch.equal(y, runtime.gather_sum(x, indices) + bias)
        g = torch.randn_like(y)
        fused = torch.autograd.grad(y, (x, bias), g)
        plain = torch.autograd.grad(runtime.gather_sum(x, indices) + bias, (x, bias), g)
        assert all(torch.equal(a, b) for a, b in zip(fused, plain))
        fn = lambda t, b: runtime.gather_sum(t, indices, b)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x, bias))
        assert torch.autograd.gradgradcheck(fn, (x, bias))


@needs_operators
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_values", [False, True])
def test_the_operator_adds_the_bias_in_its_one_node(index_dtype, with_values):
    """One C++ autograd node with x and the bias as inputs; the bias alone may need a gradient."""
    indices = csr(with_values, index_dtype)
    x = torch.randn(3, 2, dtype=F64, requires_grad=True)
    bias = torch.randn(2, dtype=F64, requires_grad=True)
    y = runtime.gather_sum(x, indices, bias)
    assert type(y.grad_fn).__name__ == "CppFunction", type(y.grad_fn)
    assert sum(f is not None for f, _ in y.grad_fn.next_functions) == 2
    (grad_bias,) = torch.autograd.grad(runtime.gather_sum(x.detach(), indices, bias), bias, torch.ones(2, 2, dtype=F64))
    assert torch.equal(grad_bias, torch.full((2,), 2.0, dtype=F64))
    assert torch.autograd.gradcheck(lambda b: runtime.gather_sum(x.detach(), indices, b), (bias,))
    with torch.no_grad():
        assert runtime.gather_sum(x, indices, bias).grad_fn is None


@needs_operators
@pytest.mark.parametrize("with_values", [False, True])
def test_the_traced_sum_adds_the_bias_in_its_one_call(with_values):
    """Under torch.compile the sum and its bias are one ``csr_sum`` call (engines/ops.py): the same
    floats as the separate add, and its gradients."""
    b = csr(with_values)._buffers
    x = torch.randn(3, 4, 2, dtype=F64, requires_grad=True)
    bias = torch.randn(4, 2, dtype=F64, requires_grad=True)

    def traced(t, c):
        return ops._TracedGatherSum.apply(t, b["ptr"], b["index"], b["values"], b["t_ptr"], b["t_col"],
                                          b["t_values"], c)

    assert torch.equal(traced(x, bias), traced(x, None) + bias)
    assert torch.autograd.gradcheck(traced, (x, bias))


@needs_operators
def test_a_bias_of_the_wrong_shape_is_refused():
    with pytest.raises(RuntimeError, match="bias must be one row of the result"):
        runtime.gather_sum(torch.randn(3, 2, dtype=F64), csr(False), torch.randn(3, dtype=F64))


def unfused(graph, preset, dtype=F64):
    """The module as compiled without this fusion (the separate ``+``)."""
    original = torch_module._biased_sums
    torch_module._biased_sums = lambda *args: {}
    try:
        return neurovec.compile(graph, preset, dtype=dtype)
    finally:
        torch_module._biased_sums = original


# gin/continuous pools with a segment_reduce (contiguous segments): its bias stays a separate add.
@pytest.mark.parametrize("model, features", [(m, f) for m in ("gcn", "sage", "gin") for f in FEATURES
                                             if (m, f) != ("gin", "continuous")])
def test_mutag_readout_bias_is_added_by_the_sparse_sum(tu_dir, model, features):
    """MUTAG's readout, the pooled sums plus the output bias, is one ``gather_sum`` call with
    the bias, no separate add; outputs and gradients bitwise those of the separate add
    (float64 and float32), and the reference engine's."""
    graph = make_task(DataCache(tu_dir.parent), "MUTAG", model, features=features).graph
    for dtype in (torch.float32, F64):  # the float64 module last, for the reference
        module, plain = neurovec.compile(graph, "default", dtype=dtype), unfused(graph, "default", dtype)
        statements = [line.split("#")[0] for line in module.code.splitlines()]
        readout = [line for line in statements if "gather_sum(" in line and "bias" in line]
        assert len(readout) == 1 and readout[0].count(",") == 2, module.code
        assert not any(" + " in line for line in statements), module.code
        plain.load_state_dict(module.state_dict())
        (out, grads), (out_plain, grads_plain) = outputs_and_grads(module), outputs_and_grads(plain)
        assert torch.equal(out, out_plain)
        assert all(torch.equal(grads[name], grads_plain[name]) for name in grads)
    assert_equivalent(graph, module)


@pytest.mark.parametrize("preset", neurovec.list_presets())
def test_mutag_gcn_equals_the_reference_every_preset(tu_dir, preset):
    graph = datasets.gcn(datasets.load_tu("MUTAG", tu_dir, download=False), hidden=8)
    assert_equivalent(graph, neurovec.compile(graph, preset, dtype=F64))
