"""Thesis 5.2.10 clean-up: identities, chains of indexing ops, pre-concatenation and dead code.

``remove_identity`` (steps 17 and 24) drops ops whose output is their input --
identity TRANSFORMs, single-input CONCATs, all-ones REDUCEs, identity GATHERs and
SLICEs, TILE/INTERLEAVE by 1 -- and merges chains of indexing ops into one op:
GATHER of GATHER/SLICE/TILE/INTERLEAVE (or of a CONCAT read in one part only)
becomes one GATHER of the chain's source, SLICE of SLICE one SLICE, TILE of TILE
one TILE and INTERLEAVE of INTERLEAVE one INTERLEAVE. The thesis' "pairs of
reshapes, keep the last" (step 24) has no counterpart here: this IR has no reshape
op (the views of LINEAR layouts and REDUCE kernels are attributes), so the
repeated TILE/INTERLEAVE chains are the reshapes that collapse::

    %a = TILE(x; times=2)          : (6, 4)
    %b = TILE(a; times=3)          : (18, 4)
  becomes
    %b = TILE(x; times=6)          : (18, 4)

``preconcatenate`` (step 19): a CONCAT of FACTs only (static ones) or of WEIGHTS
only, whose inputs nothing else reads, becomes one FACT constant or one WEIGHTS
node. Never a weight twice in one WEIGHTS node (a duplicated parameter), never
weights with facts (learnable with fixed values)::

    %w_a = WEIGHTS(names=('a',)) : (1, 3)
    %w_b = WEIGHTS(names=('b', 'c')) : (2, 3)
    %w = CONCAT(w_a, w_b)        : (3, 3)
  becomes
    %w = WEIGHTS(names=('a', 'b', 'c')) : (3, 3)

It then drops what nothing reads (step 20), input facts and constants included: every other
editor drops only what its own edit leaves unread, and keeps unread input facts.
"""
from __future__ import annotations

import numpy as np

from ..gather_plans import chain_candidates
from ..grouping import is_identity
from ..ir import Node, Op, Program
from ..rewrite import Rewriter, eliminate_dead_code, remove_unit_reductions
from ..settings import Settings

__all__ = ["remove_identity", "preconcatenate"]


def remove_identity(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program := remove_unit_reductions(program))
    for node in program.nodes:
        node = rw.take(node)
        identity_of = _identity_source(rw, node)
        if identity_of is not None:
            rw.alias(node.name, identity_of)
            continue
        merged = _merge_chain(rw, node)
        if merged is None:
            rw.keep(node)
        elif merged.op is Op.GATHER and is_identity(rw.constants[merged.attrs["index"]], rw.nodes[merged.srcs[0]].count):
            rw.alias(node.name, merged.srcs[0])
        else:
            rw.replace(merged)
    return rw.finish()


def _identity_source(rw: Rewriter, node: Node) -> str | None:
    """The input a node merely passes through, or None (all-ones REDUCEs are gone already)."""
    op, a = node.op, node.attrs
    if op is Op.TRANSFORM and a.get("fn") == "identity":
        return node.srcs[0]
    if op is Op.CONCAT and len(node.srcs) == 1:
        return node.srcs[0]
    if op in (Op.TILE, Op.INTERLEAVE) and a["times"] == 1:
        return node.srcs[0]
    if op is Op.SLICE and a["start"] == 0 and a["step"] == 1 and node.count == rw.nodes[node.srcs[0]].count:
        return node.srcs[0]
    if op is Op.GATHER and is_identity(rw.constants[a["index"]], rw.nodes[node.srcs[0]].count):
        return node.srcs[0]
    return None


def _merge_chain(rw: Rewriter, node: Node) -> Node | None:
    """One op for an indexing op that reads another indexing op, or None if there is no chain."""
    src = rw.nodes[node.srcs[0]] if node.srcs else None
    if src is None:
        return None
    if node.op is Op.GATHER:
        # Same number of rows gathered from the deepest source: never more work, one op less.
        *_, (root, index) = chain_candidates(src.name, rw.constants[node.attrs["index"]], rw.nodes, rw.constants)
        if root == src.name:
            return None
        key = rw.const(node.attrs["index"], index)
        return node.with_(srcs=(root,), attrs={**node.attrs, "index": key})
    if node.op is src.op and node.op in (Op.TILE, Op.INTERLEAVE):
        return node.with_(srcs=src.srcs, attrs={**node.attrs, "times": node.attrs["times"] * src.attrs["times"]})
    if node.op is src.op is Op.SLICE:
        a, b = src.attrs, node.attrs
        start, step = a["start"] + b["start"] * a["step"], a["step"] * b["step"]
        stop = start + (node.count - 1) * step + 1 if node.count else start
        return node.with_(srcs=src.srcs, attrs={**node.attrs, "start": start, "stop": stop, "step": step})
    return None


def preconcatenate(program: Program, settings: Settings) -> Program:
    users = program.users()
    dynamic = set(settings.dynamic_facts)
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.op is not Op.CONCAT or node.name == program.output:
            rw.keep(node)
            continue
        parts = [rw.nodes[s] for s in node.srcs]
        only_here = all(set(users.get(p.name, ())) == {node.name} and p.name != program.output for p in parts)
        if only_here and all(p.op is Op.FACT and p.attrs.get("fact_layer") not in dynamic for p in parts):
            values = np.concatenate([rw.constants[p.attrs["const"]] for p in parts])
            rw.replace(Node(node.name, Op.FACT, (), node.count, node.shape,
                            {"const": rw.const(f"facts_{node.name}", values), "fact_layer": None,
                             "unit": all(p.attrs.get("unit") for p in parts)}, node.layer))
        elif only_here and all(p.op is Op.WEIGHTS for p in parts) \
                and len(set(names := sum((tuple(p.attrs["names"]) for p in parts), ()))) == len(names):
            rw.replace(Node(node.name, Op.WEIGHTS, (), node.count, node.shape, {"names": names}, node.layer))
        else:
            rw.keep(node)
    return eliminate_dead_code(rw.finish(keep_inputs=False))
