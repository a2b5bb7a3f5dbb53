"""IR to ``torch.nn.Module``: generate readable Python for ``forward`` and run it.

One statement per IR node, with the value's shape in a trailing comment, in
the spirit of torch.fx's code generation and thesis Fig. 6.8::

    def program(self, f_atoms):
        w = self.weights
        w_8x7 = torch.stack([w['conv1'], w['conv2']])            # (2, 8, 7)
        h_x = f_atoms.index_select(0, self.idx_h_x)                # (7442, 7)
        ...

The source is registered with ``linecache`` so tracebacks and
``inspect.getsource`` show the generated lines.
"""
from __future__ import annotations

import itertools
import linecache

import numpy as np
import torch
from torch import nn

from ..compiler.ir import Node, Op, Program, compact_index, linear_grid
from ..sources.graph import GraphError
from . import kernels, runtime
from .functions import TRANSFORM_FUNCTIONS
from .weights import WeightStore

__all__ = ["CompiledModule", "generate_source"]

_READABLE_TRANSFORMS = {
    "sigmoid": "torch.sigmoid", "tanh": "torch.tanh", "relu": "torch.relu", "exp": "torch.exp",
    "log": "torch.log", "sqrt": "torch.sqrt", "sign": "torch.sign", "inverse": "torch.reciprocal",
    "reverse": "torch.neg",
}
_file_counter = itertools.count()


def _rows(shape: tuple) -> str:
    """A view that lets a per-row scalar broadcast over a value of ``shape``."""
    return f".view(-1{', 1' * len(shape)})"


def _expression(node: Node, nodes: dict[str, Node]) -> str:
    srcs = [nodes[s] for s in node.srcs]
    names = list(node.srcs)
    if node.op is Op.FACT:
        return f"self.{node.attrs['const']}"
    if node.op is Op.WEIGHTS:
        names_ = node.attrs["names"]
        distinct = list(dict.fromkeys(names_))
        parts = ", ".join(f"w[{n!r}]" for n in distinct)
        if len(distinct) < len(names_):
            # Upward propagation repeats weights row by row: stack each once, then gather.
            return f"torch.stack([{parts}]).index_select(0, self.wsel_{node.name})"
        return f"torch.stack([{parts}])"
    if node.op is Op.CONCAT:
        return f"torch.cat([{', '.join(names)}])"
    if node.op is Op.GATHER:
        return f"{names[0]}.index_select(0, self.{node.attrs['index']})"
    if node.op is Op.SLICE:
        a = node.attrs
        step = "" if a["step"] == 1 else f":{a['step']}"
        return f"{names[0]}[{a['start']}:{a['stop']}{step}]"
    if node.op is Op.TILE:
        ones = ", 1" * len(node.shape)
        return f"{names[0]}.repeat({node.attrs['times']}{ones})"
    if node.op is Op.INTERLEAVE:
        return f"{names[0]}.repeat_interleave({node.attrs['times']}, dim=0)"
    if node.op is Op.LINEAR:
        return _linear(node, *srcs)
    if node.op is Op.REDUCE:
        key, agg = node.attrs["counts"], node.attrs["aggregation"]
        kernel = node.attrs.get("kernel", "scatter")
        coef = node.attrs.get("coef")
        if kernel == "sparse_mm":
            # Per-edge coefficients (and a mean's 1/count) are the values of the sparse matrix.
            return f"gather_sum({names[0]}, self.csr_{node.name})"
        if coef:  # the other kernels multiply first
            names[0] = f"{names[0]} * self.{coef}{_rows(node.shape)}"
        if kernel == "segment":
            return f"segment_reduce({names[0]}, self.ptr_{key}, self.seg_{key}, self.cnt_{key}, {agg!r})"
        if kernel == "dense":
            return f"dense_reduce({names[0]}, {int(srcs[0].count // max(node.count, 1))}, {agg!r})"
        if kernel == "strided":
            return f"strided_reduce({names[0]}, {int(srcs[0].count // max(node.count, 1))}, {agg!r})"
        return f"scatter_reduce({names[0]}, self.seg_{key}, {node.count}, {agg!r}, self.cnt_{key})"
    if node.op is Op.ADD:
        x, b = srcs
        if b.shape == () and x.shape != ():
            return f"{x.name} + {b.name}{_rows(x.shape)}"
        return f"{x.name} + {b.name}"
    if node.op is Op.TRANSFORM:
        fn = node.attrs["fn"]
        if fn in _READABLE_TRANSFORMS:
            return f"{_READABLE_TRANSFORMS[fn]}({names[0]})"
        return f"T[{fn!r}]({names[0]})"
    raise NotImplementedError(f"no code generation for {node.op}")


def _product(kind: str, w: str, w_shape: tuple, x: str, x_shape: tuple, lead: int) -> str:
    """``W . x`` on tensors with ``lead`` leading batch axes before the value shapes."""
    if kind == "matmul":
        if len(x_shape) == 1:
            return f"torch.matmul({w}, {x}.unsqueeze(-1)).squeeze(-1)"
        return f"torch.matmul({w}, {x})"
    if w_shape == () and x_shape != ():
        return f"{w}{_trailing(lead, len(x_shape))} * {x}"
    if x_shape == () and w_shape != ():
        return f"{w} * {x}{_trailing(lead, len(w_shape))}"
    return f"{w} * {x}"


def _trailing(lead: int, extra: int) -> str:
    return "" if extra == 0 else f"[{', '.join([':'] * lead + ['None'] * extra)}]"


def _linear(node: Node, w: Node, x: Node) -> str:
    kind, out = node.attrs["kind"], node.count
    w_layout, x_layout = node.attrs.get("w_layout", "full"), node.attrs.get("x_layout", "full")
    if w_layout == x_layout == "full":
        if kind == "matmul":
            if len(x.shape) == 1:
                return f"torch.bmm({w.name}, {x.name}.unsqueeze(-1)).squeeze(-1)"
            return f"torch.bmm({w.name}, {x.name})"
        return _product(kind, w.name, w.shape, x.name, x.shape, 1)
    # One shared weight (the common GNN case): a single GEMM against all rows.
    # A single row on one side broadcasts along axis 0 by itself.
    if w.count == 1 and x_layout == "full":
        if kind == "matmul":
            return f"{x.name} @ {w.name}[0].T" if len(x.shape) == 1 else f"torch.matmul({w.name}[0], {x.name})"
        return _product(kind, w.name, w.shape, x.name, x.shape, 1)
    if x.count == 1 and w_layout == "full":
        if kind == "matmul" and len(x.shape) == 1:
            return f"{w.name} @ {x.name}[0]"
        return _product(kind, w.name, w.shape, x.name, x.shape, 1)
    g1, g2 = linear_grid(node, w, x)
    views = {"full": f"{g1}, {g2}", "tile": f"1, {g2}", "interleave": f"{g1}, 1"}

    def view(side: Node, layout: str) -> str:
        rest = "".join(f", {d}" for d in side.shape)
        return f"{side.name}.view({views[layout]}{rest})"

    product = _product(kind, view(w, w_layout), w.shape, view(x, x_layout), x.shape, 2)
    shape = "".join(f", {d}" for d in node.shape)
    return f"({product}).reshape({out}{shape})"


def input_facts(program: Program) -> list[Node]:
    """FACT nodes fed from graph fact layers: the generated function's arguments."""
    return [n for n in program.nodes if n.op is Op.FACT and n.attrs.get("fact_layer")]


def generate_source(program: Program) -> str:
    nodes = program.by_name()
    args = ", ".join(["self"] + [n.name for n in input_facts(program)])
    lines = [f"def program({args}):", "    w = self.weights"]
    for node in program.nodes:
        if node.op is Op.FACT and node.attrs.get("fact_layer"):
            continue
        code = f"    {node.name} = {_expression(node, nodes)}"
        shape = ", ".join(map(str, (node.count,) + node.shape))
        lines.append(f"{code:<72}  # ({shape})")
    lines.append(f"    return {program.output}")
    return "\n".join(lines) + "\n"


class CompiledModule(nn.Module):
    """A compiled neuron graph.

    ``module()`` returns the graph's outputs in declared order, one tensor of
    shape ``(n_outputs, *output_shape)``. ``module(facts={"layer": tensor})``
    replaces the values of a fact layer for this call (same shape; the layer must
    be among ``Settings.dynamic_facts`` unless no pass touched it).
    ``module.weights[name]`` is the parameter (or fixed buffer) of a graph weight.
    ``print(module.code)`` shows the generated forward program.
    """

    def __init__(self, program: Program, dtype: torch.dtype | None = None):
        super().__init__()
        program.verify()
        dtype = dtype or torch.get_default_dtype()
        self.program = program
        self.weights = WeightStore(program.weights, dtype)
        for key, array in program.constants.items():
            self.register_buffer(key, _tensor(array, dtype), persistent=False)
        for node in program.nodes:
            if node.op is Op.WEIGHTS and len(set(node.attrs["names"])) < len(node.attrs["names"]):
                distinct = {n: k for k, n in enumerate(dict.fromkeys(node.attrs["names"]))}
                rows = torch.tensor([distinct[n] for n in node.attrs["names"]], dtype=torch.int64)
                self.register_buffer(f"wsel_{node.name}", rows, persistent=False)
            if node.op is Op.REDUCE and not hasattr(self, f"seg_{node.attrs['counts']}"):
                key = node.attrs["counts"]
                counts = torch.from_numpy(np.ascontiguousarray(program.constants[key], dtype=np.int64))
                self.register_buffer(f"seg_{key}", torch.repeat_interleave(torch.arange(counts.numel()), counts),
                                     persistent=False)
                self.register_buffer(f"ptr_{key}", torch.cat([counts.new_zeros(1), counts.cumsum(0)]),
                                     persistent=False)
                self.register_buffer(f"cnt_{key}", counts.to(dtype), persistent=False)
            if node.op is Op.REDUCE and node.attrs.get("kernel") == "sparse_mm":
                coef = node.attrs.get("coef")  # constant per-edge coefficients, if any
                fused = kernels.GatherSum.from_index(program.constants[node.attrs["index"]],
                                                     program.constants[node.attrs["counts"]],
                                                     program.node(node.srcs[0]).count,
                                                     None if coef is None else program.constants[coef],
                                                     mean=node.attrs["aggregation"] == "mean", dtype=dtype)
                self.add_module(f"csr_{node.name}", runtime.CSRIndices(fused))
        self._inputs = {n.attrs["fact_layer"]: n for n in input_facts(program)}
        self.code = generate_source(program)
        self._program = _load(self.code)

    def forward(self, facts: dict | None = None) -> torch.Tensor:
        args = [getattr(self, n.attrs["const"]) for n in self._inputs.values()]
        if facts:
            args = self._replace_facts(args, facts)
        return self._program(self, *args)

    def _replace_facts(self, args: list, facts: dict) -> list:
        args = list(args)
        position = {layer: k for k, layer in enumerate(self._inputs)}
        for layer, value in facts.items():
            if layer not in position and layer in self.program.dynamic_facts:
                # Declared dynamic but nothing computed from it survived: check and ignore.
                if tuple(torch.as_tensor(value).shape) != self.program.fact_shapes[layer]:
                    raise GraphError(f"fact layer {layer!r}: replacement has shape {tuple(value.shape)}, "
                                     f"expected {self.program.fact_shapes[layer]}")
                continue
            if layer not in position:
                raise GraphError(f"fact layer {layer!r} cannot be replaced at call time: it is not an input "
                                 "of the compiled program (unknown, or optimized using its values; list it "
                                 "in Settings.dynamic_facts)")
            current = args[position[layer]]
            value = torch.as_tensor(value, dtype=current.dtype, device=current.device)
            if value.shape != current.shape:
                raise GraphError(f"fact layer {layer!r}: replacement has shape {tuple(value.shape)}, "
                                 f"expected {tuple(current.shape)}")
            args[position[layer]] = value
        return args

    def _apply(self, fn, recurse=True):
        # Constants are kept exact: after a dtype change (e.g. `.double()`), re-create
        # them from the program's float64 arrays instead of upcasting rounded values.
        super()._apply(fn, recurse)
        for key, array in self.program.constants.items():
            current = getattr(self, key)
            if current.is_floating_point():
                setattr(self, key, _tensor(array, current.dtype).to(current.device))
        return self

    def extra_repr(self) -> str:
        n_ops = sum(1 for n in self.program.nodes if n.op not in (Op.FACT, Op.WEIGHTS))
        return f"{n_ops} ops, {len(self.weights)} weights, {len(self._inputs)} fact inputs"


def _tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if np.issubdtype(array.dtype, np.integer):
        # Indices keep the IR's dtype (int32 where it fits): index_select takes int32 as it is.
        return torch.from_numpy(compact_index(array))
    return torch.tensor(array, dtype=dtype)


def _load(source: str):
    filename = f"<neurovec-program-{next(_file_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch, "T": TRANSFORM_FUNCTIONS, "segment_reduce": kernels.segment_reduce,
                 "scatter_reduce": kernels.scatter_reduce_native, "dense_reduce": kernels.dense_reduce,
                 "strided_reduce": runtime.strided_reduce, "gather_sum": runtime.gather_sum}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["program"]
