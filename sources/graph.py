"""The pre-grouped neuron graph: neurovec's input format.

A graph is a list of *layers* in topological order plus a list of *weights*.
Every neuron belongs to exactly one layer; a neuron is addressed by
``(layer index, ordinal)``.

A neuron of a :class:`NeuronLayer` computes (NeuraLogic's semantics)::

    value(n) = T( A_i (W_i . x_i) + b )

* ``x_i`` are the values of its inputs, in order (repeats allowed),
* ``W_i`` an optional per-input weight (see :func:`product_shape` for ``.``),
* ``A`` the layer's aggregation (``sum``, ``mean``, ``max``, ``min``, ``prod``),
* ``b`` an optional bias weight, ``T`` the layer's transformation.

A :class:`FactLayer` holds constant values. *Unit* facts are scalar ones
flagged as such: multiplying by a unit returns the weight itself (thesis 5.2.8),
which is exactly what a scalar 1.0 does under broadcasting.

The edges of a neuron layer are stored CSR-style in flat numpy arrays
(``counts`` per neuron, then ``input_layer``, ``input_ordinal`` and
``input_weight`` per edge), so graphs with millions of neurons are cheap to
build, validate and compile. :class:`neurovec.sources.GraphBuilder` builds the
same object neuron by neuron.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = [
    "AGGREGATIONS",
    "TRANSFORMATIONS",
    "GraphError",
    "Weight",
    "FactLayer",
    "NeuronLayer",
    "Graph",
    "product_shape",
]

AGGREGATIONS = ("sum", "mean", "max", "min", "prod")
# Elementwise unless noted; the torch implementations live in engines/functions.py.
TRANSFORMATIONS = (
    "identity", "sigmoid", "tanh", "relu", "leaky_relu", "exp", "log", "sqrt",
    "sign", "inverse", "reverse", "lukasiewicz", "softplus", "elu", "gelu",
    "softmax",  # over the last axis of a vector or matrix value
)

NO_WEIGHT = -1  # in input_weight / bias: the unit weight (no multiplication, no bias)


class GraphError(ValueError):
    """Raised for a malformed neuron graph; the message names the layer and neuron."""


@dataclass(frozen=True, eq=False)
class Weight:
    """A weight tensor: learnable parameter or fixed value.

    ``value`` is the initial (or fixed) value: shape ``()``, ``(d,)`` or ``(rows, cols)``.
    """

    name: str
    value: np.ndarray
    learnable: bool = True

    def __post_init__(self):
        object.__setattr__(self, "value", np.asarray(self.value, dtype=np.float64))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@dataclass(frozen=True, eq=False)
class FactLayer:
    """A layer of constant input values, ``values`` of shape ``(n, *value_shape)``."""

    name: str
    values: np.ndarray
    unit: bool = False

    def __post_init__(self):
        object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float64))

    @classmethod
    def units(cls, name: str, count: int) -> "FactLayer":
        """``count`` unit facts: identity under multiplication by a weight."""
        return cls(name, np.ones(count), unit=True)

    @property
    def size(self) -> int:
        return int(self.values.shape[0]) if self.values.ndim else 0

    @property
    def value_shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape[1:])


@dataclass(frozen=True, eq=False)
class NeuronLayer:
    """A group of computed neurons sharing aggregation, transformation and shape.

    Edge ``e`` of neuron ``j`` (``ptr[j] <= e < ptr[j + 1]``) reads neuron
    ``input_ordinal[e]`` of layer ``input_layer[e]`` (an index into
    ``Graph.layers``) and multiplies it by weight ``input_weight[e]`` (an index
    into ``Graph.weights``, or -1 for none). ``bias[j]`` is a weight index or -1.
    """

    name: str
    counts: np.ndarray
    input_layer: np.ndarray
    input_ordinal: np.ndarray
    input_weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    aggregation: str = "sum"
    transformation: str = "identity"

    def __post_init__(self):
        ints = lambda a: np.ascontiguousarray(a, dtype=np.int64).reshape(-1)  # noqa: E731
        object.__setattr__(self, "counts", ints(self.counts))
        object.__setattr__(self, "input_layer", ints(self.input_layer))
        object.__setattr__(self, "input_ordinal", ints(self.input_ordinal))
        n_edges = self.input_layer.shape[0]
        weight = np.full(n_edges, NO_WEIGHT) if self.input_weight is None else self.input_weight
        object.__setattr__(self, "input_weight", ints(weight))
        bias = np.full(self.counts.shape[0], NO_WEIGHT) if self.bias is None else self.bias
        object.__setattr__(self, "bias", ints(bias))

    @property
    def size(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.input_layer.shape[0])

    @property
    def ptr(self) -> np.ndarray:
        """CSR row pointer: the edges of neuron j are ``ptr[j]:ptr[j+1]``."""
        return np.concatenate([[0], np.cumsum(self.counts)])

    def edge_neuron(self, edges: np.ndarray | int) -> np.ndarray:
        """The neuron ordinal that owns each edge index."""
        return np.searchsorted(self.ptr, edges, side="right") - 1


def product_shape(weight: tuple[int, ...] | None, value: tuple[int, ...]) -> tuple[int, ...] | None:
    """Shape of ``W . x``; ``None`` if the shapes do not fit.

    * no weight: ``x``;
    * a scalar on either side: elementwise broadcast (so a unit fact times W is W);
    * a matrix weight ``(o, i)``: matrix product with ``x`` of shape ``(i,)`` or ``(i, k)``;
    * a vector weight ``(d,)`` with a vector ``x`` of shape ``(d,)``: elementwise product.
    """
    if weight is None:
        return value
    if weight == ():
        return value
    if value == ():
        return weight
    if len(weight) == 2:
        if len(value) in (1, 2) and value[0] == weight[1]:
            return (weight[0],) + value[1:]
        return None
    if len(weight) == 1 and value == weight:
        return value
    return None


@dataclass(frozen=True, eq=False)
class Graph:
    """A validated pre-grouped neuron graph.

    ``output_layer[k], output_ordinal[k]`` is the k-th output neuron. Construction
    validates everything (see :meth:`_validate`) and raises :class:`GraphError`.
    """

    layers: tuple
    weights: tuple = ()
    output_layer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    output_ordinal: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Filled in by validation: the value shape of every layer.
    layer_shapes: tuple = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "weights", tuple(self.weights))
        object.__setattr__(self, "output_layer", np.asarray(self.output_layer, np.int64).reshape(-1))
        object.__setattr__(self, "output_ordinal", np.asarray(self.output_ordinal, np.int64).reshape(-1))
        object.__setattr__(self, "layer_shapes", tuple(self._validate()))

    # -- lookup -----------------------------------------------------------------
    def layer_index(self, name: str) -> int:
        for i, layer in enumerate(self.layers):
            if layer.name == name:
                return i
        raise KeyError(f"no layer named {name!r}")

    def layer(self, name: str):
        return self.layers[self.layer_index(name)]

    @property
    def n_neurons(self) -> int:
        return sum(layer.size for layer in self.layers)

    @property
    def n_edges(self) -> int:
        return sum(layer.n_edges for layer in self.layers if isinstance(layer, NeuronLayer))

    def __repr__(self) -> str:
        return (f"Graph({len(self.layers)} layers, {self.n_neurons} neurons, {self.n_edges} edges, "
                f"{len(self.weights)} weights, {self.output_layer.size} outputs)")

    # -- validation -----------------------------------------------------------------
    def _validate(self) -> list[tuple[int, ...]]:
        names = [layer.name for layer in self.layers]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise GraphError(f"layer name {name!r} is used by layers {names.index(name)} and {i}")
        weight_names = [w.name for w in self.weights]
        seen: dict[str, int] = {}
        for i, w in enumerate(self.weights):
            if not isinstance(w, Weight):
                raise GraphError(f"weight {i} is a {type(w).__name__}, expected neurovec Weight")
            if w.name in seen:
                raise GraphError(f"weight name {w.name!r} is used by weights {seen[w.name]} and {i}")
            seen[w.name] = i
            if w.value.ndim > 2:
                raise GraphError(f"weight {w.name!r}: expected a scalar, vector or matrix (got shape {w.shape})")
            if not np.all(np.isfinite(w.value)):
                raise GraphError(f"weight {w.name!r} contains NaN or inf")
        weight_shapes = [w.shape for w in self.weights]
        sizes = np.array([layer.size for layer in self.layers], dtype=np.int64)
        shapes: list[tuple[int, ...]] = []
        for index, layer in enumerate(self.layers):
            if isinstance(layer, FactLayer):
                shapes.append(_validate_facts(layer))
            elif isinstance(layer, NeuronLayer):
                shapes.append(_validate_neurons(index, layer, self.layers, sizes, shapes,
                                                weight_shapes, weight_names))
            else:
                raise GraphError(f"layer {index} is a {type(layer).__name__}, expected FactLayer or NeuronLayer")
        self._validate_outputs(sizes, shapes)
        return shapes

    def _validate_outputs(self, sizes: np.ndarray, shapes: list) -> None:
        if self.output_layer.shape != self.output_ordinal.shape:
            raise GraphError("output_layer and output_ordinal must have the same length "
                             f"(got {self.output_layer.size} and {self.output_ordinal.size})")
        if self.output_layer.size == 0:
            raise GraphError("the graph has no outputs")
        bad = np.flatnonzero((self.output_layer < 0) | (self.output_layer >= len(self.layers)))
        if bad.size:
            raise GraphError(f"output {bad[0]} references missing layer index {self.output_layer[bad[0]]}")
        ordinal_ok = (self.output_ordinal >= 0) & (self.output_ordinal < sizes[self.output_layer])
        bad = np.flatnonzero(~ordinal_ok)
        if bad.size:
            k = bad[0]
            layer = self.layers[self.output_layer[k]]
            raise GraphError(f"output {k} references neuron {self.output_ordinal[k]} of layer "
                             f"{layer.name!r}, which has only {layer.size} neurons")
        # forward() returns all outputs stacked into one tensor, so they must share a shape.
        out_layers = np.unique(self.output_layer)
        out_shapes = {shapes[i] for i in out_layers}
        if len(out_shapes) > 1:
            described = ", ".join(f"{self.layers[i].name!r} {shapes[i]}" for i in out_layers)
            raise GraphError(f"output neurons must all have one shape (got {described})")


def _validate_facts(layer: FactLayer) -> tuple[int, ...]:
    where = f"fact layer {layer.name!r}"
    if layer.values.ndim == 0:
        raise GraphError(f"{where}: values must have a leading neuron axis (got a scalar)")
    if layer.values.ndim > 3:
        raise GraphError(f"{where}: values must be scalars, vectors or matrices (got shape {layer.values.shape[1:]})")
    if layer.size == 0:
        raise GraphError(f"{where} is empty")
    finite = np.isfinite(layer.values).reshape(layer.size, -1).all(axis=1)
    if not finite.all():
        raise GraphError(f"{where}, neuron {int(np.flatnonzero(~finite)[0])}: value contains NaN or inf")
    if layer.unit and (layer.values.ndim != 1 or not np.all(layer.values == 1.0)):
        raise GraphError(f"{where} is marked unit but its values are not scalar ones")
    return layer.value_shape


def _validate_neurons(index, layer, layers, sizes, shapes, weight_shapes, weight_names):
    where = f"layer {layer.name!r}"
    n, n_edges = layer.size, layer.n_edges
    if n == 0:
        raise GraphError(f"{where} is empty")
    if layer.aggregation not in AGGREGATIONS:
        raise GraphError(f"{where}: unknown aggregation {layer.aggregation!r} (expected one of {AGGREGATIONS})")
    if layer.transformation not in TRANSFORMATIONS:
        raise GraphError(f"{where}: unknown transformation {layer.transformation!r} "
                         f"(expected one of {TRANSFORMATIONS})")
    if layer.input_ordinal.size != n_edges or layer.input_weight.size != n_edges:
        raise GraphError(f"{where}: input_layer, input_ordinal and input_weight must have equal lengths "
                         f"(got {n_edges}, {layer.input_ordinal.size}, {layer.input_weight.size})")
    if layer.bias.size != n:
        raise GraphError(f"{where}: bias must have one entry per neuron (got {layer.bias.size} for {n})")
    if np.any(layer.counts < 1):
        j = int(np.flatnonzero(layer.counts < 1)[0])
        raise GraphError(f"{where}, neuron {j}: has no inputs (every computed neuron needs at least one)")
    if int(layer.counts.sum()) != n_edges:
        raise GraphError(f"{where}: counts sum to {int(layer.counts.sum())} but there are {n_edges} inputs")

    def fail(edges: np.ndarray, problem: str):
        e = int(edges[0])
        j = int(layer.edge_neuron(e))
        raise GraphError(f"{where}, neuron {j}, input {e - int(layer.ptr[j])}: {problem(e)}")

    src = layer.input_layer
    bad = np.flatnonzero((src < 0) | (src >= len(layers)))
    if bad.size:
        fail(bad, lambda e: f"references missing layer index {src[e]}")
    bad = np.flatnonzero(src == index)
    if bad.size:
        fail(bad, lambda e: f"references neuron {layer.input_ordinal[e]} of its own layer; neurons of one "
                            "layer must be independent")
    bad = np.flatnonzero(src > index)
    if bad.size:
        fail(bad, lambda e: f"references later layer {layers[src[e]].name!r} (a cycle or a backward "
                            "reference: layers must be in topological order)")
    ordinal = layer.input_ordinal
    bad = np.flatnonzero((ordinal < 0) | (ordinal >= sizes[src]))
    if bad.size:
        fail(bad, lambda e: f"references missing neuron {ordinal[e]} of layer {layers[src[e]].name!r} "
                            f"(it has {sizes[src[e]]} neurons)")
    n_weights = len(weight_shapes)
    weight = layer.input_weight
    bad = np.flatnonzero((weight < NO_WEIGHT) | (weight >= n_weights))
    if bad.size:
        fail(bad, lambda e: f"references missing weight index {weight[e]} (there are {n_weights})")
    bad_bias = np.flatnonzero((layer.bias < NO_WEIGHT) | (layer.bias >= n_weights))
    if bad_bias.size:
        j = int(bad_bias[0])
        raise GraphError(f"{where}, neuron {j}: bias references missing weight index {layer.bias[j]}")

    # Shapes: one check per distinct (input layer shape, weight shape) pair, not per edge.
    shape_ids, shape_list = _shape_classes([shapes[i] for i in range(index)])
    wshape_ids, wshape_list = _shape_classes(weight_shapes)
    edge_value_cls = shape_ids[src]
    edge_weight_cls = np.where(weight >= 0, wshape_ids[np.maximum(weight, 0)] if n_weights else 0, -1)
    pairs, first = np.unique(np.stack([edge_value_cls, edge_weight_cls], 1), axis=0, return_index=True)
    out_shape = None
    for (value_cls, weight_cls), e in zip(pairs, first):
        value_shape = shape_list[value_cls]
        w_shape = None if weight_cls < 0 else wshape_list[weight_cls]
        result = product_shape(w_shape, value_shape)
        if result is None:
            fail([e], lambda e: f"weight {weight_names[weight[e]]!r} of shape {w_shape} does not fit the "
                                f"value of layer {layers[src[e]].name!r} with shape {value_shape}")
        if out_shape is None:
            out_shape, out_edge = result, e
        elif result != out_shape:
            fail([e], lambda e: f"weighted input has shape {result}, but input {int(out_edge)} of the layer "
                                f"gives {out_shape}: all weighted inputs of a layer must have one shape")
    has_bias = layer.bias >= 0
    if has_bias.any():
        bias_cls = np.where(has_bias, wshape_ids[np.maximum(layer.bias, 0)], -1)
        distinct = np.unique(bias_cls[has_bias])
        if distinct.size > 1:
            j = int(np.flatnonzero(bias_cls == distinct[1])[0])
            raise GraphError(f"{where}, neuron {j}: bias {weight_names[layer.bias[j]]!r} has shape "
                             f"{wshape_list[distinct[1]]}, but other biases of the layer have shape "
                             f"{wshape_list[distinct[0]]}: a layer's biases must share one shape")
        for cls in distinct:
            shape = wshape_list[cls]
            if shape != () and shape != out_shape:
                j = int(np.flatnonzero(bias_cls == cls)[0])
                raise GraphError(f"{where}, neuron {j}: bias {weight_names[layer.bias[j]]!r} has shape "
                                 f"{shape} but the neuron's value has shape {out_shape}")
    if layer.transformation == "softmax" and out_shape == ():
        raise GraphError(f"{where}: softmax needs vector or matrix values (got scalars)")
    return out_shape


def _shape_classes(shapes: Sequence[tuple]) -> tuple[np.ndarray, list[tuple]]:
    """Map each shape to a small integer id; returns (ids, distinct shapes)."""
    distinct: dict[tuple, int] = {}
    ids = np.array([distinct.setdefault(s, len(distinct)) for s in shapes], dtype=np.int64)
    return ids, list(distinct)
