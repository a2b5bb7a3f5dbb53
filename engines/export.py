"""Exporting compiled modules: torch.export and ONNX, with the dynamic fact layers as inputs.

A compiled module's graph, its structure and its static facts are constants of the
program; what a call may change are the fact layers declared in
``Settings.dynamic_facts``. An export therefore takes those layers as its inputs,
as the keyword ``facts={layer: tensor}`` (input names ``facts_<layer>`` in the exported
program and the ONNX model), and holds the weights as parameters::

    module = neurovec.compile(graph, neurovec.Settings(dynamic_facts=("x",)))
    program = export(module)                       # torch.export.ExportedProgram
    program.module()(facts={"x": new_x})           # same as module(facts={"x": new_x})
    export_onnx(module, "model.onnx")              # ONNX, runs in onnxruntime

Both export the module's forward written in standard torch ops (NOTE: [standard ops] in
``torch_module.py``): neurovec's C++ kernels and registered ops are left out, so the
exported program loads with plain torch (``torch.export.load``) and every op has an
ONNX translation. The numbers are those of the module (the "scatter" kernel's sums,
equal to the reference engine within rounding). See docs/export.md.
"""
from __future__ import annotations

import os
from typing import Mapping

import torch
from torch import nn

from ..sources.graph import GraphError
from .torch_module import CompiledModule, _program_class, add_buffers, choose_kernels, generate_source

__all__ = ["standard_ops", "example_facts", "export", "export_onnx"]


def standard_ops(module: CompiledModule) -> CompiledModule:
    """A view of ``module`` whose ``forward`` uses standard torch ops only.

    It shares ``module``'s parameters, buffers and submodules (training one trains the
    other; moving one moves the other) and computes the same function; print its
    ``code`` to see the difference. A module already in standard ops is returned as is.
    """
    if not isinstance(module, CompiledModule):
        raise TypeError(f"standard_ops expects a neurovec CompiledModule (got {type(module).__name__}); "
                        "compile a graph with neurovec.compile first")
    if getattr(type(module), "standard_ops", False):
        return module
    chosen = choose_kernels(module.program, standard_ops=True)
    cls = _program_class(generate_source(module.program, chosen=chosen))
    cls.standard_ops = True
    view = nn.Module.__new__(cls)
    view.__dict__.update(module.__dict__)  # the same parameter, buffer and submodule dicts
    add_buffers(view, cls.code, chosen)  # what its code reads that the native one did not: shared too
    view.reduce_kernels = chosen
    return view


def example_facts(module: CompiledModule) -> dict[str, torch.Tensor]:
    """Copies of the stored values of ``module``'s dynamic fact layers: ``{layer: tensor}``
    (copies: a tracer handed the buffer itself would read it as the buffer, not as an input)."""
    return {layer: getattr(module, const).clone() for layer, const in module._inputs.items()}


def _inputs(module: CompiledModule, facts: Mapping | None) -> dict[str, torch.Tensor]:
    if not isinstance(module, CompiledModule):
        raise TypeError(f"expected a neurovec CompiledModule (got {type(module).__name__})")
    declared = [layer for layer in module.program.dynamic_facts if layer in module._inputs]
    if not declared:
        reason = ("it declares no dynamic fact layer" if not module.program.dynamic_facts else
                  f"its dynamic fact layers {list(module.program.dynamic_facts)} feed no output")
        raise GraphError(f"this module has no inputs to export: {reason}, so the exported program would "
                         "compute one constant result. Compile with Settings(dynamic_facts=(<layer>, ...)) to "
                         f"make fact layers inputs (fact layers: {sorted(module.program.fact_shapes)})")
    values = example_facts(module)
    if facts is not None:
        values = {**values, **module.fact_inputs(facts)}
    return {layer: values[layer] for layer in declared}


def export(module: CompiledModule, facts: Mapping | None = None, *, strict: bool = False,
           **kwargs) -> torch.export.ExportedProgram:
    """``torch.export`` of ``module`` in standard ops, with its dynamic fact layers as inputs.

    ``facts`` gives example values (default: the stored ones); the exported program is
    called as ``program.module()(facts={layer: tensor, ...})`` with every dynamic fact layer
    that reaches an output, each of its compiled shape. Further keyword arguments go to
    ``torch.export.export``.
    """
    inputs = _inputs(module, facts)
    return torch.export.export(standard_ops(module), (), {"facts": inputs}, strict=strict, **kwargs)


def export_onnx(module: CompiledModule, path: str | os.PathLike | None = None, facts: Mapping | None = None,
                **kwargs):
    """``torch.onnx.export`` of ``module`` in standard ops (needs the packages onnx and onnxscript);
    the inputs are named ``facts_<layer>``. Returns the ``torch.onnx.ONNXProgram`` and, with a
    ``path``, saves the model there. Further keyword arguments go to ``torch.onnx.export``."""
    inputs = _inputs(module, facts)
    view = standard_ops(module)
    view.training = False  # no layer of a compiled module behaves differently in training
    kwargs.setdefault("dynamo", True)
    kwargs.setdefault("verbose", False)
    return torch.onnx.export(view, (), path, kwargs={"facts": inputs}, **kwargs)
