"""compiler/passes/relation_products.py: per-relation products as one chunked, segmented product, one
batched GEMM (``torch.bmm``) in the generated code."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import Settings
from neurovec.compiler import pipeline
from neurovec.compiler.ir import Op
from neurovec.compiler.passes import relation_products as rp
from neurovec.compiler.vectorizer import vectorize
from neurovec.datasets import kg as kgmod
from neurovec.datasets import rgcn
from neurovec.engines.reference import ReferenceModule
from neurovec.engines.torch_module import CompiledModule


def build(graph, settings: Settings, with_pass: bool = True):
    """The pipeline's program with the ``relation_products`` switch on (or off, ``with_pass=False``)."""
    settings = settings.model_copy(update={"relation_products": with_pass})
    program = vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts))
    for name, enabled, run in pipeline.PIPELINE:
        if enabled(settings):
            program = run(program, settings)
            if settings.verify:
                program.verify()
    return program


def test_default_runs_the_pass_after_upward_and_unoptimized_does_not():
    names = [name for name, *_ in pipeline.PIPELINE]
    assert names.index("relation_products") == names.index("upward") + 1
    assert Settings().relation_products and not Settings.preset("unoptimized").relation_products
    data = kgmod.synthetic_hetero(300, 3000, 12, n_features=4, n_classes=3, seed=5)
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, rgcn.RGCNSpec.create(4, 12, hidden=[5]), seed=1)
    module = neurovec.compile(graph, dtype=torch.float64)
    # small layers run torch.bmm; from 2**20 input values the engine's chunked_product does the same products
    assert ("torch.bmm(" in module.code or "chunked_product(" in module.code) \
        and module.code.count("w['conv1.weight.3']") == 1


@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=30), seed=st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_chunk_plan_places_every_row(sizes, seed):
    rng = np.random.default_rng(seed)
    weight = rng.permutation(np.repeat(np.arange(len(sizes)) * 3, sizes))  # weights need not be consecutive
    x_index = rng.integers(0, 1000, weight.size)
    plan = rp.chunk_plan(weight, x_index)
    assert plan.rows == plan.chunks * plan.size
    assert np.unique(plan.position).size == weight.size and plan.position.max() < plan.rows
    np.testing.assert_array_equal(plan.x_index[plan.position], x_index)           # each row reads its value
    np.testing.assert_array_equal(plan.w_index[plan.position // plan.size], weight)  # ... through its weight
    # Padding rows repeat a row of their own chunk's weight group: a valid read, never an out-of-range one.
    assert plan.rows - weight.size < len(sizes) * plan.size


def test_chunk_size_choice():
    assert rp.chunk_size(np.array([1000] * 10 + [3000])) == 1000  # equal relations: their size
    assert rp.chunk_size(np.array([5000] * 4)) == 5000
    rng = np.random.default_rng(0)
    for sizes in ([2, 6, 10, 400, 700, 1000], rng.integers(1, 2000, 40), rng.zipf(1.5, 30).clip(1, 3000)):
        sizes = np.asarray(sizes)
        cost = lambda c: int((-(-sizes // c) * (c + rp.CHUNK_ROWS)).sum())  # noqa: E731
        assert cost(rp.chunk_size(sizes)) == min(cost(c) for c in range(1, int(sizes.max()) + 1))


@pytest.mark.parametrize("options, preset", [({}, "default"), ({}, "unoptimized"), ({"num_bases": 10}, "default"),
                                             ({"root_weight": False}, "default")])
def test_exact_and_segmented(options, preset):
    data = kgmod.synthetic_hetero(300, 3000, 12, n_features=4, n_classes=3, seed=5)
    spec = rgcn.RGCNSpec.create(4, 12, hidden=[5, 3], **options)
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, spec, seed=1)
    program = build(graph, Settings.preset(preset))
    segmented = [n for n in program.nodes if n.op is Op.LINEAR and n.attrs.get("w_layout") == "interleave"]
    assert len(segmented) == 2, str(program)  # one segmented product per convolution, whatever the relations
    if preset == "default" and "num_bases" not in options:
        # The first layer's inputs are facts: its gathered rows are folded (NOTE: [folded product rows]).
        assert program.node(segmented[0].srcs[1]).op is Op.FACT, str(program)
    module = CompiledModule(program, torch.float64)
    reference = ReferenceModule(graph, torch.float64)
    out, expected = module(), reference()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for name, param in reference.weights.named_parameters():
        torch.testing.assert_close(module.weights[name].grad, param.grad, rtol=1e-12, atol=1e-12, msg=name)
    # No statement per relation: the relation weights appear once, in the stack the chunks gather from.
    assert module.code.count("w['conv1.weight.3']") == 1
    if preset == "default":
        assert module.code.count("torch.stack") <= 3


def test_dynamic_facts_and_skewed_relations(kg_dir):
    """Kinship's relation counts range from 2 to 1004 triples: the chunks are cut to fit, the embeddings stay
    replaceable, and the result equals the reference engine's."""
    kinship = kgmod.load_kg("kinships", data_dir=kg_dir)
    graph = rgcn.rgcn_encoder(kinship, hidden=4, layers=1, seed=0)
    settings = Settings.preset("default", dynamic_facts=("x",))
    plain, chunked = build(graph, settings, with_pass=False), build(graph, settings)
    rows = {p: sum(n.count for n in prog.nodes if n.op is Op.LINEAR) for p, prog in (("plain", plain),
                                                                                  ("chunked", chunked))}
    chunks = [plain.node(n.srcs[0]).count for n in plain.nodes if n.op is Op.LINEAR]
    new_chunks = [chunked.node(n.srcs[0]).count for n in chunked.nodes if n.op is Op.LINEAR]
    assert new_chunks[0] < chunks[0] / 10, (chunks, new_chunks, rows)  # far fewer, longer chunks
    x = torch.randn(kinship.n_entities, 4, dtype=torch.float64, requires_grad=True)
    module = CompiledModule(chunked, torch.float64)
    reference = ReferenceModule(graph, torch.float64)
    out, expected = module(facts={"x": x}), reference(facts={"x": x})
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    grad, = torch.autograd.grad(out.sum(), x)
    expected_grad, = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)


def test_few_weights_are_left_alone():
    data = kgmod.synthetic_hetero(200, 1500, 3, n_features=4, seed=6)
    spec = rgcn.RGCNSpec.create(4, 3, hidden=[5])
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, spec)
    settings = Settings()
    assert str(build(graph, settings)) == str(build(graph, settings, with_pass=False))
