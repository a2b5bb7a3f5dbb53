"""The program editor that passes share (`Rewriter`), fresh names, dead nodes, and zero-sign facts."""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import numpy as np

from .grouping import is_identity
from .indexing import ROW_SELECTIONS, SideRows
from .ir import Node, Op, Program, compact_index, stored, users_of

__all__ = ["PROCESS_NUMBERS", "eliminate_dead_code", "unique_name", "single_use",
           "zero_sign_matters", "unit_reduction_is_identity", "Rewriter", "freeze_facts", "NodeEditor",
           "side_node"]


def eliminate_dead_code(program: Program) -> Program:
    """Drop nodes the output does not depend on, and constants nobody reads.

    Before: ``%a = ...; %b = TRANSFORM(%a); return %a`` -- after: ``%a = ...; return %a``.
    """
    live = {program.output}
    for node in reversed(program.nodes):
        if node.name in live:
            live.update(node.srcs)
    nodes = tuple(n for n in program.nodes if n.name in live)
    used = {v for n in nodes for v in n.attrs.values() if isinstance(v, str) and v in program.constants}
    if len(nodes) == len(program.nodes) and len(used) == len(program.constants):
        return program
    constants = {k: v for k, v in program.constants.items() if k in used}
    return program.replace(nodes=nodes, constants=constants)


def unique_name(base: str, taken, numbers: Iterator[int] | None = None) -> str:
    """The one place that mints names of nodes and constants: ``base`` if ``taken`` (anything with
    ``in``) lacks it, else ``base_n`` for the first ``n`` from ``numbers`` that it lacks (by default
    2, 3, ... afresh for this call). A set ``taken`` gets the name added."""
    name = base
    if name in taken:
        numbers = itertools.count(2) if numbers is None else numbers
        while name in taken:
            name = f"{base}_{next(numbers)}"
    if isinstance(taken, set):
        taken.add(name)
    return name


#: The numbers that ``Rewriter(program, PROCESS_NUMBERS)`` appends, process-wide
#: (benchmarks/program_digests.py starts them afresh for each program it digests).
_counter = itertools.count()


# NOTE: [two numberings] A name already taken gets a number appended. Rewriters number from 1 for
# each rewrite; the passes that used the old ``fresh_const`` before they used the Rewriter
# (``Rewriter(program, PROCESS_NUMBERS)``) take the next number of a process-wide count, as it
# did, so their names depend on what the process compiled before. One numbering for all would
# rename constants on the benchmark programs (not byte-identical), so it is a step of its own.
class _ProcessNumbers:
    """The process-wide count (``_counter``, which benchmarks/program_digests.py may restart)."""

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return next(_counter)


PROCESS_NUMBERS = _ProcessNumbers()


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


def unit_reduction_is_identity(program: Program, node: Node, matters: set[str]) -> bool:
    """Whether REDUCE ``node`` (every count 1) may be dropped: each row is its one input row, except
    that a sum or mean turns ``-0.0`` into ``+0.0`` -- which only an ``inverse``, a ``log`` or a
    ``sqrt`` later can tell (``zero_sign_matters``)."""
    return node.attrs["aggregation"] in ("max", "min", "prod") or node.name not in matters


def _clears_sign(program: Program, node: Node) -> bool:
    if node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean"):
        return False
    return not bool(np.all(program.constants[node.attrs["counts"]] == 1))


class Rewriter:
    """Builds a new program node by node, in the old program's order.

    ``take`` resolves a node's inputs through the aliases made so far; ``keep`` copies
    it; ``alias`` makes its readers read another node instead; ``emit`` adds new nodes.
    ``finish`` drops the nodes this rewrite left without readers (never ones that were
    already dead: dead-code elimination is ``remove_unused``'s switch) and the
    constants only they read.
    """

    def __init__(self, program: Program, numbers: Iterator[int] | None = None):
        self.program = program
        self.nodes: dict[str, Node] = {}
        self.constants = dict(program.constants)
        self.aliases: dict[str, str] = {}
        self.taken = {n.name for n in program.nodes} | set(program.constants)
        self.changed = False
        # Fresh names' suffixes: one sequence for the whole rewrite, or (``numbers=PROCESS_NUMBERS``,
        # NOTE: [two numberings]) the process-wide one.
        self._numbers = itertools.count(1) if numbers is None else numbers
        self._old = program.by_name()

    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def take(self, node: Node) -> Node:
        srcs = tuple(self.resolve(s) for s in node.srcs)
        return node if srcs == node.srcs else node.with_(srcs=srcs)

    def keep(self, node: Node) -> Node:
        """Copy a node (as returned by ``take``: maybe with renamed inputs, or a new version of it)."""
        self.nodes[node.name] = node
        if node is not self._old.get(node.name):
            self.taken.add(node.name)
            self.changed = True
        return node

    def replace(self, node: Node) -> None:
        """Put a changed version of a node (same name) last: after anything just emitted for it."""
        self.nodes.pop(node.name, None)
        self.nodes[node.name] = node
        self.changed = True

    def alias(self, old: str, new: str) -> None:
        self.aliases[old] = self.resolve(new)
        self.changed = True

    def fresh(self, base: str) -> str:
        return unique_name(base, self.taken, self._numbers)

    def const(self, base: str, array: np.ndarray) -> str:
        key = self.fresh(base)
        self.constants[key] = stored(array)
        return key

    def emit(self, name: str, op: Op, srcs, count: int, shape: tuple, layer: str = "", **attrs) -> Node:
        self.taken.add(name)
        node = Node(name, op, tuple(srcs), int(count), tuple(shape), attrs, layer)
        self.nodes[name] = node
        self.changed = True
        return node

    def finish(self, keep_inputs: bool = True) -> Program:
        if not self.changed:
            return self.program
        output = self.resolve(self.program.output)
        nodes = _drop_orphans(list(self.nodes.values()), output, self.program, keep_inputs)
        return self.program.replace(nodes=tuple(nodes), constants=_kept_constants(self.program, nodes, self.constants),
                                    output=output)


def _live(nodes: list[Node], roots: set[str]) -> set[str]:
    live = set(roots)
    for node in reversed(nodes):
        if node.name in live:
            live.update(node.srcs)
    return live


def _drop_orphans(nodes: list[Node], output: str, old: Program, keep_inputs: bool) -> list[Node]:
    """Drop what this rewrite left without readers; keep what was dead before (and what it reads)."""
    live_before = _live(list(old.nodes), {old.output})
    roots = {output} | {n.name for n in old.nodes if n.name not in live_before}
    if keep_inputs:
        roots |= {n.name for n in nodes if n.op is Op.FACT and n.attrs.get("fact_layer")}
    live = _live(nodes, roots)
    return [n for n in nodes if n.name in live]


def _constant_keys(nodes: Iterable[Node], constants: dict) -> set[str]:
    return {v for n in nodes for v in n.attrs.values() if isinstance(v, str) and v in constants}


def _kept_constants(old: Program, nodes: Iterable[Node], constants: dict) -> dict:
    """Of ``constants``, those the rewritten ``nodes`` read, and those of the ``old`` program that
    none of its nodes read (unread before: another pass's business, e.g. ``remove_unused``)."""
    unread_before = set(old.constants) - _constant_keys(old.nodes, old.constants)
    new_keys = _constant_keys(nodes, constants)
    return {k: v for k, v in constants.items() if k in new_keys or k in unread_before}


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



# -- a second editor, for passes that replace nodes in place (folded into Rewriter next) -------------

class NodeEditor:
    """Nodes in order plus a constants copy, with fresh names and insertion; ``build()`` makes the Program."""

    def __init__(self, program: Program):
        self.program = program
        self.nodes: list[Node] = list(program.nodes)
        self.constants = dict(program.constants)
        self.changed = False
        self._taken = {n.name for n in program.nodes} | set(program.constants)

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def users(self) -> dict[str, list[str]]:
        return users_of(self.nodes)

    def fresh(self, base: str) -> str:
        return unique_name(base, self._taken)

    def const(self, base: str, array: np.ndarray) -> str:
        key = self.fresh(base)
        array = compact_index(array)
        # A slice of another index (split_by_runs) is copied: a view would keep all of its base alive.
        self.constants[key] = array.copy() if array.base is not None else array
        return key

    def gather(self, base: str, source: Node, index: np.ndarray, layer: str) -> Node:
        """A new GATHER node (not yet placed) of ``source`` rows ``index``."""
        key = self.const(f"idx_{base}", index)
        return Node(self.fresh(base), Op.GATHER, (source.name,), len(index), source.shape, {"index": key},
                    layer)

    def replace(self, name: str, new_nodes: list[Node]) -> None:
        """Put ``new_nodes`` where node ``name`` is (they may reuse the name)."""
        position = next(k for k, n in enumerate(self.nodes) if n.name == name)
        self.nodes[position:position + 1] = new_nodes
        self.changed = True

    def drop_unused(self, names) -> None:
        """Remove the nodes ``names`` (and the selections they read) that nothing reads any more."""
        pending = list(names)
        while pending:
            users = self.users()
            nodes = self.by_name()
            dead = {n for n in pending if n in users and not users[n] and n != self.program.output}
            if not dead:
                return
            pending = [s for n in dead for s in nodes[n].srcs if nodes[s].op in ROW_SELECTIONS]
            self.nodes = [n for n in self.nodes if n.name not in dead]

    def build(self) -> Program:
        if not self.changed:
            return self.program
        # Drop the constants that this rewrite left unread (old gather indices).
        return self.program.replace(nodes=tuple(self.nodes),
                                    constants=_kept_constants(self.program, self.nodes, self.constants))




def side_node(editor: NodeEditor, rows: SideRows, index: np.ndarray, base: str, layer: str) -> list[Node]:
    """Nodes that make the rows ``index`` of ``rows.source``: none if that is the whole source."""
    if is_identity(index, rows.source_count):
        return []
    return [editor.gather(base, editor.by_name()[rows.source], index, layer)]

