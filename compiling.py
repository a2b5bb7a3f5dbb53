"""``neurovec.compile``: the one place where the compiler and the engine meet.

The compiler (``compiler/``) turns a graph into a program; the engine (``engines/``) runs programs
as torch modules. Neither imports the other's top (``tests/test_layers.py``): this module sits above
both, and on import gives the compiler's passes what they ask of the engine (``compiler/backend.py``):
constant values computed by the engine itself (``fold_constants``), and which reductions the engine
runs best fused (``choose_kernels``), by its cost model assuming its C++ kernels, so that a program
does not depend on whether the machine that compiled it has a C++ compiler (the kernel that runs a
``kernel="auto"`` reduction is chosen when the module is built: NOTE: [kernels chosen by the
engine] in ``engines/torch_module.py``).
"""
from __future__ import annotations

import numpy as np
import torch

from .compiler import backend
from .compiler.ir import Program
from .compiler.pipeline import build_program, resolve_settings
from .compiler.settings import Settings
from .engines import kernels, native, torch_module
from .engines.torch_module import CompiledModule
from .memory import reusing_freed_memory
from .sources.graph import Graph

__all__ = ["compile", "FLOAT_DTYPES", "TorchBackend"]

#: The dtypes a module can compute in.
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class TorchBackend:
    """The torch engine's answers to the compiler's questions (``compiler.backend.Backend``)."""

    def evaluate(self, program: Program) -> np.ndarray:
        with torch.no_grad():
            return torch_module.CompiledModule(program, torch.float64)().numpy()

    def fuses_gather(self, n_edges: int, counts: np.ndarray, feature_size: int, reduce: str) -> bool:
        return kernels.choose_kernel(n_edges, counts.size, counts, feature_size, "cpu", reduce=reduce,
                                     after_gather=True, native_kernels=True) == "sparse_mm"

    def sequential_sums(self, facts: np.ndarray, index: np.ndarray, coef: np.ndarray | None,
                        counts: np.ndarray) -> np.ndarray | None:
        return native.fold_sums(facts, index, coef, counts)

    def gathered_wrapping_sums(self, words: np.ndarray, index: np.ndarray, counts: np.ndarray
                               ) -> np.ndarray | None:
        return native.gathered_wrapping_sums(words, index, counts)

    def gathers_as_sum(self, count: int, feature_size: int, needs_grad: bool) -> bool:
        return kernels.choose_gather_kernel(count, feature_size, needs_grad, native_kernels=True) == "sparse_mm"


backend.register(TorchBackend())


def compile(graph: Graph, settings: Settings | str | dict | None = None, dtype: torch.dtype | None = None
            ) -> CompiledModule:  # noqa: A001
    """Compile a neuron graph into a ``torch.nn.Module``.

    ``settings`` is a :class:`Settings`, a preset name (see ``list_presets()``), a
    dict of settings (``{"upward": False}`` means ``Settings(upward=False)``) or
    None for the ``default`` preset. ``dtype`` (one of :data:`FLOAT_DTYPES`)
    defaults to torch's default (float32); pass ``torch.float64`` to start from the
    graph's exact initial weights (``.double()`` later keeps facts and fixed weights
    exact but upcasts the learnable weights as they are).
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"neurovec.compile expects a neurovec.Graph (got {type(graph).__name__})")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"neurovec.compile: dtype must be one of {', '.join(map(str, FLOAT_DTYPES))} "
                        f"(got {dtype!r}); weights are learnable, so the module computes in floating point")
    # The module's tensors too take the pages the passes freed (at 100x PROTEINS building the
    # module took 1.5 s outside and 0.8 s inside): see memory.py.
    with reusing_freed_memory():
        program = build_program(graph, resolve_settings(settings), dtype=dtype or torch.get_default_dtype())
        return CompiledModule(program, dtype)
