"""The torch functions behind transformation and aggregation names.

Shared by the reference engine and the generated modules: one table, so that a
name means the same function everywhere. The tensors have a leading batch axis
(neurons), so every function here acts per neuron.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["TRANSFORM_FUNCTIONS", "transform", "apply_weight", "preferred_zeros", "order_signed_zeros"]


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


# NOTE: [signed zeros in max and min] A max or min over both 0.0 and -0.0 is one of them, and
# which one torch returns depends on the kernel and even on the shape: ``amax(0)`` over the rows
# [-0.0, 0.0] gives -0.0 (the first) for rows of 2 elements and 0.0 (the last) for rows of 16
# (torch 2.13, CPU), and the scatter and segment kernels disagree likewise. The sign is seen only
# through ``inverse`` (1 / -0.0 = -inf), and there it decides between inf and -inf. Every engine
# here orders the zeros as IEEE 754-2019's maximum and minimum do: -0.0 < 0.0, so
# max{0.0, -0.0} = 0.0 and min{0.0, -0.0} = -0.0, whatever the order of the inputs. That also
# makes max and min truly commutative, which the passes that merge neurons with the same inputs
# in another order (``dedup.RowIds``) rely on. The generated code does it only where the sign
# can reach an ``inverse`` (``compiler.rewrite.zero_sign_matters``): elsewhere it costs a second
# reduction for nothing. The ordering adds a constant zero (order_signed_zeros), so gradients pass
# it bit for bit. Zero *gradients* may still differ in sign between the reference and a compiled
# module, with equal values: where the generated code leaves the ordering out (the sign of a tie
# then reaches only gradients, through a product's backward g * t), and where it reads weights
# through torch.stack + index_select, whose backward sums into +0.0 (a lone -0.0 becomes +0.0).


def preferred_zeros(x: torch.Tensor, reduce: str) -> torch.Tensor:
    """The inputs that are the zero a ``reduce`` ("max" or "min") over ties of 0.0 and -0.0 must
    return: 1.0 where ``x`` is 0.0 (max), -1.0 where it is -0.0 (min), else 0. Reduced with
    ``reduce`` itself, a segment's value is nonzero iff the segment has such a zero."""
    zeros = (x == 0) & (torch.signbit(x) == (reduce == "min"))
    return zeros.to(x.dtype) if reduce == "max" else -zeros.to(x.dtype)


def order_signed_zeros(value: torch.Tensor, preferred: torch.Tensor, reduce: str) -> torch.Tensor:
    """A max or min ``value`` with its zeros given the sign of the preferred zero where
    ``preferred`` (the reduction of :func:`preferred_zeros`) says the inputs had one.

    Written as the addition of a constant zero, not a selection: ``x + 0.0`` is ``0.0`` for either
    zero and ``x + -0.0`` is ``x`` for every ``x`` (min negates around it), so the value changes only
    where it must and the gradient passes through one addition, bit for bit, signed zeros included.
    (A ``torch.where`` would add the unselected branch's ``+0.0`` to the gradient, and turn an incoming
    ``-0.0`` into ``+0.0`` at every tie.)"""
    at_tie = (value == 0) & (preferred != 0)
    shift = torch.where(at_tie, 0.0, -0.0).to(value.dtype)  # a constant: at_tie is boolean
    return value + shift if reduce == "max" else -((-value) + shift)
