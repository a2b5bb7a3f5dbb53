"""A sum (or mean) of a fused sparse sum's rows becomes one sparse sum: two linear maps, one matrix.

GCN's last layer aggregates 1-wide rows over the graph and the readout then averages
them per sample: two sparse products, an addition of the layer's bias between them,
and all of their backwards. A sum or mean ``R2`` over the rows of a fused ``sparse_mm``
sum ``R1`` that nothing else reads is the product of their matrices, ``(P A) x``::

    %a = REDUCE(%h; kernel='sparse_mm', index=i, counts=c)         %p = REDUCE(%h; kernel='sparse_mm',
    %p = REDUCE(%a; aggregation='mean', counts=k)          ->           index=i', counts=k', coef=d')

Row ``j`` of ``P A`` lists, for each row ``r`` of ``R2``'s segment ``j``, the edges of
``R1``'s segment ``r`` with the product of both coefficients (``1/count`` for a mean).

NOTE: [repeated columns] A readout reads many rows that share their neighbours (and
deduplication makes that common: MUTAG's 188 samples read 81 distinct node values over
10,813 edges), so a column of ``P A`` comes up again and again within one row. Those
entries are merged into one whose coefficient is their sum, ``a x + b x = (a + b) x``
(MUTAG GCN's readout: 1,618 entries instead of 10,813, summed forward and backward every
step). The coefficients are exact float64 sums; the row's terms are summed in another
order, like every other composition here. A bias
added to ``R1`` (``%b = ADD(%a, %c)``, ``%c`` one row) passes through a mean, whose
segments are never empty, as ``mean(a + c) = mean(a) + c``. The sums are the same real
numbers summed in another order, so outputs agree to rounding; no value is merged.
Made where the new matrix (repeated columns merged) has no more entries than the two
had together.
"""
from __future__ import annotations

import numpy as np

from ..grouping import expand_segments
from ..ir import Node, Op, Program, is_sparse_sum
from ..rewrite import Rewriter, single_use
from ..settings import Settings

__all__ = ["compose_sums", "CHUNK_ENTRIES"]

#: The composed matrix's entries are made, sorted and merged a run of whole rows, about this
#: many entries, at a time (NOTE: [merging in chunks]).
CHUNK_ENTRIES = 1 << 16

# NOTE: [merging in chunks] At 100x PROTEINS the readout's composed matrix has 20.6M entries
# (4M after merging). Sorted all at once, as int64 keys row * n_columns + column, the stable
# sort (timsort) took 0.45 s and the pass, with its six entry-sized arrays (160 MB each), 1.0 s
# of CPU (2.8 s where their pages were fresh). The rows come in order, so the sort only has
# to order each row's columns: a run of whole rows at a time is sorted on its own, with keys
# that number each row's columns from its lowest on, after the previous rows' (as few keys as
# the rows' column spans: a chunk's keys fit in 16 bits for graph readouts, and numpy's
# stable sort of uint16 is a radix sort). The chunks' arrays are small and reused, and the
# result is the same bit for bit: the same entries in the same stable order, each merged
# coefficient the same ``np.add.reduceat`` of the same run. 100x: 0.47 s of CPU; 10x 0.08 ->
# 0.045 s (loaded machine).


def compose_sums(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    rw = Rewriter(program)
    for node in program.nodes:
        inner, bias = _inner_sum(node, nodes, once)
        composed = None if inner is None else _composed_matrix(program, node, inner)
        if composed is None:
            rw.keep(node)
            continue
        index, counts, coef = composed
        attrs = {"aggregation": "sum", "kernel": inner.attrs["kernel"],
                 "counts": rw.const(f"counts_{node.name}", counts), "index": rw.const(f"idx_{node.name}", index)}
        if not np.all(coef == 1.0):
            attrs["coef"] = rw.const(f"coef_{node.name}", coef)
        if bias is None:
            rw.keep(node.with_(srcs=inner.srcs, attrs=attrs))
        else:  # mean(a + c) = mean(a) + c: the bias after the mean
            summed = rw.keep(node.with_(name=rw.fresh(f"{node.name}_sum"), srcs=inner.srcs, attrs=attrs))
            rw.keep(node.with_(op=Op.ADD, srcs=(summed.name, bias.name), attrs={}))
    return rw.finish()


def _inner_sum(node: Node, nodes: dict[str, Node], once: set[str]) -> tuple[Node | None, Node | None]:
    """``(R1, bias)`` where ``node`` is a sum or mean of a single-use fused sum ``R1``'s rows
    (directly, or plus a one-row bias under a mean); else ``(None, None)``."""
    # Not "strided": its segments are not consecutive rows (segment j is rows j, j + n, ...).
    if node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean") \
            or node.attrs.get("kernel") == "strided":
        return None, None
    src, bias = nodes[node.srcs[0]], None
    if src.op is Op.ADD and src.name in once and node.attrs["aggregation"] == "mean":
        value, other = (nodes[s] for s in src.srcs)
        if other.count == 1 and other.shape == src.shape and value.name != other.name:
            src, bias = value, other
    if is_sparse_sum(src) and src.name in once and src.attrs["aggregation"] in ("sum", "mean"):
        return src, bias
    return None, None


def _composed_matrix(program: Program, outer: Node, inner: Node) -> tuple | None:
    """``(index, counts, coef)`` of the product of ``outer``'s and ``inner``'s matrices, or
    None where it has more entries than the two, or ``outer`` has an empty segment."""
    c = program.constants
    outer_counts = c[outer.attrs["counts"]].astype(np.int64)
    if outer.attrs["aggregation"] == "mean" and not np.all(outer_counts > 0):
        return None
    n_outer = int(outer_counts.sum())
    rows = c[outer.attrs["index"]].astype(np.int64) if "index" in outer.attrs else np.arange(n_outer)
    outer_coef = np.asarray(c[outer.attrs["coef"]], np.float64) if "coef" in outer.attrs else np.ones(n_outer)
    if outer.attrs["aggregation"] == "mean":
        outer_coef = outer_coef / np.repeat(outer_counts, outer_counts)
    inner_counts = c[inner.attrs["counts"]].astype(np.int64)
    inner_index = c[inner.attrs["index"]]
    inner_coef = np.asarray(c[inner.attrs["coef"]], np.float64) if "coef" in inner.attrs \
        else np.ones(inner_index.shape[0])
    if inner.attrs["aggregation"] == "mean":
        inner_coef = inner_coef / np.repeat(inner_counts, inner_counts)
    picked = inner_counts[rows]  # edges each outer entry brings
    first_edge = (np.cumsum(inner_counts) - inner_counts)[rows]
    outer_bounds = np.concatenate([[0], np.cumsum(outer_counts)])  # outer entries of each row
    row_bounds = np.concatenate([[0], np.cumsum(picked)])[outer_bounds]  # new entries of each row
    # Whole rows, about CHUNK_ENTRIES new entries at a time (NOTE: [merging in chunks]).
    cuts = np.searchsorted(row_bounds[:-1], np.arange(0, row_bounds[-1], CHUNK_ENTRIES), side="right") - 1
    cuts = np.append(np.unique(np.concatenate([[0], cuts])), outer.count)  # [0, 0]: one empty chunk
    pieces = []
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        first, last = int(outer_bounds[a]), int(outer_bounds[b])
        edges = expand_segments(first_edge[first:last], picked[first:last])
        coef = inner_coef[edges]
        coef *= np.repeat(outer_coef[first:last], picked[first:last])
        pieces.append(_merge_repeated_columns(inner_index[edges], coef, np.diff(row_bounds[a:b + 1])))
    index, counts, coef = (np.concatenate(parts) for parts in zip(*pieces))
    if index.size > inner_index.shape[0] + n_outer:
        return None
    return index, counts, coef


def _merge_repeated_columns(columns: np.ndarray, coef: np.ndarray, lengths: np.ndarray) -> tuple:
    """``(index, counts, coef)`` of a sparse matrix given entry by entry (``columns``,
    ``coef``; rows in order, row ``k`` has ``lengths[k]`` entries), with the entries of one
    row that read the same column merged into one whose coefficient is their sum (``a x + b x
    = (a + b) x``; NOTE: [repeated columns]); each row's columns ascending."""
    if columns.size == 0:
        return np.zeros(0, np.int64), np.zeros(lengths.size, np.int64), coef
    # Each entry's key: row k's columns low_k .. high_k numbered from ends[k - 1] on, so the
    # keys order the entries by row, then column, and are as few as the rows' column spans.
    nonempty = lengths > 0
    low = np.zeros(lengths.size, np.int64)
    high = np.full(lengths.size, -1, np.int64)  # an empty row spans no column
    starts = (np.cumsum(lengths) - lengths)[nonempty]
    low[nonempty] = np.minimum.reduceat(columns, starts)
    high[nonempty] = np.maximum.reduceat(columns, starts)
    ends = np.cumsum(high + 1 - low)
    shift = ends - (high + 1)  # key = column + shift[row]
    keys = columns + np.repeat(shift, lengths)
    # A stable sort: equal keys keep their order, so each merged coefficient is summed in the
    # order of its entries. Keys below 2^16 sort as uint16: a radix sort (NOTE: [merging in chunks]).
    order = np.argsort(keys.astype(np.uint16) if ends[-1] <= 1 << 16 else keys, kind="stable")
    keys = keys[order]
    first = np.empty(keys.size, bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    unique = keys[starts]
    counts = np.diff(np.searchsorted(unique, ends), prepend=0)
    return unique - np.repeat(shift, counts), counts, np.add.reduceat(coef[order], starts)
