"""PyTorch Geometric models that compute exactly what the RGCN templates compute.

``RGCNTwin(spec)`` stacks PyG's ``RGCNConv`` (or ``FastRGCNConv`` with ``fast=True``) as
:mod:`neurovec.datasets.rgcn` defines the template: ReLU between convolutions, none after the
last. Its parameters are PyG's own (``conv1.weight`` of shape (relations or bases, in, out),
``conv1.comp``, ``conv1.root``, ``conv1.bias``); the template names each relation's weight
``conv1.weight.R`` (transposed: (out, in)) and each basis coefficient ``conv1.comp.R.B``.
:func:`copy_weights` and :func:`copy_weights_from_twin` translate between the two, so both
compute the same function; :func:`twin_values` gives a twin's weights as the template's
``values=`` argument.

:class:`TwinEncoder` binds a twin to its typed graph, the encoder of
:class:`neurovec.datasets.link_prediction.LinkPredictor`.

Requires ``torch_geometric``; imported lazily.
"""
from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn

from ._common import DatasetError
from .rgcn import RGCNSpec

__all__ = ["RGCNTwin", "TwinEncoder", "copy_weights", "copy_weights_from_twin", "twin_values",
           "neurovec_to_twin", "twin_to_neurovec"]

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "identity": lambda x: x}


class RGCNTwin(nn.Module):
    """``conv1 .. convL`` (``RGCNConv``, or ``FastRGCNConv`` with ``fast``); ``forward(x, edge_index, edge_type)``."""

    def __init__(self, spec: RGCNSpec, fast: bool = False):
        super().__init__()
        from torch_geometric.nn import FastRGCNConv, RGCNConv

        self.spec, self.fast = spec, fast
        conv_class = FastRGCNConv if fast else RGCNConv
        in_dim = spec.in_dim
        for k, width in enumerate(spec.hidden, start=1):
            self.add_module(f"conv{k}", conv_class(in_dim, width, spec.n_relations, num_bases=spec.num_bases,
                                                   aggr="add" if spec.aggr == "sum" else spec.aggr,
                                                   root_weight=spec.root_weight, bias=spec.bias))
            in_dim = width

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        last = len(self.spec.hidden)
        for k in range(1, last + 1):
            x = getattr(self, f"conv{k}")(x, edge_index, edge_type)
            if k < last:
                x = _ACTIVATIONS[self.spec.activation](x)
        return x


class TwinEncoder(nn.Module):
    """A twin with its graph bound: ``forward(x)`` is ``twin(x, edge_index, edge_type)``."""

    def __init__(self, twin: nn.Module, edge_index, edge_type):
        super().__init__()
        self.twin = twin
        self.register_buffer("edge_index", torch.as_tensor(np.asarray(edge_index), dtype=torch.long), persistent=False)
        self.register_buffer("edge_type", torch.as_tensor(np.asarray(edge_type), dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.twin(x, self.edge_index, self.edge_type)


# -- weights -------------------------------------------------------------------------------

_SPLIT = re.compile(r"^(.*)\.(weight|comp|root|bias)(?:\.(\d+))?(?:\.(\d+))?$")


def neurovec_to_twin(weights: dict, twin_shapes: dict) -> dict:
    """The template's weights (by neurovec name) as the twin's parameters (by twin name), as numpy/torch values."""
    result = {}
    for name, shape in twin_shapes.items():
        prefix, kind = name.rsplit(".", 1)
        if kind == "weight":
            value = torch.stack([_get(weights, f"{name}.{r}").T for r in range(shape[0])])
        elif kind == "comp":
            value = torch.stack([torch.stack([_get(weights, f"{name}.{r}.{b}").reshape(())
                                              for b in range(shape[1])]) for r in range(shape[0])])
        elif kind == "root":
            value = _get(weights, name).T
        else:
            value = _get(weights, name)
        if tuple(value.shape) != tuple(shape):
            raise DatasetError(f"weight {name}: the template gives shape {tuple(value.shape)}, the twin has {tuple(shape)}")
        result[name] = value
    return result


def twin_to_neurovec(params: dict, names) -> dict:
    """The twin's parameters as the template's weights: ``{neurovec name: tensor}`` for every name in ``names``."""
    result = {}
    for name in names:
        match = _SPLIT.match(name)
        if match is None:
            raise DatasetError(f"weight {name!r} is not an RGCN template weight")
        prefix, kind, first, second = match.groups()
        param = params.get(f"{prefix}.{kind}")
        if param is None:
            raise DatasetError(f"the twin has no parameter {prefix}.{kind} for weight {name!r}")
        if kind == "weight":
            result[name] = param[int(first)].T
        elif kind == "comp":
            result[name] = param[int(first), int(second)]
        elif kind == "root":
            result[name] = param.T
        else:
            result[name] = param
    return result


def _get(weights: dict, name: str) -> torch.Tensor:
    if name not in weights:
        raise DatasetError(f"the neurovec module has no weight {name!r} (is the twin made from the same spec?)")
    return torch.as_tensor(weights[name])


def _learnable(module: nn.Module) -> dict:
    store = getattr(module, "weights", None)
    if not isinstance(store, nn.Module):
        raise DatasetError(f"{type(module).__name__} has no `weights` module; expected a neurovec module")
    return dict(store.named_parameters())


@torch.no_grad()
def copy_weights(module: nn.Module, twin: nn.Module) -> None:
    """Copy every learnable weight of the neurovec ``module`` into the twin (transposing as PyG stores them)."""
    params = dict(twin.named_parameters())
    values = neurovec_to_twin(_learnable(module), {n: p.shape for n, p in params.items()})
    for name, value in values.items():
        params[name].copy_(value)


@torch.no_grad()
def copy_weights_from_twin(twin: nn.Module, module: nn.Module) -> None:
    """The reverse of :func:`copy_weights`."""
    weights = _learnable(module)
    values = twin_to_neurovec(dict(twin.named_parameters()), weights)
    for name, value in values.items():
        weights[name].copy_(value.reshape(weights[name].shape))


def twin_values(twin: nn.Module) -> dict:
    """The twin's parameters as numpy arrays by their names: the template's ``values=`` argument."""
    return {name: p.detach().cpu().double().numpy() for name, p in twin.named_parameters()}
