"""Fixed per-edge factors into the reduction: a weighted sparse matrix instead of per-edge products.

A sum or mean whose inputs are ``fixed scalar x value`` (GCN's ``1/sqrt(deg_i deg_j)``,
the fixed weight 0 that gives isolated nodes an empty neighbourhood) multiplies every
edge's whole value row, every step, by a constant it could have known at compile time.
This pass gives the reduction the factors as per-edge constants (REDUCE's ``coef``)
and reads the values directly; a mean becomes a sum whose coefficients include
``1/count``. With a gather before it, the reduction is then one weighted sparse
matrix product (PyG's cached, normalised ``adj_t``)::

    %x = GATHER(h; index=idx)                          : (E, 16)
    %c = GATHER(w_scalar; index=widx)                  : (E)        fixed scalars
    %p = LINEAR(c, x; kind='mul')                      : (E, 16)
    %a = REDUCE(p; aggregation='sum', counts=k)        : (n, 16)
  becomes
    %x = GATHER(h; index=idx)                          : (E, 16)
    %a = REDUCE(x; aggregation='sum', counts=k, coef=c_a)   c_a[e] = w_scalar[widx[e]]

The rows are traced through any chain of indexing ops and scalar products
(:func:`indexing.trace_rows`), so broadcast layouts and CONCATs of parts (the isolated-node
artefact of the GNN templates) dissolve too. Factors of 0 stay as explicit entries:
``0 * inf`` is NaN, so dropping them would change non-finite results. Static facts of
shape ``()`` count as fixed scalars (their layers then are no longer replaceable at call
time); facts in ``Settings.dynamic_facts`` never do.

A fixed positive scalar per row *after* such a sum goes into the same coefficients: GCN's
normalisation factorised on skewed graphs (NOTE: [GCN normalisation] in
``datasets/gnn.py``) multiplies node ``i``'s sum by ``1/sqrt(deg_i)`` after it, every step
(arxiv-like: a stack of 332 scalars, an index_select and an addcmul over every (n, 128) output)::

    %a = REDUCE(x; aggregation='sum', coef=c)          %s = REDUCE(x; aggregation='sum', coef=c')
    %s = LINEAR(GATHER(w_scalar; index=k), a; 'mul') -> c'[e] = c[e] * w_scalar[k[i]], i the row of e

``s_i * sum_e c_e x_e`` becomes ``sum_e (s_i c_e) x_e``: the same real number, rounded in another
order (float64 within a few ulps). Only for finite ``s_i > 0`` whose products with the
coefficients stay finite and nonzero: a negative factor would turn a sum's ``+0.0`` into ``-0.0``
after the sum but not before, and a factor of 0 or inf would change which values are NaN.
The sum must be read by the product alone. With the features folded (``fold_constants``: the
first layer's ``A_hat X``), the factor is then part of the folded constant too.
"""
from __future__ import annotations

import numpy as np

from ..gather_plans import emit_plan, plan_index
from ..indexing import trace_rows
from ..ir import Node, Op, Program, is_sparse_sum
from ..rewrite import Rewriter, freeze_facts
from ..settings import Settings

__all__ = ["reduce_coefficients", "segment_of_rows"]


def segment_of_rows(node: Node, counts: np.ndarray, rows: int) -> np.ndarray:
    """The segment (output row) each input row of a REDUCE belongs to."""
    if node.attrs.get("kernel") == "strided":
        return np.arange(rows, dtype=np.int64) % max(node.count, 1)
    return np.repeat(np.arange(node.count, dtype=np.int64), counts)


def reduce_coefficients(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    facts_used: set[str] = set()
    factors: list = []  # edge-sized factors met so far: GCN's later layers meet the first one's again
    for node in program.nodes:
        node = rw.take(node)
        if (node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean")
                or "coef" in node.attrs or is_sparse_sum(node)):
            rw.keep(node)
            continue
        source = rw.nodes[node.srcs[0]]
        origins = trace_rows(program.replace(constants=rw.constants), rw.nodes, source.name, scalars=True,
                             factors=factors)
        bases = [rw.nodes[b] for b in origins.bases]
        # Several bases are read through one CONCAT of them all: only where that is no bigger.
        if not origins.scaled or sum(b.count for b in bases) > source.count:
            rw.keep(node)
            continue
        facts_used |= origins.facts_used
        if len(bases) == 1:
            root = bases[0]
            # As traced (int32 where the program's indices are): plan_index reads it and the
            # stored index is int32 anyway; an int64 copy was 150 MB at 100x PROTEINS.
            index = origins.row
        else:
            offsets = np.cumsum([0] + [b.count for b in bases])[:-1]
            index = offsets[origins.which] + origins.row
            root = rw.emit(rw.fresh(f"{node.name}_sources"), Op.CONCAT, [b.name for b in bases],
                           sum(b.count for b in bases), source.shape, node.layer)
        src = emit_plan(rw, rw.fresh(f"{node.name}_x"), plan_index(index, root.count), root, node.layer)
        coef = origins.coef
        counts = rw.constants[node.attrs["counts"]]
        if node.attrs["aggregation"] == "mean":
            coef = coef / counts[segment_of_rows(node, counts, coef.size)]
        attrs = dict(node.attrs, aggregation="sum", coef=rw.const(f"coef_{node.name}", coef))
        rw.replace(node.with_(srcs=(src,), attrs=attrs))
    result = rw.finish()
    result, scales_used = _scales_after_sums(result)
    return freeze_facts(result, facts_used | scales_used)


def _scales_after_sums(program: Program) -> tuple[Program, set[str]]:
    """Fixed positive per-row factors after weighted sums, moved into the sums' coefficients."""
    rw = Rewriter(program)
    nodes, users = program.by_name(), program.users()
    facts_used: set[str] = set()
    made: list = []  # (old coefficients, scale, counts, new coefficients) of the sums scaled so far
    for node in program.nodes:
        found = (_scaled_sum(program, nodes, node, users, made) if node.op is Op.LINEAR and node.attrs["kind"] == "mul"
                 else None)
        if found is None:
            rw.keep(node)
            continue
        total, coef, used = found
        facts_used |= used
        rw.keep(total.with_(name=node.name, layer=node.layer,
                            attrs=dict(total.attrs, coef=rw.const(f"coef_{node.name}", coef))))
    return rw.finish(), facts_used


def _scaled_sum(program: Program, nodes: dict[str, Node], node: Node, users: dict[str, list[str]], made: list):
    """``(sum, its new coefficients, facts used)`` where ``node`` multiplies each row of a weighted
    sum read by it alone by a fixed positive finite scalar; else None. Where an earlier sum in
    ``made`` had the same coefficients (the same array: GCN's layers, see ``indexing._scalar_values``),
    scale and counts, its new coefficients are these (edge-sized work once, not once per layer)."""
    origins = trace_rows(program, nodes, node.name, scalars=True)
    if not origins.scaled or len(origins.bases) != 1:
        return None
    total = nodes[origins.bases[0]]
    if (total.op is not Op.REDUCE or total.attrs["aggregation"] != "sum" or "coef" not in total.attrs
            or total.attrs.get("kernel") == "strided" or is_sparse_sum(total) or users[total.name] != [node.name]
            or total.count != node.count or total.shape != node.shape
            or not np.array_equal(origins.row, np.arange(node.count))):
        return None
    scale = np.asarray(origins.coef, dtype=np.float64)
    if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
        return None
    counts = program.constants[total.attrs["counts"]]
    old = np.asarray(program.constants[total.attrs["coef"]], dtype=np.float64)  # read only: no copy
    for seen_old, seen_scale, seen_counts, seen in made:
        if seen_old is old and np.array_equal(seen_scale, scale) and np.array_equal(seen_counts, counts):
            return total, seen, origins.facts_used
    # Whole edge-sized arrays, as few as possible (products-like: 62M edges): each segment's factor
    # repeated over its entries (not strided: refused above) is the product's right side and its output.
    coef = np.repeat(scale, counts)
    np.multiply(old, coef, out=coef)
    # Finite: no NaN or infinity (NaN propagates into min and max). Then old is finite too, and a zero
    # coefficient stays zero (0 * s): the zeros are the same exactly where there are as many of them.
    if coef.size and not (np.isfinite(coef.min()) and np.isfinite(coef.max())):
        return None
    if np.count_nonzero(coef) != np.count_nonzero(old):
        return None
    coef.flags.writeable = False
    made.append((old, scale, counts, coef))
    return total, coef, origins.facts_used

