"""engines/relation_ops.py: the fused gather -> chunked GEMM -> sum of many relation types, against its torch
ops (float64, outputs and gradients, 1, 2 and 4 threads), and against a compiled RGCN's own product and sum."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neurovec.engines import relation_ops

pytestmark = pytest.mark.skipif(relation_ops.kernel() is None, reason="the relation_ops kernel could not be built")


def _problem(seed: int, k=5, chunk=7, n_x=30, n_out=11, i=6, o=3, values=True, dtype=torch.float64):
    """Random rows, weights, and a transposed CSR in which some product rows (padding) are read by no output and
    others by several."""
    rng = np.random.default_rng(seed)
    rows = k * chunk
    reads = rng.integers(0, 3, size=rows)   # 0: a padded row nobody reads
    t_ptr = np.concatenate([[0], np.cumsum(reads)])
    t_col = rng.integers(0, n_out, size=int(t_ptr[-1]))
    x = torch.tensor(rng.normal(size=(n_x, i)), dtype=dtype, requires_grad=True)
    w = torch.tensor(rng.normal(size=(k, o, i)), dtype=dtype, requires_grad=True)
    t_values = torch.tensor(rng.normal(size=t_col.size), dtype=dtype) if values else None
    return (x, w, torch.from_numpy(rng.integers(0, n_x, size=rows)), torch.from_numpy(t_ptr),
            torch.from_numpy(t_col), t_values, n_out)


def _value_and_grads(function, args, seed=0):
    x, w = args[0], args[1]
    out = function(*args)
    weights = torch.tensor(np.random.default_rng(seed + 1).normal(size=tuple(out.shape)), dtype=out.dtype)
    gx, gw = torch.autograd.grad((out * weights).sum(), [x, w])
    return out.detach(), gx, gw


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("values", [False, True])
def test_the_kernel_gives_the_torch_ops_value_and_gradients(threads, values):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for seed in range(3):
            args = _problem(seed, values=values)
            for expected, found in zip(_value_and_grads(relation_ops.segment_product_sum_torch, args, seed),
                                       _value_and_grads(relation_ops.segment_product_sum, args, seed)):
                torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
    finally:
        torch.set_num_threads(before)


def test_float32_and_a_constant_input():
    """float32 to its rounding; an input without a gradient (an RGCN's first layer) gets none."""
    x, w, *rest = _problem(4, dtype=torch.float32)
    x = x.detach()
    out = relation_ops.segment_product_sum(x, w, *rest)
    expected = relation_ops.segment_product_sum_torch(x, w, *rest)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    (gw,) = torch.autograd.grad(out.sum(), [w])
    (expected_gw,) = torch.autograd.grad(expected.sum(), [w])
    torch.testing.assert_close(gw, expected_gw, rtol=1e-5, atol=1e-5)


def test_the_kernel_refuses_a_second_derivative_and_the_torch_ops_give_it():
    args = _problem(5)
    out = relation_ops.segment_product_sum(*args)
    (gx,) = torch.autograd.grad(out.pow(2).sum(), [args[0]], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate"):
        gx.sum().backward()
    x, w = args[0], args[1]
    assert torch.autograd.gradcheck(lambda x_, w_: relation_ops.segment_product_sum_torch(x_, w_, *args[2:]),
                                    (x, w))
    assert torch.autograd.gradgradcheck(lambda x_, w_: relation_ops.segment_product_sum_torch(x_, w_, *args[2:]),
                                        (x, w))


def test_bad_indices_are_refused_with_a_message():
    x, w, idx, t_ptr, t_col, t_values, n_out = _problem(6)
    with pytest.raises(RuntimeError, match="int64"):
        relation_ops.kernel().segment_product_sum(x.detach(), w.detach(), idx.int(), t_ptr, t_col, t_values, n_out)
    with pytest.raises(RuntimeError, match="C rows per weight"):
        relation_ops.kernel().segment_product_sum(x.detach(), w.detach(), idx[:-1], t_ptr[:-1], t_col, t_values,
                                                  n_out)


def test_an_rgcn_layer_in_relation_products_chunks():
    """An RGCN layer (a weight per relation, the mean over each relation's neighbours) laid out as
    ``compiler/passes/relation_products.py`` chunks it (rows grouped by weight, chunks of one size, the last of a
    weight padded with rows nobody reads): the fused call gives the per-edge sum, float64."""
    from neurovec.compiler.passes.relation_products import chunk_plan

    rng = np.random.default_rng(0)
    n, n_rel, n_edges, i, o = 50, 9, 400, 4, 3
    src, dst = rng.integers(0, n, n_edges), rng.integers(0, n, n_edges)
    rel = np.minimum(rng.zipf(1.6, n_edges) - 1, n_rel - 1)   # skewed relation sizes
    degree = np.zeros((n, n_rel))
    np.add.at(degree, (dst, rel), 1)
    scale = 1 / degree[dst, rel]
    x = torch.tensor(rng.normal(size=(n, i)), requires_grad=True)
    weights = torch.tensor(rng.normal(size=(n_rel, o, i)), requires_grad=True)
    expected = torch.zeros(n, o, dtype=torch.float64).index_add(
        0, torch.from_numpy(dst), torch.from_numpy(scale).unsqueeze(1) *
        torch.bmm(weights[torch.from_numpy(rel)], x[torch.from_numpy(src)].unsqueeze(2)).squeeze(2))
    plan = chunk_plan(rel, src, chunk_rows=4)
    assert plan.rows > n_edges   # padded
    reader = np.full(plan.rows, -1)
    reader[plan.position] = np.arange(n_edges)   # the edge on each new row (-1: padding)
    read = reader >= 0
    t_ptr = torch.from_numpy(np.concatenate([[0], np.cumsum(read)]))
    t_col, t_values = torch.from_numpy(dst[reader[read]]), torch.from_numpy(scale[reader[read]])
    found = relation_ops.segment_product_sum(x, weights[torch.from_numpy(plan.w_index)],
                                             torch.from_numpy(plan.x_index), t_ptr, t_col, t_values, n)
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(found.sum(), [x, weights]), torch.autograd.grad(expected.sum(), [x, weights])):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_compiled_rgcn_with_its_layers_fused_gives_its_outputs_and_gradients():
    """benchmarks/relation_ops.py's rewrite of a compiled two-layer RGCN (what the code generator would write): the
    chunked layers as fused calls give the program's outputs and every weight's gradient, float64."""
    import neurovec
    from neurovec import Settings
    from neurovec.benchmarks.relation_ops import _forward, fuse_source
    from neurovec.datasets import kg as kgmod
    from neurovec.datasets import rgcn

    data = kgmod.synthetic_hetero(n_nodes=400, n_edges=4000, n_relations=12, n_features=5, n_classes=3, seed=0)
    spec = rgcn.RGCNSpec.create(5, 12, [6, 3])
    module = neurovec.compile(rgcn.rgcn(data.x, data.edge_index, data.edge_type, spec, seed=0),
                              Settings.preset("default"), dtype=torch.float64)
    source, fused = fuse_source(module.code, module)
    assert fused == 2 and source.count("chunked_product_sum(") == 2 and "torch.bmm" not in source
    forward = _forward(source)
    params = list(module.parameters())
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):   # the kernel at one thread, the same three statements at two (MAX_THREADS)
            torch.set_num_threads(threads)
            expected, found = module(), forward(module)
            torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
            weights = torch.tensor(np.random.default_rng(1).normal(size=tuple(expected.shape)))
            for a, b in zip(torch.autograd.grad((found * weights).sum(), params),
                            torch.autograd.grad((expected * weights).sum(), params)):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    finally:
        torch.set_num_threads(before)
