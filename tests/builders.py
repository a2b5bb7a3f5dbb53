"""Hand-written programs for the pass tests (``Builder``), and checks that two programs compute the
same function (outputs and gradients)."""
import numpy as np
import torch

from neurovec.compiler.ir import Node, Op, Program
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import Weight, product_shape

from .equivalence import outputs_and_grads

__all__ = ["Builder", "evaluate", "assert_same_function", "ops", "index_of"]


class Builder:
    """Hand-written programs: each method adds one node and returns its name."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: dict[str, Node] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.weight_list: list[Weight] = []
        self.layer = None  # the graph layer of the next nodes (None: each node its own)

    def _add(self, name, op, srcs, count, shape, **attrs):
        layer = "" if op in (Op.FACT, Op.WEIGHTS) else (self.layer or name)
        node = Node(name, op, tuple(srcs), int(count), tuple(shape), attrs, layer)
        # A draft until build(): a test may still change its attrs (a built program's are read-only).
        object.__setattr__(node, "attrs", dict(node.attrs))
        self.nodes[name] = node
        return name

    def fact(self, name, values, layer="auto", unit=False):
        values = np.asarray(values, dtype=np.float64)
        self.constants[f"c_{name}"] = values
        return self._add(name, Op.FACT, (), values.shape[0], values.shape[1:], const=f"c_{name}",
                         fact_layer=name if layer == "auto" else layer, unit=unit)

    def weights(self, name, shape, k=1, learnable=True, values=None):
        names = []
        for i in range(k):
            value = self.rng.normal(size=shape) if values is None else values[i]
            self.weight_list.append(Weight(f"{name}{i}", value, learnable))
            names.append(f"{name}{i}")
        return self._add(name, Op.WEIGHTS, (), k, shape, names=tuple(names))

    def gather(self, name, src, index):
        self.constants[f"i_{name}"] = np.asarray(index, dtype=np.int64)
        return self._add(name, Op.GATHER, (src,), len(index), self.nodes[src].shape, index=f"i_{name}")

    def concat(self, name, *srcs):
        count = sum(self.nodes[s].count for s in srcs)
        return self._add(name, Op.CONCAT, srcs, count, self.nodes[srcs[0]].shape)

    def linear(self, name, w, x, kind=None, count=None, **layouts):
        ws, xs = self.nodes[w].shape, self.nodes[x].shape
        kind = kind or ("matmul" if len(ws) == 2 and xs != () else "mul")
        return self._add(name, Op.LINEAR, (w, x), count or self.nodes[x].count, product_shape(ws, xs),
                         kind=kind, **layouts)

    def reduce(self, name, src, counts, aggregation="sum"):
        self.constants[f"n_{name}"] = np.asarray(counts, dtype=np.int64)
        return self._add(name, Op.REDUCE, (src,), len(counts), self.nodes[src].shape,
                         aggregation=aggregation, counts=f"n_{name}")

    def add(self, name, x, b):
        return self._add(name, Op.ADD, (x, b), self.nodes[x].count, self.nodes[x].shape)

    def transform(self, name, x, fn="sigmoid"):
        return self._add(name, Op.TRANSFORM, (x,), self.nodes[x].count, self.nodes[x].shape, fn=fn)

    def build(self, output) -> Program:
        nodes = tuple(n.with_() for n in self.nodes.values())  # attrs read-only from here on
        program = Program(nodes, dict(self.constants), tuple(self.weight_list), output)
        program.verify()
        return program


def evaluate(program: Program):
    return outputs_and_grads(CompiledModule(program, torch.float64))


def assert_same_function(before: Program, after: Program, tol=1e-12):
    """Outputs and gradients w.r.t. every learnable weight agree (a NaN where the other has a NaN:
    finite outputs can still have NaN gradients, e.g. sqrt at 0 times 0)."""
    after.verify()
    out_a, grads_a = evaluate(before)
    out_b, grads_b = evaluate(after)
    torch.testing.assert_close(out_b, out_a, rtol=tol, atol=tol, equal_nan=True)
    for name in grads_a:
        if grads_a[name] is None or grads_b[name] is None:
            assert grads_a[name] is None or torch.all(grads_a[name] == 0)
            assert grads_b[name] is None or torch.all(grads_b[name] == 0)
        else:
            torch.testing.assert_close(grads_b[name], grads_a[name], rtol=tol, atol=tol, equal_nan=True)


def ops(program: Program) -> list[str]:
    return [n.op.name for n in program.nodes]


def index_of(program: Program, name: str) -> list[int]:
    return program.constants[program.node(name).attrs["index"]].tolist()
