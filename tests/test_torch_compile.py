"""The emitted modules under ``torch.compile``: same outputs and gradients as eager.

The generated ``forward`` is an exec'd function registered with ``linecache``;
its weights come from ``self.weights[name]`` on the ``WeightStore`` module and
its reductions are neurovec's kernels. While dynamo traces, the kernels call the
``torch.ops.neurovec`` custom ops (``engines/ops.py``: fake implementations and
registered autograd), so every preset compiles with ``fullgraph=True``, max / min
layers included, with the C++ kernels on or off.

Every compiled program is a class of its own whose ``forward`` is the generated
code (``engines/torch_module.py``, NOTE: [A class per program]): dynamo caches
compiled code per code object, so each module is compiled once, and many
modules in one process never share a cache entry or its recompile limit.

The quick tests use the ``aot_eager`` backend (dynamo + AOTAutograd, no code
generation: seconds); the inductor test (C++ code generation, ~30-60 s cold) is
marked ``slow``. A tiny GCN (4 MUTAG graphs) keeps tracing fast.
"""
from __future__ import annotations

import dataclasses
import functools
import shutil

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import neurovec
from neurovec import datasets
from neurovec.compiler.settings import list_presets
from neurovec.engines import native

PRESETS = ["default", "upward-17-aggressive"]


@functools.lru_cache(maxsize=None)
def _backend_problem(backend: str) -> str | None:
    """Why ``torch.compile(backend=...)`` cannot run here (None: it can), from a trivial function."""
    if backend == "inductor" and not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        return "no C++ compiler on PATH (inductor's CPU backend needs one)"
    try:
        compiled = torch.compile(lambda x: torch.sin(x) * 2, backend=backend, fullgraph=True)
        x = torch.linspace(0, 1, 8)
        if not torch.allclose(compiled(x), torch.sin(x) * 2):
            return f"torch.compile(backend={backend!r}) computes a wrong trivial function"
    except Exception as error:  # noqa: BLE001 - any failure means: no toolchain here
        return f"torch.compile(backend={backend!r}) fails on a trivial function: {type(error).__name__}: {error}"
    finally:
        torch._dynamo.reset()
    return None


def _require(backend: str) -> None:
    problem = _backend_problem(backend)
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def tiny_gcn(tu_dir):
    ds = datasets.load_tu("MUTAG", tu_dir)
    return datasets.gcn(ds, hidden=8, layers=2, samples=[0, 1, 2, 3])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Compiled code is cached per code object; every test starts (and leaves) a clean cache.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tiny_max_min(tu_dir):
    """GraphSAGE on 4 MUTAG graphs whose first neighbourhood aggregation is a max and readout a min."""
    ds = datasets.load_tu("MUTAG", tu_dir)
    graph = datasets.sage(ds, hidden=8, layers=2, samples=[0, 1, 2, 3])
    swap = {"conv1.mean": "max", "pool": "min"}
    layers = [dataclasses.replace(layer, aggregation=swap[layer.name]) if getattr(layer, "name", None) in swap
              else layer for layer in graph.layers]
    return dataclasses.replace(graph, layers=layers)


def _outputs_and_grads(module: torch.nn.Module, call=None):
    call = module if call is None else call
    out = call()
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * projection).sum(), params)
    return out.detach(), grads


def _assert_same(eager: torch.nn.Module, compiled_call, module: torch.nn.Module, tol: float = 1e-12) -> None:
    out_e, grads_e = _outputs_and_grads(eager)
    out_c, grads_c = _outputs_and_grads(module, compiled_call)
    torch.testing.assert_close(out_c, out_e, rtol=tol, atol=tol)
    for g_c, g_e in zip(grads_c, grads_e):
        torch.testing.assert_close(g_c, g_e, rtol=tol, atol=tol)


def _sgd_step(module: torch.nn.Module, call) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.grad = None
    call().pow(2).mean().backward()
    with torch.no_grad():
        for p in module.parameters():
            p -= 0.1 * p.grad


def _matches_and_trains_without_recompiling(eager: torch.nn.Module, module: torch.nn.Module, call) -> None:
    """``call`` (compiled ``module``) equals ``eager``; after an SGD step on both, which changes the
    weights in place, it still does, without being traced again."""
    _assert_same(eager, call, module)
    _sgd_step(eager, eager)
    with torch._dynamo.config.patch(error_on_recompile=True):
        _sgd_step(module, call)
        _assert_same(eager, call, module)


@pytest.mark.parametrize("how", ["torch.compile", "module.compile"])
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_module_matches_eager(tiny_gcn, preset, how):
    _require("aot_eager")
    eager = neurovec.compile(tiny_gcn, preset, torch.float64)
    module = neurovec.compile(tiny_gcn, preset, torch.float64)
    if how == "torch.compile":
        call = torch.compile(module, backend="aot_eager")
    else:
        module.compile(backend="aot_eager")
        call = module
    _matches_and_trains_without_recompiling(eager, module, call)


def test_fullgraph_without_sparse_kernels(tiny_gcn):
    # CSR segment kernels on small inputs (no spmm): one graph, no breaks.
    _require("aot_eager")
    settings = neurovec.Settings(reduce_kernel="segment")
    eager = neurovec.compile(tiny_gcn, settings, torch.float64)
    module = neurovec.compile(tiny_gcn, settings, torch.float64)
    _assert_same(eager, torch.compile(module, backend="aot_eager", fullgraph=True), module)


def test_fullgraph_with_sparse_mm(tiny_gcn):
    """Under compilation the sparse kernels switch to dense equivalents, so the graph stays whole."""
    _require("aot_eager")
    settings = neurovec.Settings(reduce_kernel="sparse_mm")
    eager = neurovec.compile(tiny_gcn, settings, torch.float64)
    module = neurovec.compile(tiny_gcn, settings, torch.float64)
    assert "gather_sum(" in module.code
    _assert_same(eager, torch.compile(module, backend="aot_eager", fullgraph=True), module)


@pytest.mark.parametrize("preset", list_presets())
def test_fullgraph_with_max_min_every_preset(tiny_max_min, preset):
    """Segment max / min (and every other kernel a preset picks) trace as one graph."""
    _require("aot_eager")
    eager = neurovec.compile(tiny_max_min, preset, torch.float64)
    module = neurovec.compile(tiny_max_min, preset, torch.float64)
    _assert_same(eager, torch.compile(module, backend="aot_eager", fullgraph=True), module)


@pytest.mark.parametrize("kernel", ["auto", "segment", "sparse_mm"])
def test_fullgraph_without_native_kernels(tiny_max_min, kernel, monkeypatch):
    """With the C++ kernels off, the registered ops run their torch fallbacks inside the graph."""
    _require("aot_eager")
    monkeypatch.setattr(native, "_enabled", False)
    settings = neurovec.Settings(reduce_kernel=kernel)
    eager = neurovec.compile(tiny_max_min, settings, torch.float64)
    module = neurovec.compile(tiny_max_min, settings, torch.float64)
    _assert_same(eager, torch.compile(module, backend="aot_eager", fullgraph=True), module)


def test_dynamic_facts_under_compile(tiny_gcn):
    _require("aot_eager")
    settings = neurovec.Settings(dynamic_facts=("x",))
    eager = neurovec.compile(tiny_gcn, settings, torch.float64)
    module = neurovec.compile(tiny_gcn, settings, torch.float64)
    call = torch.compile(module, backend="aot_eager")
    x = torch.randn(tiny_gcn.layer("x").values.shape, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    torch.testing.assert_close(call(facts={"x": x}), eager(facts={"x": x}), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_inductor(tiny_gcn, preset):
    _require("inductor")
    eager = neurovec.compile(tiny_gcn, preset, torch.float64)
    module = neurovec.compile(tiny_gcn, preset, torch.float64)
    call = torch.compile(module, backend="inductor")
    # Inductor fuses and reorders floating-point work: equal up to rounding.
    _assert_same(eager, call, module, tol=1e-10)
    _sgd_step(eager, eager)
    _sgd_step(module, call)
    _assert_same(eager, call, module, tol=1e-10)


@pytest.mark.slow
def test_inductor_max_min(tiny_max_min):
    _require("inductor")
    eager = neurovec.compile(tiny_max_min, "default", torch.float64)
    module = neurovec.compile(tiny_max_min, "default", torch.float64)
    _assert_same(eager, torch.compile(module, backend="inductor", fullgraph=True), module, tol=1e-10)


def aggregation_graph(aggregations=("max", "min", "mean", "prod", "sum")) -> neurovec.Graph:
    """A small graph with one layer per aggregation (each reading the one before),
    repeated inputs, and ties for max/min."""
    rng = np.random.default_rng(0)
    b = neurovec.GraphBuilder()
    w = b.weight("w", rng.normal(size=(3, 3)))
    v = b.weight("v", rng.normal(size=3))
    x = b.facts("x", np.vstack([rng.normal(size=(3, 3)), np.ones((2, 3))]))  # two equal rows: ties
    rows = list(x)
    for k, aggregation in enumerate(aggregations):
        h = b.layer(f"h{k}_{aggregation}", aggregation=aggregation, transformation="tanh")
        rows = [h.neuron([(rows[0], w), (rows[1], w)]), h.neuron([(rows[2], w), (rows[3], None), (rows[4], v)]),
                h.neuron([(rows[3], v), (rows[4], v)], bias=v), h.neuron([(rows[1], w)]),
                h.neuron([(rows[0], None), (rows[0], w), (rows[2], v)])]
    b.output(*rows)
    return b.build()


@pytest.mark.parametrize("kernel", ["scatter", "segment", "dense", "sparse_mm"])
def test_every_kernel_compiles_as_one_graph(kernel):
    _require("aot_eager")
    graph = aggregation_graph()
    eager = neurovec.compile(graph, {"reduce_kernel": kernel}, torch.float64)
    module = neurovec.compile(graph, {"reduce_kernel": kernel}, torch.float64)
    _assert_same(eager, torch.compile(module, backend="aot_eager", fullgraph=True), module)


def test_twenty_modules_each_get_compiled_code():
    """One module per mini-batch: each is compiled once, none falls back to eager.

    Before each program had its own class, every module shared one ``forward``
    code object: dynamo re-traced it per module (guards on each module's buffers)
    and, after ``recompile_limit`` (8) modules, silently ran the rest eagerly.
    """
    _require("eager")
    batches = [neurovec.compile(aggregation_graph(("sum",)), neurovec.Settings(reduce_kernel="segment"))
               for k in range(20)]
    for k, module in enumerate(batches):  # twenty different modules (different weights)
        with torch.no_grad():
            module.weights["w"].add_(k)
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for module in batches:
            compiled = torch.compile(module, backend="eager", fullgraph=True)
            torch.testing.assert_close(compiled(), module())
            torch.testing.assert_close(compiled(), module())  # the second call runs the cached code
    assert counters["stats"]["unique_graphs"] == 20
    assert not counters["recompiles"] and not counters["graph_break"]


@pytest.mark.slow
@pytest.mark.parametrize("template", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("preset", ["unoptimized", "default", "upward-17-aggressive"])
def test_inductor_templates(tu_dir, template, preset):
    # unoptimized used to fail: inductor cannot compile index_select's backward from a
    # one-element tensor (the (1, 1) output bias), which is now written as an expand.
    _require("inductor")
    graph = getattr(datasets, template)(datasets.load_tu("MUTAG", tu_dir), hidden=8, layers=2, samples=[0, 1, 2, 3])
    eager = neurovec.compile(graph, preset, torch.float64)
    module = neurovec.compile(graph, preset, torch.float64)
    _assert_same(eager, torch.compile(module, backend="inductor", fullgraph=True), module, tol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["unoptimized", "default", "upward-17-aggressive"])
def test_inductor_every_aggregation(preset):
    _require("inductor")
    graph = aggregation_graph()
    eager = neurovec.compile(graph, preset, torch.float64)
    module = neurovec.compile(graph, preset, torch.float64)
    _assert_same(eager, torch.compile(module, backend="inductor", fullgraph=True), module, tol=1e-10)


def test_weights_named_like_module_attributes_compile():
    """Weights named ``half``, ``train``, ``training`` ... (NOTE: [weights are not attributes])
    trace as one graph and train like any others."""
    _require("aot_eager")
    from .test_module import ATTRIBUTE_NAMES, _graph_with_weight_names
    graph = _graph_with_weight_names(ATTRIBUTE_NAMES)
    eager = neurovec.compile(graph, "default", torch.float64)
    module = neurovec.compile(graph, "default", torch.float64)
    _matches_and_trains_without_recompiling(eager, module, torch.compile(module, backend="aot_eager", fullgraph=True))


@pytest.mark.parametrize("preset", ["unoptimized"] + PRESETS)
def test_standard_ops_view_compiles_as_one_graph(preset):
    """The forward in standard torch ops (NOTE: [standard ops], what engines/export.py exports)
    traces as one graph too, every aggregation included."""
    _require("aot_eager")
    from neurovec.engines.export import standard_ops
    graph = aggregation_graph()
    eager = neurovec.compile(graph, preset, torch.float64)
    view = standard_ops(neurovec.compile(graph, preset, torch.float64))
    _assert_same(eager, torch.compile(view, backend="aot_eager", fullgraph=True), view)


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_fullgraph_with_sparse_facts(model):
    """A sparse sum of a weight's columns (compiler/passes/sparse_facts.py) compiles whole and trains."""
    _require("aot_eager")
    from .passes.test_sparse_facts import TEMPLATES, node_dataset, transposes
    graph = TEMPLATES[model](node_dataset())
    eager = neurovec.compile(graph, "default", torch.float64)
    module = neurovec.compile(graph, "default", torch.float64)
    assert transposes(module.program)
    _matches_and_trains_without_recompiling(eager, module, torch.compile(module, backend="aot_eager", fullgraph=True))
