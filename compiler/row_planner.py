"""Computing a node at some of its rows, by pushing the selection into the nodes before it.

"Node ``%p`` at rows ``index``" asks ``%p``'s own inputs for the rows it needs, so a selection
keeps travelling up (thesis 5.2.7): elementwise ops and ADD pass the rows on, LINEAR maps them
to its sides, REDUCE takes whole segments (or reads equal-length segments element-major, the
``strided`` kernel: thesis 5.2.9), indexing ops compose, a CONCAT splits the rows into runs
that each read one part, and static facts and weight stacks fold the rows in. The upward pass
(``passes/upward.py``, the "upward" policy) and deduplication (``passes/dedup.py``, the "shrink"
policy: never copy or grow anything) use :class:`RowPlanner` on a :class:`~.rewrite.Rewriter` editing in place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .grouping import expand_segments, is_identity, row_dtype
from .indexing import ROW_SELECTIONS, is_regular_index, k_major, layout_rows, source_rows
from .ir import Node, Op
from .rewrite import Rewriter
from .settings import Settings

__all__ = ["RowPlanner", "UPWARD", "SHRINK", "MAX_CONCAT_RUNS"]

UPWARD, SHRINK = "upward", "shrink"
# A gather through a CONCAT becomes a CONCAT of one piece per run of rows from the same part
# (thesis 5.2.9), if every part is read in one run -- or, with unlimited growth, in at most
# this many runs (one gather beats a long list of tiny pieces).
MAX_CONCAT_RUNS = 16
_ARITHMETIC = (Op.TRANSFORM, Op.ADD, Op.LINEAR, Op.REDUCE)


# -- planning "node at rows" ----------------------------------------------------------------------

@dataclass
class _Plan:
    """How to get some node's rows: ``cost`` = irregular gathers it leaves minus those it
    absorbs; ``growth`` = rows it adds; ``build()`` makes it so and returns the node's name
    (built once: NOTE: [plans once])."""

    cost: int
    growth: int
    make: Callable[[], str]
    built: str | None = None

    def build(self) -> str:
        if self.built is None:
            self.built = self.make()
        return self.built


# NOTE: [plans once] Where the program is a DAG with many paths (a deep chain with skip
# connections), a request for some node's rows reaches each node once per path, and with unlimited
# growth each one plans its own inputs again: a 12-layer chain took 38 s under
# upward-17-aggressive, each two more layers six times as long. Plans depend only on the request
# and on the program, which does not change while a plan is made, so a request made again is
# answered with the same plan (until the next definition), and a plan is built once: a second
# build returns the node the first one made. The depth a gather travelled is part of the request
# only against a depth limit (elsewhere it is recorded, never compared).
#
# NOTE: [copies once] A node that others read too is copied to give some reader its rows. Growth
# limits that allow a copy of a whole layer (rel-2, rel-4, abs-100k on a 4-row chain) made one copy
# per path through the layers above, each reading copies of its own: a deep chain with skip
# connections compiled exponentially (depth 8 0.54 s, depth 12 over 60 s) into exponentially many
# nodes. A copy of node ``%p`` at rows ``index`` is recorded, and a later request for the same rows
# of the same (unchanged) ``%p`` reads that copy while it is live: it adds no rows and no gathers.
# A copy counts as shared from the start (it is never redefined in place): a plan made before a
# second reader took it might otherwise narrow it for its first reader within the same build.
# The programs grow linearly with depth again (tests/test_depth.py).

class _Rows:
    """Row numbers as part of a dict key: equal exactly when the arrays are (same dtype, same
    values), as their bytes were, without copying or hashing every row (NOTE: [keys of rows])."""

    __slots__ = ("index", "_hash")

    def __init__(self, index: np.ndarray):
        self.index = index
        n = index.size
        sample = index[::max(1, n // _SAMPLED)] if n else index
        self._hash = hash((index.dtype.char, n, sample.tobytes(), index[-1:].tobytes()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Rows) and (other.index is self.index or (
            other._hash == self._hash and other.index.dtype == self.index.dtype
            and other.index.shape == self.index.shape and bool(np.array_equal(other.index, self.index))))


_SAMPLED = 32  # rows of an index that its key hashes (about): NOTE: [keys of rows]

# NOTE: [keys of rows] Plans and copies are looked up by the rows asked for. Their bytes as the key
# (``index.tobytes()``) copied every index and hashed all of it on every request, though a request
# for the same rows again is rare: deduplication asks for a REDUCE's edges (8M rows at products-like
# x 1/8) and, composing, for its inputs' (two more), about 0.4 s of the pass there. ``_Rows`` hashes
# a strided sample of about _SAMPLED rows (with the size, dtype and last row) and compares the whole
# arrays only where the hashes match: the same answers as the bytes, with no copy.


class RowPlanner:
    """Plans and builds "node ``name`` at rows ``index``", pushing the selection upward.

    ``policy`` UPWARD: the upward pass (growth, depth and cost rules from the settings).
    ``policy`` SHRINK: deduplication's row selection: push into single-use arithmetic nodes,
    compose with gathers, otherwise leave a gather; never copy or fold into leaves.
    """

    def __init__(self, editor: Rewriter, settings: Settings, policy: str = SHRINK):
        self.editor = editor
        self.policy = policy
        self.dynamic = set(settings.dynamic_facts)
        unlimited = settings.upward_growth_abs is None or settings.upward_growth_rel is None
        self.growth_abs = None if unlimited else settings.upward_growth_abs
        self.growth_rel = None if unlimited else settings.upward_growth_rel
        self.max_depth = settings.upward_max_depth
        self.transpose = settings.transposed_reductions
        self.left: dict[str, int] = {}  # gathers this planner built -> how many layers they travelled
        self._plans: dict[tuple, _Plan] = {}  # NOTE: [plans once]
        self._copies: dict[tuple, tuple[Node, Node]] = {}  # NOTE: [copies once]
        self._copy_names: set[str] = set()  # never redefined in place: a later request may read them
        self._planned_at = -1  # the editor version the plans were made against

    def close(self) -> None:
        """Planning is over: drop the plans. Their closures read the planner, so while the planner
        keeps them it sits in a reference cycle (with the editor and its constants, about 0.5 GB on
        products-like at 1/4) that only the cyclic collector frees; without them refcounting does."""
        self._plans.clear()
        self._copies.clear()

    # -- the recursion
    def rows(self, name: str, index: np.ndarray, reader: str | None, depth: int = 0, layer: str = "",
             shared: bool = False, reuse: str | None = None, exclusive: bool = False) -> _Plan:
        """A plan for the rows ``index`` of node ``name``, as read by ``reader``.

        ``shared``: ``name`` must stay as it is (someone else reads it too). ``reuse``: a
        single-use gather being absorbed, whose name a gather left here may take.
        ``exclusive``: every reader of ``name`` is being rewritten: redefine it in place.
        """
        index = np.asarray(index)
        if index.dtype != np.int32:  # row numbers: int32 where they fit (as a REDUCE's edges are), else int64
            index = index.astype(np.int64, copy=False)
        if self._planned_at != self.editor.version:
            self._plans.clear()
            self._planned_at = self.editor.version
        # The depth matters only against a depth limit (then it is at most the limit).
        key = (name, _Rows(index), reader, depth if self.max_depth is not None else 0, layer, shared, reuse,
               exclusive)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(name, index, reader, depth, layer, shared, reuse, exclusive)
        return plan

    def _plan(self, name: str, index: np.ndarray, reader: str | None, depth: int, layer: str, shared: bool,
              reuse: str | None, exclusive: bool) -> _Plan:
        node = self.editor.nodes[name]
        if is_identity(index, node.count):
            return _Plan(0, 0, lambda: name)
        shared = not exclusive and (shared or name in self._copy_names or self.editor.shared(name, reader))
        if shared:
            copy = self._copy_of(node, index)
            if copy is not None:
                return _Plan(0, 0, lambda: copy)
        leave = self._leave(name, index, reuse, depth, layer)
        candidate = self._candidate(node, index, shared, depth, layer, reuse)
        if candidate is None:
            return leave
        if (self.policy == SHRINK or candidate.cost < leave.cost
                or (candidate.cost == leave.cost and (candidate.growth < 0 or node.op in ROW_SELECTIONS))):
            return candidate
        return leave

    def _copy_of(self, node: Node, index: np.ndarray) -> str | None:
        """A copy of ``node`` at rows ``index`` made before, if it is still live and ``node``
        unchanged since (NOTE: [copies once])."""
        made = self._copies.get((node.name, _Rows(index)))
        if made is None:
            return None
        copy, original = made
        nodes = self.editor.nodes
        # Neither redefined since (a copy reached by a gather of its own may be, with other rows).
        if nodes[node.name] is not original or nodes[copy.name] is not copy or not self.editor.is_live(copy.name):
            return None
        return copy.name

    def _copied(self, node: Node, index: np.ndarray, copy: str) -> str:
        self._copies[(node.name, _Rows(index))] = (self.editor.nodes[copy], node)
        self._copy_names.add(copy)
        return copy

    def _leave(self, name: str, index: np.ndarray, reuse: str | None, depth: int, layer: str) -> _Plan:
        node = self.editor.nodes[name]
        cost = 0 if is_regular_index(index, node.count) else 1

        def build():
            # A reused name is an absorbed gather: `_compose` reports its row move.
            made = self.editor.gather(name, index, name=reuse, layer=layer or node.layer)
            self.left[made] = depth
            return made

        return _Plan(cost, 0, build)

    def _allowed(self, node: Node, new_rows: int, shared: bool) -> bool:
        if self.policy == SHRINK:
            return not shared and new_rows <= node.count
        if self.growth_abs is None:
            return True
        extra = new_rows if shared else new_rows - node.count
        return extra <= node.count * self.growth_rel + self.growth_abs

    def _candidate(self, node: Node, index: np.ndarray, shared: bool, depth: int, layer: str,
                   reuse: str | None = None) -> _Plan | None:
        op = node.op
        if op in ROW_SELECTIONS:
            return self._compose(node, index, shared, depth, layer)
        if op is Op.CONCAT:
            return None if self.policy == SHRINK else self._concat(node, index, shared, depth, layer)
        if op is Op.FACT:
            if self.policy == SHRINK or node.attrs.get("fact_layer") in self.dynamic:
                return None
            if not self._allowed(node, index.size, shared):
                return None
            return _Plan(0, index.size - (0 if shared else node.count),
                         lambda: self.fold_fact(node.name, index, in_place=not shared, name_as=reuse))
        if op is Op.WEIGHTS:
            return None if self.policy == SHRINK else self._weights(node, index, shared, reuse)
        if op in _ARITHMETIC:
            crossing = depth + (self.policy == UPWARD and (node.layer or node.name) != layer)
            if self.policy == UPWARD and self.max_depth is not None and crossing > self.max_depth:
                return None
            if not self._allowed(node, index.size, shared):
                return None
            return self._arithmetic(node, index, shared, crossing)
        return None

    def _compose(self, node: Node, index: np.ndarray, shared: bool, depth: int, layer: str) -> _Plan:
        """GATHER(GATHER(s, a), b) = GATHER(s, a[b]); likewise for slices, tiles, interleaves."""
        src = node.srcs[0]
        inner = source_rows(node, index, self.editor.constants)
        absorbed = 0
        if not shared and node.op is Op.GATHER and not is_regular_index(self.editor.index(node),
                                                                         self.editor.nodes[src].count):
            absorbed = 1
        reuse = None if shared else node.name
        if self.policy == SHRINK:
            # Deduplication only composes: the gather stays at the same place, with fewer rows.
            if is_identity(inner, self.editor.nodes[src].count):
                return _Plan(-absorbed, 0, lambda: src)
            sub = self._leave(src, inner, reuse, depth, layer)
        else:
            sub = self.rows(src, inner, None if shared else node.name, depth, layer, shared=shared,
                            reuse=reuse)
        return _Plan(sub.cost - absorbed, sub.growth, self._with_rows(sub.build, reuse, index))

    def _with_rows(self, build: Callable[[], str], reused: str | None,
                   index: np.ndarray) -> Callable[[], str]:
        """Wrap ``build`` so that a node redefined under its old name reports its row move."""
        def run():
            made = build()
            if reused is not None and made == reused:
                for listener in self.editor.row_listeners:
                    listener(made, index)
            return made
        return run

    def _concat(self, node: Node, index: np.ndarray, shared: bool, depth: int, layer: str) -> _Plan | None:
        parts = list(node.srcs)
        counts = np.array([self.editor.nodes[p].count for p in parts], dtype=np.int64)
        ends = np.cumsum(counts)
        part = np.searchsorted(ends, index, side="right")
        local = index - (ends - counts)[part]
        cuts = np.flatnonzero(np.diff(part)) + 1
        reader = None if shared else node.name
        if cuts.size == 0:  # one part only: the CONCAT is bypassed
            return self.rows(parts[part[0]], local, reader, depth, layer, shared=shared)
        if cuts.size + 1 > MAX_CONCAT_RUNS or not self._allowed(node, index.size, shared):
            return None
        runs = np.split(np.arange(index.size), cuts)
        run_parts = [int(part[r[0]]) for r in runs]
        if len(set(run_parts)) < len(runs) and self.growth_abs is not None:
            return None  # a part in several runs: many small pieces, only worth it to remove every gather
        repeated = {p for p in run_parts if run_parts.count(p) > 1}
        subs = [self.rows(parts[p], local[r], reader, depth, layer, shared=shared or p in repeated)
                for p, r in zip(run_parts, runs)]

        def build():
            srcs = tuple(s.build() for s in subs)
            if not shared:
                return self.editor.define(node.with_(srcs=srcs, count=int(index.size)), rows=index)
            copy = node.with_(name=self.editor.fresh(f"{node.name}_rows"), srcs=srcs, count=int(index.size))
            return self._copied(node, index, self.editor.define(copy))

        growth = index.size - (0 if shared else node.count)
        return _Plan(sum(s.cost for s in subs), growth + sum(s.growth for s in subs), build)

    def fold_fact(self, name: str, index: np.ndarray, in_place: bool = True,
                  name_as: str | None = None) -> str:
        """A FACT holding rows ``index`` of FACT ``name`` (no longer a replaceable input);
        a copy is called ``name_as`` if given."""
        node = self.editor.nodes[name]
        values = self.editor.constants[node.attrs["const"]][index]
        new_name = name if in_place else (name_as or self.editor.fresh(f"{name}_rows"))
        key = self.editor.const(f"facts_{new_name}", values, owner=new_name)
        attrs = {**node.attrs, "const": key, "fact_layer": None}
        return self.editor.define(node.with_(name=new_name, count=int(index.size), attrs=attrs),
                                  rows=index if in_place else None, near=name)

    def _weights(self, node: Node, index: np.ndarray, shared: bool, reuse: str | None) -> _Plan | None:
        """Rows of a weight stack: a stack naming the weights as often as needed. Where the
        repetition is regular, stack each distinct weight once and leave the repetition to a
        gather that becomes a tile or an interleave. ``reuse``: the absorbed gather's name."""
        distinct, inverse = np.unique(index, return_inverse=True)
        inverse = inverse.reshape(-1)
        split = distinct.size < index.size and is_regular_index(inverse, distinct.size)
        rows = distinct if split else index
        if not self._allowed(node, rows.size, shared):
            return None

        def build():
            editor = self.editor
            names = tuple(node.attrs["names"][i] for i in rows)
            if not shared:
                name = node.name
            elif split:
                name = editor.fresh(f"{reuse}_w" if reuse else f"{node.name}_rows")
            else:
                name = reuse or editor.fresh(f"{node.name}_rows")
            attrs = {**node.attrs, "names": names}
            stack = editor.define(node.with_(name=name, count=int(rows.size), attrs=attrs),
                                  rows=None if shared else rows, near=node.name)
            return editor.gather(stack, inverse, name=reuse) if split else stack

        return _Plan(0, rows.size - (0 if shared else node.count), build)

    def _arithmetic(self, node: Node, index: np.ndarray, shared: bool, depth: int) -> _Plan:
        """TRANSFORM / ADD / LINEAR / REDUCE computing only the rows ``index``."""
        if node.op is Op.REDUCE:
            return self._reduce(node, index, shared, depth)
        attrs = dict(node.attrs)
        requests: list[np.ndarray | None] = []  # rows wanted from each src (None: read it as is)
        if node.op in (Op.TRANSFORM, Op.ADD):
            requests = [index] * len(node.srcs)
        else:  # LINEAR
            w, x = (self.editor.nodes[s] for s in node.srcs)
            layouts = [attrs.get("w_layout", "full"), attrs.get("x_layout", "full")]
            for k, (side, layout) in enumerate(zip((w, x), layouts)):
                keep = side.count == 1 and not (k == 1 and requests[0] is None)
                if keep:  # one row broadcasts along every row as it is
                    requests.append(None)
                    attrs["wx"[k] + "_layout"] = "tile"
                else:
                    requests.append(layout_rows(layout, side.count, node.count, index))
                    attrs["wx"[k] + "_layout"] = "full"
        return self._node_plan(node, index, shared, depth, requests, attrs)

    def _reduce(self, node: Node, index: np.ndarray, shared: bool, depth: int) -> _Plan:
        """Whole segments. Segments of equal length k may also be laid out k-major (the
        ``strided`` kernel: element t of every segment, then element t + 1, ...): where each
        segment reads its elements from different CONCAT parts (GraphSAGE: a node's mean and
        its own value), that layout reads each part in one run (thesis 5.2.9)."""
        counts = self.editor.constants[node.attrs["counts"]]
        new_counts = counts[index]
        if node.attrs.get("kernel") == "strided":  # segment j is rows j, j + n, j + 2n, ...
            k = int(counts[0]) if counts.size else 0
            element = node.count * np.arange(k)[None, :] + index[:, None]  # (segment, t) -> row
        else:
            k = int(new_counts[0]) if new_counts.size and np.all(new_counts == new_counts[0]) else 0
            starts = (np.cumsum(counts) - counts)[index]
            element = starts[:, None] + np.arange(k)[None, :] if k else None
        consecutive_kernel = "dense" if node.attrs.get("kernel") == "strided" else node.attrs.get("kernel")
        # The edges' rows in the narrow type (at 100x PROTEINS a convolution's 20M: 80 MB less).
        edges = element.reshape(-1) if element is not None else expand_segments(starts, new_counts,
                                                                                row_dtype(counts.sum()))
        attrs = {**node.attrs, "counts": new_counts}
        if consecutive_kernel is None:
            attrs.pop("kernel", None)
        else:
            attrs["kernel"] = consecutive_kernel
        plan = self._node_plan(node, index, shared, depth, [edges], attrs)
        if (self.policy == UPWARD and self.transpose and plan.cost > 0 and element is not None and k > 1
                and index.size > 1):
            strided = self._node_plan(node, index, shared, depth, [k_major(element.reshape(-1), k)],
                                      {**node.attrs, "counts": new_counts, "kernel": "strided"})
            if strided.cost < plan.cost:
                return strided
        return plan

    def transposed(self, node: Node) -> _Plan | None:
        """REDUCE ``node`` (segments of equal length k) as a strided reduction of its input
        rows reordered k-major: the same rows, read in an order that may need fewer gathers."""
        counts = self.editor.constants[node.attrs["counts"]]
        if (not self.transpose or node.attrs.get("kernel") == "strided" or node.count < 2
                or counts[0] < 2 or np.any(counts != counts[0])):
            return None
        k = int(counts[0])
        element = (np.cumsum(counts) - counts)[:, None] + np.arange(k)[None, :]  # (segment, t) -> row
        return self._node_plan(node, np.arange(node.count), False, 0, [k_major(element.reshape(-1), k)],
                               {**node.attrs, "counts": counts, "kernel": "strided"})

    def _node_plan(self, node: Node, index: np.ndarray, shared: bool, depth: int,
                   requests: list[np.ndarray | None], attrs: dict) -> _Plan:
        """``node`` redefined (or copied, if ``shared``) with ``attrs``, reading ``requests[k]``
        rows of its k-th input (None: the input as it is). A REDUCE's ``counts`` attr holds
        the new counts themselves until the plan is built."""
        editor = self.editor
        reader = None if shared else node.name
        multiplicity = {s: node.srcs.count(s) for s in node.srcs}
        subs = [_Plan(0, 0, (lambda s=s: s)) if rows is None else
                self.rows(s, rows, reader, depth, node.layer or node.name,
                          shared=shared or multiplicity[s] > 1)
                for s, rows in zip(node.srcs, requests)]

        def build():
            srcs = tuple(sub.build() for sub in subs)
            name = editor.fresh(f"{node.name}_rows") if shared else node.name
            final = dict(attrs)
            if node.op is Op.REDUCE:
                final["counts"] = editor.const(f"counts_{name}", attrs["counts"], owner=name)
            made = editor.define(node.with_(name=name, srcs=srcs, count=int(index.size), attrs=final),
                                 rows=None if shared else index)
            return self._copied(node, index, made) if shared else made

        growth = index.size - (0 if shared else node.count)
        return _Plan(sum(s.cost for s in subs), growth + sum(s.growth for s in subs), build)
