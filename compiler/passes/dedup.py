"""Thesis 5.2.6: deduplication, and downward propagation of the resulting gathers.

Every node computes each distinct value once:

* ``dedup_linear``: a LINEAR computes each distinct (weight row, value row) pair once;
* ``dedup_aggregations``: a REDUCE computes each distinct group of inputs once (groups are
  compared as multisets: every aggregation is commutative); then rows that nothing reads are
  dropped.

Rows are compared by structural labels (``RowIds``): equal labels mean equal values as
functions of the weights, because they are the same weight row, the same fact row, the same pair
of equal rows, or the same multiset of equal rows -- never by comparing weight values (two
different learnable weights are different functions even when their values agree). Equal labels
are found exactly and without sorting (``compiler/grouping.py``), and the labels of unchanged
nodes pass from one labeling pass to the next (NOTE: [label hand-over]).

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

import weakref
from dataclasses import dataclass

import numpy as np

from .. import grouping
from ..grouping import first_equal_multisets, first_equal_rows, first_rows, representatives, row_dtype
from ..ir import Node, Op, Program, linear_grid
from ..settings import Settings
from .upward import SHRINK, Editor, RowPlanner, linear_side_rows, source_rows

__all__ = ["dedup_linear", "dedup_aggregations", "compress", "RowIds", "hand_over_distinct_facts"]


# -- labels ----------------------------------------------------------------------------------------

_TRANSIENT = (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE, Op.LINEAR)  # edge-sized: not kept once read
_PAIR_LIMIT = 2**62


def _pair(a: np.ndarray, a_bound: int, b: np.ndarray, b_bound: int,
          a_rows: np.ndarray | None = None, b_rows: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Exact labels of the pairs ``(a[i], b[i])``: ``a * b_bound + b`` (compacted first if that
    could overflow). With ``a_rows`` (``b_rows``), side ``a`` (``b``) is read as ``a[a_rows]``: a
    gathered side is read a chunk of rows at a time (NOTE: [chunks]), never made whole."""
    if a_bound * b_bound >= _PAIR_LIMIT:
        a, a_bound = first_rows(a if a_rows is None else a[a_rows], a_bound), (a if a_rows is None else a_rows).size
        b, b_bound = first_rows(b if b_rows is None else b[b_rows], b_bound), (b if b_rows is None else b_rows).size
        a_rows = b_rows = None
    bound = max(a_bound * b_bound, 1)
    n = (a if a_rows is None else a_rows).size
    pairs = np.empty(n, row_dtype(bound))  # int32 where every pair (and b_bound) fits
    for lo in range(0, n, grouping.CHUNK):
        hi = min(lo + grouping.CHUNK, n)
        np.multiply(a[lo:hi] if a_rows is None else a[a_rows[lo:hi]], b_bound, out=pairs[lo:hi], dtype=pairs.dtype)
        pairs[lo:hi] += b[lo:hi] if b_rows is None else b[b_rows[lo:hi]]
    return pairs, bound


@dataclass(frozen=True)
class _Known:
    """A node's labels as one labeling pass left them, and what they were computed from."""

    node: Node
    inputs: tuple          # the node objects it read
    arrays: tuple          # (key, array) of the constants it named
    ids: np.ndarray | None  # None: an edge-sized intermediate, recomputed when needed
    bound: int
    first: np.ndarray | None
    # Its rows are pairwise distinct under the labeling of the pass that found it, which labelled
    # facts by value (``fact_values``) but for ``dynamic`` (NOTE: [distinct rows]); or None.
    distinct: tuple | None = None


# NOTE: [distinct rows] A labeling that merges more (iso_compression's: facts equal by value,
# fixed weights by bytes) than another (dedup's: facts by row, weights by name) is coarser: rows
# equal under the finer one are equal under the coarser one. So rows that the coarser labeling
# finds pairwise distinct are distinct under the finer one too, and their finer labels are just
# ``arange(count)``, with nothing computed upstream. iso_compression leaves every layer end it
# compressed (or found distinct) and every node whose labels increase strictly marked so; dedup's
# passes take the mark while the node and everything it reads are the very same nodes and constant
# arrays (a FACT only re-marked as no longer replaceable counts as the same), and pass it on.
# At 100x PROTEINS this spares dedup_linear the labels of both convolutions' aggregations and of
# the readout (three hashings of up to 20M labels). dedup_facts, which compares facts by their
# bytes as iso_compression does, marks the facts it found distinct and left alone the same way
# (``hand_over_distinct_facts``), so that iso_compression does not hash their rows again.

# NOTE: [label hand-over] iso_compression, dedup_linear and dedup_aggregations run back to back
# and label the same nodes. The first two leave their labels to the next pass, keyed to the
# program they returned (held weakly, and taken by the next labeling pass). A label is reused only
# for the very same node object reading the very same, unchanged nodes and constant arrays
# (``RowIds.unchanged``).
_handover: list = []  # [(weakref to the program, {name: _Known})], at most one


def _hand_over(program: Program, known: dict) -> None:
    _handover.clear()
    ref = weakref.ref(program, lambda _: _handover.clear())
    _handover.append((ref, known))


def hand_over_distinct_facts(program: Program, names: list[str], dynamic) -> None:
    """Tell the next labeling pass that the FACT nodes ``names`` of ``program`` have pairwise
    distinct rows, bit for bit (``dedup_facts`` found so): iso_compression, which labels facts by
    their bytes, takes every row as its own instead of hashing them again (NOTE: [distinct rows];
    at 100x PROTEINS 4.3M rows of 3 floats, 0.25 s)."""
    nodes, constants = program.by_name(), program.constants
    known = {}
    for name in names:
        node = nodes[name]
        arrays = tuple((v, constants[v]) for v in node.attrs.values() if isinstance(v, str) and v in constants)
        known[name] = _Known(node, (), arrays, None, 0, None, (True, frozenset(dynamic)))
    _hand_over(program, known)


def _handed_over(program: Program) -> dict:
    """The labels left for ``program`` (taken: the slot is empty afterwards)."""
    known = _handover[0][1] if _handover and _handover[0][0]() is program else {}
    _handover.clear()
    return known


class RowIds:
    """Exact labels of every node's rows: equal labels => equal values, as functions of the
    learnable weights (and of the dynamic facts). Follows row moves made through the editor.

    A node's labels are ``(ids, bound)`` with ``0 <= ids < bound``: a WEIGHTS row is its weight's
    name; a FACT row its own row, or with ``fact_values`` (isomorphic compression) the row's bytes
    (static facts only); an indexing op selects its source's labels; a LINEAR or ADD row is the
    pair of its inputs' labels; a TRANSFORM row its input's label; a REDUCE row the multiset of
    its inputs' labels (every aggregation is commutative -- max and min on signed zeros too, NOTE:
    [signed zeros in max and min]; for a mean, up to a common factor of the
    multiplicities: mean{a, a, b, b} = mean{a, b} for every value of a and b, gradients included).
    Rows of different CONCAT parts never share a label. Two weights are never equal because their values are: a learnable weight is
    itself only; a fixed weight, with ``fact_values``, equals the fixed weights with the same bytes.

    Labels of edge-sized intermediates (gathers, linear products) are dropped once read, so that
    a pass holds only a few edge-sized arrays at a time.
    """

    def __init__(self, editor: Editor, fact_values: bool = False, dynamic: tuple = ()):
        self.editor = editor
        self.fact_values = fact_values
        self.dynamic = set(dynamic)
        self.memo: dict[str, tuple[np.ndarray, int]] = {}
        self.firsts: dict[str, np.ndarray] = {}
        self.known = _handed_over(editor.program)  # labels an earlier labeling pass left
        self._unchanged: dict[str, tuple] = {}  # name -> (node, its inputs, unchanged?) as checked
        self._initial = editor.program.by_name()  # the nodes as this pass found them
        self._carried: dict[str, Node] = {}  # name -> its redefinition with the same values (carry)
        self._same: dict[str, bool] = {}  # name -> same_values(name), as checked
        self._distinct: dict[str, dict] = {}  # name -> what it read when found distinct (mark_distinct)
        editor.row_listeners.append(self._moved)

    def _moved(self, name: str, rows: np.ndarray) -> None:
        if name in self.memo:
            ids, bound = self.memo[name]
            self.memo[name] = (ids[rows], bound)
        self.firsts.pop(name, None)

    def labels(self, name: str) -> tuple[np.ndarray, int]:
        if name not in self.memo:
            node = self.editor.nodes[name]
            known = self.known.get(name)
            if known is not None and known.ids is not None and self.unchanged(name):
                self.memo[name] = known.ids, known.bound
                if known.first is not None:
                    self.firsts[name] = known.first
            elif self.known_distinct(name):
                every_row_its_own = np.arange(node.count, dtype=row_dtype(node.count))
                self.memo[name] = every_row_its_own, max(node.count, 1)
                self.firsts[name] = every_row_its_own
            else:
                self.memo[name] = self._compute(node)
            for s in set(node.srcs):
                if self.editor.nodes[s].op in _TRANSIENT:
                    self.memo.pop(s, None)
        return self.memo[name]

    def carry(self, name: str, redefined: Node) -> None:
        """Keep an earlier pass's labels of node ``name`` across its redefinition as ``redefined``,
        which keeps its values."""
        if self.known_distinct(name):
            self._carried[name] = redefined
        known = self.known.get(name)
        if name not in self.memo and known is not None and known.ids is not None and self.unchanged(name):
            self.memo[name] = known.ids, known.bound

    def unchanged(self, name: str) -> bool:
        """Whether node ``name`` holds the same values as when an earlier pass labelled it: the
        same node object, reading unchanged nodes and the same constant arrays. Leaves (facts,
        weights) are relabelled -- cheaply -- and compared, since this pass may label them by
        other rules (fact values or not)."""
        nodes = self.editor.nodes
        node = nodes[name]
        inputs = tuple(nodes[s] for s in node.srcs)
        checked = self._unchanged.get(name)
        if checked is not None and checked[0] is node and all(a is b for a, b in zip(checked[1], inputs)):
            return checked[2] and all(self.unchanged(s) for s in set(node.srcs))
        known = self.known.get(name)
        same = known is not None and known.node is node
        if same and node.op in (Op.FACT, Op.WEIGHTS):
            ids, bound = self._compute(node)
            same = bound == known.bound and np.array_equal(ids, known.ids)
        elif same:
            same = (all(a is self.editor.constants.get(k) for k, a in known.arrays)
                    and all(a is b for a, b in zip(known.inputs, inputs))
                    and all(self.unchanged(s) for s in set(node.srcs)))
        self._unchanged[name] = (node, inputs, same)
        return same

    def known_distinct(self, name: str) -> bool:
        """Whether an earlier pass found node ``name``'s rows pairwise distinct under a labeling at
        least as coarse as this one, and the node still holds those values (NOTE: [distinct rows])."""
        known = self.known.get(name)
        if known is None or known.distinct is None:
            return False
        by_values, dynamic = known.distinct
        coarser = not self.fact_values or (by_values and dynamic <= self.dynamic)
        # Not redefined by this pass (its rewrites keep every value but of the rows they move, and
        # then redefine the readers): the values this pass found.
        now = self.editor.nodes.get(name)
        untouched = now is self._initial.get(name) or now is self._carried.get(name)
        return coarser and untouched and self.same_values(name)

    def same_values(self, name: str) -> bool:
        """Whether node ``name`` and everything it reads were, when this pass started, the nodes
        and constant arrays that an earlier pass handed over (a FACT may have been re-marked as no
        longer replaceable)."""
        if name not in self._same:
            node, known = self._initial[name], self.known.get(name)
            constants = self.editor.program.constants
            self._same[name] = (known is not None and _same_node(known.node, node)
                                and all(a is constants.get(k) for k, a in known.arrays)
                                and all(_same_node(a, self._initial[s]) for a, s in zip(known.inputs, node.srcs))
                                and all(self.same_values(s) for s in set(node.srcs)))
        return self._same[name]

    def mark_distinct(self, name: str) -> None:
        """Node ``name``'s rows are pairwise distinct now (under this labeling): tell the next pass,
        unless what it reads changes before then."""
        self._distinct[name] = _reads(self.editor.nodes, self.editor.constants, name)

    def hand_over(self, program: Program) -> None:
        """Leave this pass's labels to the next labeling pass, for the nodes of ``program``."""
        constants, nodes = program.constants, program.by_name()
        known = {}
        mode = (self.fact_values, frozenset(self.dynamic))
        for name, node in nodes.items():
            if node is not self.editor.nodes.get(name):
                continue
            if name not in self.memo and name in self.known and self.unchanged(name):
                known[name] = self.known[name]  # not needed here, still valid: passed on
                continue
            ids, bound = self.memo.get(name, (None, 0))
            arrays = tuple((v, constants[v]) for v in node.attrs.values() if isinstance(v, str) and v in constants)
            if ids is None and self.known_distinct(name):  # not needed here, still distinct: passed on
                known[name] = _Known(node, tuple(nodes[s] for s in node.srcs), arrays, None, 0, None,
                                     self.known[name].distinct)
                continue
            marked = self._distinct.get(name)
            distinct = ((marked is not None and _still_reads(nodes, constants, marked))
                        or (ids is not None and ids.size > 0 and bool(np.all(ids[1:] > ids[:-1]))))
            known[name] = _Known(node, tuple(nodes[s] for s in node.srcs), arrays, ids, bound,
                                 self.firsts.get(name) if ids is not None else None, mode if distinct else None)
        _hand_over(program, known)

    def close(self) -> None:
        """Stop following the editor and drop every label: the editor and these labels refer to each
        other, and as a cycle they (edge-sized arrays, at 100x PROTEINS hundreds of MB) would wait
        for the garbage collector instead of being freed when the pass returns."""
        self.editor.row_listeners.remove(self._moved)
        for table in (self.memo, self.firsts, self.known, self._unchanged, self._same, self._distinct):
            table.clear()

    def of(self, name: str) -> np.ndarray:
        return self.labels(name)[0]

    def first(self, name: str) -> np.ndarray:
        """The first-row form of node ``name``'s rows (see ``compiler/grouping.py``)."""
        if name not in self.firsts:
            ids, bound = self.labels(name)
            self.firsts[name] = ids if _is_first_form(ids) else first_rows(ids, bound)
        return self.firsts[name]

    def _compute(self, node: Node) -> tuple[np.ndarray, int]:
        e = self.editor
        if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
            ids, bound = self.labels(node.srcs[0])
            return ids[source_rows(node, None, e.constants)], bound
        if node.op is Op.CONCAT:
            parts, offset = [], 0
            total = sum(self.labels(s)[1] for s in node.srcs)
            for s in node.srcs:
                ids, bound = self.labels(s)
                parts.append(ids.astype(row_dtype(total), copy=False) + offset)
                offset += bound
            return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), max(offset, 1)
        if node.op is Op.TRANSFORM:
            return self.labels(node.srcs[0])
        if node.op is Op.ADD:
            return _pair(*self.labels(node.srcs[0]), *self.labels(node.srcs[1]))
        if node.op is Op.LINEAR:
            w, x = (e.nodes[s] for s in node.srcs)
            _, g2 = linear_grid(node, w, x)
            sides = []  # (labels, rows of them or None, bound) of w, then of x
            for side, layout in ((w, node.attrs.get("w_layout", "full")), (x, node.attrs.get("x_layout", "full"))):
                if layout == "full":
                    sides.append(self._gathered(side.name))
                else:
                    ids, bound = self.labels(side.name)
                    sides.append((_side(ids, layout, node.count, g2), None, bound))
            (w_ids, w_rows, w_bound), (x_ids, x_rows, x_bound) = sides
            return _pair(w_ids, w_bound, x_ids, x_bound, w_rows, x_rows)
        if node.op is Op.REDUCE:
            counts = e.constants[node.attrs["counts"]]
            inputs, bound = self.labels(node.srcs[0])
            if node.attrs.get("kernel") == "strided":  # segment j is rows j, j + n, ...
                inputs = inputs.reshape(-1, max(node.count, 1)).T.reshape(-1)
            elif inputs.size == node.count and np.all(counts == 1):
                return inputs, bound  # one input each: the aggregation of one value is that value
            # A mean of {a, a} is a mean of {a}: multisets compare up to a common multiplicity.
            up_to_scale = node.attrs["aggregation"] == "mean"
            return first_equal_multisets(inputs, counts, bound, up_to_scale), max(node.count, 1)
        if node.op is Op.WEIGHTS:
            return self._weight_ids(node)
        if node.op is Op.FACT and self.fact_values and node.attrs.get("fact_layer") not in self.dynamic:
            return first_equal_rows(e.constants[node.attrs["const"]]), max(node.count, 1)
        return np.arange(node.count, dtype=row_dtype(node.count)), max(node.count, 1)  # FACT: every row its own

    def _gathered(self, name: str) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Node ``name``'s labels as ``(ids, rows, bound)``: its labels are ``ids[rows]``, or ``ids``
        where ``rows`` is None. A GATHER whose labels are not at hand gives its source's labels and
        its index, which ``_pair`` reads a chunk at a time: at 100x PROTEINS the labels of a
        convolution's gathered weights and inputs are two edge-sized arrays (20M rows) less."""
        node = self.editor.nodes[name]
        known = self.known.get(name)
        if (node.op is not Op.GATHER or name in self.memo
                or (known is not None and (known.ids is not None or known.distinct is not None))):
            ids, bound = self.labels(name)
            return ids, None, bound
        source = node.srcs[0]
        ids, bound = self.labels(source)
        if self.editor.nodes[source].op in _TRANSIENT:  # dropped once read, as labels() does
            self.memo.pop(source, None)
        return ids, self.editor.constants[node.attrs["index"]], bound

    def _weight_ids(self, node: Node) -> tuple[np.ndarray, int]:
        """Rows naming the same weight are equal (an upward fold may name a weight twice)."""
        weights = {w.name: w for w in self.editor.program.weights}
        seen: dict[object, int] = {}
        ids = np.empty(node.count, dtype=row_dtype(node.count))  # gathered per edge: the narrow type
        for row, name in enumerate(node.attrs["names"]):  # one per weight of the stack, not per edge
            weight = weights.get(name)
            key = name
            if self.fact_values and weight is not None and not weight.learnable:
                value = np.asarray(weight.value)
                key = ("fixed", value.shape, value.dtype.str, value.tobytes())
            ids[row] = seen.setdefault(key, row)
        return ids, max(node.count, 1)


def _same_node(before: Node, now: Node) -> bool:
    """The same node, or the same FACT with only its attributes changed (same constant key)."""
    return before is now or (before.op is Op.FACT and now.op is Op.FACT and before.name == now.name
                             and before.count == now.count and before.attrs["const"] == now.attrs["const"])


def _reads(nodes: dict, constants: dict, name: str) -> dict:
    """Node ``name`` and every node it reads, directly or not: name -> (node, its constant arrays,
    held weakly: an array the pass replaces is freed, not kept for this check)."""
    seen: dict = {}
    stack = [name]
    while stack:
        n = stack.pop()
        if n not in seen:
            node = nodes[n]
            seen[n] = (node, tuple((v, weakref.ref(constants[v])) for v in node.attrs.values()
                                   if isinstance(v, str) and v in constants))
            stack.extend(node.srcs)
    return seen


def _still_reads(nodes: dict, constants: dict, reads: dict) -> bool:
    """Whether every node of ``reads`` (``_reads``) is still there, the same, with the same arrays."""
    return all(n in nodes and _same_node(node, nodes[n]) and all(constants.get(k) is a() for k, a in arrays)
               for n, (node, arrays) in reads.items())


def _side(ids: np.ndarray, layout: str, count: int, g2: int) -> np.ndarray:
    """The labels of a LINEAR side's rows as the LINEAR's ``count`` rows read them."""
    if layout == "full":
        return ids
    return ids[linear_side_rows(layout, np.arange(count), g2)]


def _is_first_form(ids: np.ndarray) -> bool:
    """Whether ``ids`` already is a first-row form (labels that are row numbers of their class's
    first row) -- as every REDUCE, FACT and WEIGHTS label is."""
    n = ids.size
    if n == 0:
        return True
    if ids.min() < 0 or ids.max() >= n:
        return False
    return bool(np.all(ids <= np.arange(n)) and np.all(ids[ids] == ids))


def _shallow_ids(editor: Editor, name: str) -> np.ndarray:
    node = editor.nodes[name]
    if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
        return source_rows(node, None, editor.constants)
    return np.arange(node.count)


# -- compress: compute a node on some of its rows, reindex its readers ---------------------------

def compress(editor: Editor, planner: RowPlanner, name: str, reps: np.ndarray, inverse: np.ndarray,
             ids: RowIds | None = None) -> str:
    """Make node ``name`` compute only its rows ``reps``; its old row ``i`` is new row
    ``inverse[i]`` (rows that nothing reads may map anywhere). Readers are rewritten. Returns the
    node with the rows ``reps``: ``name`` redefined, or a new one where it could not be."""
    node = editor.nodes[name]
    readers = editor.readers(name)
    was_output = editor.output == name
    if node.op is Op.FACT:
        new = planner.fold_fact(name, reps)
    else:
        new = planner.rows(name, reps, None, exclusive=True).build()
    _reindex(editor, planner, name, new, reps, inverse, readers, was_output, ids)
    return new


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
            rows = inverse[source_rows(node, None, editor.constants)]
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
        redefined = node.with_(srcs=tuple(restored() if s == old else s for s in node.srcs))
        if ids is not None:
            ids.carry(name, redefined)  # the same values from a reindexed input: its labels still hold
        editor.define(redefined)
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

def _dedup(program: Program, settings: Settings, ops: tuple[Op, ...], drop_unused: bool,
           hand_over: bool) -> Program:
    editor = Editor(program)
    planner = RowPlanner(editor, settings, SHRINK)
    ids = RowIds(editor)
    for name in [n.name for n in program.nodes if n.op in ops]:
        if not editor.is_live(name) or editor.nodes[name].op not in ops:
            continue
        reps, inverse = representatives(ids.first(name))
        if reps.size < editor.nodes[name].count:
            compress(editor, planner, name, reps, inverse, ids)
        del reps, inverse  # edge-sized: not kept while the next node is labelled
    if drop_unused:
        _drop_unused_rows(editor, planner, ids)
    result = editor.finish()
    if hand_over:
        ids.hand_over(result)
    ids.close()
    return result


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
        read = np.zeros(editor.nodes[name].count, dtype=bool)
        for r in readers:
            read[editor.index(editor.nodes[r])] = True
        if read.all():
            continue
        used = np.flatnonzero(read)
        inverse = np.cumsum(read) - 1
        compress(editor, planner, name, used, np.maximum(inverse, 0), ids)


def dedup_linear(program: Program, settings: Settings) -> Program:
    """Each LINEAR computes every distinct (weight row, value row) pair once (thesis 5.2.6)."""
    return _dedup(program, settings, (Op.LINEAR,), drop_unused=False, hand_over=True)


def dedup_aggregations(program: Program, settings: Settings) -> Program:
    """Each REDUCE computes every distinct group once; unread rows are dropped (thesis 5.2.6)."""
    return _dedup(program, settings, (Op.REDUCE,), drop_unused=True, hand_over=False)
