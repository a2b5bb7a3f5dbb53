"""neurovec: compile neuron-level relational computation graphs into fast PyTorch modules.

    graph = neurovec.GraphBuilder() ... .build()     # or an importer in neurovec.sources
    module = neurovec.compile(graph)                  # a torch.nn.Module
    print(module.code)                                # its forward, as readable Python
"""
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

__all__ = [
    "Program", "ReferenceModule", "Settings", "autotune", "compile", "iter_presets", "list_presets",
    "FactLayer", "Graph", "GraphBuilder", "GraphError", "NeuronLayer", "Ref", "Weight",
    "load_json", "save_json", "MiniBatch", "MiniBatchModel", "SampleLoader", "set_progress", "ClusterLoader",
]
__version__ = "0.1.0"
