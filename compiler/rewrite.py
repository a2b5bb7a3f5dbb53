"""The one program editor (`Rewriter`), the one place that mints names (`unique_name`), dead nodes,
and zero-sign facts."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Iterable, Mapping

import numpy as np

from .grouping import is_identity
from .indexing import SideRows
from .ir import IRError, Node, Op, Program, read_only, stored, users_of

__all__ = ["eliminate_dead_code", "unique_name", "single_use",
           "zero_sign_matters", "remove_unit_reductions", "Rewriter", "freeze_facts",
           "side_node"]


def eliminate_dead_code(program: Program) -> Program:
    """Drop nodes the output does not depend on, and constants nobody reads.

    Before: ``%a = ...; %b = TRANSFORM(%a); return %a`` -- after: ``%a = ...; return %a``.
    """
    live = _live(program.by_name(), {program.output})
    nodes = tuple(n for n in program.nodes if n.name in live)
    used = _constant_keys(nodes, program.constants)
    if len(nodes) == len(program.nodes) and len(used) == len(program.constants):
        return program
    constants = {k: v for k, v in program.constants.items() if k in used}
    return program.replace(nodes=nodes, constants=constants)


def unique_name(base: str, taken) -> str:
    """The one place that mints names of nodes and constants: ``base`` if ``taken`` (anything with
    ``in``) lacks it, else ``base_n`` for the first ``n`` of 2, 3, ... that it lacks. A set ``taken``
    gets the name added. (One numbering, by name, for every editor: a name depends only on the names
    taken, never on how many were minted before in the pass or the compile.)"""
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    if isinstance(taken, set):
        taken.add(name)
    return name


def single_use(program: Program) -> set[str]:
    """Names of nodes read exactly once (and not the output): safe to fuse into their reader."""
    users = program.users()
    return {name for name, readers in users.items() if len(readers) == 1 and name != program.output}


def is_input_fact(node: Node) -> bool:
    return node.op is Op.FACT and bool(node.attrs.get("fact_layer"))


#: Transformations that tell ``-0.0`` from ``0.0``: ``inverse`` in its value (``1 / -0.0 = -inf``),
#: ``log`` and ``sqrt`` in their derivatives (``1 / x`` and ``1 / (2 sqrt(x))``: -inf at ``-0.0``).
ZERO_SIGN_READERS = frozenset({"inverse", "log", "sqrt"})


def zero_sign_matters(program: Program) -> set[str]:
    """Nodes whose ``-0.0`` rows could reach a TRANSFORM of ``ZERO_SIGN_READERS`` before a sum or
    mean turns them into ``+0.0`` (torch, like the reference engine, sums from ``+0.0``).

    A REDUCE summing more than one row per segment is where the sign is lost; a one-row sum is
    not (it may be removed), and every other op passes a ``-0.0`` on (conservatively).
    """
    matters: set[str] = set()
    users, nodes = program.users(), program.by_name()
    for node in reversed(program.nodes):
        for reader in (nodes[r] for r in users.get(node.name, ())):
            if reader.op is Op.TRANSFORM and reader.attrs.get("fn") in ZERO_SIGN_READERS:
                matters.add(node.name)
            elif reader.name in matters and not _clears_sign(program, reader):
                matters.add(node.name)
    return matters


def remove_unit_reductions(program: Program) -> Program:
    """Each REDUCE of every count 1 is replaced by its input: each row is its one input row, except
    that a sum or mean turns ``-0.0`` into ``+0.0`` -- which only an ``inverse``, a ``log`` or a
    ``sqrt`` later can tell (``zero_sign_matters``). Part of ``cleanup.remove_identity``; run by
    ``segments.scatter_to_segment`` too, as that switch may be off."""
    rw = Rewriter(program)
    matters = zero_sign_matters(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.op is Op.REDUCE and bool(np.all(program.constants[node.attrs["counts"]] == 1)) and (
                node.attrs["aggregation"] in ("max", "min", "prod") or node.name not in matters):
            rw.alias(node.name, node.srcs[0])
        else:
            rw.keep(node)
    return rw.finish()


def _clears_sign(program: Program, node: Node) -> bool:
    if node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean"):
        return False
    return not bool(np.all(program.constants[node.attrs["counts"]] == 1))


class Rewriter:
    """The program editor every pass uses. It edits a program in one of two ways:

    * a walk (``Rewriter(program)``): the new program is built node by node, in the old one's
      order. ``take`` resolves a node's inputs through the aliases made so far; ``keep`` copies
      it; ``alias`` makes its readers read another node instead; ``emit`` adds a new node after
      everything so far; a node not kept is gone;
    * in place (``Rewriter(program, in_place=True)``): every node stays unless changed.
      ``define`` adds a node (after its inputs) or redefines one under its name, ``place`` puts
      new nodes where an old one was, ``redirect`` makes every reader of a node read another.

    ``fresh`` and ``const`` mint names (``unique_name``). ``finish`` orders
    the nodes topologically, as near their old places as it can, drops what the output does not
    read (but unread input facts where ``keep_inputs``: ``cleanup.preconcatenate`` drops those) and
    the constants no node reads, and returns the old program itself if nothing changed.
    """

    def __init__(self, program: Program, *, in_place: bool = False, keep_inputs: bool = True):
        self.program = program
        self.output = program.output
        self.constants = dict(program.constants)
        self.aliases: dict[str, str] = {}
        self.taken = {n.name for n in program.nodes} | set(program.constants)
        self.changed = False
        self.keep_inputs = keep_inputs  # unread input facts stay (``finish``)
        self._old = program.by_name()
        # A node's place: (position, tick). Nodes of one position keep the order they came in.
        self.nodes: dict[str, Node] = dict(self._old) if in_place else {}
        self._key: dict[str, tuple[int, int]] = {n: (i, 0) for i, n in enumerate(self.nodes)}
        self._position = itertools.count(len(self.nodes))
        self._tick = itertools.count(1)
        self._users: dict[str, list[str]] | None = None
        self._readers_of: tuple[dict, dict[str, list[str]]] | None = None  # (users, readers): ``const``
        self.row_listeners: list[Callable[[str, np.ndarray], None]] = []  # told where rows move (``define``)
        self.version = 0  # counts definitions: what was planned against an older version is stale

    # -- queries
    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def users(self) -> dict[str, list[str]]:
        """Readers of every live node (a reader reading twice is listed twice)."""
        if self._users is None:
            live = _live(self.nodes, {self.output})
            users: dict[str, list[str]] = {name: [] for name in live}
            for name in live:
                for s in self.nodes[name].srcs:
                    users[s].append(name)
            self._users = users
        return self._users

    def all_users(self) -> dict[str, list[str]]:
        """Readers of every node, live or not."""
        return users_of(self.nodes.values())

    def is_live(self, name: str) -> bool:
        return name in self.users()

    def readers(self, name: str) -> list[str]:
        return list(dict.fromkeys(self.users().get(name, [])))

    def shared(self, name: str, reader: str | None) -> bool:
        """Whether ``name`` is read by anything but ``reader`` (once), or is the output."""
        return name == self.output or self.users().get(name, []) != [reader]

    def _const_readers(self) -> dict[str, list[str]]:
        """The live readers of every constant (made with ``users``, once per version)."""
        users = self.users()
        if self._readers_of is None or self._readers_of[0] is not users:
            readers: dict[str, list[str]] = {}
            for name in users:
                for key in self.nodes[name].consts:
                    readers.setdefault(key, []).append(name)
            self._readers_of = (users, readers)
        return self._readers_of[1]

    def index(self, node: Node) -> np.ndarray:
        return self.constants[node.attrs["index"]]

    # -- names
    def fresh(self, base: str) -> str:
        return unique_name(base, self.taken)

    def const(self, base: str, array: np.ndarray, owner: str | None = None) -> str:
        """Store ``array`` under a fresh key; ``owner``: the node being (re)defined with it, which
        may take over ``base`` itself if no other live node reads that constant."""
        reuse = owner is not None and base in self.constants and base not in self.nodes and not (
            set(self._const_readers().get(base, ())) - {owner})
        key = base if reuse else self.fresh(base)
        array = stored(array)
        # A slice of another array is copied: a view would keep all of its base alive.
        if array.base is not None and getattr(array.base, "nbytes", None) != array.nbytes:
            array = read_only(array.copy())
        self.constants[key] = array
        return key

    # -- a walk
    def take(self, node: Node) -> Node:
        srcs = tuple(self.resolve(s) for s in node.srcs)
        return node if srcs == node.srcs else node.with_(srcs=srcs)

    def keep(self, node: Node) -> Node:
        """Copy a node (as returned by ``take``: maybe with renamed inputs, or a new version of it)."""
        if node.name not in self.nodes:
            self._key[node.name] = (next(self._position), 0)
        self.nodes[node.name] = node
        if node is not self._old.get(node.name):
            self.taken.add(node.name)
            self._edited()
        return node

    def replace(self, node: Node) -> None:
        """Put a changed version of a node (same name) last: after anything just emitted for it."""
        self.nodes.pop(node.name, None)
        self._key.pop(node.name, None)
        self.keep(node)
        self._edited()

    def alias(self, old: str, new: str) -> None:
        self.aliases[old] = self.resolve(new)
        self._edited()

    def emit(self, name: str, op: Op, srcs, count: int, shape: tuple, layer: str = "", **attrs) -> Node:
        self.taken.add(name)
        return self.keep(Node(name, op, tuple(srcs), int(count), tuple(shape), attrs, layer))

    # -- in place
    def define(self, node: Node, rows: np.ndarray | None = None, near: str | None = None) -> str:
        """Add ``node`` after its inputs (or after ``near``), or redefine the node of its name;
        ``rows``: it now holds the old rows ``rows`` of that name (``row_listeners`` are told)."""
        if node.name not in self._key:
            anchors = [self._key[s] for s in node.srcs] or [self._key.get(near, (-1, 0))]
            self._key[node.name] = (max(anchors)[0], next(self._tick))
            self.taken.add(node.name)
        self.nodes[node.name] = node
        self._edited()
        if rows is not None:
            for listener in self.row_listeners:
                listener(node.name, rows)
        return node.name

    def place(self, name: str, new_nodes: list[Node]) -> None:
        """Put ``new_nodes``, in this order, where node ``name`` is (they may reuse the name)."""
        position = self._key.pop(name)[0]
        del self.nodes[name]
        for node in new_nodes:
            self._key[node.name] = (position, next(self._tick))
            self.nodes[node.name] = node
            self.taken.add(node.name)
        self._edited()

    def redirect(self, old: str, new: str) -> None:
        """Every reader of ``old`` (and the output) reads ``new`` instead."""
        if old == new:
            return
        for reader in self.readers(old):
            node = self.nodes[reader]
            self.define(node.with_(srcs=tuple(new if s == old else s for s in node.srcs)))
        if self.output == old:
            self.output = new
            self._users = None

    def gather(self, src: str, index: np.ndarray, name: str | None = None, layer: str | None = None,
               rows: np.ndarray | None = None) -> str:
        """Define ``GATHER(src, index)`` (under ``name`` if given, else a fresh name)."""
        node = self.nodes[src]
        name = name or self.fresh(f"{src}_rows")
        key = self.const(f"idx_{name}", index, owner=name)
        return self.define(Node(name, Op.GATHER, (src,), int(index.size), node.shape, {"index": key},
                                node.layer if layer is None else layer), rows=rows)

    def new_gather(self, base: str, source: Node, index: np.ndarray, layer: str) -> Node:
        """A new GATHER node (not yet placed) of ``source`` rows ``index``."""
        key = self.const(f"idx_{base}", index)
        return Node(self.fresh(base), Op.GATHER, (source.name,), len(index), source.shape, {"index": key},
                    layer)

    def _edited(self) -> None:
        self._users = None
        self.changed = True
        self.version += 1

    def finish(self, keep_inputs: bool | None = None) -> Program:
        if not self.changed:
            return self.program
        keep_inputs = self.keep_inputs if keep_inputs is None else keep_inputs
        output = self.resolve(self.output)
        inputs = {n.name for n in self.nodes.values() if is_input_fact(n)} if keep_inputs else set()
        nodes = self._in_order(_live(self.nodes, {output} | inputs))
        used = _constant_keys(nodes, self.constants)
        return self.program.replace(nodes=tuple(nodes), constants={k: v for k, v in self.constants.items() if k in used},
                                    output=output)

    def _in_order(self, names: set[str]) -> list[Node]:
        """The nodes ``names`` in topological order, each as near its place (``_key``) as it can be."""
        pending = {name: len(set(self.nodes[name].srcs)) for name in names}
        readers: dict[str, set[str]] = {name: set() for name in names}
        for name in names:
            for s in self.nodes[name].srcs:
                readers[s].add(name)
        ready = [(self._key[name], name) for name, k in pending.items() if k == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(self.nodes[name])
            for reader in readers[name]:
                pending[reader] -= 1
                if pending[reader] == 0:
                    heapq.heappush(ready, (self._key[reader], reader))
        if len(order) != len(names):
            raise IRError(f"a rewrite left a circle among {sorted(names - {n.name for n in order})[:5]}")
        return order


def _live(nodes: Mapping[str, Node], roots: set[str]) -> set[str]:
    """The nodes ``roots`` (those of ``nodes``) and all they read, directly or not, in any order."""
    live = {r for r in roots if r in nodes}
    stack = list(live)
    while stack:
        for s in nodes[stack.pop()].srcs:
            if s not in live:
                live.add(s)
                stack.append(s)
    return live


def _constant_keys(nodes: Iterable[Node], constants: dict) -> set[str]:
    return {k for n in nodes for k in n.consts if k in constants}


def freeze_facts(program: Program, names: set[str]) -> Program:
    """Input facts (FACT nodes ``names``) whose values a pass used are no longer replaceable at
    call time: they become plain constants of the module (as iso compression does), and are
    dropped where nothing reads them any more (they were kept only as inputs)."""
    if not names:
        return program
    read = {s for n in program.nodes for s in n.srcs} | {program.output}
    rw = Rewriter(program)
    for n in program.nodes:
        if n.name in names and n.attrs.get("fact_layer"):
            if n.name not in read:
                rw.changed = True  # (dropped: not kept)
                continue
            n = n.with_(attrs={**n.attrs, "fact_layer": None})
        rw.keep(n)
    return rw.finish()



def side_node(rw: Rewriter, rows: SideRows, index: np.ndarray, base: str, layer: str) -> list[Node]:
    """Nodes that make the rows ``index`` of ``rows.source``: none if that is the whole source."""
    if is_identity(index, rows.source_count):
        return []
    return [rw.new_gather(base, rw.nodes[rows.source], index, layer)]

