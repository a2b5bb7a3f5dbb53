"""JSON save and load of a :class:`Graph`, with an exact round trip.

Floats are written with Python's shortest round-trip representation, so
``load_json(save_json(g))`` reproduces every value bit for bit.

The file format is checked by pydantic models in strict mode before any array
is built: a missing or unknown key, or a value of the wrong kind (a float where
an index belongs, ``true`` or ``"1.5"`` where a number belongs), raises a
:class:`GraphError` that names the file, the key path (``layers[2].counts[5]``)
and what was expected. Nothing is cast silently.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .graph import FactLayer, Graph, GraphError, NeuronLayer, Weight

__all__ = ["graph_to_dict", "graph_from_dict", "save_json", "load_json"]

FORMAT, VERSION = "neurovec-graph", 1


# -- the file format ------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Tensor(_Strict):
    shape: list[Annotated[int, Field(ge=0)]]
    data: list[float]

    @model_validator(mode="after")
    def _sizes_agree(self):
        if len(self.data) != int(np.prod(self.shape)):
            raise ValueError(f"'data' has {len(self.data)} numbers, but 'shape' {self.shape} needs "
                             f"{int(np.prod(self.shape))}")
        return self


class _Weight(_Strict):
    name: str
    learnable: bool
    value: _Tensor


class _Facts(_Strict):
    kind: Literal["facts"]
    name: str
    unit: bool
    count: Annotated[int, Field(ge=0)] | None = None
    values: _Tensor | None = None

    @model_validator(mode="after")
    def _count_or_values(self):
        if self.unit and self.count is None:
            raise ValueError("a unit fact layer needs 'count'")
        if not self.unit and self.values is None:
            raise ValueError("a fact layer that is not unit needs 'values'")
        return self


class _Neurons(_Strict):
    kind: Literal["neurons"]
    name: str
    aggregation: str
    transformation: str
    counts: list[int]
    input_layer: list[int]
    input_ordinal: list[int]
    input_weight: list[int]
    bias: list[int]


class _Outputs(_Strict):
    layer: list[int]
    ordinal: list[int]


class _File(_Strict):
    format: Literal["neurovec-graph"]
    version: Literal[1]
    weights: list[_Weight]
    layers: list[Annotated[Union[_Facts, _Neurons], Field(discriminator="kind")]]
    outputs: _Outputs


def _key(loc: tuple) -> str:
    """pydantic's error location as a key path: ``layers[2].neurons.counts[5]`` -> ``layers[2].counts[5]``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("facts", "neurons"):  # the union member pydantic tried, not a key
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def _validation_error(source: str, error: ValidationError) -> GraphError:
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return GraphError(f"{source}: not valid JSON ({first['msg']})")
    kind, message = first["type"], first["msg"]
    if kind == "missing":
        message = "missing (a required key)"
    elif kind == "union_tag_not_found":
        message = "has no key 'kind' (expected 'facts' or 'neurons')"
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    quiet = ("missing", "union_tag_invalid", "union_tag_not_found", "value_error")
    got = "" if kind in quiet else f" (got {first['input']!r:.60})"
    more = f"; and {error.error_count() - 1} more problem(s)" if error.error_count() > 1 else ""
    return GraphError(f"{source}: key {_key(first['loc'])}: {message}{got}{more}")


# -- graph <-> dict ------------------------------------------------------------------

def _tensor(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "data": a.reshape(-1).tolist()}


def _array(tensor: _Tensor) -> np.ndarray:
    return np.asarray(tensor.data, dtype=np.float64).reshape(tensor.shape)


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


def _check_header(data, source: str) -> None:
    """A clear message for a file that is not a neurovec graph at all, before the key-by-key check."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: expected a JSON object with a neurovec graph (got {type(data).__name__})")
    if data.get("format") != FORMAT:
        raise GraphError(f"{source}: not a neurovec graph (key format is {data.get('format')!r}, "
                         f"expected {FORMAT!r})")
    if data.get("version") != VERSION:
        raise GraphError(f"{source}: unsupported neurovec graph version {data.get('version')!r} "
                         f"(key version, expected {VERSION})")


def graph_from_dict(data: dict, source: str = "graph dict") -> Graph:
    """The graph described by ``data`` (as made by :func:`graph_to_dict`); errors start with ``source``."""
    _check_header(data, source)
    try:
        parsed = _File.model_validate(data)
    except ValidationError as error:
        raise _validation_error(source, error) from None
    return _build(parsed, source)


def _build(parsed: _File, source: str) -> Graph:
    try:
        weights = [Weight(w.name, _array(w.value), w.learnable) for w in parsed.weights]
        layers = []
        for item in parsed.layers:
            if isinstance(item, _Facts):
                layers.append(FactLayer.units(item.name, item.count) if item.unit
                              else FactLayer(item.name, _array(item.values)))
            else:
                layers.append(NeuronLayer(
                    item.name, counts=item.counts, input_layer=item.input_layer,
                    input_ordinal=item.input_ordinal, input_weight=item.input_weight, bias=item.bias,
                    aggregation=item.aggregation, transformation=item.transformation))
        return Graph(layers, weights, parsed.outputs.layer, parsed.outputs.ordinal)
    except GraphError as error:
        raise GraphError(f"{source}: {error}") from None


def save_json(graph: Graph, path: str | Path) -> None:
    Path(path).write_text(json.dumps(graph_to_dict(graph)))


def load_json(path: str | Path) -> Graph:
    """Load a graph saved by :func:`save_json`; every error names the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise GraphError(f"{path}: not a UTF-8 text file ({error})") from None
    except json.JSONDecodeError as error:
        raise GraphError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: "
                         f"{error.msg})") from None
    return graph_from_dict(data, str(path))
