"""Thesis 5.2.6: isomorphic compression, layer by layer.

The program is evaluated under ``Settings.iso_draws`` random draws of its learnable weights (and
of its dynamic facts; static facts and fixed weights keep their values), all at once in float64
numpy, seeded by ``Settings.iso_seed``. Within every node that ends a layer (a REDUCE, ADD or
TRANSFORM that no TRANSFORM or ADD continues), rows that agree under every draw are merged: the
layer is computed on one row per class, and its readers are reindexed (``dedup.compress``). Only
rows of the same node are compared, never rows of different layers (thesis footnote 9).

This is probabilistic: two different functions of the weights could agree on every draw. Plain
numeric comparison would make that likely in two ways, which the evaluation rules out:

* Saturating functions (relu, sign, clamps, max/min selection, a sigmoid rounding to 1.0) are
  constant on whole regions, so different inputs often give the same output on every draw. So
  a TRANSFORM's output, and a max/min REDUCE's output, are not computed: each class of its input
  rows (respectively of its multisets of input rows) gets fresh random values instead. Equal
  classes give equal outputs, so merges stay sound, and everything compared numerically is a
  rational function (sums, products, means) of independent random values.
* Rounding: values are compared after rounding to 32 bits of mantissa, so that sums of the same
  terms in another order still match; two different rational functions agreeing to 1e-10 on
  every draw is what remains, and it does not happen on the graphs we test.

Before (two atoms with the same neighbourhood, written in another order)::

    %x = GATHER(%lin; index=[0, 1, 1, 0])
    %agg = REDUCE(%x; aggregation='sum', counts=[2, 2])      : (2, 16)
    %out = TRANSFORM(%agg; fn='relu')                        : (2, 16)
    %next = GATHER(%out; index=[0, 1, 1])

After::

    %x = GATHER(%lin; index=[0, 1])
    %agg = REDUCE(%x; aggregation='sum', counts=[2])         : (1, 16)
    %out = TRANSFORM(%agg; fn='relu')                        : (1, 16)
    %next = GATHER(%out; index=[0, 0, 0])
"""
from __future__ import annotations

import numpy as np
import torch

from ..ir import Node, Op, Program, linear_grid
from ..rewrite import is_input_fact
from ..settings import Settings
from .dedup import compress, representatives, sequence_ids
from .upward import SHRINK, Editor, RowPlanner, linear_side_rows, source_rows

__all__ = ["iso_compress", "layer_ends", "evaluate_classes"]

_MANTISSA_BITS = 32
_FEW_WEIGHT_ROWS = 32  # a LINEAR side with at most this many distinct weights: one GEMM per weight


def iso_compress(program: Program, settings: Settings) -> Program:
    ends = layer_ends(program)
    if not ends:
        return program
    classes = evaluate_classes(program, settings, ends)
    editor = Editor(program)
    planner = RowPlanner(editor, settings, SHRINK)
    for name in [n.name for n in program.nodes if n.name in ends]:
        reps, inverse = representatives(classes[name])
        if reps.size < editor.nodes[name].count:
            compress(editor, planner, name, reps, inverse)
    if editor.changed:
        # The merges hold for these fact values only: the facts stop being replaceable inputs.
        dynamic = set(settings.dynamic_facts)
        for node in program.nodes:
            if is_input_fact(node) and node.attrs["fact_layer"] not in dynamic and editor.is_live(node.name):
                editor.define(editor.nodes[node.name].with_(attrs={**editor.nodes[node.name].attrs,
                                                                   "fact_layer": None}))
    return editor.finish()


def layer_ends(program: Program) -> set[str]:
    """REDUCE / ADD / TRANSFORM nodes whose value no TRANSFORM or ADD (as its main input) continues."""
    continued = set()
    for n in program.nodes:
        if n.op in (Op.TRANSFORM, Op.ADD):
            continued.add(n.srcs[0])
    values = (Op.REDUCE, Op.ADD, Op.TRANSFORM)
    return {n.name for n in program.nodes if n.op in values and n.name not in continued}


# -- evaluation ------------------------------------------------------------------------------------
# Values are arrays of shape (rows, draws, *value shape): rows first, so that gathers copy whole
# contiguous rows and segment reductions run along axis 0.

class _Rows:
    """``base[index]`` without materializing it (e.g. a gather of a small weight stack)."""

    def __init__(self, base: np.ndarray, index: np.ndarray):
        self.base, self.index = base, index

    def array(self) -> np.ndarray:
        return self.base[self.index]


def _array(value) -> np.ndarray:
    return value.array() if isinstance(value, _Rows) else value


def _base_and_index(value) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(value, _Rows):
        return value.base, value.index
    return value, np.arange(value.shape[0])


def exact_row_labels(keys: np.ndarray) -> np.ndarray:
    """Labels of equal rows of an int64 matrix: hash each row to 64 bits, then compare every
    row with its hash class's first row, so that a collision never merges different rows."""
    n = keys.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng(0xC1A55)  # fixed: labels are the same on every run
    mult = rng.integers(1, 2**63, size=keys.shape[1], dtype=np.uint64) | np.uint64(1)
    with np.errstate(over="ignore"):
        hashes = (keys.view(np.uint64) * mult).sum(axis=1, dtype=np.uint64)
    _, first, labels = np.unique(hashes, return_index=True, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    wrong = ~np.all(keys == keys[first[labels]], axis=1)
    labels[wrong] = first.size + np.arange(int(wrong.sum()))
    return labels


def numeric_classes(values: np.ndarray) -> np.ndarray:
    """Labels of rows (axis 0 of ``(rows, draws, ...)``) that are equal after rounding to
    32 mantissa bits under every draw. Rows with a non-finite value are never merged."""
    n = values.shape[0]
    flat = values.reshape(n, -1)
    mantissa, exponent = np.frexp(flat)
    with np.errstate(invalid="ignore"):
        keys = np.round(mantissa * 2.0 ** _MANTISSA_BITS).astype(np.int64) * 4096 + (exponent + 2048)
    bad = ~np.isfinite(flat).all(axis=1)
    if bad.any():
        keys[bad] = 0
        keys = np.concatenate([keys, np.where(bad, np.arange(n) + 1, 0)[:, None]], axis=1)
    return exact_row_labels(keys)


def evaluate_classes(program: Program, settings: Settings, wanted: set[str]) -> dict[str, np.ndarray]:
    """Row classes of the ``wanted`` nodes (see the module doc)."""
    draws = settings.iso_draws
    rng = np.random.default_rng(settings.iso_seed)
    dynamic = set(settings.dynamic_facts)
    weight_draws = {}
    for w in program.weights:
        value = np.broadcast_to(w.value, (draws,) + w.shape)
        weight_draws[w.name] = rng.standard_normal((draws,) + w.shape) if w.learnable else value
    last_use = {}
    for i, n in enumerate(program.nodes):
        for s in n.srcs:
            last_use[s] = i
    values: dict[str, object] = {}
    classes: dict[str, np.ndarray] = {}
    nodes = program.by_name()

    def symbols(labels: np.ndarray, shape: tuple) -> np.ndarray:
        table = rng.standard_normal((int(labels.max(initial=-1)) + 1, draws) + shape)
        return table[labels]

    for i, node in enumerate(program.nodes):
        srcs = [values[s] for s in node.srcs]
        if node.op is Op.FACT:
            const = program.constants[node.attrs["const"]]
            if is_input_fact(node) and node.attrs["fact_layer"] in dynamic:
                value = rng.standard_normal((node.count, draws) + node.shape)
            else:
                value = np.broadcast_to(const[:, None], (node.count, draws) + node.shape)
        elif node.op is Op.WEIGHTS:
            value = (np.stack([weight_draws[name] for name in node.attrs["names"]]) if node.count
                     else np.zeros((0, draws) + node.shape))
        elif node.op in (Op.GATHER, Op.SLICE, Op.TILE, Op.INTERLEAVE):
            base, index = _base_and_index(srcs[0])
            value = _Rows(base, index[source_rows(node, np.arange(node.count), program.constants)])
        elif node.op is Op.CONCAT:
            value = np.concatenate([_array(v) for v in srcs])
        elif node.op is Op.LINEAR:
            value = _linear(node, nodes[node.srcs[0]], nodes[node.srcs[1]], srcs[0], srcs[1], draws)
        elif node.op is Op.REDUCE:
            x = _array(srcs[0])
            counts = program.constants[node.attrs["counts"]].astype(np.int64)
            if node.attrs.get("kernel") == "strided":  # to consecutive segments
                x = x.reshape((-1, node.count) + x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
            if node.attrs["aggregation"] in ("max", "min"):
                labels = sequence_ids(numeric_classes(x), counts)
                classes[node.name] = labels
                value = symbols(labels, node.shape)
            else:
                value = _segment_reduce(x, counts, node.attrs["aggregation"])
        elif node.op is Op.ADD:
            x, b = _array(srcs[0]), _array(srcs[1])
            if b.ndim == 2 and x.ndim > 2:
                b = b.reshape(b.shape + (1,) * (x.ndim - 2))
            value = x + b
        elif node.op is Op.TRANSFORM:
            x = _array(srcs[0])
            labels = numeric_classes(x)
            classes[node.name] = labels
            value = x if node.attrs["fn"] == "identity" else symbols(labels, node.shape)
        else:
            raise NotImplementedError(f"isomorphic compression cannot evaluate {node.op}")
        values[node.name] = value
        if node.name in wanted and node.name not in classes:
            classes[node.name] = numeric_classes(_array(value))
        for s in set(node.srcs):
            if last_use.get(s) == i:
                del values[s]
    return {name: classes[name] for name in wanted}


def _segment_reduce(x: np.ndarray, counts: np.ndarray, aggregation: str) -> np.ndarray:
    n = counts.size
    if x.shape[0] == n and np.all(counts == 1):
        return x
    if aggregation == "prod":
        out = np.ones((n,) + x.shape[1:])
        nonempty = np.flatnonzero(counts > 0)
        if nonempty.size:
            out[nonempty] = np.multiply.reduceat(x, (np.cumsum(counts) - counts)[nonempty], axis=0)
        return out
    # numpy's reduceat is slow on wide rows; torch's index_add_ runs in order on the CPU.
    segment = torch.from_numpy(np.repeat(np.arange(n), counts))
    rows = torch.from_numpy(np.ascontiguousarray(x))
    out = torch.zeros((n,) + x.shape[1:], dtype=rows.dtype).index_add_(0, segment, rows).numpy()
    if aggregation == "mean":
        out /= np.maximum(counts, 1).reshape((n,) + (1,) * (x.ndim - 1))
    return out


def _product(kind: str, w: np.ndarray, x: np.ndarray, w_shape: tuple, x_shape: tuple) -> np.ndarray:
    """``W . x`` on ``(rows, draws, ...)`` arrays (rows may broadcast), as in codegen."""
    if kind == "matmul":
        if len(x_shape) == 1:
            return np.matmul(w, x[..., None])[..., 0]
        return np.matmul(w, x)
    if w_shape == () and x_shape != ():
        return w.reshape(w.shape + (1,) * len(x_shape)) * x
    if x_shape == () and w_shape != ():
        return w * x.reshape(x.shape + (1,) * len(w_shape))
    return w * x


def _linear(node: Node, w_node: Node, x_node: Node, w_value, x_value, draws: int) -> np.ndarray:
    _, g2 = linear_grid(node, w_node, x_node)
    rows = np.arange(node.count)
    w_base, w_index = _base_and_index(w_value)
    x_base, x_index = _base_and_index(x_value)
    w_index = w_index[linear_side_rows(node.attrs.get("w_layout", "full"), rows, g2)]
    x_index = x_index[linear_side_rows(node.attrs.get("x_layout", "full"), rows, g2)]
    kind = node.attrs["kind"]
    distinct = np.unique(w_index)
    if distinct.size > _FEW_WEIGHT_ROWS or (kind != "matmul" and w_node.shape == ()):
        return _product(kind, w_base[w_index], x_base[x_index], w_node.shape, x_node.shape)
    out = np.empty((node.count, draws) + node.shape)
    for k in distinct:
        selected = np.flatnonzero(w_index == k) if distinct.size > 1 else rows
        x = x_base[x_index[selected]]
        w = w_base[k]
        if kind == "matmul" and len(x_node.shape) == 1:
            for d in range(draws):  # one GEMM per weight and draw
                out[selected, d] = x[:, d] @ w[d].T
        else:
            out[selected] = _product(kind, w[None], x, w_node.shape, x_node.shape)
    return out
