"""Biases are added by broadcasting their one row, not by repeating it to every row first.

The Vectorizer gathers every neuron's bias; once the gathers are simplified, a bias
shared by a whole layer is a TILE of one row: a ``(n, 16)`` copy made (and reduced
again in the backward) every step only to be added. An ADD may read a one-row
``b`` (NOTE in ``compiler/ir.py``), so the copy goes::

    %b = TILE(w_bias; times=n)            : (n, 16)
    %y = ADD(x, b)                        : (n, 16)
  becomes
    %y = ADD(x, w_bias)                   : (n, 16)      x + w['conv1.bias']
"""
from __future__ import annotations

from ..ir import Op, Program
from ..settings import Settings
from .simplify_gathers import Rewriter

__all__ = ["broadcast_adds"]


def broadcast_adds(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        if node.op is Op.ADD and node.count > 1:
            row = _one_row(rw, node.srcs[1])
            if row is not None:
                node = node.with_(srcs=(node.srcs[0], row))
                rw.replace(node)
                continue
        rw.keep(node)
    return rw.finish()


def _one_row(rw: Rewriter, name: str) -> str | None:
    """The one-row value that ``name`` repeats to every row, or None."""
    node = rw.nodes[name]
    while node.op in (Op.TILE, Op.INTERLEAVE) and node.count > 1:
        node = rw.nodes[node.srcs[0]]
    return node.name if node.count == 1 else None
