"""Compute once, at compile time, what depends only on static facts and fixed weights.

A value computed from static facts and fixed weights alone is the same at every
step. Once ``pull_linear_up`` has moved the first layer's weight after the
aggregation, GCN's, SAGE's and GIN's first aggregation over the node features is
such a value: it becomes a constant (float64, rounded to the module's dtype once),
and its backward needs no sparse product at all::

    %f_x = FACT(const=facts_x, fact_layer='x')           : (n, 3)
    %g = GATHER(f_x; index=idx)                           : (E, 3)
    %a = REDUCE(g; aggregation='sum', coef=c)             : (n, 3)
    %l = LINEAR(w, a; kind='matmul')                      : (n, 16)
  becomes
    %a = FACT(const=folded_a, fact_layer=None)            : (n, 3)
    %l = LINEAR(w, a; kind='matmul')                      : (n, 16)

Folded are the computing ops (not pure row movements, which cost nothing to keep
and could be large) that some non-constant op reads. Their values come from the
program itself, run by the engine in float64, so they are exactly what the module
would compute. Facts in ``Settings.dynamic_facts`` are never folded; a fact layer
that was folded into a constant is no longer replaceable at call time.
"""
from __future__ import annotations

import torch

from ...engines.torch_module import CompiledModule
from ..ir import INDEXING, Node, Op, Program
from ..rewrite import eliminate_dead_code, zero_sign_matters
from ..settings import Settings
from .rows import freeze_facts, is_constant
from .simplify_gathers import Rewriter

__all__ = ["fold_constants", "evaluate", "EXPANSION"]

# A row movement of constants is folded unless it stores more than this many times the rows it
# reads (one-hot labels: 3 distinct rows gathered to every edge would only cost memory).
EXPANSION = 2


def fold_constants(program: Program, settings: Settings) -> Program:
    nodes = program.by_name()
    folded = _targets(program, nodes, is_constant(program, nodes))
    if not folded:
        return program
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.name in folded:
            key = rw.const(f"folded_{node.name}", evaluate(program, node.name))
            rw.replace(Node(node.name, Op.FACT, (), node.count, node.shape,
                            {"const": key, "fact_layer": None, "unit": False}, node.layer))
        else:
            rw.keep(node)
    read = _ancestors(program, folded)
    return freeze_facts(rw.finish(), {n.name for n in program.nodes if n.op is Op.FACT and n.name in read})


def _targets(program: Program, nodes: dict[str, Node], constant: set[str]) -> set[str]:
    """The constants to fold: those that non-constant ops (or the output) read, except row
    movements that would store many more rows than they read (:data:`EXPANSION`), under
    which the search goes on."""
    needed = [program.output] if program.output in constant else []
    needed += [s for n in program.nodes if n.name not in constant for s in n.srcs if s in constant]
    targets: set[str] = set()
    seen: set[str] = set()
    while needed:
        name = needed.pop()
        if name in seen:
            continue
        seen.add(name)
        node = nodes[name]
        if node.op in (Op.FACT, Op.WEIGHTS):
            continue
        if node.op in INDEXING and _expands(node, nodes):
            needed.extend(node.srcs)
        elif node.op is Op.SLICE and nodes[node.srcs[0]].op in (Op.FACT, Op.WEIGHTS):
            continue  # a view of a stored constant: nothing to compute
        else:
            targets.add(name)
    return targets


def _expands(node: Node, nodes: dict[str, Node]) -> bool:
    """A row movement whose result is much bigger (over ``EXPANSION`` times) than what it reads."""
    return node.count > EXPANSION * sum(nodes[s].count for s in dict.fromkeys(node.srcs))


def evaluate(program: Program, name: str):
    """The float64 value of node ``name`` (a numpy array), computed by the generated module."""
    sub = eliminate_dead_code(program.replace(output=name))
    if name in zero_sign_matters(program):
        # The sign of its zeros reaches an inverse in ``program``: an (unused) inverse reader makes
        # the generated code give them as the whole program would (NOTE: [signed zeros in max and min]).
        node = sub.node(name)
        reader = Node(f"{name}_inverse", Op.TRANSFORM, (name,), node.count, node.shape, {"fn": "inverse"})
        while any(n.name == reader.name for n in sub.nodes):
            reader = reader.with_(name=f"{reader.name}_")
        sub = sub.replace(nodes=sub.nodes + (reader,))
    with torch.no_grad():
        return CompiledModule(sub, torch.float64)().numpy()


def _ancestors(program: Program, names: set[str]) -> set[str]:
    nodes = program.by_name()
    seen, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(nodes[name].srcs)
    return seen
