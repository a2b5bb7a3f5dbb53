"""Drop the neurons that no output reaches, before vectorizing.

A neuron whose value no output reads changes neither the outputs nor, in exact arithmetic, the
gradients. In floating point it can: its backward still runs, and a zero upstream gradient times
an infinite local derivative (``sqrt`` at 0, a product with -0.0 over a huge value) is NaN, which
then flows into the gradient of a weight that the outputs *do* use. The reference engine (and
NeuraLogic, which grounds only what the queries reach) never differentiates such neurons, so the
compiled module must not compute them either. It is also less work.

Fact layers stay whole: dynamic facts replace a whole layer at call time, and a fact row costs
nothing until something reads it. A neuron layer that loses every neuron is dropped.

Everything is whole-array numpy: one global "used" mask over all neurons, marked from the outputs
and then layer by layer from the last to the first through each layer's CSR inputs (a layer only
reads earlier layers, so one backward sweep is enough); kept neurons are renumbered by a cumsum.
"""
from __future__ import annotations

import numpy as np

from ..sources.graph import FactLayer, Graph, NeuronLayer
from .grouping import CHUNK

__all__ = ["prune_unreachable", "reachable"]


def reachable(graph: Graph) -> list[np.ndarray]:
    """For each layer, a bool mask of its neurons that some output reads (directly or not).

    Fact layers are marked the same way (their masks say which rows are read), though
    :func:`prune_unreachable` keeps them whole.
    """
    sizes = np.array([layer.size for layer in graph.layers], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)])
    used = np.zeros(int(start[-1]), dtype=bool)
    used[start[graph.output_layer] + graph.output_ordinal] = True
    rows_of: dict[int, tuple[np.ndarray, int, np.ndarray]] = {}  # id(ordinals) -> (ordinals, size, rows they read)
    for index in range(len(graph.layers) - 1, -1, -1):
        layer = graph.layers[index]
        if isinstance(layer, FactLayer):
            continue
        mine = used[start[index]:start[index + 1]]
        if not mine.any():
            continue
        if mine.all() and layer.n_edges and layer.input_layer.min() == layer.input_layer.max():
            # Every neuron used, one input layer: the rows its ordinals read, kept for the next layer that reads a
            # layer as long through the same array (a GCN's layers share their edges: 62M at products-like).
            source = int(layer.input_layer[0])
            size = int(sizes[source])
            known = rows_of.get(id(layer.input_ordinal))
            if known is None or known[0] is not layer.input_ordinal or known[1] != size:
                read_rows = np.zeros(size, dtype=bool)
                for lo in range(0, layer.n_edges, CHUNK):  # NOTE: [chunks] in compiler/grouping.py
                    read_rows[layer.input_ordinal[lo:lo + CHUNK]] = True
                known = rows_of[id(layer.input_ordinal)] = (layer.input_ordinal, size, read_rows)
            used[start[source]:start[source + 1]] |= known[2]
            continue
        read = None if mine.all() else np.repeat(mine, layer.counts)  # the edges of used neurons
        # A chunk of edges at a time: the positions of all 20M edges of a 100x PROTEINS layer at
        # once were two int64 temporaries of 160 MB each (NOTE: [chunks] in compiler/grouping.py).
        for lo in range(0, layer.n_edges, CHUNK):
            edges = slice(lo, lo + CHUNK)
            layers, ordinals = layer.input_layer[edges], layer.input_ordinal[edges]
            if read is not None:
                layers, ordinals = layers[read[edges]], ordinals[read[edges]]
            if layers.size and layers.min() == layers.max():  # one input layer (a GNN's are): no offsets to add
                source = int(layers[0])
                used[start[source]:start[source + 1]][ordinals] = True
            else:
                used[start[layers] + ordinals] = True
    return [used[start[i]:start[i + 1]] for i in range(len(graph.layers))]


def prune_unreachable(graph: Graph) -> Graph:
    """``graph`` without the neurons no output reaches (``graph`` itself if there are none)."""
    masks = reachable(graph)
    if all(mask.all() for layer, mask in zip(graph.layers, masks) if isinstance(layer, NeuronLayer)):
        return graph
    keep_layer = np.array([isinstance(layer, FactLayer) or bool(mask.any())
                           for layer, mask in zip(graph.layers, masks)])
    new_layer_index = np.cumsum(keep_layer) - 1
    # A kept neuron's new ordinal is its rank among the kept neurons of its layer; fact rows keep theirs.
    new_ordinal = [np.arange(layer.size) if isinstance(layer, FactLayer) else np.cumsum(mask) - 1
                   for layer, mask in zip(graph.layers, masks)]
    sizes = np.array([layer.size for layer in graph.layers], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)])
    new_ordinal = np.concatenate(new_ordinal)
    whole = np.array([isinstance(layer, FactLayer) or bool(mask.all()) for layer, mask in zip(graph.layers, masks)])

    layers = []
    for index, (layer, mask) in enumerate(zip(graph.layers, masks)):
        if not keep_layer[index]:
            continue
        if whole[:index + 1].all():
            layers.append(layer)  # neither it nor anything before it lost a neuron
            continue
        edges = slice(None) if mask.all() else np.repeat(mask, layer.counts)
        src = layer.input_layer[edges]
        layers.append(NeuronLayer(
            name=layer.name,
            counts=layer.counts[mask],
            input_layer=new_layer_index[src],
            input_ordinal=new_ordinal[start[src] + layer.input_ordinal[edges]],
            input_weight=layer.input_weight[edges],
            bias=layer.bias[mask],
            aggregation=layer.aggregation,
            transformation=layer.transformation,
            copy=False,
        ))
    out_layer, out_ordinal = graph.output_layer, graph.output_ordinal
    return Graph(layers=tuple(layers), weights=graph.weights,
                 output_layer=new_layer_index[out_layer],
                 output_ordinal=new_ordinal[start[out_layer] + out_ordinal])
