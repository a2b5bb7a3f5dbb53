"""The compile entry point: graph -> Vectorizer -> passes -> torch module."""
from __future__ import annotations

import torch

from ..engines.torch_module import CompiledModule
from ..sources.graph import Graph
from .ir import Program
from .settings import Settings
from .vectorizer import vectorize

__all__ = ["compile", "build_program"]


def build_program(graph: Graph, settings: Settings | None = None) -> Program:
    """Vectorize ``graph`` and run the optimizer passes chosen by ``settings``."""
    settings = settings or Settings()
    program = vectorize(graph)
    if settings.verify:
        program.verify()
    return program


def compile(graph: Graph, settings: Settings | None = None, dtype: torch.dtype | None = None
            ) -> CompiledModule:  # noqa: A001
    """Compile a neuron graph into a ``torch.nn.Module``.

    ``dtype`` defaults to torch's default (float32). Pass ``torch.float64`` to
    start from the graph's exact initial weights; ``.double()`` later keeps
    facts and fixed weights exact but upcasts the learnable weights as they are.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"neurovec.compile expects a neurovec.Graph (got {type(graph).__name__})")
    return CompiledModule(build_program(graph, settings), dtype)
