"""Per-relation products as one segmented product: rows chunked by weight, one batched GEMM.

A relational layer (RGCN: one weight per relation type; basis decomposition: one per basis)
multiplies every row by one of many weight matrices. Vectorized, that is one LINEAR whose
weight side gathers a matrix per row: a ``(rows, out, in)`` copy of the weights and a batched
matrix-vector product per row. ``split_products`` turns a few weights (at most 8) into a GEMM
each; with tens or hundreds of relations that would be a statement (and an autograd node) per
relation. The thesis' padding (5.2.4-5.2.5) sorts the rows by weight and pads every group to a
common block size, so that the weight side becomes one row per block ("interleave"): but with
groups of very different sizes (a root weight on every node beside a hundred small relations)
the common block is large and most rows are padding (100k nodes, 1M edges, 100 relation types:
1,030,746 rows for 246,832 products).

This pass cuts each weight's rows into chunks of ``C`` rows instead, the last chunk of a weight
padded with copies of one of its rows, and gives the LINEAR the chunks' weights, one per chunk
(``w_layout="interleave"``): one batched GEMM of ``(chunks, C, in) x (chunks, in, out)``, the
segmented product, whatever the number of relations::

    %w = GATHER(%W; index=[per-row weight])  : (n, o, i)        %w = GATHER(%W; index=[per-chunk weight]) : (k, o, i)
    %x = GATHER(%X; index=...)               : (n, i)     ->   %x = GATHER(%X; index=[rows by chunk])    : (k C, i)
    %lin = LINEAR(%w, %x)                    : (n, o)          %lin_chunks = LINEAR(%w, %x; w_layout='interleave')
                                                               %lin = GATHER(%lin_chunks; index=[row -> position])

``C`` minimises ``rows + CHUNK_ROWS * chunks`` over the group sizes and the powers of two (a
chunk costs about ``CHUNK_ROWS`` rows of work in overhead): for roughly equal relations ``C``
is their size, and a large group (the root term) takes several chunks. The gather back is
composed into the reduction that reads the products by the later passes (a sparse sum reads
the chunked rows directly), and padded rows are never read: outputs and gradients are exactly
those of the per-row products. Only row indices are used, never values (dynamic facts are safe).
"""
from __future__ import annotations

import numpy as np

from ..indexing import ROW_SELECTIONS, layout_rows, resolve_rows, trace_rows
from ..ir import Node, Op, Program
from ..rewrite import Rewriter, side_node
from ..settings import Settings

__all__ = ["relation_products", "chunk_plan", "ChunkPlan", "chunk_size", "MIN_WEIGHTS", "MIN_ROWS", "CHUNK_ROWS",
           "MAX_SPLITS"]

#: Fewer distinct weights are left to padding and ``split_products`` (one GEMM per weight).
MIN_WEIGHTS = 9
#: Products with fewer rows are left as they are (nothing to gain).
MIN_ROWS = 64
#: The overhead of one chunk of the batched GEMM, in rows of work (CPU, MKL).
CHUNK_ROWS = 32
#: Chunk sizes that split one group into at most this many chunks are candidates (see chunk_size).
MAX_SPLITS = 64


class ChunkPlan:
    """Row ``e`` of the product lands on row ``position[e]`` of ``rows`` rows; ``x_index`` (one per new row)
    are the value side's rows, ``w_index`` (one per chunk of ``size`` rows) the weight side's."""

    def __init__(self, size: int, position: np.ndarray, x_index: np.ndarray, w_index: np.ndarray):
        self.size, self.position, self.x_index, self.w_index = size, position, x_index, w_index

    @property
    def rows(self) -> int:
        return int(self.x_index.size)

    @property
    def chunks(self) -> int:
        return int(self.w_index.size)


def chunk_size(group_sizes: np.ndarray, chunk_rows: int = CHUNK_ROWS) -> int:
    """The ``C`` minimising ``sum_g ceil(n_g / C) * (C + chunk_rows)`` (ties: the smallest).

    Between two values of ``C`` where no ``ceil(n_g / C)`` changes, the cost grows with ``C``, so
    the best ``C`` is one where some group fits exactly ``m`` chunks: ``ceil(n_g / m)``. Those are the
    candidates, for ``m`` up to ``MAX_SPLITS`` (more chunks per group than that cost more in overhead
    than the padding they save on any group the others do not dominate), and the powers of two.
    """
    sizes = np.asarray(group_sizes, dtype=np.int64)
    largest = int(sizes.max())
    splits = np.arange(1, MAX_SPLITS + 1)
    candidates = np.unique(np.concatenate([-(-sizes[:, None] // splits[None, :]).ravel(),
                                           2 ** np.arange(int(np.log2(largest)) + 1)]))
    cost = np.zeros(candidates.size, dtype=np.int64)
    for start in range(0, sizes.size, 64):  # (candidates, 64 groups) at a time: bounded memory
        part = sizes[start:start + 64]
        cost += (-(-part[None, :] // candidates[:, None]) * (candidates[:, None] + chunk_rows)).sum(1)
    return int(candidates[np.argmin(cost)])


def chunk_plan(w_index: np.ndarray, x_index: np.ndarray, chunk_rows: int = CHUNK_ROWS) -> ChunkPlan:
    """Rows grouped by weight (stable), each group cut into chunks of one size, the last one padded."""
    w_index = np.asarray(w_index, dtype=np.int64)
    order = np.argsort(w_index, kind="stable")
    weights, first, sizes = np.unique(w_index[order], return_index=True, return_counts=True)
    size = chunk_size(sizes, chunk_rows)
    chunks = -(-sizes // size)
    padded = chunks * size
    group_start = np.concatenate([[0], np.cumsum(padded)[:-1]])
    # Sorted row k of group g goes to group_start[g] + (k - first[g]).
    group_of_sorted = np.repeat(np.arange(weights.size), sizes)
    new_of_sorted = group_start[group_of_sorted] + np.arange(order.size) - first[group_of_sorted]
    position = np.empty(order.size, dtype=np.int64)
    position[order] = new_of_sorted
    # Padding rows repeat the group's first row (any row of the group would do: nobody reads them).
    new_x = np.repeat(np.asarray(x_index)[order[first]], padded)
    new_x[new_of_sorted] = np.asarray(x_index)[order]
    return ChunkPlan(size, position, new_x, np.repeat(weights, chunks))


def relation_products(program: Program, settings: Settings) -> Program:
    """Give every matrix product over many weights the chunked, segmented layout (see the module doc)."""
    rw = Rewriter(program, in_place=True)
    for name in [n.name for n in program.nodes if n.op is Op.LINEAR]:
        nodes = rw.nodes
        linear = nodes[name]
        w_side, x_side = nodes[linear.srcs[0]], nodes[linear.srcs[1]]
        if linear.attrs["kind"] != "matmul" or linear.count < MIN_ROWS or len(w_side.shape) != 2 \
                or len(x_side.shape) != 1 or w_side.count == 1:
            continue
        rows = np.arange(linear.count, dtype=np.int64)
        w_layout, x_layout = linear.attrs.get("w_layout", "full"), linear.attrs.get("x_layout", "full")
        current = program.replace(constants=rw.constants)  # trace_rows reads its constants, and ``nodes``
        origins = trace_rows(current, nodes, w_side.name, layout_rows(w_layout, w_side.count, linear.count, rows))
        base = origins.single_base()
        if base is None or nodes[base].op is not Op.WEIGHTS:
            continue
        readers = _gather_readers(rw, name)
        live = rows if readers is None else np.unique(np.concatenate(
            [rw.constants[r.attrs["index"]] for r in readers])).astype(np.int64)
        weight_of_row = np.asarray(origins.row, dtype=np.int64)[live]
        if np.unique(weight_of_row).size < MIN_WEIGHTS:
            continue
        x = resolve_rows(nodes, rw.constants, x_side.name)
        x_rows = x.index[layout_rows(x_layout, x_side.count, linear.count, live)]
        plan = chunk_plan(weight_of_row, x_rows)
        if w_layout == "interleave" and x_layout == "full" and \
                linear.count + CHUNK_ROWS * w_side.count <= plan.rows + CHUNK_ROWS * plan.chunks:
            continue  # already segmented, and no more cheaply
        weights = nodes[base]
        w_nodes = side_node(rw, resolve_rows(nodes, rw.constants, base), plan.w_index, f"{name}_w", linear.layer)
        x_nodes = side_node(rw, x, plan.x_index, f"{name}_x", linear.layer)
        srcs = (w_nodes[0].name if w_nodes else weights.name, x_nodes[0].name if x_nodes else x.source)
        chunked = linear.with_(srcs=srcs, count=plan.rows,
                               attrs={**linear.attrs, "w_layout": "interleave", "x_layout": "full"})
        # Old row live[k] is new row plan.position[k]; a dead row (nobody reads it) maps anywhere.
        position = np.zeros(linear.count, dtype=np.int64)
        position[live] = plan.position
        if readers is None:
            chunked = chunked.with_(name=rw.fresh(f"{name}_chunks"))
            back = rw.new_gather(name, chunked, position, linear.layer).with_(name=name)
            rw.place(name, w_nodes + x_nodes + [chunked, back])
        else:
            rw.place(name, w_nodes + x_nodes + [chunked])
            for reader in readers:
                key = rw.const(f"idx_{reader.name}", position[rw.constants[reader.attrs["index"]]])
                rw.place(reader.name, [reader.with_(attrs={**reader.attrs, "index": key})])
        _drop_unused(rw, [s for s in linear.srcs if s not in srcs])
    return rw.finish()


def _gather_readers(rw: Rewriter, name: str) -> list[Node] | None:
    """The GATHERs reading ``name`` (to be reindexed), or None if anything else reads it (or it is the output)."""
    if name == rw.output:
        return None
    readers = [rw.nodes[u] for u in dict.fromkeys(rw.all_users()[name])]
    if not readers or any(r.op is not Op.GATHER for r in readers):
        return None
    return readers


def _drop_unused(rw: Rewriter, names) -> None:
    """Remove the nodes ``names`` (and the row selections they read) that nothing reads any more, now:
    the next products' readers (``_gather_readers``) must not count them (``finish`` would drop them too)."""
    pending = list(names)
    while pending:
        users = rw.all_users()
        dead = [n for n in dict.fromkeys(pending) if n in users and not users[n] and n != rw.output]
        if not dead:
            return
        pending = [s for n in dead for s in rw.nodes[n].srcs if rw.nodes[s].op in ROW_SELECTIONS]
        for n in dead:
            rw.place(n, [])
