"""Hypothesis strategies: random valid pre-grouped neuron graphs.

The graphs cover every aggregation and transformation, unit facts, scalar /
vector / matrix values and weights, fixed and learnable weights, repeated and
interleaved inputs, inputs of different shapes within one neuron, skip
connections across layers, biases (on some neurons only), and repeated outputs.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from neurovec.sources.graph import (AGGREGATIONS, TRANSFORMATIONS, FactLayer, Graph, NeuronLayer, Weight,
                                    product_shape)

VALUE_SHAPES = [(), (2,), (3,), (2, 2)]


def weight_shapes_for(s_in: tuple, s_out: tuple) -> list:
    """Every weight shape (None = no weight) that maps a value of s_in to s_out."""
    candidates = [None, (), s_in, s_out]
    if s_in and s_out:
        candidates.append((s_out[0], s_in[0]))
    return list(dict.fromkeys(c for c in candidates if product_shape(c, s_in) == s_out))


@st.composite
def graphs(draw, max_layers: int = 4, max_neurons: int = 4, max_inputs: int = 4) -> Graph:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layers, shapes, weights = [], [], []

    def weight_of(shape, reuse=True):
        pool = [i for i, w in enumerate(weights) if w.shape == shape]
        if pool and reuse and draw(st.booleans()):
            return pool[draw(st.integers(0, len(pool) - 1))]
        learnable = draw(st.integers(0, 4)) > 0
        weights.append(Weight(f"w{len(weights)}", rng.normal(0, 0.8, shape), learnable))
        return len(weights) - 1

    for k in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, max_neurons))
        if draw(st.booleans()):
            layers.append(FactLayer.units(f"unit{k}", size))
            shapes.append(())
        else:
            shape = draw(st.sampled_from(VALUE_SHAPES))
            layers.append(FactLayer(f"fact{k}", rng.normal(0, 1, (size,) + shape)))
            shapes.append(shape)

    for k in range(draw(st.integers(1, max_layers))):
        out_shape = draw(st.sampled_from(VALUE_SHAPES))
        sources = [i for i, s in enumerate(shapes) if weight_shapes_for(s, out_shape)]
        if not sources:
            out_shape = ()
            sources = [i for i, s in enumerate(shapes) if s == ()] or [0]
            if shapes[sources[0]] != ():
                out_shape = shapes[sources[0]]
                sources = [i for i, s in enumerate(shapes) if s == out_shape]
        transformation = draw(st.sampled_from([t for t in TRANSFORMATIONS if out_shape or t != "softmax"]))
        aggregation = draw(st.sampled_from(AGGREGATIONS))
        size = draw(st.integers(1, max_neurons))
        counts = [draw(st.integers(1, max_inputs)) for _ in range(size)]
        src, ordinal, wts = [], [], []
        for _ in range(sum(counts)):
            s = draw(st.sampled_from(sources))
            src.append(s)
            ordinal.append(draw(st.integers(0, layers[s].size - 1)))
            shape = draw(st.sampled_from(weight_shapes_for(shapes[s], out_shape)))
            wts.append(-1 if shape is None else weight_of(shape))
        bias = None
        if draw(st.booleans()):
            bias_shape = draw(st.sampled_from([(), out_shape]))
            shared = weight_of(bias_shape, reuse=False)
            bias = [shared if draw(st.integers(0, 3)) else -1 for _ in range(size)]
        layers.append(NeuronLayer(f"layer{k}", counts=counts, input_layer=src, input_ordinal=ordinal,
                                  input_weight=wts, bias=bias, aggregation=aggregation,
                                  transformation=transformation))
        shapes.append(out_shape)

    last = len(layers) - 1
    candidates = [i for i, s in enumerate(shapes) if s == shapes[last] and isinstance(layers[i], NeuronLayer)]
    n_out = draw(st.integers(1, 4))
    out_layer = [draw(st.sampled_from(candidates)) for _ in range(n_out)]
    out_ordinal = [draw(st.integers(0, layers[i].size - 1)) for i in out_layer]
    return Graph(layers, weights, out_layer, out_ordinal)
