"""The torch functions behind transformation and aggregation names.

Shared by the reference engine and the generated modules: one table, so that a
name means the same function everywhere. The tensors have a leading batch axis
(neurons), so every function here acts per neuron.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["TRANSFORM_FUNCTIONS", "transform", "apply_weight"]


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


TRANSFORM_FUNCTIONS = {
    "identity": lambda x: x,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.01),  # NeuraLogic's slope
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sign": torch.sign,
    "inverse": torch.reciprocal,
    "reverse": torch.neg,
    "lukasiewicz": lambda x: torch.clamp(x, 0.0, 1.0),
    "softplus": F.softplus,
    "elu": F.elu,
    "gelu": F.gelu,
    "softmax": _softmax,
}


def transform(name: str, x: torch.Tensor) -> torch.Tensor:
    return TRANSFORM_FUNCTIONS[name](x)


def apply_weight(w: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``W . x`` for one neuron input (see ``neurovec.sources.graph.product_shape``)."""
    if w is None:
        return x
    if w.dim() == 0 or x.dim() == 0:
        return w * x
    if w.dim() == 2:
        return w @ x
    return w * x
