"""sparse_facts: products of sparse static fact matrices by a weight as sparse sums of its columns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec.compiler.ir import Node, Op, Program
from neurovec.compiler.passes.sparse_facts import MIN_WORK, WIDE, fact_csr, sparse_facts
from neurovec.compiler.pipeline import build_program, enabled_passes
from neurovec.compiler.settings import Settings
from neurovec.datasets import gcn, gin, sage
from neurovec.datasets.nodes import NodeDataset
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import Weight

from ..equivalence import assert_equivalent, outputs_and_grads

TEMPLATES = {"gcn": gcn, "sage": sage, "gin": gin}
NO_DEDUP = Settings(dedup_facts=False, iso_compression=False, dedup_linear=False, dedup_aggregations=False)


def node_dataset(n=150, features=250, density=0.01, seed=0, values="binary", empty_rows=3, empty_cols=4):
    """A random graph (in-degree 1 on average) whose features are sparse, with some all-zero rows and
    columns: aggregated over a node and its neighbours, they stay under 10% nonzero."""
    rng = np.random.default_rng(seed)
    x = (rng.random((n, features)) < density).astype(np.float64)
    if values == "real":
        x *= rng.normal(size=x.shape)
    elif values == "zero":
        x[:] = 0.0
    x[:empty_rows] = 0.0
    x[:, features - empty_cols:] = 0.0
    edges = rng.integers(0, n, size=(2, n))
    edges = edges[:, edges[0] != edges[1]]
    return NodeDataset("sparse", x, edges, rng.integers(0, 3, n), num_classes=3)


def transposes(program: Program) -> list[Node]:
    return [n for n in program.nodes if n.op is Op.TRANSPOSE]


@pytest.mark.parametrize("model", TEMPLATES)
def test_sparse_first_layer_becomes_a_sparse_sum(model):
    graph = TEMPLATES[model](node_dataset())
    program = build_program(graph, "default")
    columns = transposes(program)
    assert len(columns) == (2 if model == "sage" else 1)  # SAGE: the node's own features and their mean
    for column in columns:  # read by a sparse sum, or (SAGE's side-by-side product) stacked for one
        (reader,) = [n for n in program.nodes if column.name in n.srcs]
        if reader.op is Op.CONCAT:
            (reader,) = [n for n in program.nodes if reader.name in n.srcs]
        assert reader.op is Op.REDUCE and "index" in reader.attrs
    assert not any(n.op is Op.LINEAR and program.node(n.srcs[1]).op is Op.FACT for n in program.nodes)
    # Without the pass (its switch off, or the unoptimized preset) the product stays a GEMM.
    assert not transposes(build_program(graph, Settings(sparse_fact_density=0.0)))
    assert not transposes(build_program(graph, "unoptimized"))
    assert "sparse_facts" in enabled_passes(Settings()) and "sparse_facts" not in enabled_passes(
        Settings.preset("unoptimized"))


def test_dense_facts_and_dynamic_facts_stay_products():
    assert not transposes(build_program(gcn(node_dataset(density=0.6, empty_rows=0, empty_cols=0)), "default"))
    graph = gcn(node_dataset())
    assert not transposes(build_program(graph, Settings(dynamic_facts=("x",))))


def test_wider_products_need_sparser_facts():
    ds = node_dataset(n=600, features=40, density=0.06, empty_rows=0, empty_cols=0)
    ds = NodeDataset("sparse", ds.x, np.zeros((2, 0), dtype=np.int64), ds.y, num_classes=3)  # A X = X
    density = np.count_nonzero(ds.x) / ds.x.size
    assert WIDE * 0.1 / 64 < density < 0.1
    assert transposes(build_program(gin(ds, hidden=WIDE), Settings(dedup_facts=False)))
    assert not transposes(build_program(gin(ds, hidden=64), Settings(dedup_facts=False)))  # 0.1 * 32 / 64


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("values", ["binary", "real", "zero"])
@pytest.mark.parametrize("model", TEMPLATES)
def test_equals_the_reference(model, values, threads):
    """Empty rows and columns, real values, an all-zero matrix: outputs and every weight gradient."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        graph = TEMPLATES[model](node_dataset(values=values, seed=threads))
        # All-zero rows are one distinct row to deduplication: without it the zero matrix stays whole.
        options = NO_DEDUP if values == "zero" else "default"
        module = neurovec.compile(graph, options, torch.float64)
        assert transposes(module.program)
        assert_equivalent(graph, module)
    finally:
        torch.set_num_threads(before)


def test_small_products_stay_gemms():
    graph = gcn(node_dataset(n=40, features=60, density=0.02))  # 40 x 60 x 16 < MIN_WORK
    assert 40 * 60 * 16 < MIN_WORK and not transposes(build_program(graph, "default"))


def test_fact_csr_pads_empty_rows():
    matrix = np.array([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, -3.0], [0.0, 0.0, 0.0]])
    counts, cols, values = fact_csr(matrix)
    assert counts.tolist() == [1, 1, 2, 1]
    assert cols.tolist() == [1, 0, 0, 2, 0] and values.tolist() == [2.0, 0.0, 1.0, -3.0, 0.0]
    counts, cols, values = fact_csr(np.zeros((3, 2)))
    assert counts.tolist() == [1, 1, 1] and not values.any()


def _side_by_side_program(fa: np.ndarray, fb: np.ndarray) -> Program:
    """``%s = ADD(LINEAR(Wa, Fa), LINEAR(Wb, Fb))`` marked side by side, as fuse_fact_products leaves it."""
    rng = np.random.default_rng(3)
    n, o = fa.shape[0], 8
    weights = (Weight("a", rng.normal(size=(o, fa.shape[1])), True), Weight("b", rng.normal(size=(o, fb.shape[1])), True))
    nodes = (
        Node("wa", Op.WEIGHTS, (), 1, (o, fa.shape[1]), {"names": ("a",)}),
        Node("wb", Op.WEIGHTS, (), 1, (o, fb.shape[1]), {"names": ("b",)}),
        Node("fa", Op.FACT, (), n, (fa.shape[1],), {"const": "fa", "fact_layer": None}),
        Node("fb", Op.FACT, (), n, (fb.shape[1],), {"const": "fb", "fact_layer": None}),
        Node("pa", Op.LINEAR, ("wa", "fa"), n, (o,), {"kind": "matmul", "w_layout": "tile", "x_layout": "full"}),
        Node("pb", Op.LINEAR, ("wb", "fb"), n, (o,), {"kind": "matmul", "w_layout": "tile", "x_layout": "full"}),
        Node("s", Op.ADD, ("pa", "pb"), n, (o,), {"hcat": "hcat", "hcat_weights": ("wa", "wb")}),
    )
    return Program(nodes, {"fa": fa, "fb": fb, "hcat": np.hstack([fa, fb])}, weights, "s")


def test_side_by_side_product_is_one_sparse_sum():
    rng = np.random.default_rng(0)
    fa = (rng.random((400, 200)) < 0.03) * rng.normal(size=(400, 200))
    fb = (rng.random((400, 100)) < 0.03) * 1.0
    program = _side_by_side_program(fa, fb)
    program.verify()
    rewritten = sparse_facts(program, Settings())
    rewritten.verify()
    assert [n.op for n in rewritten.nodes if n.name not in ("wa", "wb")] == \
        [Op.TRANSPOSE, Op.TRANSPOSE, Op.CONCAT, Op.REDUCE]
    expected = outputs_and_grads(CompiledModule(program, torch.float64))
    actual = outputs_and_grads(CompiledModule(rewritten, torch.float64))
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-12, atol=1e-12)
    for name in expected[1]:
        torch.testing.assert_close(actual[1][name], expected[1][name], rtol=1e-12, atol=1e-12)
    dense = _side_by_side_program(rng.normal(size=(400, 200)), fb)
    assert sparse_facts(dense, Settings()) is dense


def _projected(module: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outputs, and the weight gradients of one fixed projection of them (the same in every dtype)."""
    out = module()
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    names = [name for name, p in module.named_parameters()]
    grads = torch.autograd.grad((out * projection.to(out.dtype)).sum(), [p for _, p in module.named_parameters()])
    return out.detach().double(), {name: g.double() for name, g in zip(names, grads)}


@pytest.mark.parametrize("model", TEMPLATES)
def test_float16_is_as_close_as_the_gemm(model):
    """In float16 (where the reassociating passes are off) the sparse sum stays as close to float64 as
    the dense GEMM does: each output is a sum of the same few products."""
    graph = TEMPLATES[model](node_dataset())
    exact = _projected(neurovec.compile(graph, "default", torch.float64))
    half = neurovec.compile(graph, "default", torch.float16)
    assert transposes(half.program)
    errors = {}
    for name, module in (("sparse", half), ("gemm", neurovec.compile(graph, Settings(sparse_fact_density=0.0),
                                                                       torch.float16))):
        out, grads = _projected(module)
        errors[name] = max([(out - exact[0]).abs().max().item()]
                           + [((grads[k] - exact[1][k]).abs().max() / exact[1][k].abs().max()).item() for k in grads])
    assert errors["sparse"] <= 2 * errors["gemm"] + 1e-3, errors


@pytest.mark.parametrize("model", TEMPLATES)
def test_cora_templates(planetoid_dir, model):
    """Cora's first layer is a sparse sum, with the numbers of the dense GEMM (float64)."""
    from neurovec.datasets.planetoid import load_planetoid

    graph = TEMPLATES[model](load_planetoid("Cora", planetoid_dir, download=False))
    sparse = neurovec.compile(graph, "default", torch.float64)
    dense = neurovec.compile(graph, Settings(sparse_fact_density=0.0), torch.float64)
    assert len(transposes(sparse.program)) == (2 if model == "sage" else 1) and not transposes(dense.program)
    out, grads = outputs_and_grads(sparse)
    out_dense, grads_dense = outputs_and_grads(dense)
    torch.testing.assert_close(out, out_dense, rtol=1e-9, atol=1e-9)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_dense[name], rtol=1e-9, atol=1e-9)
