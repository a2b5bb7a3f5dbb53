"""The reference engine: evaluates a graph neuron by neuron, with autograd.

It is slow and deliberately simple: it reads the definition
``value(n) = T(A_i(W_i . x_i) + b)`` off the graph one neuron at a time, with no
vectorization. Every compiled module is tested against it.
"""
from __future__ import annotations

import torch
from torch import nn

from ..sources.graph import FactLayer, Graph
from .functions import apply_weight, order_signed_zeros, preferred_zeros, transform
from .weights import WeightStore

__all__ = ["ReferenceModule", "evaluate"]

_AGGREGATE = {
    "sum": lambda xs: xs.sum(0),
    "mean": lambda xs: xs.mean(0),
    # Gradient split evenly among ties, like scatter_reduce; 0.0 > -0.0 (NOTE: [signed zeros in max and min]).
    "max": lambda xs: order_signed_zeros(xs.amax(0), preferred_zeros(xs, "max").amax(0), "max"),
    "min": lambda xs: order_signed_zeros(xs.amin(0), preferred_zeros(xs, "min").amin(0), "min"),
    "prod": lambda xs: xs.prod(0),
}


class ReferenceModule(nn.Module):
    """Holds the graph's weights as parameters and evaluates neuron by neuron.

    Weights live in ``self.weights`` (a :class:`WeightStore`) exactly as in compiled
    modules, so their state dicts are interchangeable.
    """

    def __init__(self, graph: Graph, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.graph = graph
        self.weights = WeightStore(graph.weights, dtype)
        self.dtype = dtype

    def weight(self, index: int) -> torch.Tensor | None:
        return None if index < 0 else self.weights[self.graph.weights[index].name]

    def forward(self, facts: dict | None = None) -> torch.Tensor:
        values = self.neuron_values(facts)
        return torch.stack([values[l][o] for l, o in
                            zip(self.graph.output_layer.tolist(), self.graph.output_ordinal.tolist())])

    def neuron_values(self, facts: dict | None = None) -> list[list[torch.Tensor]]:
        """The value of every neuron: ``values[layer][ordinal]``."""
        facts = facts or {}
        values: list[list[torch.Tensor]] = []  # values[layer][ordinal]
        for layer in self.graph.layers:
            if isinstance(layer, FactLayer):
                data = facts.get(layer.name)
                data = torch.tensor(layer.values, dtype=self.dtype) if data is None else data
                values.append([data[i] for i in range(layer.size)])
                continue
            ptr = layer.ptr.tolist()
            src, ordinal = layer.input_layer.tolist(), layer.input_ordinal.tolist()
            weight, bias = layer.input_weight.tolist(), layer.bias.tolist()
            outputs = []
            for j in range(layer.size):
                terms = [apply_weight(self.weight(weight[e]), values[src[e]][ordinal[e]])
                         for e in range(ptr[j], ptr[j + 1])]
                value = _AGGREGATE[layer.aggregation](torch.stack(terms))
                if bias[j] >= 0:
                    value = value + self.weight(bias[j])
                outputs.append(transform(layer.transformation, value.unsqueeze(0))[0])
            values.append(outputs)
        return values


def evaluate(graph: Graph, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The graph's outputs under its initial weights, computed neuron by neuron."""
    return ReferenceModule(graph, dtype)()
