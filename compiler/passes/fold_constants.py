"""Compute once, at compile time, what depends only on static facts and fixed weights.

A value computed from static facts and fixed weights alone is the same at every
step. Once ``pull_linear_up`` has moved the first layer's weight after the
aggregation, GCN's, SAGE's and GIN's first aggregation over the node features is
such a value: it becomes a constant (float64, rounded to the module's dtype once),
and its backward needs no sparse product at all::

    %f_x = FACT(const=facts_x, fact_layer='x')           : (n, 3)
    %g = GATHER(f_x; index=idx)                           : (E, 3)
    %a = REDUCE(g; aggregation='sum', coef=c)             : (n, 3)
    %l = LINEAR(w, a; kind='matmul')                      : (n, 16)
  becomes
    %a = FACT(const=folded_a, fact_layer=None)            : (n, 3)
    %l = LINEAR(w, a; kind='matmul')                      : (n, 16)

Folded are the computing ops (not pure row movements, which cost nothing to keep
and could be large) that some non-constant op reads, and the gathered input rows of a
segmented product (NOTE: [folded product rows]). Their values come from the
program itself, run in float64 by the engine the compiler was given (``compiler/backend.py``),
so they are exactly what the module would compute; a sum or mean over gathered facts (the
largest such value) is computed here as the engine's kernels compute it, bit for bit
(``sequential_sums``, NOTE: [sequential sums]). Facts in ``Settings.dynamic_facts`` are never folded; a fact layer
that was folded into a constant is no longer replaceable at call time.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from .. import backend
from ..ir import INDEXING, Node, Op, Program, users_of
from ..indexing import EXPANSION, is_constant
from ..rewrite import Rewriter, eliminate_dead_code, freeze_facts, zero_sign_matters
from ..settings import Settings

__all__ = ["fold_constants", "evaluate"]

# A folded reduction over a gather of a stored constant is computed about this many gathered values
# (rows times features) at a time (NOTE: [folding in chunks]).
CHUNK_VALUES = 1 << 24
# A folded sum over gathered facts is computed this many gathered values at a time (NOTE: [sequential sums]).
SEQUENTIAL_CHUNK = 1 << 18
#: The gathered input rows of a segmented product are folded up to this many values (NOTE: [folded product rows]).
PRODUCT_ROWS_VALUES = 1 << 26

# NOTE: [folded product rows] A segmented product (``relation_products``: LINEAR with
# ``w_layout='interleave'``, one weight per chunk of rows) reads its value side as one
# (chunks x rows, in) block, gathered in chunk order. In an RGCN's first layer that side is
# constant: each row is the mean of a (target, relation) pair's source facts, and a row of the
# node features where the pair has one edge, so the constant has about as many distinct rows as
# there are nodes and the gather expands them to one row per (target, relation) pair (100k nodes,
# 1M edges, 100 relation types: 246,805 rows -> 1,035,166). Row movements that expand are not
# folded elsewhere (they would store more than they read), but this one is materialised at every
# step anyway -- the product reads it, and keeps it for its weights' gradient until the backward
# -- so storing it costs no more memory than a step already takes, and saves a million-row gather
# and a fresh 66 MB tensor per step (hetero-100, 1 thread: step 1.16x, loaded). It is a copy of
# rows of the folded values, so the module computes exactly what it did. Bounded by
# PRODUCT_ROWS_VALUES (2^26 values, 512 MB in float64 while the pass evaluates it).

# NOTE: [sequential sums] A folded sum or mean over gathered facts (GCN's, SAGE's and GIN's first
# aggregation, once pull_linear_up has moved the weight after it) is the largest evaluation of a
# compile: at products-like x 1/8, 8M gathered rows of 100 features. The engine's kernels (the
# C++ segment sum, torch's scatter_reduce) compute it as: every product ``coef[e] * x[index[e]]``
# rounded on its own (the module multiplies before it reduces), then added per segment and feature
# in entry order, starting from 0.0 (so a segment of -0.0 products sums to 0.0), then, for a mean,
# divided by the count. ``sequential_sums`` computes exactly that, with whole-array ops whose
# rounding is defined: torch's ``index_select`` (a copy) and ``mul_`` (one IEEE product per element),
# then numpy's ``add.reduce`` over the entries' axis of a (segments, entries, features) block, which
# adds one (segments, features) slice after the other, in entry order (numpy sums pairwise only
# along the fast axis in memory, the features'; with one feature, ``add.accumulate``, sequential on
# any axis). It replaced ``+=`` of one entry's slice at a time (a Python call per entry position)
# and ``cumsum_`` along the entries (a write of every running sum): products-like x 1/8 GCN, loaded,
# alternating runs: the pass 2.0-2.1 -> 1.77-1.81 CPU s. The order in which segments are visited is
# free, as every segment and feature is summed on its own: segments of equal length go together as
# a (segments, entries, features) block, so that no padding is needed, and the gathered rows of a
# piece land in one reused buffer (a fresh tensor per piece cost about as much as the gather).
# The values are bit for bit those of the engine's unfused kernels, a multiply then a segment sum
# (tests/passes/test_fold_constants.py checks both, torch's scatter_reduce and the C++ segment sum,
# with -0.0, infinities and segments longer than a piece), and depend on no machine: no fused
# multiply-add can enter. The engine's fused weighted gather-sum (``ops.gather_sum``, C++ built with
# ``-march=native``) may contract a product into its running sum, one rounding fewer: where the
# module would run that kernel, the folded value can differ from it in the last bit (a float64 check
# at 2000 x 16 rows: 4,143 of 8,000 sums differed, by at most 3.6e-15). Both are within rounding
# of the reference engine, which is what every compiled module is checked against.
# Products-like x 1/8 GCN, loaded: 3.4-3.8 -> 2.2-2.6 CPU s for this evaluation (the whole
# evaluation through the engine held the gathered rows, their products and a copy of them in the
# module).

# NOTE: [sequential sums in C++] Where the engine offers them (``Backend.sequential_sums``; the torch
# engine's is ``engines/native.py``'s ``fold_sums``, the C++ kernel ``engines/native_fold.cpp``), the
# sums of NOTE: [sequential sums] come from one fused loop instead: it reads each gathered row once
# into its segment's running sums (numpy's path copies it into a buffer, multiplies the buffer and
# adds it up), asks for rows a few entries ahead (the gather is bound by memory latency), and splits
# the segments over torch's threads, each segment summed by one thread. Its values are the same bit
# for bit, on any machine: that file is compiled with floating-point contraction off (each product
# rounded on its own) and vectorised across the features only, never across a sum's entries
# (tests/test_native_fold.py fails if either changes). Where the engine has no such kernel, or its C++
# kernels are switched off or not built, the pass computes the sums itself, as before.

# NOTE: [folding in chunks] (now for a folded max, min or product over gathered facts: sums and means
# are NOTE: [sequential sums]) GCN's first aggregation over the node features, folded, gathers the
# features to every edge and weights them before summing: two (E, F) float64 temporaries, at
# products-like x 1/8 (8M edges, 100 features) 6.4 GB each. Evaluated a run of whole segments at a
# time, each temporary stays near CHUNK_VALUES values (128 MB): numpy gathers the run's rows of the
# facts (a copy, no arithmetic), and the run's sub-program sums them, unweighted rows times their
# coefficients, as a REDUCE of a FACT (no GATHER: the rows are already in edge order). Every value
# is reduced from the same products, in the same order, by the same kernel (the sub-program keeps
# the node's kernel; a sum or a mean computes each segment and feature on its own), so the values
# are those of the whole evaluation, bit for bit. Below CHUNK_VALUES nothing changes.
# Whole rows, not a few feature columns of every edge (as before): a gather of one column reads
# one value per cache miss where a row reads 100, and every column piece copied all the indices
# and coefficients again. Products-like GCN (62M edges, 100 features): the pass took 147 s in
# pieces of one column (superlinear: x 1/8 took 5.2 s); in runs of rows it is linear in E * F.
# Products-like x 1/16, GCN: by 2^24 values the pass took 0.8 GB of fresh memory at once.


def fold_constants(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    folded = _targets(program, nodes, is_constant(program, nodes))
    if not folded:
        return program
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.name in folded:
            key = rw.const(f"folded_{node.name}", evaluate(program, node.name))
            rw.replace(Node(node.name, Op.FACT, (), node.count, node.shape,
                            {"const": key, "fact_layer": None, "unit": False}, node.layer))
        else:
            rw.keep(node)
    read = _ancestors(program, folded)
    return freeze_facts(rw.finish(), {n.name for n in program.nodes if n.op is Op.FACT and n.name in read})


def _targets(program: Program, nodes: dict[str, Node], constant: set[str]) -> set[str]:
    """The constants to fold: those that non-constant ops (or the output) read, except row
    movements that would store many more rows than they read (:data:`EXPANSION`), under
    which the search goes on, unless they are a segmented product's rows (NOTE: [folded product rows])."""
    users = users_of(program.nodes)
    needed = [program.output] if program.output in constant else []
    needed += [s for n in program.nodes if n.name not in constant for s in n.srcs if s in constant]
    targets: set[str] = set()
    seen: set[str] = set()
    while needed:
        name = needed.pop()
        if name in seen:
            continue
        seen.add(name)
        node = nodes[name]
        if node.op in (Op.FACT, Op.WEIGHTS):
            continue
        if node.op in INDEXING and _expands(node, nodes) and not _product_rows(node, [nodes[u] for u in users[name]]):
            needed.extend(node.srcs)
        elif node.op is Op.SLICE and nodes[node.srcs[0]].op in (Op.FACT, Op.WEIGHTS):
            continue  # a view of a stored constant: nothing to compute
        else:
            targets.add(name)
    return targets


def _expands(node: Node, nodes: dict[str, Node]) -> bool:
    """A row movement whose result is much bigger (over ``EXPANSION`` times) than what it reads."""
    return node.count > EXPANSION * sum(nodes[s].count for s in dict.fromkeys(node.srcs))


def _product_rows(node: Node, readers: list[Node]) -> bool:
    """A GATHER that only segmented products read, as their value side (NOTE: [folded product rows])."""
    values = node.count * int(np.prod(node.shape, dtype=np.int64))
    return (node.op is Op.GATHER and values <= PRODUCT_ROWS_VALUES and bool(readers)
            and all(r.op is Op.LINEAR and r.srcs[1] == node.name and r.srcs[0] != node.name
                    and r.attrs.get("w_layout") == "interleave" and r.attrs.get("x_layout", "full") == "full"
                    and r.count == node.count for r in readers))


def evaluate(program: Program, name: str):
    """The float64 value of node ``name`` (a numpy array), computed by the engine (``backend``)."""
    sub = eliminate_dead_code(program.replace(output=name))
    if name in zero_sign_matters(program):
        # The sign of its zeros reaches an inverse, log or sqrt in ``program``: an (unused) inverse
        # reader makes the generated code give them as the whole program would (NOTE: [signed zeros in max and min]).
        node = sub.node(name)
        reader = Node(f"{name}_inverse", Op.TRANSFORM, (name,), node.count, node.shape, {"fn": "inverse"})
        while any(n.name == reader.name for n in sub.nodes):
            reader = reader.with_(name=f"{reader.name}_")
        sub = sub.replace(nodes=sub.nodes + (reader,))
    else:
        summed = _gathered_sum(sub, name)
        if summed is not None:
            return summed
        chunked = _in_chunks(sub, name)
        if chunked is not None:
            return chunked
    return backend.current().evaluate(sub)


def _gathered_sum(sub: Program, name: str) -> np.ndarray | None:
    """The value of ``name`` where it is a sum or mean (REDUCE) over a GATHER of a stored FACT, as
    the engine's segment kernel computes it (NOTE: [sequential sums]); None where it is not."""
    nodes = sub.by_name()
    node = nodes[name]
    if (node.op is not Op.REDUCE or node.attrs.get("kernel") not in ("segment", "scatter") or "index" in node.attrs
            or node.attrs["aggregation"] not in ("sum", "mean")):
        return None
    gather = nodes[node.srcs[0]]
    if gather.op is not Op.GATHER or nodes[gather.srcs[0]].op is not Op.FACT:
        return None
    facts = sub.constants[nodes[gather.srcs[0]].attrs["const"]]
    coef = sub.constants[node.attrs["coef"]] if "coef" in node.attrs else None
    counts, index = sub.constants[node.attrs["counts"]], sub.constants[gather.attrs["index"]]
    value = _engine_sums(facts, index, coef, counts)
    if value is None:
        value = sequential_sums(facts, index, coef, counts)
    if node.attrs["aggregation"] == "mean":
        value /= counts.astype(np.float64).reshape((-1,) + (1,) * (value.ndim - 1))
    # In place, not ``reshape``: a view would make ``Rewriter.const`` copy it (products-like: 2 GB, 6% of the pass).
    value.shape = (node.count, *node.shape)
    return value


def _engine_sums(facts: np.ndarray, index: np.ndarray, coef: np.ndarray | None, counts: np.ndarray
                 ) -> np.ndarray | None:
    """``sequential_sums``' values, bit for bit, from the engine's fold kernel where it offers one
    (``Backend.sequential_sums``: the torch engine's is C++, NOTE: [sequential sums in C++]); None where
    it does not, or cannot now (its kernels switched off or not built)."""
    kernel = getattr(backend.current(), "sequential_sums", None)
    return None if kernel is None else kernel(facts, index, coef, counts)


def sequential_sums(facts: np.ndarray, index: np.ndarray, coef: np.ndarray | None, counts: np.ndarray,
                    chunk_values: int | None = None) -> np.ndarray:
    """``value[j] = (((0.0 + p[s]) + p[s + 1]) + ...) + p[s + counts[j] - 1]`` in float64, where
    ``s`` is segment ``j``'s first entry and ``p[e] = coef[e] * facts[index[e]]`` (rounded: no fused
    multiply-add), added in entry order (NOTE: [sequential sums])."""
    chunk_values = chunk_values or SEQUENTIAL_CHUNK
    counts = np.asarray(counts, dtype=np.int64)
    n = counts.size
    facts = np.asarray(facts, dtype=np.float64)
    width = int(np.prod(facts.shape[1:], dtype=np.int64))
    with warnings.catch_warnings():  # read-only constants: torch warns, and nothing here writes them
        warnings.simplefilter("ignore", UserWarning)
        x = torch.from_numpy(facts.reshape(facts.shape[0], width))
    coef = None if coef is None else np.asarray(coef, dtype=np.float64)
    value = np.zeros((n, width), dtype=np.float64)
    starts = np.cumsum(counts) - counts
    order = np.argsort(counts, kind="stable")  # segments of equal length side by side
    ordered = counts[order]
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(ordered)) + 1, [n]]).tolist()
    # The gathered rows of every piece, in one buffer (a fresh tensor per piece costs twice the gather).
    buffer = torch.empty((max(1, chunk_values // max(width, 1)) if n else 0, width), dtype=torch.float64)
    block = buffer.numpy()  # the same memory: numpy adds the entries (NOTE: [sequential sums])
    for a, b in zip(bounds[:-1], bounds[1:]):
        length = int(ordered[a]) if a < b else 0
        if length == 0:
            continue  # empty segments sum to 0.0
        segments = order[a:b]
        per_piece = max(1, chunk_values // (length * max(width, 1)))  # whole segments per piece
        run = min(length, max(1, chunk_values // max(width, 1)))  # else entries of one segment per piece
        for lo in range(0, segments.size, per_piece):
            piece = segments[lo:lo + per_piece]
            first = starts[piece][:, None]
            acc = np.zeros((piece.size, width), dtype=np.float64)
            for k in range(0, length, run):
                entries = first + np.arange(k, min(k + run, length))  # (segments, entries)
                rows = torch.index_select(x, 0, torch.from_numpy(index[entries].ravel()), out=buffer[:entries.size])
                if coef is not None:
                    rows.view(piece.size, entries.shape[1], width).mul_(torch.from_numpy(coef[entries]).unsqueeze(2))
                _add_entries(block[:entries.size].reshape(piece.size, entries.shape[1], width), acc)
            value[piece] = acc
    return value


def _add_entries(rows: np.ndarray, acc: np.ndarray) -> None:
    """``acc[s] = (((acc[s] + rows[s, 0]) + rows[s, 1]) + ...)`` per segment ``s`` and feature, in
    entry order (``rows``: (segments, entries, width), C order, overwritten). ``np.add.reduce`` over
    the entries' axis, which is not the fast one, adds one (segments, width) slice at a time, in
    order: numpy sums pairwise only along the fast axis, which a width of 1 would make the entries'
    one (there, running sums: ``np.add.accumulate`` is sequential on every axis)."""
    rows[:, 0] += acc
    if rows.shape[2] > 1:
        np.add.reduce(rows, axis=1, out=acc)
    else:
        np.add.accumulate(rows, axis=1, out=rows)
        acc[...] = rows[:, -1]


def _in_chunks(sub: Program, name: str) -> np.ndarray | None:
    """The value of REDUCE ``name`` over a GATHER of a stored FACT, computed about ``CHUNK_VALUES``
    gathered values (a run of whole segments) at a time (NOTE: [folding in chunks]); None where it
    is not such a node, or small."""
    nodes = sub.by_name()
    node = nodes[name]
    if node.op is not Op.REDUCE or node.attrs.get("kernel") not in ("segment", "scatter") or "index" in node.attrs:
        return None
    gather = nodes[node.srcs[0]]
    width = int(np.prod(node.shape, dtype=np.int64))
    if gather.op is not Op.GATHER or gather.count * width <= CHUNK_VALUES or nodes[gather.srcs[0]].op is not Op.FACT:
        return None
    fact = nodes[gather.srcs[0]]
    counts = sub.constants[node.attrs["counts"]]
    index = sub.constants[gather.attrs["index"]]
    coef = sub.constants[node.attrs["coef"]] if "coef" in node.attrs else None
    facts = sub.constants[fact.attrs["const"]]
    run = max(1, CHUNK_VALUES // width)  # gathered rows per run of segments
    ends = np.cumsum(counts, dtype=np.int64)
    starts = ends - counts
    cuts = np.unique(np.searchsorted(starts, np.arange(0, gather.count, run)))
    cuts = np.append(cuts[cuts < counts.size], counts.size)
    keys = {part: f"{fact.attrs['const']}_{part}" for part in ("counts", "coef")}  # not the fact's
    attrs = {**node.attrs, "counts": keys["counts"], **({"coef": keys["coef"]} if coef is not None else {})}
    value = np.empty((node.count, *node.shape), dtype=np.float64)
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        lo, hi = int(starts[a]), int(ends[b - 1])
        constants = {fact.attrs["const"]: facts[index[lo:hi]], keys["counts"]: counts[a:b]}
        if coef is not None:
            constants[keys["coef"]] = coef[lo:hi]
        piece = sub.replace(nodes=(fact.with_(count=hi - lo), node.with_(srcs=(fact.name,), count=b - a, attrs=attrs)),
                            constants=constants,
                            weights=())  # it reads no weight: no module parameter to make per run
        value[a:b] = backend.current().evaluate(piece)
    return value


def _ancestors(program: Program, names: set[str]) -> set[str]:
    nodes = program.by_name()
    seen, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(nodes[name].srcs)
    return seen
