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

from ...engines.kernels import choose_gather_kernel, choose_kernel
from ..ir import Node, Op, Program
from ..rewrite import eliminate_dead_code, fresh_const, single_use, zero_sign_matters
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
    if changed:
        # Fused gathers are now unread.
        program = eliminate_dead_code(program.replace(nodes=tuple(result)))
    return _gathers_as_sums(program) if forced == "auto" else program


def _needs_grad(program: Program) -> set[str]:
    """Nodes computed from a learnable weight (their gradient flows back through them)."""
    learnable = {w.name: w.learnable for w in program.weights}
    result: set[str] = set()
    for node in program.nodes:
        if (node.op is Op.WEIGHTS and any(learnable.get(n, True) for n in node.attrs["names"])) \
                or any(s in result for s in node.srcs):
            result.add(node.name)
    return result


def _gathers_as_sums(program: Program) -> Program:
    """A large gather of a value that needs a gradient becomes a one-row-per-segment fused sum::

        %g = GATHER(%h; index=idx)   ->   %g = REDUCE(%h; kernel='sparse_mm', index=idx,
                                                      aggregation='sum', counts=ones)

    Same rows forward; the backward is a sorted sum over the transposed index (C++)
    instead of index_select's scatter (``index_add``). Not where a ``-0.0`` could reach
    an ``inverse``, ``log`` or ``sqrt`` (``zero_sign_matters``): a sum turns it into ``+0.0``, a gather keeps it.
    """
    grad = _needs_grad(program)
    keep_sign = zero_sign_matters(program)
    nodes = program.by_name()
    constants = dict(program.constants)
    ones: dict[int, str] = {}
    result: list[Node] = []
    for node in program.nodes:
        if (node.op is Op.GATHER and node.name not in keep_sign
                and choose_gather_kernel(node.count, _feature_size(node.shape), nodes[node.srcs[0]].name in grad)
                == "sparse_mm"):
            if node.count not in ones:
                ones[node.count] = fresh_const(program, constants, f"ones_{node.count}",
                                               np.ones(node.count, dtype=np.int64))
            node = node.with_(op=Op.REDUCE, attrs={"aggregation": "sum", "counts": ones[node.count],
                                                   "kernel": "sparse_mm", "index": node.attrs["index"]})
        result.append(node)
    if not ones:
        return program
    return program.replace(nodes=tuple(result), constants=constants)
