"""neurovec: compile neuron-level relational computation graphs into fast PyTorch modules.

    graph = neurovec.GraphBuilder() ... .build()     # or an importer in neurovec.sources
    module = neurovec.compile(graph)                  # a torch.nn.Module
    print(module.code)                                # its forward, as readable Python
"""
import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import sys as _sys

from .compiler import Program, Settings, iter_presets, list_presets
from .compiling import compile
from .tuning import autotune
from .engines.reference import ReferenceModule
from . import clusters, dropout
from .clusters import ClusterLoader
from .loader import MiniBatch, MiniBatchModel, SampleLoader
from .progress import set_progress
from .sources import FactLayer, Graph, GraphBuilder, GraphError, NeuronLayer, Ref, Weight, load_json, save_json
from .sources import relational  # neurovec.relational: templates grounded by joins (also importable by that name)

_sys.modules[f"{__name__}.relational"] = relational


class _RelationalAlias(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """``import neurovec.relational.models`` gives ``neurovec.sources.relational.models``: one module under
    both names (without this, Python would load the file a second time, as a module whose relative
    imports resolve outside the package, and fail)."""

    alias, target = f"{__name__}.relational.", f"{__name__}.sources.relational."

    def find_spec(self, fullname, path=None, target=None):
        return _importlib_util.spec_from_loader(fullname, self) if fullname.startswith(self.alias) else None

    def create_module(self, spec):
        module = _importlib.import_module(self.target + spec.name[len(self.alias):])
        spec.loader_state = module.__spec__  # importlib gives the module this spec next: its own goes back below
        return module

    def exec_module(self, module):  # imported already, under its own name
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _RelationalAlias) for finder in _sys.meta_path):
    _sys.meta_path.insert(0, _RelationalAlias())

__all__ = [
    "Program", "ReferenceModule", "Settings", "autotune", "compile", "iter_presets", "list_presets",
    "FactLayer", "Graph", "GraphBuilder", "GraphError", "NeuronLayer", "Ref", "Weight",
    "load_json", "save_json", "MiniBatch", "MiniBatchModel", "SampleLoader", "set_progress", "ClusterLoader",
]
__version__ = "0.1.0"
