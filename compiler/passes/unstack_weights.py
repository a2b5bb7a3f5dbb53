"""One weight sliced out of a stack is read as itself.

The Vectorizer stacks all weights of one shape (``torch.stack([w['conv1.bias'],
w['conv2.bias']])``) so that per-row weights can be gathered from one tensor. Once
each layer reads a single weight, as a one-row slice of the stack, the stack only
costs a copy and its backward; the slice becomes a WEIGHTS node of that one weight,
which the code generator uses in place (``x @ w['conv1.lin.weight'].T``)::

    %w_16 = WEIGHTS(names=('conv1.bias', 'conv2.bias'))    : (2, 16)
    %b = SLICE(w_16; start=1, stop=2, step=1)              : (1, 16)
  becomes
    %b = WEIGHTS(names=('conv2.bias',))                    : (1, 16)

It runs before the linear reordering, so a product moved onto a bias meets that
bias alone (``W_out b``), not the whole stack.
"""
from __future__ import annotations

from ..ir import Node, Op, Program
from ..rewrite import Rewriter
from ..settings import Settings

__all__ = ["unstack_weights"]


def unstack_weights(program: Program, settings: Settings) -> Program:
    rw = Rewriter(program)
    for node in program.nodes:
        node = rw.take(node)
        stack = rw.nodes.get(node.srcs[0]) if node.srcs else None
        if node.op is Op.SLICE and node.count == 1 and stack is not None and stack.op is Op.WEIGHTS:
            name = stack.attrs["names"][node.attrs["start"]]
            rw.replace(Node(node.name, Op.WEIGHTS, (), 1, node.shape, {"names": (name,)}, node.layer))
        else:
            rw.keep(node)
    return rw.finish()
