"""Arithmetic circuits: SDD files as neurovec graphs that compute weighted model counts.

A Sentential Decision Diagram (the SDD library's text format, as ``pysdd`` and KLay
write and read it) is a DAG of literals, the constants true and false, and decision
nodes ``OR_i (prime_i AND sub_i)``. Its weighted model count (WMC) under literal
weights ``w(x) = p_x``, ``w(-x) = 1 - p_x`` is the circuit evaluated in the real
semiring: literals are their weights, AND is a product, OR a sum. With these weights
``w(x) + w(-x) = 1``, so variables that a branch does not mention contribute a
factor 1 and the circuit needs no smoothing::

    from neurovec.sources import circuits
    circuit = circuits.read_sdd("sudoku_4.sdd")          # reads sudoku_4.vtree beside it
    graph = circuits.to_graph(circuit, batch=128)         # the literal weights: a dynamic fact layer
    module = neurovec.compile(graph, circuits.settings())  # any preset: circuits.settings("upward-00-free")
    wmc = module(facts={"literals": probabilities.T})[0]   # probabilities: [128, circuit.n_vars]

or, the same in one object, ``circuits.compile(circuit, batch=128)(probabilities)``.

How the circuit maps onto neurovec's layers (:func:`to_graph`):

* ``literals``: a fact layer with one neuron per variable whose value is the vector of
  that variable's weights across the batch (shape ``(n_vars, batch)``), declared
  dynamic so each call passes its own;
* ``negations``: ``1 - p`` for every variable that occurs negated, a sum neuron with
  the fixed weight -1 and the fixed bias 1;
* ``and{t}`` (``t`` odd) and ``or{t}`` (``t`` even): the products and sums of slot ``t``
  (:func:`schedule`: each node at the first slot of its kind above its children, as
  KLay layers a circuit), with aggregation ``prod`` and ``sum``. Every layer reads the
  layer below it only: a node read from higher up is copied (a one-input product or
  sum) into each slot in between, so each layer is one gather and one reduction.

In the log semiring (weights are log-probabilities, AND is a sum, OR a logsumexp)
``or{t}`` is computed stably from aggregations neurovec has: ``m = max_i x_i``, then
``m + log(sum_i exp(x_i - m))`` (layers ``or{t}.max``, ``or{t}.shift``, ``or{t}.sum``
and ``or{t}``), and a negated literal is ``log(1 - exp(l))``.

Reading is whole-array: the file is tokenized and its integers converted by numpy
over its bytes, constants are folded and the nodes levelled a DAG level at a time
(one round of array operations per level, never a Python step per node). Constants
are folded exactly as the semiring would compute them: an element with a false prime
or sub is dropped (``x * 0`` adds nothing to a sum of finite terms), an element with a
true side is its other side (``x * 1 = x``), and a decision left with one element is
that element; what stays is a circuit of literals, two-input products and sums of two
or more inputs (a true constant that stays, e.g. ``T`` as a sub next to other
elements, reads the ``constants`` fact layer).

Malformed input raises :class:`CircuitError` (a :class:`GraphError`) naming the file
and line: a truncated file, a record with the wrong count of numbers, a node that
references an undefined (or later) node, a literal whose variable the vtree does not
have, a node on a vtree node the vtree does not have.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .graph import AGGREGATIONS, NO_WEIGHT, FactLayer, Graph, GraphError, NeuronLayer, Weight

__all__ = ["SEMIRINGS", "LITERALS", "CircuitError", "Vtree", "Circuit", "read_vtree", "read_sdd",
           "to_graph", "schedule", "settings", "compile", "WMCModule"]

#: The semirings :func:`to_graph` builds: ``real`` (probabilities; sum and product) and
#: ``log`` (log-probabilities; logsumexp and sum).
SEMIRINGS = ("real", "log")

#: In the log semiring every logsumexp's max also reads this finite constant, so a sum of children
#: that are all log 0 = -inf is -inf, not NaN. It is finite in float32 and bfloat16 (in float16 it
#: is -inf, and such a sum stays NaN there); log-weights below it count as log 0.
LOG_FLOOR = -3.0e38

#: The name of the dynamic fact layer that holds the literal weights.
LITERALS = "literals"

# Circuit node kinds.
LITERAL, TRUE, AND, OR = 0, 1, 2, 3
# Resolution of an SDD node while folding constants: a circuit node id (>= 0) or a constant.
_FALSE, _TRUE = -1, -2


class CircuitError(GraphError):
    """A malformed SDD or vtree file; the message names the file and the line."""


# -- tokenizing -------------------------------------------------------------------------------

_MAX_DIGITS = 18  # int64 holds every integer of 18 decimal digits


@dataclass(frozen=True)
class _Records:
    """The non-comment lines of a file: a record word, its line and its integers (CSR)."""

    path: str
    header: np.ndarray  # per record: whether its word is the header word (``sdd``, ``vtree``)
    kind: np.ndarray    # per record: the first byte of its word
    line: np.ndarray    # per record: 1-based line number
    ptr: np.ndarray     # integers of record r: values[ptr[r]:ptr[r + 1]]
    values: np.ndarray

    def count(self) -> np.ndarray:
        return np.diff(self.ptr)

    def fail(self, record: int, problem: str):
        raise CircuitError(f"{self.path}, line {int(self.line[record])}: {problem}")


def _tokenize(path: str, data: bytes, header: bytes, letters: bytes) -> _Records:
    """Split ``data`` into records: lines whose first token is ``header`` or one of the
    one-letter ``letters`` (``c`` lines are comments), each followed by integers only.

    Whole-array: token boundaries, line numbers and integer values come from numpy
    over the bytes (a token is a run of bytes above the ASCII space); no Python object
    per line or token.
    """
    b = np.frombuffer(data, np.uint8)
    solid = np.concatenate([[False], (b > 32) & (b != 127), [False]]).view(np.int8)
    edges = np.flatnonzero(np.diff(solid))  # alternately a token's start and its end
    starts, ends = edges[0::2], edges[1::2]
    newlines = np.flatnonzero(b == 10)
    token_line = np.searchsorted(newlines, starts)  # 0-based line of each token
    first = np.ones(starts.size, bool)
    first[1:] = token_line[1:] != token_line[:-1]
    heads = np.flatnonzero(first)
    length, letter = ends[heads] - starts[heads], b[starts[heads]] if heads.size else np.zeros(0, np.uint8)
    is_header = length == len(header)
    for k, byte in enumerate(header):  # compare the header word byte by byte, whole-array
        is_header &= b[np.minimum(starts[heads] + k, max(b.size - 1, 0))] == byte
    comment = (length == 1) & (letter == ord("c"))
    known = is_header | comment | ((length == 1) & np.isin(letter, np.frombuffer(letters, np.uint8)))
    if not known.all():
        k = int(np.flatnonzero(~known)[0])
        word = data[starts[heads[k]]:ends[heads[k]]].decode("utf-8", "replace")[:40]
        expected = ", ".join([header.decode(), *letters.decode(), "c"])
        raise CircuitError(f"{path}, line {int(token_line[heads[k]]) + 1}: unknown record {word!r} "
                           f"(expected one of {expected})")
    record_of_token = np.cumsum(first) - 1
    numeric = ~first & ~comment[record_of_token]
    values = _integers(path, data, b, starts[numeric], ends[numeric], token_line[numeric])
    records = np.flatnonzero(~comment)
    renumber = np.full(heads.size, -1, np.int64)
    renumber[records] = np.arange(records.size)
    counts = np.bincount(renumber[record_of_token[numeric]], minlength=records.size)
    return _Records(path, is_header[records], letter[records], token_line[heads[records]] + 1,
                    np.concatenate([[0], np.cumsum(counts)]), values)


def _integers(path, data, b, starts, ends, lines) -> np.ndarray:
    """The integers of the tokens ``[starts, ends)``; a token that is not one is an error.

    Horner's rule over the tokens, one digit position at a time (at most 18 passes over
    the tokens, not one over every byte).
    """
    negative = b[starts] == ord("-") if starts.size else np.zeros(0, bool)
    first_digit = starts + negative
    length = ends - first_digit
    bad = (length == 0) | (length > _MAX_DIGITS)
    values = np.zeros(starts.size, np.int64)
    for k in range(int(length.max(initial=0)) if not bad.any() else 0):
        more = np.flatnonzero(length > k)
        digit = b[first_digit[more] + k].astype(np.int64) - 48
        bad[more[(digit < 0) | (digit > 9)]] = True
        values[more] = values[more] * 10 + digit
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        token = data[starts[k]:ends[k]].decode("utf-8", "replace")[:40]
        what = "beyond the int64 range" if length[k] > _MAX_DIGITS and token.lstrip("-").isdigit() else "not an integer"
        raise CircuitError(f"{path}, line {int(lines[k]) + 1}: {token!r} is {what}")
    return np.where(negative, -values, values)


def _read(path) -> tuple[str, bytes]:
    name = os.fspath(path)
    try:
        with open(name, "rb") as handle:
            return name, handle.read()
    except OSError as error:
        raise CircuitError(f"{name}: cannot read ({error.strerror or error})") from None


def _header(records: _Records, word: bytes) -> tuple[int, int]:
    """The declared node count and the index of the first node record; checks the header."""
    if not records.header[:1].any():
        line = f"line {int(records.line[0])}" if records.line.size else "the file"
        raise CircuitError(f"{records.path}, {line}: expected the header '{word.decode()} COUNT' "
                           f"before any node (is this a {word.decode()} file?)")
    if records.count()[0] != 1:
        records.fail(0, f"the header '{word.decode()} COUNT' needs one number (got {int(records.count()[0])})")
    declared = int(records.values[records.ptr[0]])
    if declared < 0:
        records.fail(0, f"the header declares {declared} nodes")
    later = np.flatnonzero(records.header[1:])
    if later.size:
        records.fail(int(later[0]) + 1, f"a second '{word.decode()}' header")
    return declared, 1


def _check_count(records: _Records, declared: int, found: int, what: str) -> None:
    if found < declared:
        last = f"the last is on line {int(records.line[-1])}" if found else "there are none"
        raise CircuitError(f"{records.path}: truncated file? the header on line {int(records.line[0])} declares "
                           f"{declared} {what} but the file has {found} ({last})")
    if found > declared:
        records.fail(1 + declared, f"more {what} than the {declared} the header on line "
                                   f"{int(records.line[0])} declares")


def _check_arity(records: _Records, node: np.ndarray, kinds: dict[int, int], what: dict[int, str]) -> None:
    """Records ``node`` of kind ``k`` must have ``kinds[k]`` integers."""
    counts = records.count()[node]
    expected = np.zeros(node.size, np.int64)
    for kind, n in kinds.items():
        expected[records.kind[node] == kind] = n
    bad = np.flatnonzero(counts != expected)
    if bad.size:
        k = int(bad[0])
        kind = int(records.kind[node[k]])
        records.fail(int(node[k]), f"a {what[kind]} needs {int(expected[k])} numbers, got {int(counts[k])}"
                     + (" (truncated file?)" if node[k] == records.kind.size - 1 else ""))


def _ids(records: _Records, node: np.ndarray, ids: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The sorted ids and their order; negative and repeated ids are errors."""
    negative = np.flatnonzero(ids < 0)
    if negative.size:
        records.fail(int(node[negative[0]]), f"{what} id {int(ids[negative[0]])} is negative")
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
    if repeated.size:
        k = int(repeated[0])
        records.fail(int(node[order[k + 1]]), f"{what} id {int(ordered[k])} is defined again "
                                              f"(first on line {int(records.line[node[order[k]]])})")
    return ordered, order


def _lookup(ordered, order, wanted):
    """Positions of ``wanted`` among the ids (``ordered = ids[order]``), -1 where absent."""
    if ordered.size == 0:
        return np.full(np.shape(wanted), -1, np.int64)
    at = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
    return np.where(ordered[at] == wanted, order[at], -1)


# -- vtrees ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Vtree:
    """A vtree file: its nodes (leaves with a variable, internal nodes with two children)."""

    path: str
    ids: np.ndarray        # vtree node ids, file order
    variable: np.ndarray   # per node: its variable (leaves), 0 for internal nodes
    left: np.ndarray       # per node: left child id (internal), -1 for leaves
    right: np.ndarray
    line: np.ndarray       # per node: its line in the file

    @property
    def variables(self) -> np.ndarray:
        """The variables of the leaves, ascending."""
        return np.sort(self.variable[self.variable > 0])

    @property
    def n_vars(self) -> int:
        """Variables are 1..n_vars in the SDD library; the largest one used."""
        return int(self.variable.max(initial=0))

    def leaf_of(self, variables: np.ndarray) -> np.ndarray:
        """The vtree node id of each variable's leaf, -1 where the vtree has no such variable."""
        table = np.full(self.n_vars + 1, -1, np.int64)
        leaves = self.variable > 0
        table[self.variable[leaves]] = self.ids[leaves]
        variables = np.asarray(variables, np.int64)
        inside = (variables >= 1) & (variables <= self.n_vars)
        return np.where(inside, table[np.where(inside, variables, 0)], -1)


def read_vtree(path) -> Vtree:
    """Read a vtree in the SDD library's text format (``vtree N``, ``L id var``, ``I id left right``)."""
    name, data = _read(path)
    records = _tokenize(name, data, b"vtree", b"LI")
    declared, begin = _header(records, b"vtree")
    node = np.arange(begin, records.kind.size)
    _check_count(records, declared, node.size, "vtree nodes")
    _check_arity(records, node, {ord("L"): 2, ord("I"): 3}, {ord("L"): "leaf 'L id var'",
                                                            ord("I"): "internal node 'I id left right'"})
    leaf = records.kind[node] == ord("L")
    first = records.ptr[node]
    ids = records.values[first]
    variable = np.where(leaf, records.values[first + 1], 0)
    left = np.where(leaf, -1, records.values[np.where(leaf, first, first + 1)])
    right = np.where(leaf, -1, records.values[np.where(leaf, first, first + 2)])
    ordered, order = _ids(records, node, ids, "vtree node")
    bad = np.flatnonzero(leaf & (variable < 1))
    if bad.size:
        records.fail(int(node[bad[0]]), f"variable {int(variable[bad[0]])} (variables are numbered from 1)")
    leaves = np.flatnonzero(leaf)
    var_order = np.argsort(variable[leaves], kind="stable")
    again = np.flatnonzero(np.diff(variable[leaves][var_order]) == 0)
    if again.size:
        k = leaves[var_order[again[0] + 1]]
        records.fail(int(node[k]), f"variable {int(variable[k])} has a second leaf "
                                   f"(first on line {int(records.line[node[leaves[var_order[again[0]]]]])})")
    for side, child in (("left", left), ("right", right)):
        inner = np.flatnonzero(~leaf)
        at = _lookup(ordered, order, child[inner])
        bad = np.flatnonzero((at < 0) | (at >= inner))
        if bad.size:
            k = int(inner[bad[0]])
            problem = "which is not defined" if at[bad[0]] < 0 else \
                f"which is defined later, on line {int(records.line[node[at[bad[0]]]])} (children come first)"
            records.fail(int(node[k]), f"internal vtree node {int(ids[k])}: {side} child {int(child[k])} {problem}")
    lines = records.line[node]
    return Vtree(name, *(_frozen(a) for a in (ids, variable, left, right, lines)))


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


# -- SDDs -----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Circuit:
    """An AND/OR circuit read from an SDD, constants folded away.

    Circuit nodes ``0 .. n_nodes - 1``: first the literals (``kind == LITERAL``,
    ``literal`` the signed variable), then at most one true constant (``TRUE``), then
    products (``AND``, two children) and sums (``OR``, two or more) in the order the
    folding made them (children before parents). Node ``i`` reads
    ``children[ptr[i]:ptr[i + 1]]``; ``level`` is the longest path from a literal.
    ``root`` is the node the WMC is read from, or ``-1`` / ``-2`` for a circuit that
    is the constant false / true.
    """

    path: str
    n_vars: int
    kind: np.ndarray
    literal: np.ndarray   # per literal node (the first ``n_literals`` nodes): its signed variable
    level: np.ndarray
    ptr: np.ndarray
    children: np.ndarray
    root: int
    sdd_nodes: int        # node records in the file
    sdd_elements: int     # (prime, sub) elements in the file

    @property
    def n_nodes(self) -> int:
        return int(self.kind.size)

    @property
    def n_edges(self) -> int:
        return int(self.children.size)

    @property
    def n_literals(self) -> int:
        return int(self.literal.size)

    @property
    def depth(self) -> int:
        return int(self.level.max(initial=0))

    def __repr__(self) -> str:
        counts = np.bincount(self.kind, minlength=4)
        return (f"Circuit({self.path!r}: {self.n_vars} variables, {counts[LITERAL]} literals, {counts[AND]} "
                f"products, {counts[OR]} sums, {self.n_edges} edges, depth {self.depth}; from "
                f"{self.sdd_nodes} SDD nodes)")


_SDD_ARITY_NAMES = {ord("L"): "literal 'L id vtree literal'", ord("T"): "true node 'T id'",
                    ord("F"): "false node 'F id'", ord("D"): "decision node 'D id vtree n {prime sub}*n'"}


def read_sdd(path, vtree="auto") -> Circuit:
    """Read an SDD file (the SDD library's text format) into a :class:`Circuit`.

    ``vtree``: the vtree file (a path or a :class:`Vtree`) the SDD is normalized for;
    ``"auto"`` reads ``NAME.vtree`` beside ``NAME.sdd`` if it exists; ``None`` reads no
    vtree. With a vtree, every literal must be a variable of the vtree on that
    variable's leaf, every decision node on an internal vtree node, and the circuit
    has the vtree's variables (``n_vars``); without one, ``n_vars`` is the largest
    variable used. The root is the last node of the file, as the SDD library has it.
    """
    name, data = _read(path)
    if isinstance(vtree, str) and vtree == "auto":
        beside = Path(name).with_suffix(".vtree")
        vtree = read_vtree(beside) if beside.is_file() else None
    elif vtree is not None and not isinstance(vtree, Vtree):
        vtree = read_vtree(vtree)
    records = _tokenize(name, data, b"sdd", b"LTFD")
    declared, begin = _header(records, b"sdd")
    node = np.arange(begin, records.kind.size)
    kind = records.kind[node]
    first = records.ptr[node]
    count = records.count()[node]
    is_d = kind == ord("D")
    # A decision node needs 3 + 2n numbers: check that n is there before reading it.
    short = np.flatnonzero(is_d & (count < 3))
    if short.size:
        records.fail(int(node[short[0]]), f"a decision node 'D id vtree n {{prime sub}}*n' needs at least 3 "
                                          f"numbers, got {int(count[short[0]])}"
                     + (" (truncated file?)" if node[short[0]] == records.kind.size - 1 else ""))
    n_elements = np.zeros(node.size, np.int64)
    n_elements[is_d] = records.values[first[is_d] + 2]
    few = np.flatnonzero(is_d & (n_elements < 1))
    if few.size:
        records.fail(int(node[few[0]]), f"decision node declares {int(n_elements[few[0]])} elements "
                                        "(a decision node has at least one)")
    arity = {ord("L"): 3, ord("T"): 1, ord("F"): 1, ord("D"): 0}
    expected = np.where(is_d, 3 + 2 * n_elements, 0)
    for letter, n in arity.items():
        if letter != ord("D"):
            expected[kind == letter] = n
    bad = np.flatnonzero(count != expected)
    if bad.size:
        k = int(bad[0])
        what = (f"decision node with {int(n_elements[k])} elements needs {int(expected[k])} numbers"
                if is_d[k] else f"{_SDD_ARITY_NAMES[int(kind[k])]} needs {int(expected[k])} numbers")
        records.fail(int(node[k]), f"a {what}, got {int(count[k])}"
                     + (" (truncated file?)" if node[k] == records.kind.size - 1 else ""))
    _check_count(records, declared, node.size, "SDD nodes")
    if node.size == 0:
        raise CircuitError(f"{name}: the file has no SDD nodes")
    ids = records.values[first]
    ordered, order = _ids(records, node, ids, "SDD node")

    # Elements: for decision node d (in file order), values first[d] + 3 + 2 k (prime), + 1 (sub).
    owner = np.repeat(np.flatnonzero(is_d), n_elements[is_d])
    element_ptr = np.concatenate([[0], np.cumsum(n_elements[is_d])])
    within = np.arange(owner.size) - np.repeat(element_ptr[:-1], n_elements[is_d])
    at = first[owner] + 3 + 2 * within
    element_ids = np.stack([records.values[at], records.values[at + 1]])  # (2, elements): prime, sub
    element_pos = _lookup(ordered, order, element_ids)
    undefined = np.flatnonzero((element_pos < 0).any(axis=0))
    later = np.flatnonzero((element_pos >= owner).any(axis=0))
    if undefined.size or later.size:
        e = int(min(undefined[:1].tolist() + later[:1].tolist()))
        side = 0 if element_pos[0, e] < 0 or element_pos[0, e] >= owner[e] else 1
        problem = (f"which is not defined in the file" if element_pos[side, e] < 0 else
                   f"which is defined later, on line {int(records.line[node[element_pos[side, e]]])} "
                   "(children come before their parents)")
        records.fail(int(node[owner[e]]), f"decision node {int(ids[owner[e]])} references node "
                                          f"{int(element_ids[side, e])} as {('a prime', 'a sub')[side]}, {problem}")

    literal_nodes = np.flatnonzero(kind == ord("L"))
    literals = records.values[first[literal_nodes] + 2]
    zero = np.flatnonzero(literals == 0)
    if zero.size:
        records.fail(int(node[literal_nodes[zero[0]]]), "literal 0 (variables are numbered from 1)")
    if vtree is not None:
        _check_vtree(records, node, kind, first, literal_nodes, literals, vtree)
        n_vars = vtree.n_vars
    else:
        n_vars = int(np.abs(literals).max(initial=0))
    circuit = _fold(name, kind, literal_nodes, literals, owner, element_ptr, element_pos)
    return Circuit(name, n_vars, *circuit, sdd_nodes=int(node.size), sdd_elements=int(owner.size))


def _check_vtree(records, node, kind, first, literal_nodes, literals, vtree: Vtree) -> None:
    v_ordered, v_order = np.sort(vtree.ids), np.argsort(vtree.ids, kind="stable")
    placed = np.flatnonzero(np.isin(kind, np.frombuffer(b"LD", np.uint8)))
    vtree_id = np.full(kind.size, -1, np.int64)
    vtree_id[placed] = records.values[first[placed] + 1]
    at = _lookup(v_ordered, v_order, vtree_id[placed])
    bad = np.flatnonzero(at < 0)
    if bad.size:
        k = int(placed[bad[0]])
        records.fail(int(node[k]), f"node {int(records.values[first[k]])} is on vtree node {int(vtree_id[k])}, "
                                   f"which {vtree.path} does not have")
    decision = placed[kind[placed] == ord("D")]
    leaf = np.flatnonzero(vtree.variable[_lookup(v_ordered, v_order, vtree_id[decision])] > 0)
    if leaf.size:
        k = int(decision[leaf[0]])
        records.fail(int(node[k]), f"decision node {int(records.values[first[k]])} is on vtree node "
                                   f"{int(vtree_id[k])}, a leaf of {vtree.path} (decisions sit on internal nodes)")
    variables = np.abs(literals)
    leaf_of = vtree.leaf_of(variables)
    outside = np.flatnonzero(leaf_of < 0)
    if outside.size:
        k = int(outside[0])
        known = vtree.variables
        span = f"{int(known[0])}..{int(known[-1])}" if known.size else "none"
        records.fail(int(node[literal_nodes[k]]), f"literal {int(literals[k])}: variable {int(variables[k])} is "
                                                  f"not in the vtree {vtree.path} (its variables: {span})")
    moved = np.flatnonzero(leaf_of != vtree_id[literal_nodes])
    if moved.size:
        k = int(moved[0])
        records.fail(int(node[literal_nodes[k]]), f"literal {int(literals[k])} is on vtree node "
                                                  f"{int(vtree_id[literal_nodes[k]])}, but variable "
                                                  f"{int(variables[k])}'s leaf in {vtree.path} is vtree node "
                                                  f"{int(leaf_of[k])}")


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, whole-array."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    offsets = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + offsets


def _fold(path, kind, literal_nodes, literals, owner, element_ptr, element_pos):
    """Fold constants and level the SDD, one DAG level of decision nodes at a time.

    Kahn's algorithm on whole arrays: a round takes every decision node whose children
    are all resolved, resolves its elements (a circuit product, a constant, or one side
    when the other is true) and then the node (a circuit sum, a constant, or its one
    remaining element). Returns the circuit's arrays (see :class:`Circuit`) and its root.
    """
    n = kind.size
    is_d = kind == ord("D")
    distinct, literal_id = np.unique(literals, return_inverse=True)
    n_lits = distinct.size
    true_id = n_lits  # the one true constant; removed again below if nothing reads it
    capacity = n_lits + 1 + owner.size + int(is_d.sum())
    node_kind = np.empty(capacity, np.int8)
    node_kind[:n_lits], node_kind[true_id] = LITERAL, TRUE
    node_level = np.zeros(capacity, np.int64)
    node_count = np.zeros(capacity, np.int64)
    child_chunks: list[np.ndarray] = []
    size = n_lits + 1

    def add(node_type: int, counts: np.ndarray, kids: np.ndarray, levels: np.ndarray) -> np.ndarray:
        nonlocal size
        ids = np.arange(size, size + counts.size)
        node_kind[ids], node_count[ids], node_level[ids] = node_type, counts, levels
        child_chunks.append(kids)
        size += counts.size
        return ids

    resolved = np.full(n, _FALSE, np.int64)
    resolved[literal_nodes] = literal_id
    resolved[kind == ord("T")] = _TRUE
    # The parents of each node through the elements (a prime and a sub: one edge each).
    n_elements = np.diff(element_ptr)
    edge_child = element_pos.reshape(-1)
    edge_parent = np.concatenate([owner, owner])
    remaining = np.bincount(edge_parent, minlength=n)
    parents_sorted = edge_parent[np.argsort(edge_child, kind="stable")]
    child_ptr = np.concatenate([[0], np.cumsum(np.bincount(edge_child, minlength=n))])
    decision_rank = np.full(n, -1, np.int64)
    decision_rank[is_d] = np.arange(int(is_d.sum()))

    frontier = np.flatnonzero(~is_d)
    while frontier.size:
        parents = parents_sorted[_ranges(child_ptr[frontier], child_ptr[frontier + 1] - child_ptr[frontier])]
        candidates, hits = np.unique(parents, return_counts=True)
        remaining[candidates] -= hits
        frontier = candidates[remaining[candidates] == 0]
        if frontier.size == 0:
            break
        rank = decision_rank[frontier]
        elements = _ranges(element_ptr[rank], n_elements[rank])
        batch_owner = np.repeat(np.arange(frontier.size), n_elements[rank])
        prime = resolved[element_pos[0, elements]]
        sub = resolved[element_pos[1, elements]]
        value = np.where(prime == _TRUE, sub, prime)  # T x s = s, p x T = p, T x T = T
        value[(prime == _FALSE) | (sub == _FALSE)] = _FALSE
        product = np.flatnonzero((prime >= 0) & (sub >= 0))
        if product.size:
            p, s = prime[product], sub[product]
            value[product] = add(AND, np.full(product.size, 2), np.stack([p, s], 1).reshape(-1),
                                 1 + np.maximum(node_level[p], node_level[s]))
        kept = value != _FALSE
        kept_owner, kept_value = batch_owner[kept], value[kept]
        n_kept = np.bincount(kept_owner, minlength=frontier.size)
        outcome = np.full(frontier.size, _FALSE, np.int64)  # no element left: false
        first_kept = np.concatenate([[0], np.cumsum(n_kept)[:-1]])
        single = n_kept == 1
        outcome[single] = kept_value[first_kept[single]]
        sums = n_kept >= 2
        if sums.any():
            kids = kept_value[sums[kept_owner]]
            kids = np.where(kids == _TRUE, true_id, kids)
            counts = n_kept[sums]
            levels = 1 + np.maximum.reduceat(node_level[kids], np.concatenate([[0], np.cumsum(counts)[:-1]]))
            outcome[sums] = add(OR, counts, kids, levels)
        resolved[frontier] = outcome
    if np.any(remaining[is_d] > 0):  # unreachable: read_sdd checks that children come first
        raise CircuitError(f"{path}: the SDD has a cycle")

    children = np.concatenate(child_chunks) if child_chunks else np.zeros(0, np.int64)
    node_kind, node_level, node_count = node_kind[:size], node_level[:size], node_count[:size]
    root = int(resolved[n - 1])
    if not np.any(children == true_id):  # drop the unused true constant, renumber what follows
        keep = np.arange(size) != true_id
        node_kind, node_level, node_count = node_kind[keep], node_level[keep], node_count[keep]
        children = children - (children > true_id)
        root = root - (root > true_id)
    ptr = np.concatenate([[0], np.cumsum(node_count)])
    return (_frozen(node_kind), _frozen(distinct.astype(np.int64)), _frozen(node_level), _frozen(ptr),
            _frozen(children), root)


# -- graphs -------------------------------------------------------------------------------------


def to_graph(circuit: Circuit, batch: int = 1, semiring: str = "real", literal_weights=None) -> Graph:
    """The circuit as a :class:`neurovec.Graph` whose one output is the WMC of each batch row.

    ``batch``: how many weightings one call evaluates; the literal weights are the fact
    layer :data:`LITERALS` with values of shape ``(n_vars, batch)`` (row ``v - 1`` holds
    variable ``v``'s weight in every batch row), to be replaced per call
    (``module(facts={"literals": weights.T})`` for ``weights`` of shape ``(batch, n_vars)``).
    ``semiring``: ``"real"`` (weights are probabilities ``p``; ``-x`` weighs ``1 - p``;
    the output is the WMC) or ``"log"`` (weights are log-probabilities ``l``; ``-x``
    weighs ``log(1 - exp(l))``; the output is the log of the WMC).
    ``literal_weights``: the stored values of :data:`LITERALS` (default: every
    probability 0.5).
    """
    if semiring not in SEMIRINGS:
        raise ValueError(f"unknown semiring {semiring!r} (expected one of {SEMIRINGS})")
    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive integer (got {batch!r})")
    log = semiring == "log"
    n_vars = max(circuit.n_vars, 1)
    if literal_weights is None:
        literal_weights = np.full((n_vars, batch), np.log(0.5) if log else 0.5)
    literal_weights = np.asarray(literal_weights, np.float64)
    if literal_weights.shape != (n_vars, batch):
        raise ValueError(f"literal_weights must have shape (n_vars, batch) = {(n_vars, batch)} "
                         f"(got {literal_weights.shape})")
    weights = [Weight("minus_one", np.array(-1.0), learnable=False), Weight("one", np.array(1.0), learnable=False)]
    MINUS_ONE, ONE = 0, 1
    layers: list = [FactLayer(LITERALS, literal_weights)]
    LIT = 0
    kind, ptr, children = circuit.kind, circuit.ptr, circuit.children
    n = circuit.n_nodes
    # Where each circuit node lives: (layer index, ordinal).
    layer_of = np.full(n, -1, np.int64)
    ordinal_of = np.full(n, -1, np.int64)
    lits = circuit.literal
    positive = lits > 0
    layer_of[:lits.size][positive] = LIT
    ordinal_of[:lits.size][positive] = lits[positive] - 1
    # The true constant: where a sum reads it (the circuit's node after the literals), or
    # as the root (with false, which is computed from it: facts are finite, log 0 is not).
    true_node = lits.size
    has_true = true_node < n and kind[true_node] == TRUE
    if has_true or circuit.root < 0:
        layers.append(FactLayer("constants", np.full((1, batch), 0.0 if log else 1.0)))
        constants = len(layers) - 1
        if has_true:
            layer_of[true_node], ordinal_of[true_node] = constants, 0
    if log:  # the floor of every logsumexp's max (see LOG_FLOOR)
        layers.append(FactLayer("log_floor", np.full((1, batch), LOG_FLOOR)))
        floor = len(layers) - 1
    negative = np.flatnonzero(~positive)
    if negative.size:
        variables = -lits[negative] - 1
        ones = np.ones(negative.size, np.int64)
        if log:  # log(1 - exp(l)): exp, then 1 - p, then log
            layers.append(NeuronLayer("negations.exp", ones, np.full(negative.size, LIT), variables,
                                      transformation="exp"))
            source, source_ordinal = len(layers) - 1, np.arange(negative.size)
        else:
            source, source_ordinal = LIT, variables
        layers.append(NeuronLayer("negations", ones, np.full(negative.size, source), source_ordinal,
                                  np.full(negative.size, MINUS_ONE), np.full(negative.size, ONE),
                                  transformation="log" if log else "identity"))
        layer_of[negative], ordinal_of[negative] = len(layers) - 1, np.arange(negative.size)

    slot = schedule(circuit)
    # A node read at slot s is needed at s - 1: from its own slot up to there it is copied
    # once per slot (a one-input product or sum: the identity), so that every layer reads
    # the layer below it only.
    reader = np.repeat(np.arange(n), np.diff(ptr))
    needed = slot.copy()
    np.maximum.at(needed, children, slot[reader] - 1)
    n_copies = needed - slot
    copy_ptr = np.concatenate([[0], np.cumsum(n_copies)])
    copy_node = np.repeat(np.arange(n), n_copies)
    copy_slot = slot[copy_node] + 1 + np.arange(copy_node.size) - copy_ptr[copy_node]
    copy_layer = np.full(copy_node.size + 1, -1, np.int64)  # (one more: a dummy for rows()'s np.where)
    copy_ordinal = np.full(copy_node.size + 1, -1, np.int64)

    def rows(nodes: np.ndarray, at: int) -> tuple[np.ndarray, np.ndarray]:
        """(layer, ordinal) of ``nodes`` (each computed at ``at`` or below) at slot ``at``."""
        own = slot[nodes] == at
        copy = np.where(own, 0, copy_ptr[nodes] + at - slot[nodes] - 1)
        return (np.where(own, layer_of[nodes], copy_layer[copy]),
                np.where(own, ordinal_of[nodes], copy_ordinal[copy]))

    inner = kind >= AND
    for t in range(1, int(slot.max(initial=0)) + 1):
        is_or = t % 2 == 0
        real = np.flatnonzero((slot == t) & inner)
        copies = np.flatnonzero(copy_slot == t)
        counts = ptr[real + 1] - ptr[real]
        edges = _ranges(ptr[real], counts)
        src_layer, src_ordinal = rows(children[edges], t - 1)
        real, counts, src_layer, src_ordinal = _sorted_inputs(real, counts, src_layer, src_ordinal)
        copy_src_layer, copy_src_ordinal = rows(copy_node[copies], t - 1)
        order = np.lexsort((copy_src_ordinal, copy_src_layer))
        copies, copy_src_layer, copy_src_ordinal = copies[order], copy_src_layer[order], copy_src_ordinal[order]
        name = f"{'or' if is_or else 'and'}{t}"
        if not (is_or and log and real.size):  # one layer: products (log: sums) or sums, and the copies
            aggregation = "sum" if is_or or log else "prod"  # (a log sum slot here has copies only)
            layers.append(NeuronLayer(name, np.concatenate([counts, np.ones(copies.size, np.int64)]),
                                      np.concatenate([src_layer, copy_src_layer]),
                                      np.concatenate([src_ordinal, copy_src_ordinal]),
                                      aggregation=aggregation, copy=False))
        elif "logsumexp" in AGGREGATIONS:  # an IR aggregation, once there is one: one layer, exact at -inf
            layers.append(NeuronLayer(name, np.concatenate([counts, np.ones(copies.size, np.int64)]),
                                      np.concatenate([src_layer, copy_src_layer]),
                                      np.concatenate([src_ordinal, copy_src_ordinal]),
                                      aggregation="logsumexp", copy=False))
        else:
            layers.extend(_logsumexp_layers(name, len(layers), counts, src_layer, src_ordinal, MINUS_ONE,
                                            copy_src_layer, copy_src_ordinal, floor))
        layer_of[real], ordinal_of[real] = len(layers) - 1, np.arange(real.size)
        copy_layer[copies], copy_ordinal[copies] = len(layers) - 1, real.size + np.arange(copies.size)
    root = circuit.root
    if root == _FALSE:  # 0 = 1 - 1, or log 0 = -inf
        if log:
            layers.append(NeuronLayer("false", [1], [constants], [0], transformation="log"))
        else:
            layers.append(NeuronLayer("false", [1], [constants], [0], [MINUS_ONE], [ONE]))
        out_layer, out_ordinal = len(layers) - 1, 0
    elif root == _TRUE:
        out_layer, out_ordinal = constants, 0
    else:
        out_layer, out_ordinal = int(layer_of[root]), int(ordinal_of[root])
    return Graph(layers, weights, output_layer=[out_layer], output_ordinal=[out_ordinal])


def schedule(circuit: Circuit) -> np.ndarray:
    """The slot of each node's layer: literals (and the true constant) at 0, products at
    odd slots, sums at even ones, each node at the first slot of its kind above all its
    children (KLay's alternating layers).

    :func:`to_graph` makes one layer per slot that reads the slot below only: a node
    read from higher up is copied into every slot in between, so each layer is one
    gather and one reduction of the tensor below, never a concatenation of every
    earlier layer. One round of array operations per longest-path level.
    """
    kind, ptr, children, level = circuit.kind, circuit.ptr, circuit.children, circuit.level
    slot = np.zeros(circuit.n_nodes, np.int64)
    inner = np.flatnonzero(kind >= AND)
    for depth in np.unique(level[inner]).tolist():
        nodes = inner[level[inner] == depth]
        counts = ptr[nodes + 1] - ptr[nodes]
        above = 1 + np.maximum.reduceat(slot[children[_ranges(ptr[nodes], counts)]],
                                        np.concatenate([[0], np.cumsum(counts)[:-1]]))
        slot[nodes] = above + ((above % 2 == 1) != (kind[nodes] == AND))  # products odd, sums even
    return slot


def _sorted_inputs(group, counts, src_layer, src_ordinal):
    """A layer's neurons and inputs, ordered so that the gather reads the layer below in order.

    A neuron's inputs go by (layer, row) (products and sums commute: this changes only
    the rounding order of a sum), neurons by their first and last inputs.
    Returns ``(group, counts, input layers, input ordinals)`` in that order.
    """
    owner = np.repeat(np.arange(group.size), counts)
    within = np.lexsort((src_ordinal, src_layer, owner))
    src_layer, src_ordinal = src_layer[within], src_ordinal[within]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    last = first + counts - 1
    neurons = np.lexsort((src_ordinal[last], src_ordinal[first], src_layer[last], src_layer[first])) \
        if group.size else np.zeros(0, np.int64)
    edges = _ranges(first[neurons], counts[neurons])
    return group[neurons], counts[neurons], src_layer[edges], src_ordinal[edges]


def _logsumexp_layers(name, first, counts, src_layer, src_ordinal, minus_one, copy_layer, copy_ordinal, floor):
    """``m + log(sum_i exp(x_i - m))`` with ``m = max_i x_i``: four layers of existing aggregations.

    The last layer (``name``) holds the sums, then the copies (``copy_layer``,
    ``copy_ordinal``: one input each, the identity).
    """
    n = counts.size
    edges = src_layer.size
    owner = np.repeat(np.arange(n), counts)
    # The max also reads the floor (LOG_FLOOR, a finite constant), so that a sum whose children are
    # all log 0 = -inf gets m = the floor, exp(-inf - m) = 0 and the result log 0 + m = -inf, where
    # m = -inf would make it NaN (-inf - -inf). Any child above the floor is the max as before.
    owner_edges = np.concatenate([[0], np.cumsum(counts)])
    at = np.insert(np.arange(edges), owner_edges[1:], -1)  # each neuron's inputs, then the floor
    max_layer = np.where(at >= 0, src_layer[np.maximum(at, 0)], floor)
    max_ordinal = np.where(at >= 0, src_ordinal[np.maximum(at, 0)], 0)
    maximum = NeuronLayer(f"{name}.max", counts + 1, max_layer, max_ordinal, aggregation="max", copy=False)
    # One neuron per input: x_i - m, then exp.
    shift_layer = np.stack([src_layer, np.full(edges, first)], 1).reshape(-1)
    shift_ordinal = np.stack([src_ordinal, owner], 1).reshape(-1)
    shift_weight = np.tile(np.array([NO_WEIGHT, minus_one]), edges)
    shift = NeuronLayer(f"{name}.shift", np.full(edges, 2), shift_layer, shift_ordinal, shift_weight,
                        transformation="exp", copy=False)
    total = NeuronLayer(f"{name}.sum", counts, np.full(edges, first + 1), np.arange(edges), transformation="log")
    result = NeuronLayer(name, np.concatenate([np.full(n, 2), np.ones(copy_layer.size, np.int64)]),
                         np.concatenate([np.tile([first + 2, first], n), copy_layer]),
                         np.concatenate([np.repeat(np.arange(n), 2), copy_ordinal]), copy=False)
    return [maximum, shift, total, result]




def settings(preset: str = "default", **overrides):
    """The :class:`neurovec.Settings` of ``preset`` with :data:`LITERALS` declared dynamic."""
    from ..compiler.settings import Settings
    return Settings.preset(preset, **{"dynamic_facts": (LITERALS,), **overrides})


def compile(circuit: Circuit, batch: int = 1, semiring: str = "real", preset="default", dtype=None) -> "WMCModule":
    """Compile ``circuit`` for ``batch`` weightings per call: a :class:`WMCModule`.

    ``preset``: a preset name, or a :class:`neurovec.Settings` (:data:`LITERALS` is
    added to its ``dynamic_facts``).
    """
    from ..compiling import compile as compile_graph
    from ..compiler.settings import Settings
    if isinstance(preset, Settings):
        chosen = preset.model_copy(update={"dynamic_facts": tuple(dict.fromkeys((*preset.dynamic_facts, LITERALS)))})
    else:
        chosen = settings(preset)
    graph = to_graph(circuit, batch, semiring)
    return WMCModule(compile_graph(graph, chosen, dtype), circuit.n_vars, batch, semiring)


def _module_base():
    import torch
    return torch.nn.Module


class WMCModule(_module_base()):
    """A compiled circuit: ``module(weights)`` maps literal weights ``(batch, n_vars)`` to the WMC ``(batch,)``.

    ``module.compiled`` is the neurovec module (``module.compiled.code`` its program).
    """

    def __init__(self, compiled, n_vars: int, batch: int, semiring: str):
        super().__init__()
        self.compiled, self.n_vars, self.batch, self.semiring = compiled, n_vars, batch, semiring

    def forward(self, weights):
        if weights.dim() != 2 or tuple(weights.shape) != (self.batch, max(self.n_vars, 1)):
            raise GraphError(f"literal weights: expected shape (batch, n_vars) = {(self.batch, self.n_vars)} "
                             f"(got {tuple(weights.shape)}); compile the circuit again for another batch size")
        return self.compiled(facts={LITERALS: weights.T})[0]

    @property
    def code(self) -> str:
        return self.compiled.code
