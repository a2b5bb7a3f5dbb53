"""Thesis 5.2.4-5.2.5: reorder (and pad) the rows of linear ops so that a side repeats.

A LINEAR's rows may be computed in any order, as long as whoever reads them is reindexed. Sorting
the rows by weight makes the weight side a run of equal blocks ("dimension 2" repetition), which
the broadcasting pass (``linear_broadcast.py``, run right after) then gathers only once per
distinct weight. Blocks of unequal size are padded with copies of a real row of the same block;
nothing ever reads a padded row, so outputs and gradients stay exactly the same::

    before                                            after (rows sorted by weight, padded to 2 each)
    %w = GATHER(%W; index=[1, 0, 1])   : (3, ...)     %w = GATHER(%W; index=[0, 0, 1, 1]) : (4, ...)
    %x = GATHER(%X; index=[5, 6, 7])   : (3, ...)     %x = GATHER(%X; index=[6, 6, 5, 7]) : (4, ...)
    %lin = LINEAR(%w, %x)              : (3, ...)     %lin = LINEAR(%w, %x)               : (4, ...)
    %g = GATHER(%lin; index=[0, 2, 1]) : (3, ...)     %g = GATHER(%lin; index=[2, 3, 0])  : (3, ...)

Strategies (``Settings.linear_padding``):

* ``"left"`` / ``"right"``: group the rows by the weight (value) side, every group padded to the
  largest one: that side becomes ``k`` equal blocks;
* ``"both"``: every distinct weight paired with every distinct value, in lexicographic order: the
  weight side is interleaved, the value side tiled, and neither needs a gather of full length;
* ``"advanced"`` (5.2.5): a group used about ``t`` times as often as the rarest one gets ``t``
  blocks (``t_I = floor(n_I / n_min + 1/2)``), which needs far less padding for skewed counts;
  the cheaper of doing this on the weight side or on the value side;
* ``"auto"``: the cheapest of all of the above and of leaving the rows alone, by the thesis's cost
  proxy: the summed length of the gathers left after broadcasting (an identity gather costs
  nothing: it is dropped later), plus the padded rows (wasted products), plus a full-length gather
  when the rows' readers cannot simply be reindexed;
* ``"none"``: nothing (``"off"`` does not even run the pass).

Readers are reindexed rather than given a new gather ("downward propagation", 5.2.6): a GATHER
reading the LINEAR, or a CONCAT of it that only GATHERs read, gets its index composed with the new
row positions. Only otherwise (a REDUCE reads the rows directly, or they are the output) does a
GATHER back into the old order follow the LINEAR, and it takes the LINEAR's old name.
Only row indices are compared, never values: dynamic facts are safe.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..grouping import is_identity, row_dtype, stable_order
from ..indexing import SideRows, best_layout, full_layout, resolve_rows
from ..ir import Node, Op, Program
from ..rewrite import Rewriter, side_node
from ..settings import Settings

__all__ = ["reorder_and_pad", "plan_rows", "iter_plans", "RowPlan"]

# A forced strategy is skipped where it would make a LINEAR more than this many times longer
# (padding every weight group to the size of the largest one can explode): ``"auto"`` never
# gets near it, since every padded row counts as cost.
MAX_GROWTH = 4
_SLACK_ROWS = 1024


@dataclass(frozen=True)
class RowPlan:
    """New rows for a LINEAR: original row ``e`` lands on row ``position[e]`` of ``rows`` rows."""

    strategy: str
    rows: int
    position: np.ndarray
    w_index: np.ndarray  # rows of the weight side's source, one per new row
    x_index: np.ndarray  # rows of the value side's source, one per new row

    def is_identity(self) -> bool:
        return self.rows == len(self.position) and is_identity(self.position, self.rows)


class _Groups:
    """The rows of a LINEAR grouped by one side's source row: distinct rows (ascending), group
    sizes, and (on first use) each row's group and the rows in stable group order. Counting, not
    sorting: the groups are source rows, so their number is bounded by the source's size. The
    sizes alone decide how many rows a strategy needs, so a strategy that is rejected for them
    makes no edge-sized array (``dense_ranks``, split in two)."""

    def __init__(self, side: SideRows):
        self._index = side.index
        bound = max(side.source_count, 1)
        occurrences = np.bincount(side.index, minlength=bound)
        self._present = occurrences > 0
        values = np.flatnonzero(self._present)
        self.values, self.counts = values.astype(row_dtype(bound), copy=False), occurrences[values]
        self._group = self._order = None

    @property
    def group(self) -> np.ndarray:
        if self._group is None:
            position = np.cumsum(self._present, dtype=row_dtype(self.values.size))
            position -= 1
            self._group = position[self._index]
        return self._group

    def cheapest_unpadded(self, rows: int, source_count: int) -> int:
        """A lower bound on this side's gather cost (``gather_cost``) under any layout of any
        reordering of the rows without padding: every distinct row is gathered at least once, and
        a side tiled or interleaved to ``l`` rows repeats each row a multiple of ``rows / l``
        times, so ``l >= rows / gcd(group sizes)`` ("full" is ``l = rows``). Zero where the
        gather could be the identity: every source row read, each equally often."""
        if self.values.size == source_count and np.all(self.counts == self.counts[0]):
            return 0
        return max(int(self.values.size), -(-rows // int(np.gcd.reduce(self.counts))))

    @property
    def order(self) -> np.ndarray:
        if self._order is None:
            self._order = stable_order(self.group, self.values.size)
        return self._order


def _grouped(groups: _Groups, other: np.ndarray, subsequence: bool, max_rows: int, min_rows: int = 0
             ) -> tuple | None:
    """Rows sorted into blocks by their group (stable), each group's blocks padded to one common size.

    With ``subsequence`` a key used ``n_I`` times gets ``t_I = floor(n_I / n_min + 1/2)`` blocks
    (thesis 5.2.5) instead of one. Returns ``(position, rows, new_key, new_other)``, or None
    (before building anything) if that takes more than ``max_rows`` rows or fewer than ``min_rows``.
    """
    values, counts = groups.values, groups.counts
    blocks = np.floor(counts / counts.min() + 0.5).astype(np.int64) if subsequence else np.ones_like(counts)
    block_size = int(np.max(-(-counts // blocks)))
    span = blocks * block_size  # rows reserved for each key
    rows = int(span.sum())
    if rows > max_rows or rows < min_rows:
        return None
    group = groups.group
    start = np.cumsum(span) - span
    order = groups.order
    dtype = row_dtype(max(rows, group.size))  # int32 where the rows fit: these are edge-sized
    if rows == group.size:  # every group fills its blocks exactly: no padding, just the group order
        position = np.empty(group.size, dtype=dtype)
        position[order] = np.arange(group.size, dtype=dtype)
        return position, rows, np.repeat(values, counts), other[order]
    first = np.cumsum(counts) - counts  # where each group starts in `order`
    # The k-th row in group order is row k - first[g] of its group g: at start[g] + k - first[g].
    position = np.empty(group.size, dtype=dtype)
    shifted = np.repeat((start - first).astype(dtype), counts)
    shifted += np.arange(group.size, dtype=dtype)
    position[order] = shifted
    del shifted
    # Padding rows repeat the group's first real row: a real, finite pair, read by nobody.
    new_other = np.repeat(other[order[first]], span)
    new_other[position] = other
    return position, rows, np.repeat(values, span), new_other


def _grid(w: _Groups, x: _Groups, max_rows: int) -> tuple[np.ndarray, ...] | None:
    """Every distinct weight times every distinct value, weight-major; None if over ``max_rows``."""
    rows = w.values.size * x.values.size
    if rows > max_rows:
        return None
    position = w.group.astype(row_dtype(rows)) * x.values.size + x.group
    return position, rows, np.repeat(w.values, x.values.size), np.tile(x.values, w.values.size)


def plan_rows(w: SideRows, x: SideRows, strategies, max_rows: int) -> list[RowPlan]:
    """The candidate row orders of a LINEAR whose sides read ``w`` and ``x``, "none" first."""
    return list(iter_plans(w, x, strategies, max_rows))


def iter_plans(w: SideRows, x: SideRows, strategies, max_rows: int, padded_only: bool = False,
               groups: dict | None = None):
    """``plan_rows`` one plan at a time (each holds a few arrays as long as the LINEAR).

    ``padded_only``: after "none", no plan that only reorders the rows ("left", "right" and the
    advanced ones where no group needs padding) is made. ``groups``: each side's ``_Groups``, where the caller made them already."""
    n = len(w.index)
    yield RowPlan("none", n, np.arange(n, dtype=row_dtype(n)), w.index, x.index)
    min_rows = n + 1 if padded_only else 0
    groups = {} if groups is None else groups

    def by(side: str) -> _Groups:  # each side's grouping once, shared by the strategies
        if side not in groups:
            groups[side] = _Groups(w if side == "w" else x)
        return groups[side]

    for strategy in strategies:
        if strategy in ("left", "advanced-left"):
            made = _grouped(by("w"), x.index, strategy == "advanced-left", max_rows, min_rows)
        elif strategy in ("right", "advanced-right"):
            made = _grouped(by("x"), w.index, strategy == "advanced-right", max_rows, min_rows)
            if made is not None:
                position, rows, x_new, w_new = made
                made = position, rows, w_new, x_new
        else:  # both
            made = _grid(by("w"), by("x"), max_rows)  # not a reordering: it merges equal pairs
        if made is not None:
            position, rows, w_new, x_new = made
            made = None  # the caller keeps only the best plan: this one must not outlive it here
            yield RowPlan(strategy, rows, position, w_new, x_new)
            del position, w_new, x_new


def plan_cost(plan: RowPlan, w: SideRows, x: SideRows, broadcasting: bool, reindexable: bool) -> int:
    """Thesis proxy: summed gather lengths after the rewrite, plus padded rows and any new gather."""
    w_new = SideRows(w.source, plan.w_index, w.source_count)
    x_new = SideRows(x.source, plan.x_index, x.source_count)
    layout = best_layout(w_new, x_new) if broadcasting else full_layout(w_new, x_new)
    extra_gather = 0 if reindexable or plan.is_identity() else len(plan.position)
    return layout.cost + (plan.rows - len(plan.position)) + extra_gather


_STRATEGIES = {
    "left": ("left",), "right": ("right",), "both": ("both",),
    "advanced": ("advanced-left", "advanced-right"),
    "auto": ("left", "right", "both", "advanced-left", "advanced-right"),
}


def _readers(editor: Rewriter, name: str) -> list[Node] | None:
    """The GATHERs (direct, or through one CONCAT) to reindex; None if some reader is anything else."""
    if name == editor.program.output:
        return None
    users, nodes = editor.all_users(), editor.nodes
    readers = []
    for user_name in dict.fromkeys(users[name]):
        user = nodes[user_name]
        if user.op is Op.GATHER:
            readers.append(user)
        elif (user.op is Op.CONCAT and user.srcs.count(name) == 1 and user_name != editor.program.output
              and all(nodes[u].op is Op.GATHER for u in users[user_name])):
            readers.append(user)
        else:
            return None
    return readers


def _reindex_readers(editor: Rewriter, linear: Node, plan: RowPlan, readers: list[Node]) -> None:
    users, nodes = editor.all_users(), editor.nodes
    for reader in readers:
        if reader.op is Op.GATHER:
            index = plan.position[editor.constants[reader.attrs["index"]]]
            key = editor.const(f"idx_{reader.name}", index)
            editor.place(reader.name, [reader.with_(attrs={**reader.attrs, "index": key})])
            continue
        # CONCAT: the LINEAR's part moves to new positions, the parts after it shift by the padding.
        offset = sum(nodes[s].count for s in reader.srcs[:reader.srcs.index(linear.name)])
        n, grown = linear.count, plan.rows - linear.count
        new_position = np.arange(reader.count, dtype=np.int64)
        new_position[offset:offset + n] = plan.position
        new_position[offset:offset + n] += offset
        new_position[offset + n:] += grown
        editor.place(reader.name, [reader.with_(count=reader.count + grown)])
        for gather_name in dict.fromkeys(users[reader.name]):
            gather = nodes[gather_name]
            key = editor.const(f"idx_{gather.name}", new_position[editor.constants[gather.attrs["index"]]])
            editor.place(gather.name, [gather.with_(attrs={**gather.attrs, "index": key})])


def _apply(editor: Rewriter, linear: Node, w: SideRows, x: SideRows, plan: RowPlan,
           readers: list[Node] | None) -> None:
    new_nodes, srcs = [], []
    for k, (rows, index) in enumerate(((w, plan.w_index), (x, plan.x_index))):
        made = side_node(editor, rows, index, f"{linear.name}_{'wx'[k]}", linear.layer)
        new_nodes += made
        srcs.append(made[0].name if made else rows.source)
    if readers is not None:
        _reindex_readers(editor, linear, plan, readers)
        new_nodes.append(linear.with_(srcs=tuple(srcs), count=plan.rows))
    else:
        # Nobody to reindex: the padded product gets a new name, and a gather back into the old
        # row order takes over the old one, so every reader (and the output) stays as it was.
        padded = linear.with_(name=editor.fresh(f"{linear.name}_padded"), srcs=tuple(srcs), count=plan.rows)
        back = editor.new_gather(linear.name, padded, plan.position, linear.layer)
        new_nodes += [padded, back.with_(name=linear.name)]
    editor.place(linear.name, new_nodes)
    editor.drop_unused([s for s in linear.srcs if s not in srcs])


def reorder_and_pad(program: Program, settings: Settings) -> Program:
    """Reorder/pad every LINEAR's rows by the strategy ``settings.linear_padding`` (thesis 5.2.4-5.2.5)."""
    mode = settings.linear_padding
    if mode in ("off", "none"):
        return program
    editor = Rewriter(program, in_place=True)
    for name in [n.name for n in program.nodes if n.op is Op.LINEAR]:
        nodes = editor.nodes
        linear = nodes[name]
        if linear.count <= 1 or linear.attrs.get("w_layout", "full") != "full" \
                or linear.attrs.get("x_layout", "full") != "full":
            continue
        w = resolve_rows(nodes, editor.constants, linear.srcs[0])
        x = resolve_rows(nodes, editor.constants, linear.srcs[1])
        readers = _readers(editor, name)
        reindexable = readers is not None
        max_rows = MAX_GROWTH * linear.count + _SLACK_ROWS
        if mode == "auto":
            as_is = plan_cost(next(iter_plans(w, x, (), 0)), w, x, settings.linear_broadcasting, reindexable)
            if as_is == 0:
                continue  # nothing gathered as it is: no order can be cheaper
            # A plan costs at least its padded rows, and must cost less than leaving the rows alone:
            # plans with more padding are not even built (they are edge-sized).
            max_rows = min(max_rows, linear.count + as_is - 1)
            # NOTE: [unpadded plans] A plan that only reorders the rows costs at least the two
            # sides' bounds; where that is no less than the rows as they are, it cannot win (a tie
            # keeps "none"), and is not made: at 100x PROTEINS (continuous features) that is every
            # candidate of both convolutions, which took 1.1 of the pass's 1.5 s CPU to build.
            groups = {"w": _Groups(w), "x": _Groups(x)}
            floor = (groups["w"].cheapest_unpadded(linear.count, w.source_count)
                     + groups["x"].cheapest_unpadded(linear.count, x.source_count))
            padded_only = floor >= as_is
        else:
            groups, padded_only = None, False
        best, best_cost = None, None
        for plan in iter_plans(w, x, _STRATEGIES[mode], max_rows, padded_only, groups):  # only the best so far is kept
            if mode != "auto" and plan.strategy == "none":
                continue  # a forced strategy: "none" is no candidate
            cost = plan_cost(plan, w, x, settings.linear_broadcasting, reindexable)
            if best is None or cost < best_cost:  # ties keep the earliest: "none" first
                best, best_cost = plan, cost
            del plan  # (edge-sized) while the next plan is made
        if best is None or best.strategy == "none":
            continue
        if best.is_identity() and np.array_equal(best.w_index, w.index) and np.array_equal(best.x_index, x.index):
            continue
        _apply(editor, linear, w, x, best, readers)
    return editor.finish()
