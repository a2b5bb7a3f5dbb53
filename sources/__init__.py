"""Ways into neurovec: the neuron-graph input API and its importers."""
from .builder import GraphBuilder, LayerBuilder, Ref
from .graph import AGGREGATIONS, TRANSFORMATIONS, FactLayer, Graph, GraphError, NeuronLayer, Weight
from . import circuits  # SDD circuits (weighted model counting) as graphs
from .serialize import graph_from_dict, graph_to_dict, load_json, save_json

__all__ = [
    "AGGREGATIONS", "TRANSFORMATIONS", "FactLayer", "Graph", "GraphBuilder", "GraphError",
    "LayerBuilder", "NeuronLayer", "Ref", "Weight", "graph_from_dict", "graph_to_dict",
    "load_json", "save_json",
]
