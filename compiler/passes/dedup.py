"""Thesis 5.2.6: deduplication in one labelling pass, and downward propagation of the gathers it makes.

Every node computes each distinct value once. ``deduplicate`` runs four steps, each with its switch:

* ``dedup_facts``: a static fact layer keeps one row per distinct value (bit for bit), in order of
  first appearance (only the rows that something reads, where only gathers read it);
* ``iso_compression``: within every node that ends a layer (a REDUCE, ADD or TRANSFORM that no
  TRANSFORM or ADD continues), rows that are provably equal merge (thesis 5.2.6, isomorphic
  compression; only rows of the same node are compared, thesis footnote 9);
* ``dedup_linear``: a LINEAR computes each distinct (weight row, value row) pair once;
* ``dedup_aggregations``: a REDUCE computes each distinct group of inputs once (groups are compared
  as multisets: every aggregation is commutative); then rows that nothing reads are dropped.

Rows are compared by structural labels (``RowIds``): equal labels mean equal values as functions of
the weights, because they are the same weight row, the same fact row, the same pair of equal rows,
or the same multiset of equal rows -- never by comparing computed values (two different learnable
weights are different functions even when their values agree; near-equal facts, ``-0.0`` against
``0.0``, and neurons that agree only because one large term dominates all stay apart: thesis 5.2.6
evaluates with random weights and a tolerance, which merges all three, and the outputs or
gradients come out wrong). Equal labels are found exactly and without sorting
(``compiler/grouping.py``). Isomorphic compression labels static facts by their bytes and fixed
weights by their values (a coarser labelling: then the facts stop being replaceable inputs); the
two dedup steps label facts by row and weights by name, which holds for any fact values.

NOTE: [one labelling] The four steps label the same nodes one after the other, so each step hands
its labels to the next within this pass: the labels that the next step's labelling gives too (all
of them from ``dedup_linear`` to ``dedup_aggregations``; from ``iso_compression`` those of nodes
whose facts and fixed weights label the same both ways), and the nodes whose rows a step found
pairwise distinct (NOTE: [distinct rows]). Within a step, labels follow the editor: a node whose
rows move (``Rewriter.define(..., rows=)``) has its labels moved along, and a node redefined with
the same values keeps them (``RowIds.carry``). A node's values change only where it is redefined,
so a label or a distinct mark is used only for the very node object it was found for.

Computing a node on its distinct rows only (``compress``) pushes the row selection up into its
single-use producers (see ``row_planner.RowPlanner``, "shrink" policy) and then rewrites its readers:
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

Isomorphic compression, before (two atoms with the same neighbourhood, written in another order)::

    %x = GATHER(%lin; index=[0, 1, 1, 0])
    %agg = REDUCE(%x; aggregation='sum', counts=[2, 2])      : (2, 16)
    %out = TRANSFORM(%agg; fn='relu')                        : (2, 16)
    %next = GATHER(%out; index=[0, 1, 1])

After::

    %x = GATHER(%lin; index=[0, 1])
    %agg = REDUCE(%x; aggregation='sum', counts=[2])         : (1, 16)
    %out = TRANSFORM(%agg; fn='relu')                        : (1, 16)
    %next = GATHER(%out; index=[0, 0, 0])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import grouping
from ..grouping import (first_equal_multisets, first_equal_rows, first_rows, key_representatives, representatives,
                        row_dtype)
from ..indexing import layout_rows, source_rows
from ..ir import Node, Op, Program
from ..rewrite import Rewriter, is_input_fact
from ..row_planner import SHRINK, RowPlanner
from ..settings import Settings

__all__ = ["deduplicate", "dedup_facts", "iso_compress", "dedup_linear", "dedup_aggregations", "compress",
           "RowIds", "layer_ends"]


# -- labels ----------------------------------------------------------------------------------------

_TRANSIENT = (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE, Op.LINEAR)  # edge-sized: not kept once read
_PAIR_LIMIT = 2**62
_TABLE_KEYS = 1 << 10  # as grouping's: keys below max(4n, this) index first_rows' table


def _pair(a: np.ndarray, a_bound: int, b: np.ndarray, b_bound: int,
          a_rows: np.ndarray | None = None, b_rows: np.ndarray | None = None, decide: bool = False
          ) -> tuple[np.ndarray, int]:
    """Exact labels of the pairs ``(a[i], b[i])``: ``a * b_bound + b`` (compacted first if that
    could overflow). With ``a_rows`` (``b_rows``), side ``a`` (``b``) is read as ``a[a_rows]``: a
    gathered side is read a chunk of rows at a time (NOTE: [chunks]), never made whole.

    With ``decide`` (first_rows groups the pairs next), where one side's label decides the other's,
    that side's labels are the pairs' labels (NOTE: [decided pairs])."""
    n = (a if a_rows is None else a_rows).size
    if decide and a_bound * b_bound > max(4 * n, _TABLE_KEYS):  # the pairs would not index first_rows' table
        for key, key_bound, key_rows, other, other_rows in ((b, b_bound, b_rows, a, a_rows),
                                                             (a, a_bound, a_rows, b, b_rows)):
            if key_bound <= max(4 * n, _TABLE_KEYS):
                keys = key if key_rows is None else key[key_rows]
                if _decides(keys, key_bound, other if other_rows is None else other[other_rows]):
                    return keys.astype(row_dtype(key_bound), copy=False), max(key_bound, 1)
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


def _decides(keys: np.ndarray, key_bound: int, other: np.ndarray) -> bool:
    """Whether rows with equal labels ``keys`` have equal labels ``other`` too: one ``other`` per
    key in a table, then every row compared with its key's, a chunk at a time (the first chunk that
    differs ends it)."""
    table = np.zeros(key_bound, dtype=other.dtype)
    table[keys] = other
    for lo in range(0, keys.size, grouping.CHUNK):
        if not np.array_equal(table[keys[lo:lo + grouping.CHUNK]], other[lo:lo + grouping.CHUNK]):
            return False
    return True


# NOTE: [decided pairs] The pairs of a LINEAR or ADD are labelled ``a * bound_b + b``; with many
# rows of large bounds (GCN's per-edge products of a normalisation coefficient, 804 labels at
# products-like x 1/8, and a source row, 306k labels: 246M possible pairs over 8M edges),
# first_rows must hash them (0.27 s a layer there). But the edge's coefficient is decided by its
# source (1/sqrt(deg) of it): rows with the same source label have the same weight label. Then
# the source labels are exact labels of the pairs -- equal exactly when the pairs are -- and
# small enough to index first_rows' table directly. Checking it is two passes of a table of one
# label per key, made only where first_rows groups the pairs next (dedup_linear; the pairs inside
# a multiset are hashed anyway). The labels differ from ``a * bound_b + b`` only in their values:
# which rows are equal, and so every first-row form, every representative and the program, is
# the same.


# NOTE: [distinct rows] A labelling that merges more (iso_compression's: facts equal by value,
# fixed weights by bytes) than another (dedup's: facts by row, weights by name) is coarser: rows
# equal under the finer one are equal under the coarser one. So rows that the coarser labelling
# finds pairwise distinct are distinct under the finer one too, and their finer labels are just
# ``arange(count)``, with nothing computed upstream. The steps run from coarse to fine (dedup_facts
# compares facts by their bytes as iso_compression does), so every distinct mark holds for every
# later step. iso_compression marks every layer end it compressed or found distinct, and every
# node whose labels increase strictly; dedup_facts the facts it found distinct and left alone. At
# 100x PROTEINS this spares dedup_linear the labels of both convolutions' aggregations and of the
# readout (three hashings of up to 20M labels), and iso_compression the hashing of 4.3M fact rows.


# NOTE: [repeated labellings] A GCN's or SAGE's layers after the first read the same edges with the
# same coefficients, and where every layer's rows are distinct their inputs have the same labels: at
# products-like x 1/8 and 1/16, the decided pairs (NOTE: [decided pairs]) of the third layer's
# per-edge products are computed from exactly the arrays the second layer's were (the same 8M-row
# index and coefficient rows, the same labels of the layer's input). ``_Recent`` keeps the last
# large call of a labelling (``_pair``: its arguments and its value, made read-only) and gives the
# value again, as a copy, when the next call's arguments are equal -- the same objects, or arrays
# compared a chunk at a time (``equal_arrays``: two that differ usually differ in the first chunk).
# ``_pair`` is a pure function of its arguments, so the labels, and the program, are the same. At
# 1/8 it spares one call of 0.09 CPU s (the multisets of the layers' sums were tried too: their
# inputs never repeated there).
_RECENT_ROWS = 1 << 20  # calls over fewer rows are computed again (comparing would cost about as much)


# NOTE: [few merges] Merging rows of a node computes it on fewer rows, but every reader is reindexed
# (an edge-sized rewrite on a large graph) and the output reads a gather back. Where a node has fewer
# than one duplicate row in MIN_MERGED_SHARE (about 0.1%) of its rows, iso compression and the two
# dedup steps leave it as it is: the work saved is under that share of the node's, the rewrites cost
# more. products-like GCN: 5 pairs of mirrored two-node components among 24,490 nodes at 1/100 (81
# among 306k at 1/8); the three layers were compressed ten times over, each time reindexing the 62M
# edges at full size. No benchmark program of graph classification merges so few (the fewest: 0.55%
# of a Cora layer, 0.83% of ENZYMES' readout). Unmerged rows stay unmarked (NOTE: [distinct rows]),
# but iso compression hands the dedup steps each layer end it left so, with its distinct rows: its
# labelling is coarser (NOTE: [distinct rows]), so theirs finds at least as many, and the node is
# not labelled and grouped again (products-like: four of 2.45M rows, 0.2 s each).
MIN_MERGED_SHARE = 1 / 1024


def _worth_merging(count: int, distinct: int) -> bool:
    """Whether a node of ``count`` rows, ``distinct`` of them distinct, is worth computing on those only."""
    return distinct < count and (count - distinct) >= MIN_MERGED_SHARE * count


class _Recent:
    """The last large call of each labelling function and its value (NOTE: [repeated labellings])."""

    def __init__(self):
        self.calls: dict[str, tuple[tuple, object]] = {}

    def __call__(self, function, rows: int, *args):
        if rows < _RECENT_ROWS:
            return function(*args)
        name = function.__name__
        if name in self.calls and _same_arguments(self.calls[name][0], args):
            return _copied(self.calls[name][1])
        value = function(*args)
        for array in value if isinstance(value, tuple) else (value,):
            if isinstance(array, np.ndarray):
                array.flags.writeable = False  # kept for the next call: nobody changes it in place
        self.calls[name] = (args, value)
        return value

    def clear(self) -> None:
        self.calls.clear()


def _same_arguments(old: tuple, new: tuple) -> bool:
    if len(old) != len(new):
        return False
    for a, b in zip(old, new):
        if a is b:
            continue
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                    and a.ndim == b.ndim == 1 and grouping.equal_arrays(a, b)):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _copied(value):
    """A fresh copy of a kept labelling's value (the one kept stays as it is)."""
    if isinstance(value, tuple):
        return tuple(v.copy() if isinstance(v, np.ndarray) else v for v in value)
    return value.copy()


@dataclass
class _Handed:
    """What one step leaves the next (NOTE: [one labelling]): labels and first-row forms by node
    name, the nodes (by name: the node object) whose rows are pairwise distinct, and those found
    to have too few equal rows to merge, with their distinct rows (NOTE: [few merges])."""

    memo: dict = field(default_factory=dict)
    firsts: dict = field(default_factory=dict)
    distinct: dict = field(default_factory=dict)
    few: dict = field(default_factory=dict)


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
    Rows of different CONCAT parts never share a label. Two weights are never equal because their
    values are: a learnable weight is itself only; a fixed weight, with ``fact_values``, equals the
    fixed weights with the same bytes.

    Labels of edge-sized intermediates (gathers, linear products) are dropped once read, so that
    a pass holds only a few edge-sized arrays at a time. ``computed`` counts the nodes labelled.
    """

    def __init__(self, editor: Rewriter, fact_values: bool = False, dynamic: tuple = (),
                 handed: _Handed | None = None):
        self.editor = editor
        self.fact_values = fact_values
        self.dynamic = set(dynamic)
        handed = handed or _Handed()
        self.memo: dict[str, tuple[np.ndarray, int]] = handed.memo
        self.firsts: dict[str, np.ndarray] = handed.firsts
        self.distinct: dict[str, Node] = handed.distinct  # name -> the node found to have distinct rows
        self.few: dict[str, tuple[Node, int]] = handed.few  # name -> (the node, its distinct rows)
        self.computed = 0
        self.recent = _Recent()  # NOTE: [repeated labellings]
        editor.row_listeners.append(self._moved)

    def _moved(self, name: str, rows: np.ndarray) -> None:
        if name in self.memo:
            ids, bound = self.memo[name]
            self.memo[name] = (ids[rows], bound)
        self.firsts.pop(name, None)

    def labels(self, name: str, grouped: bool = False) -> tuple[np.ndarray, int]:
        """Node ``name``'s ``(ids, bound)``; ``grouped``: first_rows is about to group them (NOTE: [decided pairs])."""
        if name not in self.memo:
            node = self.editor.nodes[name]
            if self.distinct.get(name) is node:
                every_row_its_own = np.arange(node.count, dtype=row_dtype(node.count))
                self.memo[name] = every_row_its_own, max(node.count, 1)
                self.firsts[name] = every_row_its_own
            else:
                self.memo[name] = self._compute(node, grouped)
            for s in set(node.srcs):
                if self.editor.nodes[s].op in _TRANSIENT:
                    self.memo.pop(s, None)
        return self.memo[name]

    def carry(self, name: str, redefined: Node) -> None:
        """Node ``name`` is about to be redefined as ``redefined``, with the same values: its
        labels (kept by name) still hold, and so does a distinct mark."""
        if self.distinct.get(name) is self.editor.nodes[name]:
            self.distinct[name] = redefined

    def mark_distinct(self, name: str) -> None:
        """Node ``name``'s rows are pairwise distinct now (NOTE: [distinct rows])."""
        self.distinct[name] = self.editor.nodes[name]

    def mark_few(self, name: str, distinct: int) -> None:
        """Node ``name`` has ``distinct`` distinct rows, too many for a merge (NOTE: [few merges])."""
        self.few[name] = (self.editor.nodes[name], distinct)

    def too_few_to_merge(self, name: str) -> bool:
        """Whether this step or a coarser one found node ``name`` (this very node object) to have too
        few equal rows to merge: then so does this labelling, which merges no more."""
        node, distinct = self.few.get(name, (None, 0))
        return node is self.editor.nodes[name] and not _worth_merging(node.count, distinct)

    def hand_over(self, program: Program, finer: bool) -> _Handed:
        """What the next step, on ``program`` (this step's result), takes from this one: with
        ``finer`` (the next step labels facts by row and weights by name, this one by value) only
        the labels that its labelling gives too, else all of them; and the distinct marks (NOTE:
        [distinct rows]), with every labelled node whose labels increase strictly."""
        nodes = program.by_name()
        keep = self._labelled_alike(program) if finer else nodes
        handed = _Handed()
        for name, node in nodes.items():
            if node is not self.editor.nodes.get(name):
                continue
            ids = self.memo.get(name, (None,))[0]
            if self.few.get(name, (None,))[0] is node:
                handed.few[name] = self.few[name]
            if self.distinct.get(name) is node or (ids is not None and ids.size > 0
                                                   and bool(np.all(ids[1:] > ids[:-1]))):
                handed.distinct[name] = node  # labelled as every row its own: no pairs of wide labels
            elif name in self.memo and name in keep:
                handed.memo[name] = self.memo[name]
                if name in self.firsts:
                    handed.firsts[name] = self.firsts[name]
        return handed

    def _labelled_alike(self, program: Program) -> set[str]:
        """Nodes of ``program`` whose labels here (facts by value, fixed weights by bytes) are the
        ones that labelling facts by row and weights by name gives: their facts' rows are
        distinct (the labels are every row its own) and their fixed weights too."""
        alike: set[str] = set()
        for node in program.nodes:
            if node.op is Op.FACT:
                ids = self.memo.get(node.name, (None,))[0]
                same = (self.distinct.get(node.name) is node
                        or node.attrs.get("fact_layer") in self.dynamic
                        or (ids is not None and np.array_equal(ids, np.arange(node.count))))
            elif node.op is Op.WEIGHTS:
                same = np.array_equal(self._weight_ids(node)[0], self._weight_ids(node, fact_values=False)[0])
            else:
                same = all(s in alike for s in node.srcs)
            if same:
                alike.add(node.name)
        return alike

    def close(self) -> None:
        """Stop following the editor: the editor and these labels refer to each other, and as a
        cycle they (edge-sized arrays, at 100x PROTEINS hundreds of MB) would wait for the garbage
        collector instead of being freed when the pass is done with them."""
        self.editor.row_listeners.remove(self._moved)
        self.editor = None
        self.recent.clear()

    def of(self, name: str) -> np.ndarray:
        return self.labels(name)[0]

    def first(self, name: str) -> np.ndarray:
        """The first-row form of node ``name``'s rows (see ``compiler/grouping.py``)."""
        if name not in self.firsts:
            ids, bound = self.labels(name, grouped=True)
            self.firsts[name] = ids if _is_first_form(ids) else first_rows(ids, bound)
        return self.firsts[name]

    def representatives(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``representatives(self.first(name))``: labels that are no first-row form go to
        ``(reps, inverse)`` directly (``grouping.key_representatives``)."""
        if name not in self.firsts:
            ids, bound = self.labels(name, grouped=True)
            if not _is_first_form(ids):
                return key_representatives(ids, bound)
            self.firsts[name] = ids
        return representatives(self.firsts[name])

    def _compute(self, node: Node, grouped: bool = False) -> tuple[np.ndarray, int]:
        e = self.editor
        self.computed += 1
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
            (a, a_bound), (b, b_bound) = self.labels(node.srcs[0]), self.labels(node.srcs[1])
            return self.recent(_pair, a.size, a, a_bound, b, b_bound, None, None, grouped)
        if node.op is Op.LINEAR:
            w, x = (e.nodes[s] for s in node.srcs)
            sides = []  # (labels, rows of them or None, bound) of w, then of x
            for side, layout in ((w, node.attrs.get("w_layout", "full")), (x, node.attrs.get("x_layout", "full"))):
                if layout == "full":
                    sides.append(self._gathered(side.name))
                else:
                    ids, bound = self.labels(side.name)
                    sides.append((ids[layout_rows(layout, side.count, node.count, np.arange(node.count))], None,
                                  bound))
            (w_ids, w_rows, w_bound), (x_ids, x_rows, x_bound) = sides
            return self.recent(_pair, node.count, w_ids, w_bound, x_ids, x_bound, w_rows, x_rows, grouped)
        if node.op is Op.REDUCE:
            counts = e.constants[node.attrs["counts"]]
            if node.attrs.get("kernel") == "strided":  # segment j is rows j, j + n, ...
                inputs, bound = self.labels(node.srcs[0])
                inputs, rows = inputs.reshape(-1, max(node.count, 1)).T.reshape(-1), None
            else:  # a gathered input: its source's labels and the index (a GCN layer's 62M edges: no labels of them)
                inputs, rows, bound = self._gathered(node.srcs[0])
                if (inputs if rows is None else rows).size == node.count and np.all(counts == 1):
                    # one input each: the aggregation of one value is that value
                    return (inputs if rows is None else inputs[rows]), bound
            # A mean of {a, a} is a mean of {a}: multisets compare up to a common multiplicity.
            up_to_scale = node.attrs["aggregation"] == "mean"
            return first_equal_multisets(inputs, counts, bound, up_to_scale, rows), max(node.count, 1)
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
        if node.op is not Op.GATHER or name in self.memo or self.distinct.get(name) is node:
            ids, bound = self.labels(name)
            return ids, None, bound
        source = node.srcs[0]
        ids, bound = self.labels(source)
        if self.editor.nodes[source].op in _TRANSIENT:  # dropped once read, as labels() does
            self.memo.pop(source, None)
        return ids, self.editor.constants[node.attrs["index"]], bound

    def _weight_ids(self, node: Node, fact_values: bool | None = None) -> tuple[np.ndarray, int]:
        """Rows naming the same weight are equal (an upward fold may name a weight twice)."""
        fact_values = self.fact_values if fact_values is None else fact_values
        weights = {w.name: w for w in self.editor.program.weights}
        seen: dict[object, int] = {}
        ids = np.empty(node.count, dtype=row_dtype(node.count))  # gathered per edge: the narrow type
        for row, name in enumerate(node.attrs["names"]):  # one per weight of the stack, not per edge
            weight = weights.get(name)
            key = name
            if fact_values and weight is not None and not weight.learnable:
                value = np.asarray(weight.value)
                key = ("fixed", value.shape, value.dtype.str, value.tobytes())
            ids[row] = seen.setdefault(key, row)
        return ids, max(node.count, 1)


def _is_first_form(ids: np.ndarray) -> bool:
    """Whether ``ids`` already is a first-row form (labels that are row numbers of their class's
    first row) -- as every REDUCE, FACT and WEIGHTS label is. Checked a chunk of rows at a time
    (NOTE: [chunks]): labels that are not (gathered or paired ones) fail in the first chunk."""
    n = ids.size
    for lo in range(0, n, grouping.CHUNK):
        chunk = ids[lo:lo + grouping.CHUNK]
        # 0 <= ids[i] <= i (so within the array), and the row it names names itself.
        if not (chunk.min() >= 0 and np.all(chunk <= np.arange(lo, lo + chunk.size, dtype=row_dtype(n)))
                and np.array_equal(ids[chunk], chunk)):
            return False
    return True


def _shallow_ids(editor: Rewriter, name: str) -> np.ndarray:
    node = editor.nodes[name]
    if node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
        return source_rows(node, None, editor.constants)
    return np.arange(node.count)


# -- compress: compute a node on some of its rows, reindex its readers ---------------------------

def compress(editor: Rewriter, planner: RowPlanner, name: str, reps: np.ndarray, inverse: np.ndarray,
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


def _reindex(editor: Rewriter, planner: RowPlanner, old: str, new: str, reps: np.ndarray, inverse: np.ndarray,
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


def _agrees(editor: Rewriter, node: Node, old: str, reps: np.ndarray, inverse: np.ndarray,
            ids: RowIds | None) -> bool:
    """Whether the other side of ADD ``node`` is equal on rows merged in ``old``."""
    for s in node.srcs:
        if s == old:
            continue
        labels = ids.of(s) if ids is not None else _shallow_ids(editor, s)
        if not np.array_equal(labels[reps][inverse], labels):
            return False
    return True


# -- the pass --------------------------------------------------------------------------------------------

def deduplicate(program: Program, settings: Settings) -> Program:
    """Thesis 5.2.6: fact deduplication, isomorphic compression, then linear and aggregation
    deduplication, each where its switch is on, labelling each node once (NOTE: [one labelling])."""
    handed = _Handed()
    if settings.dedup_facts:
        program, handed = _dedup_facts(program, settings, handed)
    if settings.iso_compression:
        program, handed = _iso_compress(program, settings, handed)
    if settings.dedup_linear:
        program, handed = _dedup(program, settings, (Op.LINEAR,), False, handed)
    if settings.dedup_aggregations:
        program, handed = _dedup(program, settings, (Op.REDUCE,), True, handed)
    return program


def _step(program: Program, settings: Settings, switch: str) -> Program:
    return deduplicate(program, settings.model_copy(update={
        s: s == switch for s in ("dedup_facts", "iso_compression", "dedup_linear", "dedup_aggregations")}))


def dedup_facts(program: Program, settings: Settings) -> Program:
    """``deduplicate``'s first step alone: one row per distinct static fact value."""
    return _step(program, settings, "dedup_facts")


def iso_compress(program: Program, settings: Settings) -> Program:
    """``deduplicate``'s isomorphic compression alone."""
    return _step(program, settings, "iso_compression")


def dedup_linear(program: Program, settings: Settings) -> Program:
    """``deduplicate``'s linear step alone: each LINEAR computes every distinct (weight row, value
    row) pair once."""
    return _step(program, settings, "dedup_linear")


def dedup_aggregations(program: Program, settings: Settings) -> Program:
    """``deduplicate``'s aggregation step alone: each REDUCE computes every distinct group once;
    unread rows are dropped."""
    return _step(program, settings, "dedup_aggregations")


def _dedup_facts(program: Program, settings: Settings, handed: _Handed) -> tuple[Program, _Handed]:
    """Facts are constants (unless listed in ``Settings.dynamic_facts``), so equal rows are the same
    value everywhere: the FACT keeps the distinct rows that something reads, in order of first
    appearance, and every gather reading it (directly or through CONCATs) gets the composed index.
    The deduplicated FACT is no longer a replaceable input of the module (it was optimized using its
    values); dynamic facts are left alone."""
    editor = Rewriter(program, in_place=True, keep_inputs=False)  # unread input facts go
    planner = RowPlanner(editor, settings, SHRINK)
    dynamic = set(settings.dynamic_facts)
    distinct = []  # facts left as they were, their rows pairwise distinct (NOTE: [distinct rows])
    for node in program.nodes:
        if not is_input_fact(node) or node.attrs["fact_layer"] in dynamic or not editor.is_live(node.name):
            continue
        first = first_equal_rows(editor.constants[node.attrs["const"]])  # bitwise: -0.0 is not 0.0
        readers = [editor.nodes[r] for r in editor.readers(node.name)]
        if readers and node.name != editor.output and all(r.op is Op.GATHER for r in readers):
            # Only the rows that some gather reads are kept: classes among the read rows.
            read = np.zeros(node.count, dtype=bool)
            for r in readers:
                read[editor.index(r)] = True
            rows = np.flatnonzero(read)
            local_reps, local_inverse = key_representatives(first[rows], node.count)
            reps = rows[local_reps]
            inverse = np.zeros(node.count, dtype=np.int64)  # unread rows may map anywhere
            inverse[rows] = local_inverse
        else:
            reps, inverse = representatives(first)
        if reps.size < node.count:
            compress(editor, planner, node.name, reps, inverse)
        else:  # every row read, and no two alike
            distinct.append(node.name)
    planner.close()  # NOTE in RowPlanner.close: no cycle left for the cyclic collector
    result = editor.finish()
    nodes = result.by_name()
    return result, _Handed(distinct={**handed.distinct, **{name: nodes[name] for name in distinct}})


def _iso_compress(program: Program, settings: Settings, handed: _Handed) -> tuple[Program, _Handed]:
    """Isomorphic compression: "provably equal" means equal for every value of the learnable
    weights, by structure (``RowIds`` with ``fact_values``): the same op, the same weights (a
    learnable weight by its identity, a fixed one by its bytes), inputs that are equal as a
    multiset under an aggregation and in order otherwise, and static facts that are equal bit for
    bit. Nothing is evaluated, so nothing is merged because it happens to round to the same number."""
    ends = layer_ends(program)
    if not ends:
        return program, handed
    editor = Rewriter(program, in_place=True, keep_inputs=False)  # unread input facts go
    planner = RowPlanner(editor, settings, SHRINK)
    ids = RowIds(editor, fact_values=True, dynamic=settings.dynamic_facts, handed=handed)
    for name in [n.name for n in program.nodes if n.name in ends]:
        if not editor.is_live(name):
            continue
        reps, inverse = ids.representatives(name)
        count, kept = editor.nodes[name].count, reps.size
        worth = _worth_merging(count, kept)
        if worth:
            name = compress(editor, planner, name, reps, inverse, ids)  # the node with the rows `reps`
        del reps, inverse  # not kept while the next layer end is labelled
        if worth or kept == count:  # NOTE: [few merges]: rows left equal are not distinct
            ids.mark_distinct(name)
        else:
            ids.mark_few(name, kept)
    if editor.changed:
        # The merges hold for these fact values only: the facts stop being replaceable inputs.
        dynamic = set(settings.dynamic_facts)
        for node in program.nodes:
            if is_input_fact(node) and node.attrs["fact_layer"] not in dynamic and editor.is_live(node.name):
                now = editor.nodes[node.name]
                constant = now.with_(attrs={**now.attrs, "fact_layer": None})
                ids.carry(node.name, constant)
                editor.define(constant)
    planner.close()  # NOTE in RowPlanner.close: no cycle left for the cyclic collector
    return _finish(editor, ids, finer=True)


def layer_ends(program: Program) -> set[str]:
    """REDUCE / ADD / TRANSFORM nodes whose value no TRANSFORM or ADD (as its main input) continues."""
    continued = set()
    for n in program.nodes:
        if n.op in (Op.TRANSFORM, Op.ADD):
            continued.add(n.srcs[0])
    values = (Op.REDUCE, Op.ADD, Op.TRANSFORM)
    return {n.name for n in program.nodes if n.op in values and n.name not in continued}


def _dedup(program: Program, settings: Settings, ops: tuple[Op, ...], drop_unused: bool,
           handed: _Handed) -> tuple[Program, _Handed]:
    editor = Rewriter(program, in_place=True, keep_inputs=False)  # unread input facts go
    planner = RowPlanner(editor, settings, SHRINK)
    ids = RowIds(editor, handed=handed)
    for name in [n.name for n in program.nodes if n.op in ops]:
        if not editor.is_live(name) or editor.nodes[name].op not in ops or ids.too_few_to_merge(name):
            continue
        reps, inverse = ids.representatives(name)
        if _worth_merging(editor.nodes[name].count, reps.size):
            compress(editor, planner, name, reps, inverse, ids)
        del reps, inverse  # edge-sized: not kept while the next node is labelled
    if drop_unused:
        _drop_unused_rows(editor, planner, ids)
    planner.close()  # NOTE in RowPlanner.close: no cycle left for the cyclic collector
    return _finish(editor, ids, finer=False)


def _finish(editor: Rewriter, ids: RowIds, finer: bool) -> tuple[Program, _Handed]:
    result = editor.finish()
    handed = ids.hand_over(result, finer)
    ids.close()
    return result, handed


def _drop_unused_rows(editor: Rewriter, planner: RowPlanner, ids: RowIds) -> None:
    """Rows that no gather reads are not computed (latest nodes first, so that what they stop
    reading becomes unused upstream in the same sweep)."""
    computed = (Op.REDUCE, Op.ADD, Op.TRANSFORM, Op.LINEAR)
    candidates = [n.name for n in editor.program.nodes if n.op in computed]
    # Indices found to read every row of a node (by row count): layers that share one stored index (the
    # vectorizer's ``_compacted``: a GCN's 62M edges at products-like) are checked once, not once each.
    reading_all: dict[int, list[np.ndarray]] = {}
    for name in reversed(candidates):
        if not editor.is_live(name) or editor.output == name:
            continue
        readers = editor.readers(name)
        if not readers or any(editor.nodes[r].op is not Op.GATHER for r in readers):
            continue
        count = editor.nodes[name].count
        indices = [editor.index(editor.nodes[r]) for r in readers]
        if any(index is known for index in indices for known in reading_all.get(count, ())):
            continue
        read = np.zeros(count, dtype=bool)
        for index in indices:
            read[index] = True
        if read.all():
            if len(indices) == 1:
                reading_all.setdefault(count, []).append(indices[0])
            continue
        used = np.flatnonzero(read)
        inverse = np.cumsum(read) - 1
        compress(editor, planner, name, used, np.maximum(inverse, 0), ids)
