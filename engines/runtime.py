"""Functions the generated programs call, besides plain torch and ``kernels``."""
from __future__ import annotations

import torch

__all__ = ["strided_reduce"]


def strided_reduce(x: torch.Tensor, k: int, aggregation: str) -> torch.Tensor:
    """Segment j is rows ``j, j + n, ..., j + (k - 1) n``: reduce a ``(k, n, ...)`` view over axis 0.

    The transposed dense reduction of thesis 5.2.9; ties in max/min split the
    gradient evenly, like ``torch.amax``.
    """
    v = x.reshape((k, -1) + tuple(x.shape[1:]))
    if aggregation == "sum":
        return v.sum(0)
    if aggregation == "mean":
        return v.mean(0)
    if aggregation == "max":
        return v.amax(0)
    if aggregation == "min":
        return v.amin(0)
    if aggregation == "prod":
        return v.prod(0)
    raise ValueError(f"unknown aggregation {aggregation!r}")
