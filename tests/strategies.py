"""Hypothesis strategies: random valid pre-grouped neuron graphs.

The graphs cover every aggregation and transformation, unit facts, scalar /
vector / matrix values and weights, fixed and learnable weights, repeated and
interleaved inputs, inputs of different shapes within one neuron, skip
connections across layers, biases (on some neurons only), and repeated outputs. Half of the
graphs without tricky values output every neuron of their neuron layers (the compiler prunes
what no output reaches); the others output a few neurons.

With ``tricky_values`` the fact and fixed weight values come from ``TRICKY_VALUES``:
signed zeros, values that differ in their last bits, and terms so large that the
small ones vanish in a 32-bit mantissa -- the values on which a merge by numeric
comparison goes wrong; and neurons are often near twins of the one before them
(the same inputs in another order, and one of them, its row or its weight redrawn, or none).
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from neurovec.benchmarks.compile_speed import deep_chain
from neurovec.sources.graph import (AGGREGATIONS, TRANSFORMATIONS, FactLayer, Graph, NeuronLayer, Weight,
                                    product_shape)

VALUE_SHAPES = [(), (2,), (3,), (2, 2)]
TRICKY_VALUES = np.array([0.0, -0.0, 1.0, 1.0 + 2.0**-35, -1.0, 1e6, -1e6, 1e-6])


def _values(rng: np.random.Generator, shape: tuple, scale: float, tricky: bool) -> np.ndarray:
    if not tricky:
        return rng.normal(0, scale, shape)
    values = rng.choice(TRICKY_VALUES, shape)
    if len(shape) > 1:  # rows that are near twins of row 0: one entry nudged (1 -> 1 + 2^-35, 0 -> -0)
        twins = np.repeat(values[:1], shape[0], axis=0).reshape(shape[0], -1)
        nudge = rng.integers(0, twins.shape[1], shape[0])
        rows = np.arange(shape[0])
        twins[rows, nudge] = np.where(twins[rows, nudge] == 1.0, 1.0 + 2.0**-35, -twins[rows, nudge])
        values = np.where(rng.random(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1)) < 0.5,
                          twins.reshape(shape), values)
    return values


def weight_shapes_for(s_in: tuple, s_out: tuple) -> list:
    """Every weight shape (None = no weight) that maps a value of s_in to s_out."""
    candidates = [None, (), s_in, s_out]
    if s_in and s_out:
        candidates.append((s_out[0], s_in[0]))
    return list(dict.fromkeys(c for c in candidates if product_shape(c, s_in) == s_out))


@st.composite
def graphs(draw, max_layers: int = 4, max_neurons: int = 4, max_inputs: int = 4, tricky_values: bool = False
           ) -> Graph:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layers, shapes, weights = [], [], []

    def weight_of(shape, reuse=True):
        pool = [i for i, w in enumerate(weights) if w.shape == shape]
        if pool and reuse and draw(st.booleans()):
            return pool[draw(st.integers(0, len(pool) - 1))]
        learnable = draw(st.integers(0, 4)) > 0
        weights.append(Weight(f"w{len(weights)}", _values(rng, shape, 0.8, tricky_values and not learnable),
                              learnable))
        return len(weights) - 1

    for k in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, max_neurons))
        if draw(st.booleans()):
            layers.append(FactLayer.units(f"unit{k}", size))
            shapes.append(())
        else:
            shape = draw(st.sampled_from(VALUE_SHAPES))
            layers.append(FactLayer(f"fact{k}", _values(rng, (size,) + shape, 1.0, tricky_values)))
            shapes.append(shape)

    # Half of the graphs output every neuron of their (then mostly one-shaped) neuron layers. The
    # compiler computes only what the outputs reach: with a few outputs, most of a small random graph
    # is pruned, so these graphs keep every layer whole in the passes. Not with tricky values: the
    # gradient of a weight read by many outputs sums terms of 1e12 that cancel, and the reference's
    # summation order differs from a vectorized one by more than 1e-9.
    cover = not tricky_values and draw(st.booleans())
    cover_shape = draw(st.sampled_from(VALUE_SHAPES)) if cover else None
    for k in range(draw(st.integers(1, max_layers))):
        out_shape = draw(st.sampled_from(VALUE_SHAPES)) if cover_shape is None else cover_shape
        sources = [i for i, s in enumerate(shapes) if weight_shapes_for(s, out_shape)]
        if not sources:
            out_shape = ()
            sources = [i for i, s in enumerate(shapes) if s == ()] or [0]
            if shapes[sources[0]] != ():
                out_shape = shapes[sources[0]]
                sources = [i for i, s in enumerate(shapes) if s == out_shape]
        allowed = [t for t in TRANSFORMATIONS if out_shape or t != "softmax"]
        if tricky_values:  # the transformations that tell near-equal values and signed zeros apart (log and
            # sqrt in their derivatives)
            allowed += ["identity", "inverse", "log", "sqrt"] * 4
        transformation = draw(st.sampled_from(allowed))
        aggregation = draw(st.sampled_from(AGGREGATIONS))
        size = draw(st.integers(1, max_neurons))
        counts = [draw(st.integers(1, max_inputs)) for _ in range(size)]
        if tricky_values and draw(st.booleans()):
            counts = [1] * size  # a layer of one-input neurons (reductions that passes may drop)
        src, ordinal, wts = [], [], []

        def draw_input():
            s = draw(st.sampled_from(sources))
            o = draw(st.integers(0, layers[s].size - 1))
            shape = draw(st.sampled_from(weight_shapes_for(shapes[s], out_shape)))
            return s, o, -1 if shape is None else weight_of(shape)

        for j in range(size):
            if tricky_values and j and draw(st.booleans()):
                # A near twin of the previous neuron: its inputs, in another order, one redrawn (or none).
                twin = list(zip(src, ordinal, wts))[-counts[j - 1]:]
                twin = [twin[i] for i in draw(st.permutations(range(len(twin))))]
                pick = draw(st.integers(0, len(twin) - 1))
                s, o, w = twin[pick]
                change = draw(st.sampled_from(["ordinal", "weight", "input", "none"]))
                if change == "ordinal":
                    twin[pick] = s, draw(st.integers(0, layers[s].size - 1)), w
                elif change == "weight" and w >= 0:
                    twin[pick] = s, o, weight_of(weights[w].shape)
                elif change != "none":  # else the same inputs in another order: an exact twin
                    twin[pick] = draw_input()
                counts[j] = len(twin)
            else:
                twin = [draw_input() for _ in range(counts[j])]
            if tricky_values and aggregation in ("sum", "mean", "prod"):
                # Inputs in one canonical order. A sum of the same terms in another order can round
                # differently, and tricky values make that visible: 1e12 - 1e12 + 1e-6 is 1e-6 but
                # 1e12 + 1e-6 - 1e12 is 0 (then ``inverse``: 1e6 against inf). The compiler merges
                # neurons whose inputs are the same multiset (thesis 5.2.6: a sum is commutative in
                # real arithmetic) and computes one of them, in its order: no engine that merges
                # can match the reference on the other. Max and min are commutative exactly (NOTE:
                # [signed zeros in max and min]): their twins keep their shuffled order.
                twin.sort()
            for s, o, w in twin:
                src.append(s)
                ordinal.append(o)
                wts.append(w)
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
    if cover_shape is not None:
        out_layer += [i for i in candidates for _ in range(layers[i].size)]
        out_ordinal += [o for i in candidates for o in range(layers[i].size)]
    return Graph(layers, weights, out_layer, out_ordinal)


GNN_TRANSFORMATIONS = ["identity", "relu", "tanh", "sigmoid"]


@st.composite
def gnn_graphs(draw, max_nodes: int = 8) -> Graph:
    """Random message-passing models on random graphs, shaped like the GNN templates.

    Node features (vectors, sometimes with many equal rows), then 1-3 convolutions,
    each GCN-like (a shared matrix weight, then a sum or mean over neighbours with
    fixed or learnable scalar factors, some 0), SAGE-like (a mean of neighbours, then
    two matrix weights) or GIN-like (a sum of self and neighbours, then a 2-layer MLP),
    with random widths (narrowing and widening), biases and transformations; then a
    sum or mean readout per sample and an output layer. Isolated nodes read themselves
    times the fixed weight 0, like the templates. These are the shapes the algebra
    passes (coefficients, linear reordering, constant folding) rewrite.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, max_nodes))
    width = draw(st.integers(1, 4))
    levels = draw(st.sampled_from([None, 2, 3]))  # None: continuous features; else a few distinct rows
    x = rng.normal(0, 1, (n, width)) if levels is None else rng.normal(0, 1, (levels, width))[rng.integers(0, levels, n)]
    layers: list = [FactLayer("x", x)]
    weights: list[Weight] = []

    def weight(value, learnable=True) -> int:
        weights.append(Weight(f"w{len(weights)}", np.asarray(value, dtype=np.float64), learnable))
        return len(weights) - 1

    n_edges = draw(st.integers(0, 3 * n))
    src, dst = rng.integers(0, n, n_edges), rng.integers(0, n, n_edges)
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    in_degree = np.bincount(dst, minlength=n)
    isolated = np.flatnonzero(in_degree == 0)
    zero = weight(0.0, learnable=False) if isolated.size else -1

    def neighbours():
        """(owner, source, weight) of every neighbour edge, isolated nodes reading themselves times 0."""
        owner = np.concatenate([dst, isolated])
        source = np.concatenate([src, isolated])
        w = np.concatenate([np.full(src.size, -1), np.full(isolated.size, zero)])
        order = np.argsort(owner, kind="stable")
        return np.bincount(owner, minlength=n), source[order], w[order], owner[order]

    def dense(name, source, w, bias, transformation):
        return NeuronLayer(name, np.ones(n, np.int64), np.full(n, source), np.arange(n), np.full(n, w),
                           None if bias is None else np.full(n, bias), transformation=transformation)

    h = 0
    for k in range(draw(st.integers(1, 3))):
        out = draw(st.integers(1, 4))
        act = draw(st.sampled_from(GNN_TRANSFORMATIONS))
        bias = weight(rng.normal(0, 0.5, out)) if draw(st.booleans()) else None
        kind = draw(st.sampled_from(["gcn", "sage", "gin"]))
        if kind == "gcn":
            layers.append(dense(f"conv{k}.lin", h, weight(rng.normal(0, 0.7, (out, width))), None, "identity"))
            lin = len(layers) - 1
            counts, source, w, owner = neighbours()
            self_loops = draw(st.booleans())
            factors = draw(st.sampled_from(["none", "fixed", "fixed-few", "learnable"]))
            if factors != "none":
                values = rng.uniform(-1, 1, source.size + n)
                if factors == "fixed-few":
                    values = rng.choice([0.0, 0.5, 1.5], source.size + n)
                learnable = factors == "learnable"
                ids = [weight(v, learnable) for v in values]
                ids = np.array(ids, dtype=np.int64)
                w = np.where(w == zero, w, ids[:source.size]) if zero >= 0 else ids[:source.size]
                self_w = ids[source.size:]
            else:
                self_w = np.full(n, -1, dtype=np.int64)
            if self_loops:
                owner = np.concatenate([owner, np.arange(n)])
                source = np.concatenate([source, np.arange(n)])
                w = np.concatenate([w, self_w])
                order = np.argsort(owner, kind="stable")
                owner, source, w = owner[order], source[order], w[order]
                counts = np.bincount(owner, minlength=n)
            layers.append(NeuronLayer(f"conv{k}", counts, np.full(source.size, lin), source, w,
                                      None if bias is None else np.full(n, bias),
                                      aggregation=draw(st.sampled_from(["sum", "mean"])), transformation=act))
        elif kind == "sage":
            counts, source, w, _ = neighbours()
            layers.append(NeuronLayer(f"conv{k}.mean", counts, np.full(source.size, h), source, w,
                                      aggregation="mean"))
            mean = len(layers) - 1
            w_l, w_r = weight(rng.normal(0, 0.7, (out, width))), weight(rng.normal(0, 0.7, (out, width)))
            layers.append(NeuronLayer(f"conv{k}", np.full(n, 2), np.tile([mean, h], n), np.repeat(np.arange(n), 2),
                                      np.tile([w_l, w_r], n), None if bias is None else np.full(n, bias),
                                      transformation=act))
        else:
            counts, source, w, owner = neighbours()
            eps = draw(st.sampled_from([None, 0.5]))
            self_w = -1 if eps is None else weight(1 + eps, learnable=False)
            owner = np.concatenate([owner, np.arange(n)])
            source = np.concatenate([source, np.arange(n)])
            w = np.concatenate([w, np.full(n, self_w)])
            order = np.argsort(owner, kind="stable")
            layers.append(NeuronLayer(f"conv{k}.agg", np.bincount(owner, minlength=n), np.full(source.size, h),
                                      source[order], w[order]))
            agg = len(layers) - 1
            hidden = draw(st.integers(1, 4))
            layers.append(dense(f"conv{k}.mlp", agg, weight(rng.normal(0, 0.7, (hidden, width))),
                                weight(rng.normal(0, 0.5, hidden)), "relu"))
            layers.append(dense(f"conv{k}", len(layers) - 1, weight(rng.normal(0, 0.7, (out, hidden))),
                                bias, act))
        h, width = len(layers) - 1, out

    samples = draw(st.integers(1, 3))
    sample_of = np.sort(rng.integers(0, samples, n))
    present = np.unique(sample_of)
    counts = np.bincount(np.searchsorted(present, sample_of), minlength=present.size)
    layers.append(NeuronLayer("pool", counts, np.full(n, h), np.argsort(sample_of, kind="stable"),
                              aggregation=draw(st.sampled_from(["sum", "mean"]))))
    out_dim = draw(st.integers(1, 2))
    s = present.size
    layers.append(NeuronLayer("out", np.ones(s, np.int64), np.full(s, len(layers) - 1), np.arange(s),
                              np.full(s, weight(rng.normal(0, 0.7, (out_dim, width)))),
                              np.full(s, weight(rng.normal(0, 0.5, out_dim))),
                              transformation=draw(st.sampled_from(["identity", "sigmoid"]))))
    return Graph(layers, weights, np.full(s, len(layers) - 1), np.arange(s))


@st.composite
def deep_chains(draw, max_depth: int = 12) -> Graph:
    """``deep_chain`` with drawn depth, width, skip length, weighted layers, aggregation and
    transformation (bounded ones, so that deep chains stay finite)."""
    depth = draw(st.integers(2, max_depth))
    return deep_chain(depth, width=draw(st.integers(1, 4)), dim=draw(st.integers(1, 3)),
                      weighted_layers=draw(st.sampled_from([None, 0, 1, depth // 2])),
                      skip=draw(st.integers(2, 4)), aggregation=draw(st.sampled_from(["sum", "mean", "max", "min"])),
                      transformation=draw(st.sampled_from(["tanh", "sigmoid", "identity", "relu"])),
                      seed=draw(st.integers(0, 2**16)))
