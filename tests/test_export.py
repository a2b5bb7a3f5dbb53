"""Exporting compiled modules (issue 28, item 4): torch.export and ONNX with the dynamic fact
layers as inputs, from the forward written in standard torch ops (NOTE: [standard ops]).

The standard-ops forward is checked against the reference engine like every kernel
(outputs and gradients, float64, 1e-9, every preset); the exported programs against the
module they came from after a save/load round trip, with new fact values. ONNX runs in
onnxruntime where it is installed (else the model passes onnx's checker); without the
onnx packages those tests skip.
"""
from __future__ import annotations

import io
import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import datasets
from neurovec.engines.export import example_facts, export, export_onnx, standard_ops
from neurovec.sources.graph import GraphError

from .equivalence import assert_equivalent
from .test_equivalence import all_finite
from .strategies import graphs
from .test_torch_compile import aggregation_graph

PRESETS = neurovec.list_presets()
NEUROVEC_KERNELS = ("gather_sum(", "segment_reduce(")


def _dynamic(preset: str, layers=("x",)) -> neurovec.Settings:
    return neurovec.Settings.preset(preset, dynamic_facts=layers)


def _new_facts(module, seed: int = 1) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {layer: torch.tensor(rng.normal(size=tuple(value.shape)), dtype=value.dtype)
            for layer, value in example_facts(module).items()}


@pytest.fixture(scope="module")
def tiny_gcn(tu_dir):
    return datasets.gcn(datasets.load_tu("MUTAG", tu_dir), hidden=8, layers=2, samples=[0, 1, 2, 3])


# -- the standard-ops forward ---------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_standard_ops_equal_the_reference(preset):
    graph = aggregation_graph()
    module = neurovec.compile(graph, preset, torch.float64)
    view = standard_ops(module)
    assert not any(kernel in view.code for kernel in NEUROVEC_KERNELS)
    assert_equivalent(graph, view)
    # A view: the same weights, so training the module changes what the view computes.
    with torch.no_grad():
        module.weights["w"].add_(0.5)
    assert view.weights["w"] is module.weights["w"]
    torch.testing.assert_close(view(), module(), rtol=1e-9, atol=1e-9)
    assert standard_ops(view) is view


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), preset=st.sampled_from(["default", "upward-17-aggressive"]),
       kernel=st.sampled_from(["auto", "segment", "sparse_mm"]))
def test_standard_ops_equal_the_reference_on_random_graphs(graph, preset, kernel):
    assume(all_finite(graph))  # outside the real domain gradients are NaN-defined (all_finite says why)
    module = neurovec.compile(graph, neurovec.Settings.preset(preset, reduce_kernel=kernel), torch.float64)
    assert_equivalent(graph, standard_ops(module))


def test_the_standard_view_pickles_and_refuses_other_modules(tiny_gcn):
    view = standard_ops(neurovec.compile(tiny_gcn, "default", torch.float64))
    again = pickle.loads(pickle.dumps(view))
    assert again.code == view.code and torch.equal(again(), view())
    with pytest.raises(TypeError, match="standard_ops expects a neurovec CompiledModule"):
        standard_ops(neurovec.ReferenceModule(tiny_gcn))


# -- torch.export ---------------------------------------------------------------------------------

def _round_trip(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


# Saving and loading costs more than exporting (~1 s a program here) and does not depend on the
# preset beyond the ops used, which these three programs cover; the slow sweep does every preset.
ROUND_TRIP = ("unoptimized", "default", "upward-17-aggressive")


@pytest.mark.parametrize("preset", PRESETS)
def test_torch_export(preset):
    _check_export(preset, round_trip=preset in ROUND_TRIP)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_torch_export_round_trip_every_preset(preset):
    _check_export(preset, round_trip=True)


def _check_export(preset: str, round_trip: bool) -> None:
    """Exported with the fact layer as its input, the program computes the reference engine's
    outputs for new fact values, with only standard ops (it loads with plain torch)."""
    graph = aggregation_graph()
    module = neurovec.compile(graph, _dynamic(preset), torch.float64)
    program = export(module)
    if round_trip:
        program = _round_trip(program)
    inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert inputs == ["facts_x"]
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not any("neurovec" in t for t in targets), targets
    new = _new_facts(module)
    expected = neurovec.ReferenceModule(graph)(facts=new)
    torch.testing.assert_close(program.module()(facts=new), expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(program.module()(facts=new), module(facts=new), rtol=1e-12, atol=1e-12)


def test_exported_program_trains_like_the_module(tiny_gcn):
    """The exported program keeps the weights as parameters: its gradients are the module's."""
    module = neurovec.compile(tiny_gcn, _dynamic("default"), torch.float64)
    exported = _round_trip(export(module)).module()
    new = _new_facts(module)
    grads = {}
    for name, m in (("module", module), ("exported", exported)):
        params = dict(m.named_parameters())
        out = m(facts=new)
        grads[name] = dict(zip(params, torch.autograd.grad(out.pow(2).sum(), list(params.values()))))
    assert grads["module"].keys() == grads["exported"].keys()
    for key, g in grads["module"].items():
        torch.testing.assert_close(grads["exported"][key], g, rtol=1e-9, atol=1e-9, msg=key)


def test_export_with_example_values_and_without_inputs(tiny_gcn):
    module = neurovec.compile(tiny_gcn, _dynamic("default"), torch.float64)
    new = _new_facts(module, seed=2)
    program = export(module, facts=new)
    torch.testing.assert_close(program.module()(facts=new), module(facts=new), rtol=1e-12, atol=1e-12)
    with pytest.raises(GraphError, match=r"fact layer 'x': replacement has shape \(3, 7\)"):
        export(module, facts={"x": torch.zeros(3, 7)})
    static = neurovec.compile(tiny_gcn, "default", torch.float64)
    with pytest.raises(GraphError, match=r"no inputs to export: it declares no dynamic fact layer.*"
                                         r"Settings\(dynamic_facts=\(<layer>, \.\.\.\)\).*fact layers: \['x'\]"):
        export(static)


# -- ONNX -----------------------------------------------------------------------------------------

def _onnx_model(module):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export_onnx(module)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_onnx_default(tiny_gcn, dtype):
    import onnx
    module = neurovec.compile(tiny_gcn, _dynamic("default"), dtype)
    proto = _onnx_model(module).model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert [i.name for i in proto.graph.input] == ["facts_x"]
    assert not any(node.domain.startswith("neurovec") for node in proto.graph.node)
    try:
        import onnxruntime
    except ImportError:
        pytest.skip("onnxruntime is not installed: the model passed onnx's checker only")
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    new = _new_facts(module)
    (out,) = session.run(None, {"facts_x": new["x"].numpy()})
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(out, module(facts=new).detach().numpy(), rtol=tol, atol=tol)


# -- TorchScript ----------------------------------------------------------------------------------

def test_jit_script_names_what_to_use_and_trace_works(tiny_gcn):
    module = neurovec.compile(tiny_gcn, _dynamic("default"), torch.float64)
    with pytest.raises(TypeError, match=r"torch.jit.script cannot compile a neurovec CompiledModule.*"
                                        r"neurovec.engines.export.export\(module\)"):
        torch.jit.script(module)
    new = _new_facts(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 calls jit.trace deprecated
        traced = torch.jit.trace(standard_ops(module), example_kwarg_inputs={"facts": example_facts(module)},
                                 check_trace=False)
    torch.testing.assert_close(traced(facts=new), module(facts=new), rtol=1e-12, atol=1e-12)


# -- the docs -------------------------------------------------------------------------------------

def test_the_export_doc_runs(tu_dir, tmp_path, monkeypatch):
    """docs/export.md's code blocks, in order, in one namespace (the ONNX block where onnx,
    onnxscript and onnxruntime are installed)."""
    import importlib.util
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "export.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(blocks) >= 5
    onnx_ready = all(importlib.util.find_spec(p) for p in ("onnx", "onnxscript", "onnxruntime"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block in blocks:
            if "onnx" in block and not onnx_ready:
                continue
            exec(compile(block.replace("../shared/data/tu", str(tu_dir)), "docs/export.md", "exec"), namespace)
    assert namespace["predictions"].shape == (38, 1)
    torch.testing.assert_close(namespace["traced"](facts={"x": namespace["x"]}),
                               namespace["module"](facts={"x": namespace["x"]}))


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_sparse_facts_pickle_and_export(model):
    """A sparse sum of a weight's columns (compiler/passes/sparse_facts.py): pickled, in standard ops
    (the reference engine's numbers) and through torch.export, saved and loaded."""
    from .passes.test_sparse_facts import TEMPLATES, node_dataset, transposes
    graph = TEMPLATES[model](node_dataset())
    module = neurovec.compile(graph, "default", torch.float64)
    assert transposes(module.program)
    again = pickle.loads(pickle.dumps(module))
    assert again.code == module.code and torch.equal(again(), module())
    view = standard_ops(module)
    assert not any(kernel in view.code for kernel in NEUROVEC_KERNELS)
    assert_equivalent(graph, view)
    program = _round_trip(torch.export.export(view, args=(), kwargs={}))
    torch.testing.assert_close(program.module()(), module(), rtol=1e-12, atol=1e-12)
