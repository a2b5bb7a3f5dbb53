"""Functions the generated programs call, besides plain torch."""
from __future__ import annotations

import torch

__all__ = ["segment_reduce"]

_SCATTER_REDUCE = {"max": "amax", "min": "amin", "prod": "prod"}


def segment_reduce(x: torch.Tensor, seg_id: torch.Tensor, counts: torch.Tensor, n: int,
                   aggregation: str) -> torch.Tensor:
    """Reduce consecutive rows of ``x`` into ``n`` segments; row ``e`` belongs to ``seg_id[e]``.

    ``counts`` (float) are the segment sizes, used by ``mean``. Every segment is
    non-empty. Ties in max/min split the gradient evenly, like ``torch.amax``.
    """
    shape = (n,) + tuple(x.shape[1:])
    if aggregation in ("sum", "mean"):
        out = x.new_zeros(shape).index_add_(0, seg_id, x)
        if aggregation == "mean":
            out = out / counts.view((-1,) + (1,) * (x.dim() - 1))
        return out
    index = seg_id.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    return x.new_empty(shape).scatter_reduce(0, index, x, _SCATTER_REDUCE[aggregation], include_self=False)
