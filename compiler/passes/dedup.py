"""Thesis 5.2.6: deduplication, and downward propagation of the resulting gathers.

Every node computes each distinct value once:

* ``dedup_linear``: a LINEAR computes each distinct (weight row, value row) pair once;
* ``dedup_aggregations``: a REDUCE computes each distinct group of inputs once (groups are
  compared as multisets: every aggregation is commutative); then rows that nothing reads are
  dropped.

Rows are compared by structural labels (``RowIds``): equal labels mean equal values as
functions of the weights, because they are the same weight row, the same fact row, the same pair
of equal rows, or the same multiset of equal rows -- never by comparing weight values (two
different learnable weights are different functions even when their values agree).

Computing a node on its distinct rows only (``compress``) pushes the row selection up into its
single-use producers (see ``upward.RowPlanner``, "shrink" policy) and then rewrites its readers:
a GATHER composes the inverse index into its own; an elementwise TRANSFORM, or an ADD whose other
side agrees on the merged rows, shrinks along and passes the reindexing further down; a CONCAT
shifts its offsets and passes it on; anything else (or the output) reads a new GATHER.

Before (MUTAG GCN after ``dedup_facts``: 7 distinct one-hot atom rows, 3371 atoms)::

    %f_x = FACT(const=facts_f_x[49])                              : (7, 7)
    %conv1_lin_x = GATHER(%f_x; index=idx_conv1_lin_x[3371])      : (3371, 7)
    %conv1_lin_w = GATHER(%w_16x7; index=idx_conv1_lin_w[3371])   : (3371, 16, 7)
    %conv1_lin_lin = LINEAR(%conv1_lin_w, %conv1_lin_x)           : (3371, 16)
    %conv1_lin_agg = REDUCE(%conv1_lin_lin; counts=[1, ...])      : (3371, 16)
    %conv1_x = GATHER(%conv1_lin_agg; index=idx_conv1_x[7442])    : (7442, 16)
    %conv1_agg = REDUCE(%conv1_x; counts=counts_conv1[3371])      : (3371, 16)

After ``dedup_linear`` and ``dedup_aggregations``: the linear op runs on the 7 distinct rows,
before the gather, and the convolution on its 19 distinct neighbourhoods::

    %f_x = FACT(const=facts_f_x[49])                              : (7, 7)
    %conv1_lin_w = GATHER(%w_16x7; index=[0, 0, 0, 0, 0, 0, 0])   : (7, 16, 7)
    %conv1_lin_lin = LINEAR(%conv1_lin_w, %f_x)                   : (7, 16)
    %conv1_lin_agg = REDUCE(%conv1_lin_lin; counts=[1, ...])      : (7, 16)
    %conv1_x = GATHER(%conv1_lin_agg; index=idx_conv1_x[48])      : (48, 16)
    %conv1_agg = REDUCE(%conv1_x; counts=counts_conv1_agg[19])    : (19, 16)
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Op, Program, linear_grid
from ..settings import Settings
from .upward import SHRINK, Editor, RowPlanner, linear_side_rows, source_rows

__all__ = ["dedup_linear", "dedup_aggregations", "compress", "representatives", "RowIds",
           "sequence_ids", "row_value_ids"]


# -- labels ----------------------------------------------------------------------------------------

def representatives(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(reps, inverse)``: the first row of each distinct label, ascending, and for every row
    the position of its label among them (``labels[reps][inverse]`` equals ``labels``)."""
    if labels.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order].astype(np.int64), rank[inverse.reshape(-1)].astype(np.int64)


def _dense(labels: np.ndarray) -> np.ndarray:
    return np.unique(labels, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _pair_ids(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = _dense(a), _dense(b)
    return _dense(a * (int(b.max(initial=0)) + 1) + b)


def row_value_ids(values: np.ndarray) -> np.ndarray:
    """Labels of bitwise-equal rows of an array (NaN rows with equal bits are equal)."""
    n = values.shape[0]
    flat = np.ascontiguousarray(values.reshape(n, -1))
    if flat.shape[1] == 0:
        return np.zeros(n, np.int64)
    rows = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).reshape(n)
    return np.unique(rows, return_inverse=True)[1].reshape(-1).astype(np.int64)


def sequence_ids(values: np.ndarray, counts: np.ndarray, ordered: bool = False) -> np.ndarray:
    """Labels of the segments of ``values`` (consecutive, ``counts`` long): equal labels iff
    the segments are equal sequences (``ordered``) or multisets.

    Segments are hashed (two 64-bit polynomial hashes), and every segment is then compared
    with the representative of its hash class element by element, so the labels are exact.
    """
    counts = counts.astype(np.int64)
    n = counts.size
    if n == 0:
        return np.zeros(0, np.int64)
    segment = np.repeat(np.arange(n), counts)
    values = _dense(values) if values.size else values.astype(np.int64)
    if not ordered and values.size:
        values = values[np.lexsort((values, segment))]
    starts = np.cumsum(counts) - counts
    position = np.arange(values.size) - starts[segment]
    longest = int(counts.max(initial=0))
    keys = [counts.astype(np.uint64)]
    rng = np.random.default_rng(0x5EED)  # fixed: labels are the same on every run
    for _ in range(2):
        mult = rng.integers(1, 2**63, size=longest + 1, dtype=np.uint64) | np.uint64(1)
        with np.errstate(over="ignore"):
            terms = (values.astype(np.uint64) + np.uint64(1)) * mult[position]
            sums = np.concatenate([[np.uint64(0)], np.cumsum(terms, dtype=np.uint64)])
            keys.append(sums[starts + counts] - sums[starts])
    labels = np.unique(np.stack(keys, 1), axis=0, return_inverse=True)[1].reshape(-1)
    first = np.unique(labels, return_index=True)[1]
    rep = first[labels]  # the representative segment of each segment's hash class
    same = values == values[starts[rep][segment] + position]
    wrong = np.bincount(segment[~same], minlength=n) > 0  # a hash collision: keep it apart
    labels = labels.astype(np.int64)
    labels[wrong] = labels.max(initial=0) + 1 + np.arange(int(wrong.sum()))
    return labels


class RowIds:
    """Structural labels of every node's rows: equal labels => equal values (as functions of
    the weights and dynamic facts). Follows row moves made through the editor."""

    def __init__(self, editor: Editor):
        self.editor = editor
        self.memo: dict[str, np.ndarray] = {}
        editor.row_listeners.append(self._moved)

    def _moved(self, name: str, rows: np.ndarray) -> None:
        if name in self.memo:
            self.memo[name] = self.memo[name][rows]

    def of(self, name: str) -> np.ndarray:
        if name not in self.memo:
            self.memo[name] = self._compute(self.editor.nodes[name])
        return self.memo[name]

    def _compute(self, node: Node) -> np.ndarray:
        e = self.editor
        if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
            return self.of(node.srcs[0])[source_rows(node, np.arange(node.count), e.constants)]
        if node.op is Op.CONCAT:
            parts, offset = [], 0
            for s in node.srcs:
                labels = _dense(self.of(s))
                parts.append(labels + offset)
                offset += int(labels.max(initial=-1)) + 1
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if node.op is Op.TRANSFORM:
            return self.of(node.srcs[0])
        if node.op is Op.ADD:
            return _pair_ids(self.of(node.srcs[0]), self.of(node.srcs[1]))
        if node.op is Op.LINEAR:
            w, x = (e.nodes[s] for s in node.srcs)
            _, g2 = linear_grid(node, w, x)
            rows = np.arange(node.count)
            w_rows = linear_side_rows(node.attrs.get("w_layout", "full"), rows, g2)
            x_rows = linear_side_rows(node.attrs.get("x_layout", "full"), rows, g2)
            return _pair_ids(self.of(w.name)[w_rows], self.of(x.name)[x_rows])
        if node.op is Op.REDUCE:
            counts = e.constants[node.attrs["counts"]]
            inputs = self.of(node.srcs[0])
            if node.attrs.get("kernel") == "strided":  # segment j is rows j, j + n, ...
                inputs = inputs.reshape(-1, max(node.count, 1)).T.reshape(-1)
            return sequence_ids(inputs, counts)
        return np.arange(node.count, dtype=np.int64)  # FACT, WEIGHTS: every row its own


def _shallow_ids(editor: Editor, name: str) -> np.ndarray:
    node = editor.nodes[name]
    if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
        return source_rows(node, np.arange(node.count), editor.constants)
    return np.arange(node.count)


# -- compress: compute a node on some of its rows, reindex its readers ---------------------------

def compress(editor: Editor, planner: RowPlanner, name: str, reps: np.ndarray, inverse: np.ndarray,
             ids: RowIds | None = None) -> None:
    """Make node ``name`` compute only its rows ``reps``; its old row ``i`` is new row
    ``inverse[i]`` (rows that nothing reads may map anywhere). Readers are rewritten."""
    node = editor.nodes[name]
    readers = editor.readers(name)
    was_output = editor.output == name
    if node.op is Op.FACT:
        new = planner.fold_fact(name, reps)
    else:
        new = planner.rows(name, reps, None, exclusive=True).build()
    _reindex(editor, planner, name, new, reps, inverse, readers, was_output, ids)


def _reindex(editor: Editor, planner: RowPlanner, old: str, new: str, reps: np.ndarray, inverse: np.ndarray,
             readers: list[str], was_output: bool, ids: RowIds | None) -> None:
    """Readers of ``old`` (whose row ``i`` is now row ``inverse[i]`` of ``new``) adapt."""
    restore: list[str] = []

    def restored() -> str:  # GATHER(new, inverse): the old rows, for readers that need them
        if not restore:
            restore.append(editor.gather(new, inverse, layer=editor.nodes[new].layer))
        return restore[0]

    for name in readers:
        node = editor.nodes[name]
        if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
            # Same rows as before, read from the smaller node: compose the index.
            rows = inverse[source_rows(node, np.arange(node.count), editor.constants)]
            key = editor.const(f"idx_{name}", rows, owner=name)
            editor.define(Node(name, Op.GATHER, (new,), node.count, node.shape, {"index": key}, node.layer))
            continue
        if node.op is Op.TRANSFORM or (node.op is Op.ADD and _agrees(editor, node, old, reps, inverse, ids)):
            # Elementwise: shrink along, and pass the reindexing further down.
            after = editor.readers(name)
            after_output = editor.output == name
            srcs = tuple(new if s == old else planner.rows(s, reps, name).build() for s in node.srcs)
            editor.define(node.with_(srcs=srcs, count=int(reps.size)), rows=reps)
            _reindex(editor, planner, name, name, reps, inverse, after, after_output, ids)
            continue
        if node.op is Op.CONCAT:
            after = editor.readers(name)
            after_output = editor.output == name
            old_counts = [inverse.size if s == old else editor.nodes[s].count for s in node.srcs]
            new_counts = [reps.size if s == old else editor.nodes[s].count for s in node.srcs]
            old_offsets = np.cumsum(old_counts) - old_counts
            new_offsets = np.cumsum(new_counts) - new_counts
            parts_reps, parts_inverse = [], []
            for s, c, o_old, o_new in zip(node.srcs, old_counts, old_offsets, new_offsets):
                parts_reps.append((reps if s == old else np.arange(c)) + o_old)
                parts_inverse.append((inverse if s == old else np.arange(c)) + o_new)
            concat_reps, concat_inverse = np.concatenate(parts_reps), np.concatenate(parts_inverse)
            srcs = tuple(new if s == old else s for s in node.srcs)
            editor.define(node.with_(srcs=srcs, count=int(sum(new_counts))), rows=concat_reps)
            _reindex(editor, planner, name, name, concat_reps, concat_inverse, after, after_output, ids)
            continue
        editor.define(node.with_(srcs=tuple(restored() if s == old else s for s in node.srcs)))
    if was_output:
        editor.output = restored()
        editor._users = None


def _agrees(editor: Editor, node: Node, old: str, reps: np.ndarray, inverse: np.ndarray,
            ids: RowIds | None) -> bool:
    """Whether the other side of ADD ``node`` is equal on rows merged in ``old``."""
    for s in node.srcs:
        if s == old:
            continue
        labels = ids.of(s) if ids is not None else _shallow_ids(editor, s)
        if not np.array_equal(labels[reps][inverse], labels):
            return False
    return True


# -- the passes ----------------------------------------------------------------------------------------

def _dedup(program: Program, settings: Settings, ops: tuple[Op, ...], drop_unused: bool) -> Program:
    editor = Editor(program)
    planner = RowPlanner(editor, settings, SHRINK)
    ids = RowIds(editor)
    for name in [n.name for n in program.nodes if n.op in ops]:
        if not editor.is_live(name) or editor.nodes[name].op not in ops:
            continue
        reps, inverse = representatives(ids.of(name))
        if reps.size < editor.nodes[name].count:
            compress(editor, planner, name, reps, inverse, ids)
    if drop_unused:
        _drop_unused_rows(editor, planner, ids)
    return editor.finish()


def _drop_unused_rows(editor: Editor, planner: RowPlanner, ids: RowIds) -> None:
    """Rows that no gather reads are not computed (latest nodes first, so that what they stop
    reading becomes unused upstream in the same sweep)."""
    computed = (Op.REDUCE, Op.ADD, Op.TRANSFORM, Op.LINEAR)
    candidates = [n.name for n in editor.program.nodes if n.op in computed]
    for name in reversed(candidates):
        if not editor.is_live(name) or editor.output == name:
            continue
        readers = editor.readers(name)
        if not readers or any(editor.nodes[r].op is not Op.GATHER for r in readers):
            continue
        used = np.unique(np.concatenate([editor.index(editor.nodes[r]) for r in readers]))
        if used.size == editor.nodes[name].count:
            continue
        inverse = np.zeros(editor.nodes[name].count, dtype=np.int64)
        inverse[used] = np.arange(used.size)
        compress(editor, planner, name, used, inverse, ids)


def dedup_linear(program: Program, settings: Settings) -> Program:
    """Each LINEAR computes every distinct (weight row, value row) pair once (thesis 5.2.6)."""
    return _dedup(program, settings, (Op.LINEAR,), drop_unused=False)


def dedup_aggregations(program: Program, settings: Settings) -> Program:
    """Each REDUCE computes every distinct group once; unread rows are dropped (thesis 5.2.6)."""
    return _dedup(program, settings, (Op.REDUCE,), drop_unused=True)
