"""Reductions shaped for the engine's kernels (thesis 3.4, 6.4).

Which kernel runs a reduction is the engine's choice, made when it builds the module from the
program (NOTE: [kernels chosen by the engine] in ``engines/torch_module.py``): this pass writes
``kernel="auto"`` on every REDUCE (``strided`` reductions, a layout, keep theirs), or the kernel
``Settings.reduce_kernel`` forces where it can express the reduction (else ``segment``). What it
decides is the program's shape, by asking the engine (``compiler/backend.py``; its answers do not
depend on the machine that compiles):

* a sum or mean right after a gather that nothing else reads becomes one fused sparse sum, where
  the engine runs that best (forced: ``sparse_mm``)::

      %x = GATHER(%h; index=idx)                      %r = REDUCE(%h; kernel='auto',
      %r = REDUCE(%x; aggregation='sum')      ->            index=idx, aggregation='sum')

* a large gather of a value that needs a gradient becomes a sparse sum of one row per segment,
  where the engine runs that best (its backward is then a sorted sum over the transposed index
  instead of ``index_add``): not where a ``-0.0`` could reach an ``inverse``, ``log`` or ``sqrt``
  (``zero_sign_matters``): a sum turns it into ``+0.0``, a gather keeps it.

  A gather that ``fuse_fact_products`` makes part of one side-by-side product stays a gather:
  a gather of a shared-weight product of static facts, added to another such product
  (GraphSAGE's first layer: the folded neighbours' mean and the features, one
  ``addmm`` over both side by side instead of two GEMMs, a sparse sum and an addition).

``neurovec.autotune`` times forced kernels on the real device.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..ir import Op, Program, fact_product_sides, is_sparse_sum
from ..rewrite import Rewriter, single_use, zero_sign_matters
from ..settings import Settings

__all__ = ["choose_kernels"]


def choose_kernels(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    forced = settings.reduce_kernel
    engine = backend.current() if forced == "auto" else None
    rw = Rewriter(program)
    for node in program.nodes:
        if node.op is not Op.REDUCE or node.attrs.get("kernel") == "strided" or is_sparse_sum(node):
            rw.keep(node)
            continue
        counts = program.constants[node.attrs["counts"]]
        source = nodes[node.srcs[0]]
        fusable = (source.op is Op.GATHER and source.name in once
                   and node.attrs["aggregation"] in ("sum", "mean"))
        if forced == "auto":
            fuse = fusable and engine.fuses_gather(source.count, counts, int(np.prod(node.shape)), "sum")
            kernel = "auto"
        else:
            # A forced kernel that cannot express this reduction falls back to the general one.
            equal = counts.size > 0 and bool(np.all(counts == counts[0]))
            kernel = "segment" if (forced == "dense" and not equal) or (forced == "sparse_mm" and not fusable) \
                else forced
            fuse = kernel == "sparse_mm"
        attrs = dict(node.attrs, kernel=kernel)
        srcs = node.srcs
        if fuse:
            attrs["index"] = source.attrs["index"]
            srcs = source.srcs
        if attrs != node.attrs or srcs != node.srcs:
            node = node.with_(attrs=attrs, srcs=srcs)
        rw.keep(node)
    program = rw.finish()  # (fused gathers are now unread: dropped)
    if forced != "auto":
        return program
    return _gathers_as_sums(program, engine, _fact_product_sides(program) if settings.fuse_fact_products else set())


def _needs_grad(program: Program) -> set[str]:
    """Nodes computed from a learnable weight (their gradient flows back through them)."""
    learnable = {w.name: w.learnable for w in program.weights}
    result: set[str] = set()
    for node in program.nodes:
        if (node.op is Op.WEIGHTS and any(learnable.get(n, True) for n in node.attrs["names"])) \
                or any(s in result for s in node.srcs):
            result.add(node.name)
    return result


def _fact_product_sides(program: Program) -> set[str]:
    """The gathers that are one side of ``fuse_fact_products``' form (``fact_product_sides``)."""
    nodes = program.by_name()
    once = single_use(program)
    dynamic = set(program.dynamic_facts)
    return {s for node in program.nodes if fact_product_sides(node, nodes, once, dynamic)
            for s in node.srcs if nodes[s].op is Op.GATHER}


def _gathers_as_sums(program: Program, engine, keep: set[str]) -> Program:
    """A large gather of a value that needs a gradient becomes a one-row-per-segment fused sum::

        %g = GATHER(%h; index=idx)   ->   %g = REDUCE(%h; kernel='auto', index=idx,
                                                      aggregation='sum', counts=ones)
    """
    grad = _needs_grad(program)
    keep_sign = zero_sign_matters(program)
    nodes = program.by_name()
    rw = Rewriter(program)
    ones: dict[int, str] = {}
    for node in program.nodes:
        if (node.op is Op.GATHER and node.name not in keep_sign and node.name not in keep
                and engine.gathers_as_sum(node.count, int(np.prod(node.shape)), nodes[node.srcs[0]].name in grad)):
            if node.count not in ones:
                ones[node.count] = rw.const(f"ones_{node.count}", np.ones(node.count, dtype=np.int64))
            node = node.with_(op=Op.REDUCE, attrs={"aggregation": "sum", "counts": ones[node.count],
                                                   "kernel": "auto", "index": node.attrs["index"]})
        rw.keep(node)
    return rw.finish()
