"""JSON save and load of a :class:`Graph`, with an exact round trip.

Floats are written with Python's shortest round-trip representation, so
``load_json(save_json(g))`` reproduces every value bit for bit.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .graph import FactLayer, Graph, GraphError, NeuronLayer, Weight

__all__ = ["graph_to_dict", "graph_from_dict", "save_json", "load_json"]

FORMAT, VERSION = "neurovec-graph", 1


def _tensor(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "data": a.reshape(-1).tolist()}


def _array(obj: dict, where: str) -> np.ndarray:
    try:
        return np.asarray(obj["data"], dtype=np.float64).reshape(obj["shape"])
    except (KeyError, ValueError, TypeError) as error:
        raise GraphError(f"{where}: malformed tensor ({error})") from error


def graph_to_dict(graph: Graph) -> dict:
    layers = []
    for layer in graph.layers:
        if isinstance(layer, FactLayer):
            layers.append({"kind": "facts", "name": layer.name, "unit": layer.unit,
                           **({"count": layer.size} if layer.unit else {"values": _tensor(layer.values)})})
        else:
            layers.append({
                "kind": "neurons", "name": layer.name, "aggregation": layer.aggregation,
                "transformation": layer.transformation, "counts": layer.counts.tolist(),
                "input_layer": layer.input_layer.tolist(), "input_ordinal": layer.input_ordinal.tolist(),
                "input_weight": layer.input_weight.tolist(), "bias": layer.bias.tolist(),
            })
    return {
        "format": FORMAT, "version": VERSION,
        "weights": [{"name": w.name, "learnable": w.learnable, "value": _tensor(w.value)}
                    for w in graph.weights],
        "layers": layers,
        "outputs": {"layer": graph.output_layer.tolist(), "ordinal": graph.output_ordinal.tolist()},
    }


def graph_from_dict(data: dict) -> Graph:
    if data.get("format") != FORMAT:
        raise GraphError(f"not a neurovec graph (format {data.get('format')!r}, expected {FORMAT!r})")
    if data.get("version") != VERSION:
        raise GraphError(f"unsupported neurovec graph version {data.get('version')!r} (expected {VERSION})")
    weights = [Weight(w["name"], _array(w["value"], f"weight {w['name']!r}"), bool(w["learnable"]))
               for w in data["weights"]]
    layers = []
    for i, item in enumerate(data["layers"]):
        name = item.get("name", f"#{i}")
        try:
            if item["kind"] == "facts":
                layers.append(FactLayer.units(name, item["count"]) if item["unit"]
                              else FactLayer(name, _array(item["values"], f"fact layer {name!r}")))
            elif item["kind"] == "neurons":
                layers.append(NeuronLayer(
                    name, counts=item["counts"], input_layer=item["input_layer"],
                    input_ordinal=item["input_ordinal"], input_weight=item["input_weight"],
                    bias=item["bias"], aggregation=item["aggregation"],
                    transformation=item["transformation"]))
            else:
                raise GraphError(f"layer {name!r}: unknown kind {item['kind']!r}")
        except KeyError as error:
            raise GraphError(f"layer {name!r}: missing field {error}") from error
    return Graph(layers, weights, data["outputs"]["layer"], data["outputs"]["ordinal"])


def save_json(graph: Graph, path: str | Path) -> None:
    Path(path).write_text(json.dumps(graph_to_dict(graph)))


def load_json(path: str | Path) -> Graph:
    return graph_from_dict(json.loads(Path(path).read_text()))
