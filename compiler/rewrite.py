"""Small helpers that passes share: renaming uses, dropping dead nodes, fresh names."""
from __future__ import annotations

import itertools

import numpy as np

from .ir import Node, Op, Program, stored

__all__ = ["replace_uses", "eliminate_dead_code", "fresh_name", "fresh_const", "single_use",
           "zero_sign_matters", "unit_reduction_is_identity"]


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


_counter = itertools.count()


def fresh_name(program: Program, base: str) -> str:
    """A node or constant name not used in ``program``."""
    taken = {n.name for n in program.nodes} | set(program.constants)
    if base not in taken:
        return base
    while True:
        name = f"{base}_{next(_counter)}"
        if name not in taken:
            return name


def fresh_const(program: Program, constants: dict, base: str, array: np.ndarray) -> str:
    """Store ``array`` in ``constants`` (a copy being built for a new program) under a fresh key."""
    key = base
    while key in constants or any(n.name == key for n in program.nodes):
        key = f"{base}_{next(_counter)}"
    constants[key] = stored(array)
    return key


def single_use(program: Program) -> set[str]:
    """Names of nodes read exactly once (and not the output): safe to fuse into their reader."""
    users = program.users()
    return {name for name, readers in users.items() if len(readers) == 1 and name != program.output}


def is_input_fact(node: Node) -> bool:
    return node.op is Op.FACT and bool(node.attrs.get("fact_layer"))


def zero_sign_matters(program: Program) -> set[str]:
    """Nodes whose ``-0.0`` rows could reach an ``inverse`` TRANSFORM (``1 / -0.0 = -inf``) before a
    sum or mean turns them into ``+0.0`` (torch, like the reference engine, sums from ``+0.0``).

    A REDUCE summing more than one row per segment is where the sign is lost; a one-row sum is
    not (it may be removed), and every other op passes a ``-0.0`` on (conservatively).
    """
    matters: set[str] = set()
    users, nodes = program.users(), program.by_name()
    for node in reversed(program.nodes):
        for reader in (nodes[r] for r in users.get(node.name, ())):
            if reader.op is Op.TRANSFORM and reader.attrs.get("fn") == "inverse":
                matters.add(node.name)
            elif reader.name in matters and not _clears_sign(program, reader):
                matters.add(node.name)
    return matters


def unit_reduction_is_identity(program: Program, node: Node, matters: set[str]) -> bool:
    """Whether REDUCE ``node`` (every count 1) may be dropped: each row is its one input row, except
    that a sum or mean turns ``-0.0`` into ``+0.0`` -- which only an ``inverse`` later can tell."""
    return node.attrs["aggregation"] in ("max", "min", "prod") or node.name not in matters


def _clears_sign(program: Program, node: Node) -> bool:
    if node.op is not Op.REDUCE or node.attrs["aggregation"] not in ("sum", "mean"):
        return False
    return not bool(np.all(program.constants[node.attrs["counts"]] == 1))
