"""Reduction kernels chosen by the engine (issue 24: "kernel choice belongs to the engine";
NOTE: [kernels chosen by the engine] in engines/torch_module.py).

A REDUCE whose ``kernel`` is ``"auto"`` gets its kernel when the module is built, from the
engine's cost model and whether its C++ kernels run there. On a machine with them, that is
what the compiler's choose_kernels pass picks today: a program with every such choice
replaced by "auto" generates byte-identical code. Without them, sparse sums over one row
become gathers and those over equal counts dense reductions of the gathered rows, and the
module still equals the reference engine.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import datasets
from neurovec.compiler import build_program
from neurovec.compiler.ir import Op
from neurovec.engines import native
from neurovec.engines.torch_module import CompiledModule, choose_kernels, generate_source

from .equivalence import assert_equivalent
from .test_equivalence import all_finite
from .strategies import graphs
from .test_torch_compile import aggregation_graph


def auto(program):
    """``program`` with every kernel the cost model chose left to the engine ("strided" is a layout)."""
    return program.replace(nodes=tuple(
        n.with_(attrs={**n.attrs, "kernel": "auto"}) if n.op is Op.REDUCE and n.attrs.get("kernel") != "strided"
        else n for n in program.nodes))


def _require_native():
    if not native.available():
        pytest.skip("neurovec's C++ kernels are not built here (no g++, or NEUROVEC_NATIVE=0)")


def _without_native(monkeypatch):
    """From here on, the C++ kernels are off (programs built before were compiled with them)."""
    monkeypatch.setattr(native, "_enabled", False)
    assert not native.available()


def _templates(tu_dir, name, samples):
    ds = datasets.load_tu(name, tu_dir, download=False)
    for template in ("gcn", "sage", "gin"):
        for attributes in (False, True) if ds.node_attributes is not None else (False,):
            yield getattr(datasets, template)(ds, use_attributes=attributes, samples=samples)


def _check_same_code(graph, preset):
    program = build_program(graph, preset)
    lowered = auto(program)
    assert choose_kernels(lowered) == choose_kernels(program)
    assert generate_source(lowered) == generate_source(program)
    module, engine = CompiledModule(program, torch.float64), CompiledModule(lowered, torch.float64)
    assert engine.code == module.code
    assert dict(engine.named_buffers()).keys() == dict(module.named_buffers()).keys()
    engine.load_state_dict(module.state_dict())
    assert torch.equal(engine(), module())


# Presets whose kernels the cost model picks (unoptimized forces "scatter").
AUTO_PRESETS = [p for p in neurovec.list_presets() if neurovec.Settings.preset(p).reduce_kernel == "auto"]


@pytest.mark.parametrize("preset", ["default", "upward-00-free", "upward-17-aggressive"])
def test_with_cpp_kernels_the_engine_picks_what_the_compiler_does(tu_dir, preset):
    _require_native()
    for graph in _templates(tu_dir, "MUTAG", samples=range(40)):
        _check_same_code(graph, preset)
    _check_same_code(aggregation_graph(), preset)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MUTAG", "ENZYMES", "PROTEINS"])
@pytest.mark.parametrize("preset", AUTO_PRESETS)
def test_with_cpp_kernels_the_engine_picks_what_the_compiler_does_sweep(tu_dir, name, preset):
    _require_native()
    for graph in _templates(tu_dir, name, samples=None):
        _check_same_code(graph, preset)


def _check_without_native(program, chosen):
    """Sparse sums over one row (without coefficients, the sign of no zero mattering) are
    gathers, those over equal counts dense reductions; the rest stay sparse sums."""
    with_index = {n.name: n for n in program.nodes if n.op is Op.REDUCE and "index" in n.attrs}
    assert with_index
    for name, node in with_index.items():
        counts = program.constants[node.attrs["counts"]]
        if np.all(counts == 1) and node.attrs.get("coef") is None:
            assert chosen[name] == "gather", name
        elif np.all(counts == counts[0]):
            assert chosen[name] in ("gather", "dense"), name
        else:
            assert chosen[name] == "sparse_mm", name


def test_without_cpp_kernels_sums_of_gathered_rows_run_on_torch(tu_dir, monkeypatch):
    _require_native()
    ds = datasets.load_tu("MUTAG", tu_dir, download=False)
    graph = datasets.gin(ds, hidden=8, samples=range(12))
    program = auto(build_program(graph, "default"))
    _without_native(monkeypatch)
    chosen = choose_kernels(program)
    _check_without_native(program, chosen)
    module = CompiledModule(program, torch.float64)
    assert_equivalent(graph, module)
    # Gathered rows of a sparse sum run by another kernel have index_select's backward: int64.
    for node in program.nodes:
        if node.op is Op.REDUCE and "index" in node.attrs and chosen[node.name] != "sparse_mm" \
                and program.node(node.srcs[0]).op is not Op.FACT:
            assert getattr(module, node.attrs["index"]).dtype == torch.int64


def test_without_cpp_kernels_one_row_and_equal_sums_are_gathers_and_dense(monkeypatch):
    """A GCN-like chain where the default program has one-row sparse sums (large gathers with
    a gradient) and equal-count ones."""
    rng = np.random.default_rng(0)
    b = neurovec.GraphBuilder()
    w = b.weight("w", rng.normal(size=(8, 8)))
    x = b.facts("x", rng.normal(size=(3000, 8)))
    h = b.layer("h", aggregation="sum", transformation="tanh")
    hs = [h.neuron([(x[k], w), (x[(k * 7 + 1) % 3000], w)]) for k in range(3000)]
    g = b.layer("g", aggregation="max", transformation="tanh")  # its gather stays: a one-row sum
    b.output(*[g.neuron([(hs[(k * 13) % 3000], w), (hs[(k * 5 + 2) % 3000], w)]) for k in range(2500)])
    graph = b.build()
    _require_native()
    program = auto(build_program(graph, "default"))
    kinds = {("one row" if np.all(c == 1) else "equal" if np.all(c == c[0]) else "other")
             for n in program.nodes if n.op is Op.REDUCE and "index" in n.attrs
             for c in [program.constants[n.attrs["counts"]]]}
    assert {"one row", "equal"} <= kinds  # the graph has what the test is about
    _without_native(monkeypatch)
    chosen = choose_kernels(program)
    _check_without_native(program, chosen)
    assert_equivalent(graph, CompiledModule(program, torch.float64))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), preset=st.sampled_from(["default", "upward-17-aggressive"]), cpp=st.booleans())
def test_engine_kernels_equal_the_reference_on_random_graphs(graph, preset, cpp):
    assume(all_finite(graph))  # outside the real domain gradients are NaN-defined (all_finite says why)
    program = auto(build_program(graph, preset))
    saved = native._enabled
    native._enabled = saved and cpp
    try:
        assert_equivalent(graph, CompiledModule(program, torch.float64))
    finally:
        native._enabled = saved
