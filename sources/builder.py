"""A builder for hand-written neuron graphs.

Example (thesis Fig. 4.1, one molecule)::

    b = GraphBuilder()
    w_a = b.weight("W_a", np.random.randn(3))     # a(Y) is a unit fact: W_a . a = W_a
    atoms = b.unit_facts("a", 3)
    h = b.layer("h", aggregation="sum", transformation="tanh")
    n0 = h.neuron([(atoms[1], w_a)], bias=None)
    b.output(n0)
    graph = b.build()

Neuron references are :class:`Ref` objects (layer name, ordinal). The builder
produces exactly the same validated :class:`Graph` as the bulk array form.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .graph import NO_WEIGHT, FactLayer, Graph, GraphError, NeuronLayer, Weight

__all__ = ["Ref", "GraphBuilder", "LayerBuilder"]


@dataclass(frozen=True)
class Ref:
    """A reference to neuron ``ordinal`` of layer ``layer``."""

    layer: str
    ordinal: int


class FactRefs(Sequence):
    """The neurons of a fact layer, indexable like a list of :class:`Ref`."""

    def __init__(self, name: str, size: int):
        self.name, self._size = name, size

    def __len__(self):
        return self._size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [Ref(self.name, k) for k in range(*i.indices(self._size))]
        if not -self._size <= i < self._size:
            raise IndexError(f"fact layer {self.name!r} has {self._size} neurons (got index {i})")
        return Ref(self.name, i % self._size)


class LayerBuilder:
    """Collects the neurons of one computed layer."""

    def __init__(self, builder: "GraphBuilder", name: str, aggregation: str, transformation: str):
        self._builder, self.name = builder, name
        self.aggregation, self.transformation = aggregation, transformation
        self._counts: list[int] = []
        self._inputs: list[tuple[str, int, str | None]] = []
        self._bias: list[str | None] = []

    def __len__(self):
        return len(self._counts)

    def neuron(self, inputs: Iterable, bias: str | Weight | None = None) -> Ref:
        """Add a neuron; ``inputs`` are ``Ref`` or ``(Ref, weight)`` pairs, in order.

        A weight is given by name or as the :class:`Weight` returned by
        :meth:`GraphBuilder.weight`; ``None`` means no weight.
        """
        if isinstance(inputs, (Ref, str)):
            raise GraphError(f"layer {self.name!r}, neuron {len(self)}: inputs must be a list of Ref or (Ref, weight) "
                             f"pairs (got the single {type(inputs).__name__} {inputs!r}: wrap it in a list)")
        count, checked = 0, []
        for item in inputs:
            if isinstance(item, Ref):
                ref, weight = item, None
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                ref, weight = item
            else:
                raise GraphError(f"layer {self.name!r}, neuron {len(self)}: input {count} is {item!r:.80}; an input is "
                                 "a Ref (from a fact layer's list or LayerBuilder.neuron) or a (Ref, weight) pair, "
                                 "the weight given by name, as a Weight, or None")
            if not isinstance(ref, Ref):
                raise GraphError(f"layer {self.name!r}, neuron {len(self)}: input {count} is not a Ref "
                                 f"(got {type(ref).__name__})")
            if not _is_integer(ref.ordinal):
                raise GraphError(f"layer {self.name!r}, neuron {len(self)}, input {count}: the ordinal of "
                                 f"{ref!r} must be an integer (got {type(ref.ordinal).__name__})")
            checked.append((ref.layer, int(ref.ordinal), _weight_name(weight)))
            count += 1
        self._inputs.extend(checked)   # only once every input is checked: a refused neuron leaves nothing behind
        self._counts.append(count)
        self._bias.append(_weight_name(bias))
        return Ref(self.name, len(self._counts) - 1)


def _is_integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _weight_name(weight) -> str | None:
    return weight.name if isinstance(weight, Weight) else weight


class GraphBuilder:
    """Build a :class:`Graph` layer by layer and neuron by neuron."""

    def __init__(self):
        self._weights: dict[str, Weight] = {}
        self._layers: list = []  # FactLayer | LayerBuilder, in topological order
        self._outputs: list[Ref] = []

    def weight(self, name: str, value, learnable: bool = True) -> Weight:
        if name in self._weights:
            raise GraphError(f"weight {name!r} is defined twice")
        w = Weight(name, value, learnable)
        self._weights[name] = w
        return w

    def facts(self, name: str, values) -> FactRefs:
        """A fact layer with the given values, shape ``(n, *value_shape)``."""
        layer = FactLayer(name, values)
        self._layers.append(layer)
        return FactRefs(name, layer.size)

    def unit_facts(self, name: str, count: int) -> FactRefs:
        self._layers.append(FactLayer.units(name, count))
        return FactRefs(name, count)

    def layer(self, name: str, aggregation: str = "sum", transformation: str = "identity") -> LayerBuilder:
        layer = LayerBuilder(self, name, aggregation, transformation)
        self._layers.append(layer)
        return layer

    def output(self, *refs: Ref) -> None:
        self._outputs.extend(refs)

    def build(self) -> Graph:
        names = [layer.name for layer in self._layers]
        index = {name: i for i, name in enumerate(names)}
        weight_names = list(self._weights)
        weight_index = {name: i for i, name in enumerate(weight_names)}

        def layer_id(where: str, name: str) -> int:
            if name not in index:
                raise GraphError(f"{where}: references missing layer {name!r}")
            return index[name]

        def weight_id(where: str, name: str | None) -> int:
            if name is None:
                return NO_WEIGHT
            if name not in weight_index:
                raise GraphError(f"{where}: references undefined weight {name!r}")
            return weight_index[name]

        layers = []
        for layer in self._layers:
            if isinstance(layer, FactLayer):
                layers.append(layer)
                continue
            ptr = np.concatenate([[0], np.cumsum(layer._counts, dtype=np.int64)])

            def where(e: int) -> str:
                j = int(np.searchsorted(ptr, e, side="right") - 1)
                return f"layer {layer.name!r}, neuron {j}, input {e - ptr[j]}"

            src = [layer_id(where(e), name) for e, (name, _, _) in enumerate(layer._inputs)]
            wts = [weight_id(where(e), w) for e, (_, _, w) in enumerate(layer._inputs)]
            bias = [weight_id(f"layer {layer.name!r}, neuron {j} bias", b) for j, b in enumerate(layer._bias)]
            layers.append(NeuronLayer(
                layer.name, counts=layer._counts, input_layer=src,
                input_ordinal=[o for _, o, _ in layer._inputs], input_weight=wts, bias=bias,
                aggregation=layer.aggregation, transformation=layer.transformation))
        out_layer = [layer_id(f"output {k}", ref.layer) for k, ref in enumerate(self._outputs)]
        for k, ref in enumerate(self._outputs):
            if not _is_integer(ref.ordinal):
                raise GraphError(f"output {k}: the ordinal of {ref!r} must be an integer "
                                 f"(got {type(ref.ordinal).__name__})")
        return Graph(layers, list(self._weights.values()), out_layer, [r.ordinal for r in self._outputs])
