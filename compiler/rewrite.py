"""Small helpers that passes share: renaming uses, dropping dead nodes, fresh names."""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import numpy as np

from .ir import Node, Op, Program, stored

__all__ = ["replace_uses", "eliminate_dead_code", "unique_name", "fresh_name", "fresh_const", "single_use",
           "zero_sign_matters", "unit_reduction_is_identity", "Rewriter"]


def replace_uses(program: Program, mapping: dict[str, str]) -> Program:
    """Make every reader of node ``old`` read ``mapping[old]`` instead (chains are followed)."""
    if not mapping:
        return program

    def resolve(name: str) -> str:
        while name in mapping:
            name = mapping[name]
        return name

    nodes = tuple(n if not any(s in mapping for s in n.srcs) else n.with_(srcs=tuple(resolve(s) for s in n.srcs))
                  for n in program.nodes)
    return program.replace(nodes=nodes, output=resolve(program.output))


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


class _Taken:
    """The names a program's nodes and a dict of constants use, for ``in`` (nothing is copied)."""

    def __init__(self, nodes, constants: dict):
        self.nodes, self.constants = nodes, constants

    def __contains__(self, name: str) -> bool:
        return name in self.constants or any(n.name == name for n in self.nodes)


#: The numbers fresh_name and fresh_const append, process-wide (benchmarks/program_digests.py
#: starts them afresh for each program it digests).
_counter = itertools.count()


def fresh_name(program: Program, base: str) -> str:
    """A node or constant name not used in ``program``."""
    return unique_name(base, {n.name for n in program.nodes} | set(program.constants), _counter)


def fresh_const(program: Program, constants: dict, base: str, array: np.ndarray) -> str:
    """Store ``array`` in ``constants`` (a copy being built for a new program) under a fresh key."""
    key = unique_name(base, _Taken(program.nodes, constants), _counter)
    constants[key] = stored(array)
    return key


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

    def __init__(self, program: Program):
        self.program = program
        self.nodes: dict[str, Node] = {}
        self.constants = dict(program.constants)
        self.aliases: dict[str, str] = {}
        self.taken = {n.name for n in program.nodes} | set(program.constants)
        self.changed = False
        self._numbers = itertools.count(1)  # fresh names' suffixes, one sequence for the whole rewrite
        self._old = program.by_name()

    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def take(self, node: Node) -> Node:
        srcs = tuple(self.resolve(s) for s in node.srcs)
        return node if srcs == node.srcs else node.with_(srcs=srcs)

    def keep(self, node: Node) -> None:
        """Copy a node (as returned by ``take``: maybe with renamed inputs)."""
        self.nodes[node.name] = node
        if node is not self._old.get(node.name):
            self.changed = True

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
        old_keys = _constant_keys(self.program.nodes, self.program.constants)
        new_keys = _constant_keys(nodes, self.constants)
        constants = {k: v for k, v in self.constants.items() if k in new_keys or k not in old_keys}
        return self.program.replace(nodes=tuple(nodes), constants=constants, output=output)


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
