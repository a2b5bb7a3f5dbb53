"""The Vectorizer (thesis 5.1): one neuron layer becomes a handful of tensor ops.

For a layer with neurons ``j`` and edges ``e`` (inputs, in neuron order)::

    x   = GATHER(CONCAT(input layers), index)     # every edge's input value, edge order
    w   = GATHER(WEIGHTS(shape class), index)      # every edge's weight
    p   = LINEAR(w, x)                             # W_e . x_e
    a   = REDUCE(p, counts, aggregation)           # one row per neuron
    v   = TRANSFORM(ADD(a, GATHER(bias)), fn)

Edges whose inputs or weights have different shapes cannot share one batched
product (thesis 5.2.10 step 7), so they are split into groups by
``(input shape, weight shape)``; the groups' products are concatenated and
gathered back into edge order. Everything is computed on whole arrays: the
only Python loops run over layers and shape groups, never over neurons or edges.
"""
from __future__ import annotations

import re

import numpy as np

from ..sources.graph import NO_WEIGHT, FactLayer, Graph
from .grouping import CHUNK, row_dtype
from .ir import Node, Op, Program, compact_index, read_only
from .rewrite import Rewriter
from .prune import prune_unreachable

__all__ = ["vectorize"]


def _clean(base: str) -> str:
    """A name base made of word characters, not starting with a digit (layer names may have others)."""
    base = re.sub(r"\W+", "_", base).strip("_") or "v"
    return "_" + base if base[0].isdigit() else base


def _const(rw: Rewriter, base: str, array: np.ndarray) -> str:
    return rw.const(_clean(base), array)


def _add(rw: Rewriter, base: str, op: Op, srcs, count: int, shape, layer: str = "", **attrs) -> Node:
    return rw.emit(rw.fresh(_clean(base)), op, srcs, count, shape, layer, **attrs)


def _gather(rw: Rewriter, base: str, src: Node, index: np.ndarray, layer: str) -> Node:
    key = _const(rw, f"idx_{base}", index)
    return _add(rw, base, Op.GATHER, [src.name], len(index), src.shape, layer, index=key)


def _concat(rw: Rewriter, base: str, srcs: list[Node], layer: str) -> Node:
    if len(srcs) == 1:
        return srcs[0]
    return _add(rw, base, Op.CONCAT, [s.name for s in srcs], sum(s.count for s in srcs), srcs[0].shape, layer)


def _concat_index(rw: Rewriter, base: str, sources: list[Node], which, ordinal: np.ndarray,
                  layer: str, compacted: dict | None = None) -> Node:
    """GATHER(CONCAT(sources), offset[which] + ordinal): rows of several tensors, in any order.
    ``which(rows)`` gives the source of the rows ``rows`` (a slice); it is not called for a single source.
    ``compacted``: the stored index of each ordinal array met so far (``_compacted``)."""
    joined = _concat(rw, f"{base}_cat", sources, layer)
    if len(sources) == 1:
        return _gather(rw, base, joined, _compacted(ordinal, compacted), layer)
    offsets = np.concatenate([[0], np.cumsum([s.count for s in sources])])[:-1]
    # offsets[which] + ordinal a chunk at a time into one index of the stored type (NOTE: [chunks]).
    index = np.empty(ordinal.size, dtype=row_dtype(joined.count))
    for lo in range(0, ordinal.size, CHUNK):
        np.add(offsets[which(slice(lo, lo + CHUNK))], ordinal[lo:lo + CHUNK], out=index[lo:lo + CHUNK],
               casting="unsafe")
    return _gather(rw, base, joined, index, layer)


def _compacted(ordinal: np.ndarray, compacted: dict | None) -> np.ndarray:
    """``compact_index(ordinal)`` (int32 at once: no edge-sized int64 copy first), read-only, and a
    copy where that is the graph's own array (the program's stays its own). Made once per array of
    the graph: layers that read the same edges through one array (a GCN's: the template shares it)
    store one index, so that products-like keeps one 62M-edge index, not one per layer, and the
    passes see that they are the same by identity."""
    if compacted is not None and id(ordinal) in compacted and compacted[id(ordinal)][0] is ordinal:
        return compacted[id(ordinal)][1]
    index = compact_index(ordinal)
    index = read_only(index.copy() if index is ordinal else index)
    if compacted is not None:
        compacted[id(ordinal)] = (ordinal, index)  # the graph's array kept with it: its id stays its own
    return index


def vectorize(graph: Graph) -> Program:
    """Turn a validated :class:`Graph` into an unoptimized :class:`Program`.

    Only the neurons some output reaches are computed (``prune.py``: an unread neuron's
    backward can still put a NaN into a used weight's gradient). The nodes are emitted, in
    order, into an empty program by the one program editor (``rewrite.Rewriter``), which mints
    their names.
    """
    graph = prune_unreachable(graph)
    fact_shapes = {layer.name: tuple(layer.values.shape) for layer in graph.layers if isinstance(layer, FactLayer)}
    rw = Rewriter(Program((), {}, graph.weights, "", fact_shapes))
    values: list[Node] = []  # the value node of each graph layer
    compacted: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(ordinal) -> (ordinal, its stored index)
    weight_stacks: dict[tuple, tuple[Node, np.ndarray]] = {}  # shape -> (WEIGHTS node, weight -> row)
    weight_shapes = [w.shape for w in graph.weights]

    def weights_of_shape(shape: tuple) -> tuple[Node, np.ndarray]:
        if shape not in weight_stacks:
            members = [i for i, s in enumerate(weight_shapes) if s == shape]
            row = np.full(len(graph.weights), -1, dtype=np.int64)
            row[members] = np.arange(len(members))
            label = "x".join(map(str, shape)) or "scalar"
            node = _add(rw, f"w_{label}", Op.WEIGHTS, [], len(members), shape,
                        names=tuple(graph.weights[i].name for i in members))
            weight_stacks[shape] = (node, row)
        return weight_stacks[shape]

    weight_shape_id = {s: k for k, s in enumerate(dict.fromkeys(weight_shapes))}
    weight_cls = np.array([weight_shape_id[s] for s in weight_shapes] + [-1], dtype=np.int64)
    shape_of_cls = list(weight_shape_id)

    for index, layer in enumerate(graph.layers):
        name = layer.name
        if isinstance(layer, FactLayer):
            key = _const(rw, f"facts_{name}", layer.values)
            values.append(_add(rw, f"f_{name}", Op.FACT, [], layer.size, layer.value_shape, name,
                                const=key, fact_layer=name, unit=layer.unit))
            continue
        out_shape = graph.layer_shapes[index]
        src, ordinal, weight = layer.input_layer, layer.input_ordinal, layer.input_weight
        value_shape_id = {s: k for k, s in enumerate(dict.fromkeys(graph.layer_shapes[:index]))}
        value_cls = np.array([value_shape_id[s] for s in graph.layer_shapes[:index]], dtype=np.int64)
        # Shape groups: (value shape class, weight shape class) as one small integer per edge.
        n_weight_cls = len(shape_of_cls) + 1
        n_keys = len(value_shape_id) * n_weight_cls
        key_of_layer = value_cls * n_weight_cls  # + the weight's class + 1 (NO_WEIGHT (-1) -> class -1)
        group_keys, used = _one_group(key_of_layer, src, weight_cls + 1, weight)
        if group_keys is None:
            group_keys = np.flatnonzero(_edge_counts(key_of_layer, src, weight_cls + 1, weight, n_keys))
        if group_keys.size > 1:
            group_of_key = np.zeros(n_keys, dtype=np.int64)
            group_of_key[group_keys] = np.arange(group_keys.size)
            group_of_edge = _edge_groups(group_of_key, key_of_layer, src, weight_cls + 1, weight)
        del value_cls
        products: list[Node] = []
        order = []
        for g, key in enumerate(group_keys):
            w_cls = int(key % n_weight_cls) - 1
            if group_keys.size > 1:
                edges = np.flatnonzero(group_of_edge == g)
                order.append(edges)
                g_src, g_ordinal, g_weight = src[edges], ordinal[edges], weight[edges]
            else:  # every edge (no copies of the edge arrays)
                g_src, g_ordinal, g_weight = src, ordinal, weight
            tag = name if group_keys.size == 1 else f"{name}_g{g}"
            if used is None or group_keys.size > 1:
                used = np.flatnonzero(np.bincount(g_src, minlength=index))
            local = np.full(index, -1, dtype=np.int64)
            local[used] = np.arange(used.size)
            # (only the graph's own arrays are remembered: a group's rows are a temporary, not kept alive)
            x = _concat_index(rw, f"{tag}_x", [values[i] for i in used], lambda rows: local[g_src[rows]], g_ordinal,
                              name, compacted if g_ordinal is ordinal else None)
            if w_cls < 0:
                products.append(x)
                continue
            w_shape = shape_of_cls[w_cls]
            stack, row = weights_of_shape(w_shape)
            w = _gather(rw, f"{tag}_w", stack, compact_index(row)[g_weight], name)  # stored as int32: no int64 copy
            kind = "matmul" if len(w_shape) == 2 and x.shape != () else "mul"
            products.append(_add(rw, f"{tag}_lin", Op.LINEAR, [w.name, x.name], g_src.size, out_shape, name,
                                  kind=kind))
        if len(products) == 1:
            edge_values = products[0]
        else:
            # Back to edge order: row k of the concatenated products is edge order[k].
            position = np.empty(layer.n_edges, dtype=np.int64)
            position[np.concatenate(order)] = np.arange(layer.n_edges)
            joined = _concat(rw, f"{name}_products", products, name)
            edge_values = _gather(rw, f"{name}_edges", joined, position, name)
        counts = _const(rw, f"counts_{name}", layer.counts.copy())
        value = _add(rw, f"{name}_agg", Op.REDUCE, [edge_values.name], layer.size, out_shape, name,
                      aggregation=layer.aggregation, counts=counts)
        if np.any(layer.bias != NO_WEIGHT):
            value = _add_bias(rw, name, value, layer.bias, graph, weights_of_shape)
        if layer.transformation != "identity":
            value = _add(rw, f"{name}_out", Op.TRANSFORM, [value.name], layer.size, out_shape, name,
                          fn=layer.transformation)
        values.append(value)

    output_source = _local(graph.output_layer)
    out = _concat_index(rw, "output", [values[i] for i in np.unique(graph.output_layer)],
                        lambda rows: output_source[rows], graph.output_ordinal, "output")
    rw.output = out.name
    return rw.finish()


def _add_bias(rw: Rewriter, name: str, value: Node, bias: np.ndarray, graph: Graph, weights_of_shape) -> Node:
    shape = graph.weights[int(bias[bias != NO_WEIGHT][0])].shape  # validated: one bias shape per layer
    stack, row = weights_of_shape(shape)
    if np.all(bias != NO_WEIGHT):
        b = _gather(rw, f"{name}_bias", stack, row[bias], name)
    else:
        # Neurons without a bias read an appended row of -0.0: the exact additive identity
        # (-0.0 + x is x for every x, -0.0 included; 0.0 + -0.0 would be 0.0, and 1 / it +inf).
        zero = _add(rw, f"{name}_nobias", Op.FACT, [], 1, shape, name,
                     const=_const(rw, f"zeros_{name}", np.full((1,) + shape, -0.0)), fact_layer=None, unit=False)
        joined = _concat(rw, f"{name}_bias_cat", [stack, zero], name)
        b = _gather(rw, f"{name}_bias", joined, np.where(bias == NO_WEIGHT, stack.count, row[bias]), name)
    return _add(rw, f"{name}_biased", Op.ADD, [value.name, b.name], value.count, value.shape, name)


def _one_group(key_of_layer: np.ndarray, src: np.ndarray, key_of_weight: np.ndarray, weight: np.ndarray
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(group_keys, used)`` where the ranges of the edges' sources and weights prove one shape
    group (every layer in ``src.min() .. src.max()`` has one key, and every weight in ``weight.min()
    .. weight.max()`` one), and ``used`` the one source layer where that is all of them; else
    ``(None, None)``, and the edges' keys are counted. Four reductions instead of a pass of two
    gathers and a count per edge: a node-level GNN's layers read one layer with one weight shape."""
    if not src.size:
        return None, None
    s_lo, s_hi, w_lo, w_hi = int(src.min()), int(src.max()), int(weight.min()), int(weight.max())
    if w_lo < NO_WEIGHT:
        return None, None
    layer_keys = key_of_layer[s_lo:s_hi + 1]
    weight_keys = key_of_weight[max(w_lo, 0):w_hi + 1]
    if w_lo == NO_WEIGHT:  # reads the last entry
        weight_keys = np.append(weight_keys, key_of_weight[w_lo])
    if np.any(layer_keys != layer_keys[0]) or np.any(weight_keys != weight_keys[0]):
        return None, None
    return np.array([layer_keys[0] + weight_keys[0]]), (np.array([s_lo]) if s_lo == s_hi else None)


def _edge_keys(key_of_layer: np.ndarray, src: np.ndarray, key_of_weight: np.ndarray, weight: np.ndarray):
    """``(edges, keys)`` a chunk of edges at a time: each edge's shape-group key,
    ``key_of_layer[src] + key_of_weight[weight]``. At 100x PROTEINS a layer has 20M edges, and the
    keys of all of them at once made four int64 temporaries of 160 MB each, the vectorizer's peak
    (NOTE: [chunks])."""
    for lo in range(0, src.size, CHUNK):
        edges = slice(lo, lo + CHUNK)
        yield edges, key_of_layer[src[edges]] + key_of_weight[weight[edges]]


def _edge_counts(key_of_layer: np.ndarray, src: np.ndarray, key_of_weight: np.ndarray, weight: np.ndarray,
                 n_keys: int) -> np.ndarray:
    """How many edges have each shape-group key."""
    counts = np.zeros(n_keys, dtype=np.int64)
    for _, keys in _edge_keys(key_of_layer, src, key_of_weight, weight):
        counts += np.bincount(keys, minlength=n_keys)
    return counts


def _edge_groups(group_of_key: np.ndarray, key_of_layer: np.ndarray, src: np.ndarray, key_of_weight: np.ndarray,
                 weight: np.ndarray) -> np.ndarray:
    """Every edge's group, ``group_of_key`` of its shape-group key."""
    groups = np.empty(src.size, dtype=np.int32)  # a handful of groups
    for edges, keys in _edge_keys(key_of_layer, src, key_of_weight, weight):
        groups[edges] = group_of_key[keys]
    return groups


def _local(layers: np.ndarray) -> np.ndarray:
    """Rank of each entry among the distinct values (their position in a sorted CONCAT)."""
    return np.unique(layers, return_inverse=True)[1].reshape(-1)
