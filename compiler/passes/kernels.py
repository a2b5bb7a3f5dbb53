"""Per-layer choice of the segment-reduction kernel (issue 5; thesis 3.4, 6.4).

Every REDUCE gets a ``kernel`` attr, chosen by the cost model in
``engines/kernels.choose_kernel`` (measured on PROTEINS-sized layers), or forced
by ``Settings.reduce_kernel`` where the forced kernel applies:

* ``dense``: equal counts, a reshape and one dense reduction;
* ``sparse_mm``: a sum or mean right after a gather that nothing else reads,
  fused into one CSR sparse-dense matmul (the gather disappears)::

      %x = GATHER(%h; index=idx)                      %r = REDUCE(%h; kernel='sparse_mm',
      %r = REDUCE(%x; aggregation='sum')      ->            index=idx, aggregation='sum')

* ``segment``: CSR segment kernels whose backward is one ``index_select``;
* ``scatter``: PyTorch's ``scatter_reduce`` (the unoptimized Vectorizer's form).

``strided`` reductions (transposed dense ones) are a layout, not a kernel choice:
they are kept. The model assumes the CPU (the device is not known at compile
time); ``neurovec.autotune`` times the alternatives on the real device.
"""
from __future__ import annotations

import numpy as np

from ...engines.kernels import choose_kernel
from ..ir import Node, Op, Program
from ..rewrite import eliminate_dead_code, single_use
from ..settings import Settings

__all__ = ["choose_kernels"]


def _feature_size(shape: tuple) -> int:
    return int(np.prod(shape)) if shape else 1


def choose_kernels(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    forced = settings.reduce_kernel
    changed = False
    result: list[Node] = []
    for node in program.nodes:
        if node.op is not Op.REDUCE or node.attrs.get("kernel") in ("strided", "sparse_mm"):
            result.append(node)
            continue
        counts = program.constants[node.attrs["counts"]]
        source = nodes[node.srcs[0]]
        fusable = (source.op is Op.GATHER and source.name in once
                   and node.attrs["aggregation"] in ("sum", "mean"))
        equal = counts.size > 0 and bool(np.all(counts == counts[0]))
        if forced == "auto":
            kernel = choose_kernel(source.count, node.count, counts, _feature_size(node.shape), "cpu",
                                   reduce="sum" if node.attrs["aggregation"] == "mean" else node.attrs["aggregation"],
                                   after_gather=fusable)
        else:
            kernel = forced
        # A forced kernel that cannot express this reduction falls back to the general one.
        if (kernel == "dense" and not equal) or (kernel == "sparse_mm" and not fusable):
            kernel = "segment"
        attrs = dict(node.attrs, kernel=kernel)
        srcs = node.srcs
        if kernel == "sparse_mm":
            attrs["index"] = source.attrs["index"]
            srcs = source.srcs
        if attrs != node.attrs or srcs != node.srcs:
            node = node.with_(attrs=attrs, srcs=srcs)
            changed = True
        result.append(node)
    if not changed:
        return program
    # Fused gathers are now unread.
    return eliminate_dead_code(program.replace(nodes=tuple(result)))
