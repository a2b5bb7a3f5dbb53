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
from ..ir import Node, Op, Program
from ..rewrite import eliminate_dead_code, fresh_const, single_use
from ..settings import Settings

__all__ = ["compose_sums"]


def compose_sums(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    once = single_use(program)
    constants = dict(program.constants)
    result: list[Node] = []
    changed = False
    for node in program.nodes:
        inner, bias = _inner_sum(node, nodes, once)
        if inner is None:
            result.append(node)
            continue
        composed = _composed_matrix(program, node, inner)
        if composed is None:
            result.append(node)
            continue
        index, counts, coef = composed
        attrs = {"aggregation": "sum", "kernel": "sparse_mm",
                 "counts": fresh_const(program, constants, f"counts_{node.name}", counts),
                 "index": fresh_const(program, constants, f"idx_{node.name}", index)}
        if not np.all(coef == 1.0):
            attrs["coef"] = fresh_const(program, constants, f"coef_{node.name}", coef)
        if bias is None:
            result.append(node.with_(srcs=inner.srcs, attrs=attrs))
        else:  # mean(a + c) = mean(a) + c: the bias after the mean
            summed = node.with_(name=f"{node.name}_sum", srcs=inner.srcs, attrs=attrs)
            result += [summed, node.with_(op=Op.ADD, srcs=(summed.name, bias.name), attrs={})]
        changed = True
    if not changed:
        return program
    return eliminate_dead_code(program.replace(nodes=tuple(result), constants=constants))


def _inner_sum(node: Node, nodes: dict[str, Node], once: set[str]) -> tuple[Node | None, Node | None]:
    """``(R1, bias)`` where ``node`` is a sum or mean of a single-use fused sum ``R1``'s rows
    (directly, or plus a one-row bias under a mean); else ``(None, None)``."""
    # Not "strided": its segments are not consecutive rows (segment j is rows j, j + n, ...).
    if node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean") \
            or node.attrs.get("kernel") not in ("segment", "sparse_mm", "dense", "scatter"):
        return None, None
    src, bias = nodes[node.srcs[0]], None
    if src.op is Op.ADD and src.name in once and node.attrs["aggregation"] == "mean":
        value, other = (nodes[s] for s in src.srcs)
        if other.count == 1 and other.shape == src.shape and value.name != other.name:
            src, bias = value, other
    if src.op is Op.REDUCE and src.attrs.get("kernel") == "sparse_mm" and src.name in once \
            and src.attrs["aggregation"] in ("sum", "mean"):
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
    outer_coef = c[outer.attrs["coef"]].astype(np.float64) if "coef" in outer.attrs else np.ones(n_outer)
    if outer.attrs["aggregation"] == "mean":
        outer_coef = outer_coef / np.repeat(outer_counts, outer_counts)
    inner_counts = c[inner.attrs["counts"]].astype(np.int64)
    inner_index = c[inner.attrs["index"]]
    inner_coef = c[inner.attrs["coef"]].astype(np.float64) if "coef" in inner.attrs \
        else np.ones(inner_index.shape[0])
    if inner.attrs["aggregation"] == "mean":
        inner_coef = inner_coef / np.repeat(inner_counts, inner_counts)
    picked = inner_counts[rows]  # edges each outer entry brings
    edges = expand_segments((np.cumsum(inner_counts) - inner_counts)[rows], picked)
    # Each new entry as one int64 key, row * n_columns + column, built in place: entry-sized
    # arrays are tens of millions long at scale (PROTEINS 100x: 20M), so every pass counts.
    n_columns = int(inner_index.max()) + 1 if inner_index.size else 1
    keys = np.repeat(np.repeat(np.arange(outer.count, dtype=np.int64) * n_columns, outer_counts), picked)
    keys += inner_index[edges]
    coef = inner_coef[edges]
    del edges
    coef *= np.repeat(outer_coef, picked)
    index, counts, coef = _merge_repeated_columns(keys, n_columns, coef, outer.count)
    if index.size > inner_index.shape[0] + n_outer:
        return None
    return index, counts, coef


def _merge_repeated_columns(keys: np.ndarray, n_columns: int, coef: np.ndarray, n_rows: int) -> tuple:
    """``(index, counts, coef)`` of a sparse matrix given entry by entry (key ``row * n_columns
    + column``), with the entries of one row that read the same column merged into one whose
    coefficient is their sum (``a x + b x = (a + b) x``; NOTE: [repeated columns]); each row's
    columns ascending."""
    if keys.size == 0:
        return keys, np.zeros(n_rows, np.int64), coef
    # A stable sort: the rows come in order and their columns in ascending runs, which
    # timsort merges (3x faster than np.unique here, and than np.sort of keys packed with
    # their positions); equal keys keep their order, so each merged coefficient is summed
    # in the order of its entries.
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    coef = coef[order]
    del order
    first = np.empty(keys.size, bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    del first
    unique = keys[starts]
    del keys
    rows, columns = np.divmod(unique, n_columns)
    return columns, np.bincount(rows, minlength=n_rows), np.add.reduceat(coef, starts)
