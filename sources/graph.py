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

Input is checked strictly when a layer, weight or graph is constructed:
indices, ordinals and counts must be integer arrays, values real floating or
integer arrays; nothing is rounded, truncated or cast silently. The arrays a
layer keeps are read-only and its own: an array passed in is copied unless the
dtype conversion already made a fresh one, so changing the caller's array later
cannot change a validated graph. A builder of big graphs can hand its freshly
built arrays over without a copy with ``copy=False`` (they then become read-only).
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field
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


_INT64_MAX = np.iinfo(np.int64).max
_INT64 = np.dtype(np.int64)


def _owned(array: np.ndarray, source, copy: bool = True) -> np.ndarray:
    """``array`` as a read-only array that nobody else can write to.

    ``array`` came from ``np.asarray(source, ...)``. A fresh conversion is kept; the
    caller's own array (or a view of another buffer) is copied, unless it is already
    frozen, e.g. the array of another validated layer: sharing that costs no memory.
    ``copy=False``: the caller hands its array over and it is only made read-only.
    """
    if copy and (array is source or array.base is not None) and not _frozen(array):
        array = array.copy()
    array.flags.writeable = False
    return array


def _frozen(array: np.ndarray) -> bool:
    """True if no one can write to ``array``: it and every array it views are read-only."""
    while isinstance(array, np.ndarray):
        if array.flags.writeable:
            return False
        if array.base is None:
            return True
        array = array.base
    return False  # a view of a foreign buffer (a memory map, a torch tensor): it may change


def integer_array(value, where: str, field: str, copy: bool = True) -> np.ndarray:
    """``value`` as a private read-only 1-D int64 array; a :class:`GraphError` names ``where`` and ``field``.

    Accepts signed or unsigned integer arrays (and lists of Python ints). Floats
    (even integral ones), booleans, complex numbers, strings and integers beyond
    int64 are refused rather than cast.
    """
    if type(value) is np.ndarray and value.dtype is _INT64 and value.ndim == 1 and value.flags.c_contiguous:
        return _owned(value, value, copy)   # already what is asked for: no conversion, nothing to check
    array = np.asarray(value)
    problem = f"{where}, {field}"
    if array.ndim != 1:
        raise GraphError(f"{problem}: expected a 1-D array (got shape {array.shape})")
    if array.size == 0:  # np.asarray([]) is float64; an empty list has no wrong values
        return _owned(np.zeros(0, np.int64), None)
    kind = array.dtype.kind
    if kind == "u":
        too_big = np.flatnonzero(array > _INT64_MAX)
        if too_big.size:
            k = int(too_big[0])
            raise GraphError(f"{problem}: value {int(array[k])} at position {k} is beyond the int64 range")
    elif kind == "O":  # numpy keeps Python ints beyond int64 as objects
        for k, v in enumerate(array.tolist()):
            if isinstance(v, int) and not isinstance(v, bool) and not -_INT64_MAX - 1 <= v <= _INT64_MAX:
                raise GraphError(f"{problem}: value {v} at position {k} is beyond the int64 range")
        raise GraphError(f"{problem}: expected an integer array (got {_describe(array)})")
    elif kind != "i":
        raise GraphError(f"{problem}: expected an integer array (got {_describe(array)})")
    return _owned(np.asarray(array, dtype=np.int64, order="C"), value, copy)


def real_array(value, where: str, field: str, copy: bool = True) -> np.ndarray:
    """``value`` as a private read-only float64 array.

    Refuses what float64 cannot hold exactly: complex, boolean and non-numeric
    input, floats wider than 64 bits, and integers beyond 2**53.
    """
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind not in "iuf" or (kind == "f" and array.dtype.itemsize > 8):
        got = f"{array.dtype}, wider than float64" if kind == "f" else _describe(array)
        raise GraphError(f"{where}, {field}: expected real floating or integer values (got {got})")
    if kind in "iu" and array.size:
        flat = array.reshape(-1)
        inexact = np.flatnonzero((flat > 2 ** 53) | (flat < -2 ** 53))
        if inexact.size:
            k = int(inexact[0])
            raise GraphError(f"{where}, {field}: integer {flat[k]} at position {k} is beyond +-2**53, "
                             "where float64 no longer holds every integer exactly")
    return _owned(np.asarray(array, dtype=np.float64, order="C"), value, copy)


def _describe(array: np.ndarray) -> str:
    """The dtype, and for a wrong kind of number the first value it would have lost."""
    kind = array.dtype.kind
    flat = array.reshape(-1)
    if kind == "f":
        fractional = np.flatnonzero(flat != np.trunc(flat))
        if fractional.size:
            k = int(fractional[0])
            return f"{array.dtype}, e.g. {flat[k].item()!r} at position {k}, which would be truncated"
        return f"{array.dtype}; pass integers, e.g. array.astype(np.int64), if the values are whole"
    if kind == "c":
        imaginary = np.flatnonzero(flat.imag != 0)
        at = f", e.g. {flat[int(imaginary[0])].item()!r} at position {int(imaginary[0])}" if imaginary.size else ""
        return f"complex {array.dtype}{at}, whose imaginary part would be dropped"
    if kind == "b":
        return "booleans"
    if kind == "O":
        return "Python objects, e.g. " + (repr(flat[0]) if flat.size else "none")
    return str(array.dtype)


@dataclass(frozen=True, eq=False)
class Weight:
    """A weight tensor: learnable parameter or fixed value.

    ``value`` is the initial (or fixed) value: shape ``()``, ``(d,)`` or ``(rows, cols)``.
    """

    name: str
    value: np.ndarray
    learnable: bool = True

    def __post_init__(self):
        value = real_array(self.value, f"weight {self.name!r}", "value")
        object.__setattr__(self, "value", value)
        # Whether every value is finite, found once: the value is private and read-only, and a template's weights are
        # shared by every graph grounded from it, each of which checks them (Graph._validate).
        object.__setattr__(self, "_finite", bool(np.isfinite(value).all()) if value.size <= _SMALL_WEIGHT else None)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def finite(self) -> bool:
        """No NaN or inf among the values."""
        if self._finite is None:   # a large value: checked when asked, then kept
            object.__setattr__(self, "_finite", bool(np.isfinite(self.value).all()))
        return self._finite


@dataclass(frozen=True, eq=False)
class FactLayer:
    """A layer of constant input values, ``values`` of shape ``(n, *value_shape)``."""

    name: str
    values: np.ndarray
    unit: bool = False
    copy: InitVar[bool] = True  # False: take the caller's array without a copy (it becomes read-only)

    def __post_init__(self, copy: bool):
        object.__setattr__(self, "values", real_array(self.values, f"fact layer {self.name!r}", "values", copy))

    @classmethod
    def units(cls, name: str, count: int) -> "FactLayer":
        """``count`` unit facts: identity under multiplication by a weight."""
        if not isinstance(count, (int, np.integer)) or isinstance(count, (bool, np.bool_)):
            raise GraphError(f"fact layer {name!r}, count: expected an integer (got {type(count).__name__})")
        return cls(name, np.ones(count), unit=True)

    @property
    def size(self) -> int:
        return int(self.values.shape[0]) if self.values.ndim else 0

    @property
    def value_shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape[1:])


_NEURON_ARRAYS = ("counts", "input_layer", "input_ordinal", "input_weight", "bias")


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
    copy: InitVar[bool] = True  # False: take the caller's arrays without a copy (they become read-only)

    def __post_init__(self, copy: bool):
        fields = self.__dict__   # frozen: set through __dict__, as object.__setattr__ would
        if fields["input_weight"] is None:
            fields["input_weight"] = np.full(np.shape(fields["input_layer"])[:1], NO_WEIGHT, dtype=np.int64)
        if fields["bias"] is None:
            fields["bias"] = np.full(np.shape(fields["counts"])[:1], NO_WEIGHT, dtype=np.int64)
        for field_name in _NEURON_ARRAYS:
            value = fields[field_name]
            if not copy and type(value) is np.ndarray and value.dtype is _INT64 and value.ndim == 1 \
                    and value.flags.c_contiguous:   # handed over as they are (a grounding's hundreds of layers)
                value.flags.writeable = False
            else:
                fields[field_name] = integer_array(value, f"layer {self.name!r}", field_name, copy)

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


def prepend_inputs(counts: np.ndarray, where: np.ndarray, columns: list, firsts: list) -> tuple:
    """Insert one input edge at the front of the neurons ``where`` (a boolean mask over neurons):
    ``firsts[c]`` (a value per such neuron, or one for all) into the CSR column ``columns[c]``.
    Returns the new per-neuron input counts and the grown columns (int64)."""
    new_counts = counts + where
    ptr = np.concatenate([[0], np.cumsum(new_counts)])
    regular = np.ones(int(ptr[-1]), dtype=bool)
    regular[ptr[:-1][where]] = False
    grown = []
    for old, first in zip(columns, firsts):
        new = np.empty(regular.size, dtype=np.int64)
        new[regular] = old
        new[~regular] = first
        grown.append(new)
    return new_counts, grown


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
        object.__setattr__(self, "output_layer", integer_array(self.output_layer, "graph", "output_layer"))
        object.__setattr__(self, "output_ordinal", integer_array(self.output_ordinal, "graph", "output_ordinal"))
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
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, (FactLayer, NeuronLayer)):
                raise GraphError(f"layer {i} is a {type(layer).__name__} ({layer!r:.60}), expected a neurovec "
                                 "FactLayer or NeuronLayer (build the list from FactLayer(...), FactLayer.units(...) "
                                 "and NeuronLayer(...))")
        first_of: dict[str, int] = {}
        for i, layer in enumerate(self.layers):
            first = first_of.setdefault(layer.name, i)
            if first != i:
                raise GraphError(f"layer name {layer.name!r} is used by layers {first} and {i}")
        # The weights are checked one by one, in order, only where a whole pass finds a problem: a NaN or inf, a name
        # used twice, a value of more than two dimensions.
        check_finite = not _all_finite(self.weights)
        if check_finite or len({w.name for w in self.weights}) != len(self.weights) or \
                any(w.value.ndim > 2 for w in self.weights):
            self._validate_weights(check_finite)
        sizes = np.array([layer.size for layer in self.layers], dtype=np.int64)
        # First all the small neuron layers at once (_SmallLayers); only where that finds a problem is every layer
        # checked on its own, in order, so that the error is the one that names the first bad layer and neuron.
        shapes = _SmallLayers.validate(self.layers, sizes, self.weights)
        if shapes is None:
            known = _Known(self.layers, sizes, self.weights)
            for index, layer in enumerate(self.layers):
                if isinstance(layer, FactLayer):
                    known.add_shape(_validate_facts(layer))
                elif isinstance(layer, NeuronLayer):
                    known.add_shape(_validate_neurons(index, layer, known))
                else:
                    raise GraphError(f"layer {index} is a {type(layer).__name__}, expected FactLayer or NeuronLayer")
            shapes = known.shapes
        self._validate_outputs(sizes, shapes)
        return shapes

    def _validate_weights(self, check_finite: bool) -> None:
        """Raise the error for the first weight that is no Weight, reuses a name, has more than two dimensions or
        (with ``check_finite``) holds a NaN or inf."""
        seen: dict[str, int] = {}
        for i, w in enumerate(self.weights):
            if not isinstance(w, Weight):
                raise GraphError(f"weight {i} is a {type(w).__name__}, expected neurovec Weight")
            if w.name in seen:
                raise GraphError(f"weight name {w.name!r} is used by weights {seen[w.name]} and {i}")
            seen[w.name] = i
            if w.value.ndim > 2:
                raise GraphError(f"weight {w.name!r}: expected a scalar, vector or matrix (got shape {w.shape})")
            if check_finite and not np.all(np.isfinite(w.value)):
                raise GraphError(f"weight {w.name!r} contains NaN or inf")

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
    # A NaN or inf anywhere makes the sum NaN or inf; a finite sum needs no per-value pass (where the sum
    # overflows, the values are looked at one by one).
    if not np.isfinite(layer.values.sum()):
        finite = np.isfinite(layer.values).reshape(layer.size, -1).all(axis=1)
        if not finite.all():
            raise GraphError(f"{where}, neuron {int(np.flatnonzero(~finite)[0])}: value contains NaN or inf")
    if layer.unit and (layer.values.ndim != 1 or not np.all(layer.values == 1.0)):
        raise GraphError(f"{where} is marked unit but its values are not scalar ones")
    return layer.value_shape


class _Known:
    """What validation knows of the layers before the current one and of the weights.

    Shapes are numbered as they first appear (small ints), so that a layer's checks
    look up the shape classes of the layers it reads instead of going over all earlier
    layers: validation is linear in layers and edges, not quadratic in layers.
    """

    def __init__(self, layers, sizes: np.ndarray, weights):
        self.layers, self.sizes = layers, sizes
        self.weight_names = [w.name for w in weights]
        self.weight_shapes = [w.value.shape for w in weights]
        self.wshape_ids, self.wshape_list = _shape_classes(self.weight_shapes)
        self.shapes: list[tuple[int, ...]] = []  # the value shape of every layer validated so far
        self.shape_ids = np.zeros(len(layers), dtype=np.int64)  # their classes; the rest is not yet known
        self._shape_class: dict[tuple, int] = {}
        self.shape_list: list[tuple] = []

    def add_shape(self, shape: tuple[int, ...]) -> None:
        cls = self._shape_class.setdefault(shape, len(self._shape_class))
        if cls == len(self.shape_list):
            self.shape_list.append(shape)
        self.shape_ids[len(self.shapes)] = cls
        self.shapes.append(shape)

    def weight_classes(self, weight: np.ndarray) -> np.ndarray:
        """The shape class of each weight index (-1: no weight)."""
        return np.where(weight >= 0, self.wshape_ids[np.maximum(weight, 0)] if self.wshape_ids.size else 0, -1)


def _all_finite(weights) -> bool:
    """True if every item is a :class:`Weight` and no value holds a NaN or inf (each weight knows, see
    :attr:`Weight.finite`)."""
    return all(isinstance(w, Weight) for w in weights) and all(w.finite for w in weights)


_SMALL_WEIGHT = 4096   # values: weights up to this size are checked for NaN and inf when made, larger ones when asked
_SMALL_LAYER = 1 << 16  # inputs: neuron layers up to this size are checked together (_SmallLayers),
_SMALL_TOTAL = 1 << 22  # up to this many inputs in all (the copies of their arrays stay small)


class _SmallLayers:
    """The checks of :func:`_validate_neurons` for all the small neuron layers of a graph at once.

    A layer's checks are a dozen numpy calls whatever its size; a grounded template has hundreds of small layers
    (a rule, a relation, an aggregation), where those calls would cost more than the rest of the grounding. Here
    the small layers' arrays are concatenated and checked in whole arrays (:meth:`check`: counts, the ranges of
    inputs and biases). Their value shapes are then taken from each layer's first input, in layer order, and
    checked for every input at once afterwards: each input's (value shape, weight shape) pair must give its
    layer's shape, each bias fit it. Layers of more than ``_SMALL_LAYER`` inputs, and those past ``_SMALL_TOTAL``
    inputs in all, are checked one by one, as before, without a copy of their arrays (their checks cost more than
    the dozen numpy calls' overhead).

    Only the happy path is whole-array: :meth:`validate` returns None where any check fails, and the caller then
    checks every layer on its own, in order, which raises the error naming the first bad layer, neuron and input.
    """

    def __init__(self, index: list, edges: np.ndarray, src: np.ndarray, weight_cls: np.ndarray, bias_cls: list):
        self.position = dict(zip(index, range(len(index))))   # layer index -> position among the small layers
        self.edges = edges              # the number of inputs of each
        self.src, self.weight_cls = src, weight_cls   # of every input: the layer it reads, its weight's class (-1)
        starts = np.cumsum(edges) - edges
        self.first = list(zip(src[starts].tolist(), weight_cls[starts].tolist()))   # each layer's first input
        self.bias_cls = bias_cls        # each layer's distinct bias classes

    @classmethod
    def validate(cls, layers, sizes: np.ndarray, weights) -> list | None:
        """The value shape of every layer, or None where some check failed."""
        known = _Known(layers, sizes, weights)
        small = cls.check(layers, known)
        if small is None:
            return None
        shapes, wshape_list = known.shapes, known.wshape_list
        out = []   # the shape class of each small layer
        try:
            for index, layer in enumerate(layers):
                if isinstance(layer, FactLayer):
                    known.add_shape(_validate_facts(layer))
                    continue
                p = small.position.get(index)
                if p is None:
                    known.add_shape(_validate_neurons(index, layer, known))
                    continue
                src, weight_cls = small.first[p]
                shape = product_shape(None if weight_cls < 0 else wshape_list[weight_cls], shapes[src])
                if shape is None or (layer.transformation == "softmax" and shape == ()):
                    return None
                biases = small.bias_cls[p]
                if biases and (len(biases) > 1 or wshape_list[biases[0]] not in ((), shape)):
                    return None
                known.add_shape(shape)
                out.append(known.shape_ids[index])
        except GraphError:
            return None
        return known.shapes if small.shapes_agree(np.array(out, dtype=np.int64), known) else None

    @classmethod
    def check(cls, layers, known: _Known) -> "_SmallLayers | None":
        """The small layers' checks that need no shapes; None where one fails (or there are no small layers)."""
        index, total = [], 0
        for i, layer in enumerate(layers):
            if isinstance(layer, NeuronLayer):
                n_edges = layer.input_layer.shape[0]
                if n_edges <= _SMALL_LAYER and total + n_edges <= _SMALL_TOTAL:
                    index.append(i)
                    total += n_edges
        if not index:
            return None
        chosen = [layers[i] for i in index]
        n = np.array([layer.counts.shape[0] for layer in chosen], dtype=np.int64)
        e = np.array([layer.input_layer.shape[0] for layer in chosen], dtype=np.int64)
        if int(n.min()) == 0 or any(
                layer.aggregation not in AGGREGATIONS or layer.transformation not in TRANSFORMATIONS
                or layer.input_ordinal.shape[0] != layer.input_layer.shape[0]
                or layer.input_weight.shape[0] != layer.input_layer.shape[0]
                or layer.bias.shape[0] != layer.counts.shape[0] for layer in chosen):
            return None
        counts = np.concatenate([layer.counts for layer in chosen])
        if int(counts.min()) < 1 or not np.array_equal(np.add.reduceat(counts, np.cumsum(n) - n), e):
            return None
        src = np.concatenate([layer.input_layer for layer in chosen])
        if int(src.min()) < 0 or np.any(src >= np.repeat(np.array(index, dtype=np.int64), e)):
            return None   # a missing layer, the own one or a later one
        ordinal = np.concatenate([layer.input_ordinal for layer in chosen])
        if int(ordinal.min()) < 0 or np.any(ordinal >= known.sizes[src]):
            return None
        weight = np.concatenate([layer.input_weight for layer in chosen])
        bias = np.concatenate([layer.bias for layer in chosen])
        n_weights = len(known.weight_shapes)
        if (int(weight.min()) < NO_WEIGHT or int(weight.max()) >= n_weights
                or int(bias.min()) < NO_WEIGHT or int(bias.max()) >= n_weights):
            return None
        # The distinct bias classes of each layer (biases are few: most layers have none).
        bias_cls = [[] for _ in index]
        has_bias = np.flatnonzero(bias >= 0)
        if has_bias.size:
            n_classes = len(known.wshape_list)
            code = np.repeat(np.arange(len(index)), n)[has_bias] * n_classes + known.wshape_ids[bias[has_bias]]
            for c in np.unique(code).tolist():
                bias_cls[c // n_classes].append(c % n_classes)
        return cls(index, e, src, known.weight_classes(weight), bias_cls)

    def shapes_agree(self, out: np.ndarray, known: _Known) -> bool:
        """Whether every input of every small layer, with its weight, gives the layer's shape class ``out``."""
        n_classes = len(known.wshape_list) + 1
        pair = known.shape_ids[self.src] * n_classes + (self.weight_cls + 1)   # (value class, weight class)
        present = np.flatnonzero(np.bincount(pair))
        result = np.full(int(present[-1]) + 1, -1, dtype=np.int64)   # the class of each pair's product
        for code in present.tolist():
            value_cls, weight_cls = divmod(code, n_classes)
            shape = product_shape(None if weight_cls == 0 else known.wshape_list[weight_cls - 1],
                                  known.shape_list[value_cls])
            result[code] = known.shape_list.index(shape) if shape in known.shape_list else -1
        return bool(np.array_equal(result[pair], np.repeat(out, self.edges)))


def _validate_neurons(index: int, layer: NeuronLayer, known: _Known) -> tuple[int, ...]:
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

    # Whole-array checks first: a few passes over the edges (min, max), no per-edge temporaries where
    # the layer reads one layer. Only where they find a problem do the detailed checks run, to name
    # the first offending neuron and input (the same message as a per-edge check would give).
    src, ordinal, weight = layer.input_layer, layer.input_ordinal, layer.input_weight
    sizes, n_weights = known.sizes, len(known.weight_shapes)
    src_low, src_high = int(src.min()), int(src.max())
    ok = 0 <= src_low and src_high < index
    if ok:
        if src_low == src_high:
            ok = int(ordinal.min()) >= 0 and int(ordinal.max()) < sizes[src_low]
        else:
            ok = int(ordinal.min()) >= 0 and not np.any(ordinal >= sizes[src])
    weight_low, weight_high = int(weight.min()), int(weight.max())
    ok = ok and weight_low >= NO_WEIGHT and weight_high < n_weights
    if not ok:
        _fail_inputs(index, layer, known)
    bad_bias = np.flatnonzero((layer.bias < NO_WEIGHT) | (layer.bias >= n_weights))
    if bad_bias.size:
        j = int(bad_bias[0])
        raise GraphError(f"{where}, neuron {j}: bias references missing weight index {layer.bias[j]}")

    # Shapes: one check per distinct (input layer shape, weight shape) pair, not per edge.
    out_shape = None
    for value_cls, weight_cls in _shape_pairs(layer, src_low, src_high, weight_low, weight_high, known):
        value_shape = known.shape_list[value_cls]
        w_shape = None if weight_cls < 0 else known.wshape_list[weight_cls]
        result = product_shape(w_shape, value_shape)
        if result is None or (out_shape is not None and result != out_shape):
            _fail_shapes(layer, known)
        out_shape = result
    if (layer.bias >= 0).any():
        _check_biases(layer, out_shape, known)
    if layer.transformation == "softmax" and out_shape == ():
        raise GraphError(f"{where}: softmax needs vector or matrix values (got scalars)")
    return out_shape


def _check_biases(layer: NeuronLayer, out_shape: tuple, known: _Known) -> None:
    """Raise the error for the first bias whose shape differs from another's or does not fit the value."""
    where = f"layer {layer.name!r}"
    has_bias = layer.bias >= 0
    if has_bias.any():
        wshape_ids, wshape_list, weight_names = known.wshape_ids, known.wshape_list, known.weight_names
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


def _present(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """The distinct values of ``values`` (all in ``[low, high]``), sorted: a count per value where the
    range is no longer than the array, a sort where it is (so neither the range nor a sort dominates)."""
    if high - low < values.size:
        return np.flatnonzero(np.bincount(values - low)) + low
    return np.unique(values)


def _shape_pairs(layer, src_low, src_high, weight_low, weight_high, known: _Known) -> list[tuple[int, int]]:
    """The distinct (value shape class, weight shape class or -1) pairs of the layer's inputs, in
    lexicographic order. A layer that reads one layer, or whose weights have one shape, needs no
    per-edge pass beyond the distinct layers or weights it reads; others one small-int code per edge."""
    src, weight, n_edges = layer.input_layer, layer.input_weight, layer.n_edges
    if src_low == src_high:
        value_classes = known.shape_ids[[src_low]]
    else:
        value_classes = np.unique(known.shape_ids[_present(src, src_low, src_high)])
    if weight_high < 0:
        weight_classes = np.array([-1])
    else:
        # The weights between the least and the greatest used: if they have one shape, that shape is present.
        low = max(weight_low, 0)
        in_range = np.unique(known.wshape_ids[low:weight_high + 1]) if weight_high - low < n_edges else None
        if in_range is not None and in_range.size == 1:
            weight_classes = np.concatenate([[-1] if weight_low < 0 else [], in_range]).astype(np.int64)
        else:
            weight_classes = np.unique(known.weight_classes(_present(weight, weight_low, weight_high)))
    if value_classes.size == 1 or weight_classes.size == 1:
        return [(v, w) for v in value_classes.tolist() for w in weight_classes.tolist()]
    n_classes = len(known.wshape_list) + 1
    code = known.shape_ids[src] * n_classes + (known.weight_classes(weight) + 1)
    present = np.flatnonzero(np.bincount(code))
    return list(zip((present // n_classes).tolist(), (present % n_classes - 1).tolist()))


def _fail_at(layer, where: str, edges, problem):
    e = int(edges[0])
    j = int(layer.edge_neuron(e))
    raise GraphError(f"{where}, neuron {j}, input {e - int(layer.ptr[j])}: {problem(e)}")


def _fail_inputs(index: int, layer: NeuronLayer, known: _Known):
    """Raise the error for the first input that references a missing or later layer, neuron or weight."""
    where = f"layer {layer.name!r}"
    layers, sizes, n_weights = known.layers, known.sizes, len(known.weight_shapes)
    src = layer.input_layer
    bad = np.flatnonzero((src < 0) | (src >= len(layers)))
    if bad.size:
        _fail_at(layer, where, bad, lambda e: f"references missing layer index {src[e]}")
    bad = np.flatnonzero(src == index)
    if bad.size:
        _fail_at(layer, where, bad, lambda e: f"references neuron {layer.input_ordinal[e]} of its own layer; "
                                              "neurons of one layer must be independent")
    bad = np.flatnonzero(src > index)
    if bad.size:
        _fail_at(layer, where, bad, lambda e: f"references later layer {layers[src[e]].name!r} (a cycle or a "
                                              "backward reference: layers must be in topological order)")
    ordinal = layer.input_ordinal
    bad = np.flatnonzero((ordinal < 0) | (ordinal >= sizes[src]))
    if bad.size:
        _fail_at(layer, where, bad, lambda e: f"references missing neuron {ordinal[e]} of layer "
                                              f"{layers[src[e]].name!r} (it has {sizes[src[e]]} neurons)")
    weight = layer.input_weight
    bad = np.flatnonzero((weight < NO_WEIGHT) | (weight >= n_weights))
    if bad.size:
        _fail_at(layer, where, bad, lambda e: f"references missing weight index {weight[e]} (there are "
                                              f"{n_weights})")
    raise AssertionError(f"{where}: the whole-array input checks failed but no input is wrong")  # pragma: no cover


def _fail_shapes(layer: NeuronLayer, known: _Known):
    """Raise the error for the first input whose weight does not fit its value, or whose product's shape
    differs from the layer's first (in the order of (value shape, weight shape) classes)."""
    where = f"layer {layer.name!r}"
    src, weight, n_edges = layer.input_layer, layer.input_weight, layer.n_edges
    # One small-int code per (value class, weight class) pair, in their lexicographic order: the pairs
    # present and the first edge of each come from bincount and minimum.at, with no sort.
    n_classes = len(known.wshape_list) + 1
    code = known.shape_ids[src] * n_classes + (known.weight_classes(weight) + 1)
    present = np.flatnonzero(np.bincount(code))
    first = np.full(present[-1] + 1, n_edges, dtype=np.int64)
    np.minimum.at(first, code, np.arange(n_edges))
    out_shape = out_edge = None
    for pair in present.tolist():
        value_cls, weight_cls, e = pair // n_classes, pair % n_classes - 1, int(first[pair])
        value_shape = known.shape_list[value_cls]
        w_shape = None if weight_cls < 0 else known.wshape_list[weight_cls]
        result = product_shape(w_shape, value_shape)
        if result is None:
            _fail_at(layer, where, [e], lambda e: f"weight {known.weight_names[weight[e]]!r} of shape {w_shape} "
                                                  f"does not fit the value of layer {known.layers[src[e]].name!r} "
                                                  f"with shape {value_shape}")
        if out_shape is None:
            out_shape, out_edge = result, e
        elif result != out_shape:
            _fail_at(layer, where, [e], lambda e: f"weighted input has shape {result}, but input {int(out_edge)} "
                                                  f"of the layer gives {out_shape}: all weighted inputs of a layer "
                                                  "must have one shape")
    raise AssertionError(f"{where}: the shape check failed but no input is wrong")  # pragma: no cover


def _shape_classes(shapes: Sequence[tuple]) -> tuple[np.ndarray, list[tuple]]:
    """Map each shape to a small integer id; returns (ids, distinct shapes)."""
    distinct: dict[tuple, int] = {}
    ids = np.array([distinct.setdefault(s, len(distinct)) for s in shapes], dtype=np.int64)
    return ids, list(distinct)
