"""Import NeuraLogic (PyNeuraLogic 0.9.2) built samples as a pre-grouped neurovec graph.

    model.build(Settings(chain_pruning=False))          # see "Settings" below
    built = model.build_dataset(dataset)
    graph = from_neuralogic(model, built)                # a neurovec.Graph
    module = neurovec.compile(graph, dtype=torch.float64)
    module()                                             # == model.test(built), sample by sample
    ... train module ...
    weights_to_neuralogic(module, model)                 # NeuraLogic now computes the same

How NeuraLogic computes a neuron (pinned down by experiment on 0.9.2, see
``docs/neuralogic.md``)::

    value = T( C( offset, W_1 . x_1, ..., W_n . x_n ) )

The offset is the *first input* of the combination ``C`` (so it counts in an
average, a max or a product), ``W . x`` is NeuraLogic's ``Value.times``: a scalar
broadcasts, a matrix multiplies a column vector or a matrix. neurovec computes
``T(A_i(W_i . x_i) + b)``, so a sum's offset becomes the bias ``b`` and any other
combination's offset becomes an extra first input from a unit fact carrying the
offset weight. NeuraLogic functions neurovec has no name for are composed:
``reverse`` (``1 - x``) is neurovec's ``-x`` after a bias of -1, ``signum`` (``x >
0``) is ``relu(sign(x))``, the Lukasiewicz "sigmoid" is ``sigmoid(6 x + 0.5)``;
the second step of those is an extra single-input layer.

Grouping (thesis 5.1.8, plus the merge it left out): a neuron's layer is set by
its depth (longest path from the facts) and its signature: aggregation,
transformation and value shape. Neurons of one depth never feed each other, so
all groups of one depth with equal signatures (whatever their head predicate
or neuron kind) are merged into one layer; layer names list the predicates in
them.
"""
from __future__ import annotations

import os
import re
import shutil
import warnings
from dataclasses import dataclass

import numpy as np

from .graph import NO_WEIGHT, FactLayer, Graph, NeuronLayer, Weight, prepend_inputs, product_shape

__all__ = ["from_neuralogic", "weights_to_neuralogic", "neuralogic_outputs", "NeuraLogicImportError",
           "weight_names"]


class NeuraLogicImportError(ValueError):
    """A NeuraLogic construct neurovec cannot import; the message names the neuron, its index and class."""


# Java class (simple name) -> neurovec aggregation. "" (no combination) is a single input passed through.
# "concat" and "softmax" are not neurovec aggregations: the importer builds them from fixed placement weights
# (see _concat_layer); "one" is NeuraLogic's ConstantOne (see from_neuralogic).
_AGGREGATION = {"": "sum", "Sum": "sum", "Average": "mean", "Maximum": "max", "Minimum": "min",
                "Product": "prod", "ElementProduct": "prod", "Count": "count", "Concatenation": "concat",
                "Softmax": "softmax"}
_CONCATENATIONS = ("concat", "softmax")
_NEEDS_EXTENSION = {  # what neurovec's graph would need for the rest
    "Sparsemax": "a 'sparsemax' transformation (a sparsemax over the inputs would then be imported like the "
                 "softmax combination: the concatenation of the inputs, then sparsemax)",
    "CrossSum": "a cross-sum combination", "CosineSim": "a cosine-similarity combination",
    "FunctionGraph": "nested function graphs inside a rule",
    "Normalization": "a 'norm' transformation ((x - mean) / sqrt(variance + 1e-10) over a value's elements, "
                     "NeuraLogic's NORM, as neuralogic.nn's TransformerEncoder uses)",
    "Slice": "a 'slice' transformation (a block of a vector's or matrix's rows, as neuralogic.nn's "
             "MultiheadAttention with several heads uses)",
    "AtIndex": "an aggregation that hands each grounding its own softmax weight (a softmax over each neuron's "
               "groundings whose elements feed other neurons, then a gather by grounding)",
}
# What a Java function is when its name alone would point the wrong way.
_EXPLAIN = {
    "AtIndex": "NeuraLogic's pick of one grounding's element out of a softmax aggregation, from "
               "aggregation=softmax(agg_terms=[...]) as in neuralogic.nn's GATv2Conv and attention modules",
}


@dataclass(frozen=True)
class _Step:
    """One neurovec layer step of a NeuraLogic transformation: ``T(W . x + b)`` with fixed W, b."""

    transformation: str
    weight: float | None = None
    bias: float | None = None
    # Set: not T(W . x + b) but NeuraLogic's LeakyReLu with this slope (see _leaky_relu_layers).
    leaky_slope: float | None = None


# Java transformation -> (transformation of the neuron's own layer, its fixed bias, follow-up steps).
_TRANSFORMATION = {
    "": ("identity", None, ()), "Identity": ("identity", None, ()), "Sigmoid": ("sigmoid", None, ()),
    "Tanh": ("tanh", None, ()), "ReLu": ("relu", None, ()), "LeakyReLu": ("leaky_relu", None, ()),
    "Exponentiation": ("exp", None, ()), "Logarithm": ("log", None, ()), "SquareRoot": ("sqrt", None, ()),
    "Inverse": ("inverse", None, ()), "Softmax": ("softmax", None, ()),
    # LeakyReLu with another slope (Transformation.LEAKY_RELU(0.2)) is added per slope by _leaky_relu_plans.
    # NeuraLogic's reverse is 1 - x: neurovec's reverse (-x) of x - 1.
    "Reverse": ("reverse", -1.0, ()),
    # NeuraLogic's signum is 1 for x > 0, else 0 (a step, not torch.sign).
    "Signum": ("sign", None, (_Step("relu"),)),
    # LukasiewiczSigmoid computes 1 / (1 + exp(-6 x - 0.5)).
    "LukasiewiczSigmoid": ("identity", None, (_Step("sigmoid", 6.0, 0.5),)),
}

_LEAKY_RELU_SLOPE = 0.01  # neurovec's leaky_relu (torch's default) and NeuraLogic's default LeakyReLu
_FACT = "FactNeuron"
_KINDS = {"FactNeuron", "WeightedAtomNeuron", "WeightedRuleNeuron", "AtomNeuron", "RuleNeuron",
          "AggregationNeuron", "SplittableAggregationNeuron", "NegationNeuron"}
_ZERO_WEIGHT, _UNIT_WEIGHT = -2, -1  # NeuraLogic's constant weights


def _require_neuralogic():
    try:
        import neuralogic  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("from_neuralogic needs PyNeuraLogic 0.9.2: pip install -e \".[neuralogic]\" in the neurovec "
                          "checkout") from e
    import jpype
    # The model was built, so NeuraLogic's JVM is running already: Java was found (on the PATH or through JAVA_HOME).
    if not jpype.isJVMStarted() and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("PyNeuraLogic needs a Java runtime (java >= 11): none is on the PATH and JAVA_HOME is "
                           "not set")  # pragma: no cover


_READER = None


def _reader():
    global _READER
    if _READER is None:
        from .neuralogic_java import JavaReader
        _READER = JavaReader()
    return _READER


def _samples(built) -> list:
    """NeuralSample objects of a BuiltDataset, a list of them, or one."""
    if hasattr(built, "_java_sample"):
        return [built]
    samples = list(built)
    if not samples or not all(hasattr(s, "_java_sample") for s in samples):
        raise TypeError("Expected the samples built by model.build_dataset(...) (got "
                        f"{type(built).__name__} with {len(samples)} items)")
    return samples


# -- weights --------------------------------------------------------------------------------------------------
def _value_shape(java_class: str, size: list, where: str, weight: bool = False) -> tuple:
    if java_class in ("ScalarValue", "Zero", "One"):
        return ()
    if java_class == "VectorValue":
        rows, cols = size
        if rows == 1 and cols != 1 and weight:
            # A row-vector weight (e.g. {1, 8}) takes a dot product with a column vector. neurovec has no row
            # vectors: a (1, n) matrix computes the same number, as a vector of length 1.
            return (1, cols)
        if rows == 1 and cols != 1:
            raise NeuraLogicImportError(f"{where}: row vectors are not supported (neurovec has no row/column "
                                        "vector distinction; use a (1, n) matrix)")
        return (rows,)
    if java_class == "MatrixValue":
        return tuple(size)
    raise NeuraLogicImportError(f"{where}: values of class {java_class} are not supported")


def weight_names(java_weights) -> dict:
    """NeuraLogic weight index -> the neurovec weight name (NeuraLogic's name, made unique)."""
    names, used = {}, set()
    for w in java_weights:
        index = int(w.index)
        if index < 0:
            continue
        name = str(w.name)
        if name in used or name.startswith("neuralogic:"):
            name = f"{name}#{index}"
        used.add(name)
        names[index] = name
    return names


def _template_weights(model) -> tuple[list, dict]:
    """neurovec Weights for every template weight, and NeuraLogic index -> position."""
    java_weights = list(model._neural_model.getAllWeights())
    names = weight_names(java_weights)
    weights, position = [], {}
    for w in java_weights:
        index = int(w.index)
        if index < 0:
            continue
        value = w.value
        where = f"weight {names[index]!r} (index {index})"
        shape = _value_shape(value.getClass().getSimpleName(), list(value.size()), where, weight=True)
        data = np.asarray(memoryview(value.getAsArray()), dtype=np.float64).reshape(shape)
        position[index] = len(weights)
        weights.append(Weight(names[index], data.copy(), bool(w.isLearnable())))
    return weights, position


class _Constants:
    """Fixed weights the importer adds (zero, one, broadcast ones, ...), created on first use."""

    def __init__(self, weights: list):
        self.weights, self.index = weights, {}

    def get(self, label: str, value) -> int:
        if label not in self.index:
            self.index[label] = len(self.weights)
            self.weights.append(Weight(f"neuralogic:{label}", np.asarray(value, dtype=np.float64), learnable=False))
        return self.index[label]


# -- reading ---------------------------------------------------------------------------------------------------
@dataclass
class _Neurons:
    """All distinct neurons of all samples, topologically ordered, as flat arrays (position = order)."""

    index: np.ndarray
    kind: np.ndarray
    transformation: np.ndarray
    combination: np.ndarray
    ptr: np.ndarray
    inputs: np.ndarray        # positions (into these arrays), per edge
    edge_weight: np.ndarray   # NeuraLogic weight index per edge (-1: none)
    offset: np.ndarray        # NeuraLogic weight index per neuron (-2: none)
    facts: np.ndarray         # positions of the fact neurons
    fact_shape: list          # per fact: value shape
    fact_start: np.ndarray    # per fact: where its value starts in fact_values
    fact_values: np.ndarray
    fact_weight: np.ndarray   # per fact: NeuraLogic index of the learnable weight that is its value (-1: fixed)
    queries: np.ndarray       # position of each sample's output neuron
    java: object              # SampleArrays, for names on demand

    def names(self, positions) -> list:
        return self.java.names(positions)

    def describe(self, position: int) -> str:
        position = int(position)
        return f"neuron {int(self.index[position])} ({self.kind[position]} {self.names([position])[0]!r})"

    def fact_block(self, members: np.ndarray, shape: tuple) -> np.ndarray:
        """The values of facts ``members`` (indices into ``facts``), all of ``shape``, stacked."""
        size = int(np.prod(shape, dtype=np.int64))
        gather = self.fact_start[members][:, None] + np.arange(size)
        return self.fact_values[gather].reshape((members.size,) + tuple(shape))


def _read(samples) -> _Neurons:
    """Read all samples (the Java side keeps each shared neuron once, at its first, topological place)."""
    arrays = _reader().read([sample._java_sample for sample in samples])
    n = arrays.index.size
    order = np.argsort(arrays.index, kind="stable")
    sorted_index = arrays.index[order]

    def position(indices: np.ndarray) -> np.ndarray:
        k = np.minimum(np.searchsorted(sorted_index, indices), n - 1)
        missing = sorted_index[k] != indices
        if missing.any():
            raise NeuraLogicImportError(f"an input neuron {int(indices[missing][0])} is not among the samples' "
                                        "neurons (is the network complete?)")
        return order[k]

    owner = np.repeat(np.arange(n), arrays.count)
    edge_weight = np.full(arrays.inputs.size, NO_WEIGHT, dtype=np.int64)
    weighted_edges = arrays.weighted[owner]
    if int(weighted_edges.sum()) != arrays.weights.size:
        raise NeuraLogicImportError("weights and inputs of weighted neurons do not align "
                                    f"({arrays.weights.size} weights for {int(weighted_edges.sum())} inputs)")
    edge_weight[weighted_edges] = arrays.weights
    offset = np.full(n, _ZERO_WEIGHT, dtype=np.int64)
    offset[arrays.weighted] = arrays.offset
    facts = np.flatnonzero(arrays.kind == _FACT)
    nr = _Neurons(index=arrays.index, kind=arrays.kind, transformation=arrays.transformation,
                  combination=arrays.combination, ptr=np.concatenate([[0], np.cumsum(arrays.count)]),
                  inputs=position(arrays.inputs), edge_weight=edge_weight, offset=offset, facts=facts,
                  fact_shape=[], fact_start=np.concatenate([[0], np.cumsum(arrays.fact_lengths)])[:-1],
                  fact_values=arrays.fact_values,
                  fact_weight=np.where(arrays.fact_learnable, offset[facts], NO_WEIGHT),
                  queries=position(arrays.query), java=arrays)
    # Value shapes, decided once per distinct (value class, size).
    shape_of = {}
    for k, (java_class, size) in enumerate(zip(arrays.fact_classes.tolist(), arrays.fact_shapes)):
        key = (java_class, size)
        if key not in shape_of:
            shape_of[key] = _value_shape(java_class, list(size), nr.describe(facts[k]))
        nr.fact_shape.append(shape_of[key])
    return nr


# -- the graph --------------------------------------------------------------------------------------------------
def _check_settings(model) -> None:
    """Warn about build settings that cost neurovec its layer structure."""
    settings = getattr(model, "_settings", None)
    if settings is None:
        raise ValueError("the model is not built: call model.build(Settings(...)) first")
    if bool(getattr(settings, "iso_value_compression", False)):
        warnings.warn("the model was built with iso_value_compression=True: NeuraLogic merges neurons that compute "
                      "equal values across what would be layers, so the import splits layers by depth more often "
                      "(outputs are unaffected). Build with Settings(iso_value_compression=False) for the best "
                      "grouping.", stacklevel=3)


class _Shapes:
    """Interns value shapes as small integers; () is always 0."""

    def __init__(self):
        self.shapes, self.ids = [()], {(): 0}

    def id(self, shape: tuple) -> int:
        shape = tuple(int(d) for d in shape)
        if shape not in self.ids:
            self.ids[shape] = len(self.shapes)
            self.shapes.append(shape)
        return self.ids[shape]


def _predicate(kind: str, name: str) -> str:
    """The head predicate of a neuron, for layer names only."""
    head = name.split(":-", 1)[0]
    head = re.sub(r"^\s*(\{[^}]*\}|\[[^\]]*\]|<[^>]*>|-?[\d.eE+-]+)\s*", "", head.strip())
    return re.split(r"[(\s\[]", head.strip(), 1)[0] or kind


def _per_neuron(nr: _Neurons, positions: np.ndarray, values: np.ndarray, table: dict, what: str) -> np.ndarray:
    """``table[values[p]]`` for each position, or an error naming the first neuron with an unknown value."""
    out = np.empty(positions.size, dtype=object)
    values = values[positions]
    for java_name in set(values.tolist()):
        rows = np.flatnonzero(values == java_name)
        if java_name not in table:
            need = _NEEDS_EXTENSION.get(java_name)
            hint = f"; neurovec would need {need}" if need else ""
            explain = f" ({_EXPLAIN[java_name]})" if java_name in _EXPLAIN else ""
            raise NeuraLogicImportError(f"{nr.describe(positions[rows[0]])}: {what} {java_name!r}{explain} is not "
                                        f"supported{hint}")
        out[rows] = [table[java_name]] * rows.size
    return out


def _depths(nr: _Neurons, owner: np.ndarray, computed: np.ndarray) -> np.ndarray:
    """Longest path from a fact, by relaxation (as many numpy passes as the network is deep)."""
    depth = np.zeros(nr.index.size, dtype=np.int64)
    starts = nr.ptr[:-1][computed]
    while True:
        edge_depth = depth[nr.inputs] + 1
        new = depth.copy()
        new[computed] = np.maximum.reduceat(edge_depth, starts) if starts.size else new[computed]
        if np.array_equal(new, depth):
            return depth
        depth = new


def from_neuralogic(model, built, *, warn: bool = True) -> Graph:
    """The computation graphs of NeuraLogic's built samples, as one pre-grouped neurovec graph.

    Args:
        model: the built ``neuralogic.core.Model`` (its weights are read; nothing is changed).
        built: what ``model.build_dataset(...)`` returned, a list of its samples, or one sample.
        warn: warn about build settings that hurt the grouping (see ``docs/neuralogic.md``).

    Returns:
        A validated :class:`~neurovec.Graph` whose k-th output is sample k's output neuron. Template
        weights keep NeuraLogic's names (``w0``, ...) and values; learnable ones are learnable.

    Raises:
        NeuraLogicImportError: for a construct neurovec cannot express, naming the neuron and its class.
    """
    _require_neuralogic()
    samples = _samples(built)
    if warn:
        _check_settings(model)
    nr = _read(samples)
    weights, weight_position = _template_weights(model)
    constants = _Constants(weights)
    n = nr.index.size
    counts = np.diff(nr.ptr)
    owner = np.repeat(np.arange(n), counts)
    is_fact = nr.kind == _FACT
    computed = ~is_fact

    for kind in set(nr.kind.tolist()) - _KINDS:
        raise NeuraLogicImportError(f"{nr.describe(int(np.flatnonzero(nr.kind == kind)[0]))}: neuron class "
                                    f"{kind} is not supported")
    backward = np.flatnonzero(nr.inputs >= owner)
    if backward.size:
        raise NeuraLogicImportError(f"{nr.describe(int(owner[backward[0]]))}: its inputs do not come before it "
                                    "(the samples' neuron lists are not topological)")
    no_inputs = np.flatnonzero(computed & (counts == 0))
    if no_inputs.size:
        raise NeuraLogicImportError(f"{nr.describe(int(no_inputs[0]))}: a computed neuron without inputs")

    aggregation = np.full(n, "", dtype=object)
    aggregation[computed] = _per_neuron(nr, np.flatnonzero(computed), nr.combination, _AGGREGATION, "combination")
    plan = np.full(n, None, dtype=object)
    transformations = _leaky_relu_plans(nr, computed)
    picks = np.flatnonzero(computed & (nr.transformation == "AtIndex"))
    if picks.size:  # validated by _split_softmaxes below
        transformations["AtIndex"] = ("identity", None, ())
    # transpose(k(Y)) (neuralogic.nn's Attention) is imported only as the left factor of a dot product, where
    # neurovec needs no transposition (validated in the shape pass below).
    transposed = computed & (nr.transformation == "Transposition")
    if transposed.any():
        transformations["Transposition"] = ("identity", None, ())
    plan[computed] = _per_neuron(nr, np.flatnonzero(computed), nr.transformation, transformations,
                                 "transformation")
    _refuse_stuck_at_one(nr, computed)
    # NeuraLogic replaces a softmax or sparsemax of a single input by the constant 1 (ConstantOne) and then
    # reports neither a combination nor a transformation: ask those neurons' states what they compute with.
    silent = np.flatnonzero(computed & (nr.combination == "") & (nr.transformation == ""))
    if silent.size:
        function = nr.java.state_functions()[silent]
        aggregation[silent[function == "ConstantOne$State"]] = "one"
        unknown = np.flatnonzero(~np.isin(function, ("ConstantOne$State", "Identity$State", "")))
        if unknown.size:
            raise NeuraLogicImportError(f"{nr.describe(silent[unknown[0]])}: it computes with {function[unknown[0]]} "
                                        "but reports no combination or transformation; not supported")
    pick_index = _split_softmaxes(nr, picks, aggregation, owner) if picks.size else None
    # A softmax combination is the concatenation of the inputs, then softmax; the neuron's own transformation
    # comes after that, as extra steps (NeuraLogic computes T(softmax(inputs))).
    softmax = np.flatnonzero(aggregation == "softmax")
    for java_name in set(nr.transformation[softmax].tolist()):
        rows = softmax[nr.transformation[softmax] == java_name]
        transformation, fixed_bias, steps = transformations[java_name]
        own = () if transformation == "identity" and fixed_bias is None else \
            (_Step(transformation, None, fixed_bias),)
        plan[rows] = [("softmax", None, own + steps)] * rows.size
    passthrough = computed & (nr.combination == "") & (counts > 1)
    if passthrough.any():
        raise NeuraLogicImportError(f"{nr.describe(int(np.flatnonzero(passthrough)[0]))}: several inputs but no "
                                    "combination function")

    # NeuraLogic weight index -> neurovec weight index, per edge and per offset.
    def to_neurovec(java: np.ndarray, rows: np.ndarray, what: str) -> np.ndarray:
        out = np.full(java.size, NO_WEIGHT, dtype=np.int64)
        for index in np.unique(java):
            hit = java == index
            if what == "learnable fact value" and index == NO_WEIGHT:  # a fixed fact
                out[hit] = NO_WEIGHT
            elif index == _UNIT_WEIGHT:
                out[hit] = NO_WEIGHT if what == "input" else constants.get("one", 1.0)
            elif index == _ZERO_WEIGHT:
                out[hit] = constants.get("zero", 0.0) if what == "input" else NO_WEIGHT
            elif int(index) in weight_position:
                out[hit] = weight_position[int(index)]
            elif what == "learnable fact value":
                raise NeuraLogicImportError(
                    f"{nr.describe(int(rows[np.flatnonzero(hit)[0]]))}: its value is a learnable weight (index "
                    f"{int(index)}) that is not among the template's weights, as build_dataset(..., "
                    "learnable_facts=True) makes every sample's fact values; neurovec imports learnable fact "
                    "values of the template (a template fact such as '0.5 x.') but would need per-sample weights "
                    "for these")
            else:
                raise NeuraLogicImportError(f"{nr.describe(int(rows[np.flatnonzero(hit)[0]]))}: {what} weight "
                                            f"index {int(index)} is not among the model's weights")
        return out

    edge_weight = to_neurovec(nr.edge_weight, owner, "input")
    offset = np.full(n, NO_WEIGHT, dtype=np.int64)
    offset[computed] = to_neurovec(nr.offset[computed], np.flatnonzero(computed), "offset")

    # Value shapes, depth by depth (all inputs of a depth are shallower).
    depth = _depths(nr, owner, computed)
    shapes = _Shapes()
    shape = np.full(n, -1, dtype=np.int64)
    fact_shape_ids = {fact_shape: shapes.id(fact_shape) for fact_shape in set(nr.fact_shape)}
    shape[nr.facts] = [fact_shape_ids[fact_shape] for fact_shape in nr.fact_shape]
    weight_shape = np.array([shapes.id(w.shape) for w in weights] + [-1], dtype=np.int64)  # [-1]: no weight
    edge_shape = np.full(owner.size, -1, dtype=np.int64)
    edge_depth = depth[owner]
    # Neurons whose NeuraLogic value is a scalar that neurovec holds as a vector of one element (an AtIndex pick
    # of scores computed by a row-vector weight, and neurons of such values alone): read unweighted, they count
    # as scalars (NeuraLogic broadcasts them), widened by a fixed (d, 1) matrix of ones (see _neuron_layer).
    one_as_scalar = np.zeros(n, dtype=bool)
    one_id = shapes.id((1,))
    edge_transposed = transposed[nr.inputs]
    dot_width = np.full(n, -1, dtype=np.int64)  # per dot product (see _dot_products): the shape id of its factors
    for level in range(1, int(depth.max()) + 1):
        edges = np.flatnonzero(edge_depth == level)
        # One product_shape per distinct (weight shape, input shape) pair, encoded as one integer.
        base = len(shapes.shapes) + 1
        pairs = (weight_shape[edge_weight[edges]] + 1) * base + shape[nr.inputs[edges]]
        unique, inverse = np.unique(pairs, return_inverse=True)
        result = np.empty(unique.shape[0], dtype=np.int64)
        for k, code in enumerate(unique.tolist()):
            w_id, x_id = divmod(code, base)
            w_id -= 1
            product = product_shape(None if w_id < 0 else shapes.shapes[w_id], shapes.shapes[x_id])
            if product is None:
                e = edges[np.flatnonzero(inverse.reshape(-1) == k)[0]]
                raise NeuraLogicImportError(
                    f"{nr.describe(int(owner[e]))}: input {int(e - nr.ptr[owner[e]])} has a weight of shape "
                    f"{shapes.shapes[w_id]} that does not fit its value of shape {shapes.shapes[x_id]}")
            result[k] = shapes.id(product)
        edge_shape[edges] = result[inverse.reshape(-1)]
        neurons = np.flatnonzero(depth == level)
        joins = np.isin(aggregation[neurons], _CONCATENATIONS)  # concatenations take inputs of any size
        edge_one = np.zeros(owner.size, dtype=bool)
        edge_one[edges] = one_as_scalar[nr.inputs[edges]] & (edge_weight[edges] == NO_WEIGHT)
        edge_code = np.where(edge_one, 0, edge_shape)
        high = _segment(np.maximum, edge_code, nr.ptr, neurons)
        # NeuraLogic broadcasts scalar inputs (e.g. an unweighted fact of value 1 in a sum of vectors), so
        # only the non-scalar inputs must agree.
        low_source = np.where(edge_code == 0, np.iinfo(np.int64).max, edge_code)
        low = _segment(np.minimum, low_source, nr.ptr, neurons)
        low = np.where(low == np.iinfo(np.int64).max, 0, low)
        mismatch = np.flatnonzero((high != low) & ~joins)
        if mismatch.size:
            j = int(neurons[mismatch[0]])
            found = sorted({shapes.shapes[s] for s in edge_shape[nr.ptr[j]:nr.ptr[j + 1]]})
            raise NeuraLogicImportError(f"{nr.describe(j)}: its weighted inputs have different shapes {found}")
        shape[neurons] = np.where(np.isin(aggregation[neurons], ("count", "one")), 0, high)
        # A scalar in NeuraLogic held as one element: where such an input is among scalars only.
        ones = (shape[neurons] == 0) & ~joins & ~np.isin(aggregation[neurons], ("count", "one")) & \
            _segment(np.logical_or, edge_one, nr.ptr, neurons)
        ones |= (aggregation[neurons] == "pick") & (high == one_id)
        shape[neurons[ones]] = one_id
        one_as_scalar[neurons[ones]] = True
        dots = neurons[(aggregation[neurons] == "prod") & _segment(np.logical_or, edge_transposed, nr.ptr, neurons)]
        if dots.size:
            dot_width[dots] = _dot_products(nr, dots, edge_code, edge_transposed, edge_weight, shapes)
            aggregation[dots] = "dot"
            shape[dots] = one_id
            one_as_scalar[dots] = True
        if joins.any():
            shape[neurons[joins]] = _concatenation_shapes(nr, neurons[joins], edge_shape, offset, weights, shapes)
        split = neurons[aggregation[neurons] == "softmax_split"]
        n_elements = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes.shapes])  # per distinct shape
        long = split[n_elements[shape[split]] != 1]
        if long.size:
            raise NeuraLogicImportError(
                f"{nr.describe(long[0])}: a softmax(agg_terms=[...]) aggregation of {shapes.shapes[shape[long[0]]]} "
                "values (NeuraLogic concatenates them and AtIndex picks single elements); neurovec imports it for "
                "groundings of one element each (scalars or one-element vectors), as GATv2Conv's scores")

    misread = np.flatnonzero(edge_transposed & (aggregation[owner] != "dot"))
    if misread.size:
        e = int(misread[0])
        raise NeuraLogicImportError(
            f"{nr.describe(int(owner[e]))}: reads {nr.describe(int(nr.inputs[e]))}, a transposition; neurovec "
            "imports a transposed vector only as the left factor of a dot product (a product combination of "
            "scalars, transpose(k) and q, as neuralogic.nn's Attention); other uses would need a 'transpose' "
            "transformation and matrix products of computed values")
    output_shape = shape[nr.queries]
    differs = np.flatnonzero(output_shape != output_shape[0])
    if differs.size:
        k = int(differs[0])
        raise NeuraLogicImportError(
            f"sample {k}'s output, {nr.describe(nr.queries[k])}, has shape {shapes.shapes[output_shape[k]]} but "
            f"sample 0's output, {nr.describe(nr.queries[0])}, has {shapes.shapes[output_shape[0]]}: the outputs of "
            "one neurovec graph share one shape (a concat or softmax aggregation is as long as its groundings); "
            "import the samples whose outputs have equal shapes separately")
    fact_weight = to_neurovec(nr.fact_weight, nr.facts, "learnable fact value") if nr.fact_weight.size else \
        nr.fact_weight
    edge_one = one_as_scalar[nr.inputs] & (edge_weight == NO_WEIGHT)
    return _assemble(nr, weights, constants, shapes, shape, depth, aggregation, plan, edge_weight, edge_shape,
                     offset, fact_weight, pick_index, edge_one, dot_width)


def _dot_products(nr: _Neurons, dots: np.ndarray, edge_code: np.ndarray, edge_transposed: np.ndarray,
                  edge_weight: np.ndarray, shapes) -> np.ndarray:
    """Product combinations that read a transposed value: NeuraLogic multiplies left to right, so scalars times
    ``transpose(k)`` (a row) times ``q`` (a column) is the scalar ``s * (k . q)``. Checks that each of ``dots``
    has exactly two non-scalar inputs (``edge_code`` 0 is a scalar), the first an unweighted transposition,
    the second not, both vectors of one length; returns the shape id of those vectors, per neuron.

    neurovec computes it as the elementwise product (scalars widened by ones, see _neuron_layer), then the sum
    of its elements (a fixed ``(1, d)`` weight of ones): a one-element vector (see ``one_as_scalar``).
    """
    positions = np.arange(edge_code.size, dtype=np.int64)
    wide = edge_code != 0
    n_wide = _segment(np.add, wide.astype(np.int64), nr.ptr, dots)
    first = _segment(np.minimum, np.where(wide, positions, edge_code.size), nr.ptr, dots)
    last = _segment(np.maximum, np.where(wide, positions, -1), nr.ptr, dots)
    first, last = np.minimum(first, edge_code.size - 1), np.maximum(last, 0)
    one_dimensional = np.array([len(s) == 1 for s in shapes.shapes])
    fits = (n_wide == 2) & edge_transposed[first] & (edge_weight[first] == NO_WEIGHT) & ~edge_transposed[last] \
        & (edge_code[first] == edge_code[last]) & one_dimensional[edge_code[first]] \
        & (_segment(np.add, edge_transposed.astype(np.int64), nr.ptr, dots) == 1)
    bad = np.flatnonzero(~fits)
    if bad.size:
        j = int(dots[bad[0]])
        found = [shapes.shapes[c] for c in edge_code[nr.ptr[j]:nr.ptr[j + 1]]]
        raise NeuraLogicImportError(
            f"{nr.describe(j)}: a product of a transposed value with input shapes {found} (scalars as ()); neurovec "
            "imports scalars times transpose(k) times q, with k and q vectors of one length and transpose(k) "
            "unweighted (a dot product, as neuralogic.nn's Attention); other products of transposed values would "
            "need a 'transpose' transformation and matrix products of computed values")
    return edge_code[first]


def _split_softmaxes(nr: _Neurons, picks: np.ndarray, aggregation: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """NeuraLogic's ``softmax(agg_terms=[...])`` (GATv2's attention): a softmax neuron ``S`` over groundings
    ``r_1..r_k``, read only by atoms whose transformation ``AtIndex(i)`` picks ``softmax(r)_i``.

    Marks those softmax neurons ``"softmax_split"`` and the picks ``"pick"`` in ``aggregation`` (built by
    _softmax_split_layers and _pick_layer) and returns, per neuron, the index it picks (-1 for the others).
    A pick of NeuraLogic's constant ONE (the softmax of a single grounding) stays what it is: that one.
    """
    index = np.full(nr.index.size, -1, dtype=np.int64)
    index[picks] = nr.java.at_indices()[picks]
    several = picks[np.diff(nr.ptr)[picks] != 1]
    if several.size:
        raise NeuraLogicImportError(f"{nr.describe(several[0])}: an AtIndex transformation of several inputs "
                                    "(it picks one element of a single softmax aggregation); not supported")
    softmax = nr.inputs[nr.ptr[picks]]
    one = aggregation[softmax] == "one"
    wrong = np.flatnonzero(~one & (aggregation[softmax] != "softmax"))
    if wrong.size:
        j = int(picks[wrong[0]])
        raise NeuraLogicImportError(f"{nr.describe(j)}: an AtIndex transformation of "
                                    f"{nr.describe(softmax[wrong[0]])}, which is not a softmax aggregation; "
                                    "neurovec imports AtIndex only as the pick of softmax(agg_terms=[...]) (build "
                                    "with chain_pruning=False: NeuraLogic's chain pruning removes the softmax of a "
                                    "single grounding, keeping its AtIndex or reading the score in its place)")
    if np.any(index[picks[one]] != 0):
        raise NeuraLogicImportError(f"{nr.describe(picks[one][index[picks[one]] != 0][0])}: AtIndex beyond the "
                                    "single value of a softmax of one grounding")
    split = np.unique(softmax[~one])
    readers = owner[np.isin(nr.inputs, split)]
    whole = readers[nr.transformation[readers] != "AtIndex"]
    if whole.size:
        raise NeuraLogicImportError(
            f"{nr.describe(whole[0])}: reads a softmax(agg_terms=[...]) aggregation whole, while AtIndex atoms pick "
            "its elements; neurovec imports such a softmax only when every reader picks one element")
    transformed = split[~np.isin(nr.transformation[split], ("", "Identity"))]
    if transformed.size:
        raise NeuraLogicImportError(f"{nr.describe(transformed[0])}: a transformation "
                                    f"{nr.transformation[transformed[0]]!r} of a softmax(agg_terms=[...]) "
                                    "aggregation; not supported")
    outside = np.flatnonzero(~one & (index[picks] >= np.diff(nr.ptr)[softmax]))
    if outside.size:
        raise NeuraLogicImportError(f"{nr.describe(picks[outside[0]])}: AtIndex {int(index[picks[outside[0]]])} "
                                    f"beyond the groundings of {nr.describe(softmax[outside[0]])}")
    aggregation[split] = "softmax_split"
    aggregation[picks[~one]] = "pick"
    return index


def _concatenation_shapes(nr, neurons, edge_shape, offset, weights, shapes) -> np.ndarray:
    """Shape ids of concatenations: a column vector as long as all inputs' (and the offset's) elements.

    NeuraLogic flattens a matrix input too; neurovec cannot (a weight times a matrix stays a matrix), so
    matrices are refused.
    """
    n_elements = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes.shapes], dtype=np.int64)
    is_matrix = np.array([len(s) > 1 for s in shapes.shapes])
    offset_shape = _weight_shape_ids(offset[neurons], weights, shapes)  # -1: no offset
    matrix_input = _segment(np.logical_or, is_matrix[edge_shape], nr.ptr, neurons) | \
        (is_matrix[offset_shape] & (offset_shape >= 0))
    if matrix_input.any():
        j = int(neurons[np.flatnonzero(matrix_input)[0]])
        raise NeuraLogicImportError(f"{nr.describe(j)}: a concatenation of matrix values (NeuraLogic flattens "
                                    "them row by row) is not supported; neurovec would need a 'flatten' step")
    total = _segment(np.add, n_elements[edge_shape], nr.ptr, neurons) + \
        np.where(offset_shape >= 0, n_elements[offset_shape], 0)
    unique, inverse = np.unique(total, return_inverse=True)
    return np.array([shapes.id((int(length),)) for length in unique], dtype=np.int64)[inverse.reshape(-1)]


def _weight_shape_ids(weight: np.ndarray, weights: list, shapes) -> np.ndarray:
    """Shape id of each neurovec weight index (-1 for NO_WEIGHT), one lookup per distinct weight."""
    unique, inverse = np.unique(weight, return_inverse=True)
    ids = np.array([-1 if w == NO_WEIGHT else shapes.id(weights[w].shape) for w in unique.tolist()], np.int64)
    return ids[inverse.reshape(-1)]


def _edges_of(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The edge indices ``starts[j] .. starts[j] + lengths[j] - 1`` of each neuron j, concatenated."""
    return np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())


def _segment(ufunc, values: np.ndarray, ptr: np.ndarray, neurons: np.ndarray) -> np.ndarray:
    """``ufunc`` over each neuron's edges (every computed neuron has at least one)."""
    starts, ends = ptr[neurons], ptr[neurons + 1]
    order = np.argsort(starts, kind="stable")
    # reduceat needs increasing, non-empty, contiguous slices: gather the edges of these neurons first.
    lengths = (ends - starts)[order]
    gather = np.repeat(starts[order] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + \
        np.arange(int(lengths.sum()))
    reduced = ufunc.reduceat(values[gather], np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    out = np.empty(neurons.size, dtype=values.dtype)
    out[order] = reduced
    return out


def _assemble(nr, weights, constants, shapes, shape, depth, aggregation, plan, edge_weight, edge_shape,
              offset, fact_weight, pick_index, edge_one, dot_width) -> Graph:
    """Group the neurons into layers and write the CSR arrays of each layer.

    ``fact_weight``: per fact, the neurovec weight that is its (learnable) value, or NO_WEIGHT.
    ``pick_index``: per neuron, the element its AtIndex picks (or None if there are none); ``edge_one``: per
    edge, whether it reads a NeuraLogic scalar held as a one-element vector (see from_neuralogic);
    ``dot_width``: per dot product (see _dot_products), the shape id of its factors.
    """
    n = nr.index.size
    is_fact = nr.kind == _FACT
    layers: list = []
    layer_of = np.full(n, -1, dtype=np.int64)   # the layer other neurons read a neuron from
    ordinal_of = np.full(n, -1, dtype=np.int64)
    # Split softmaxes (see _softmax_split_layers): the layer of their exp(r_j - max r) rows, and their first row.
    exp_layer_of = np.full(n, -1, dtype=np.int64)
    exp_row_of = np.full(n, -1, dtype=np.int64)

    # Facts: scalar ones are unit facts (W . 1 = W), the rest grouped by shape; learnable ones come after.
    fact_positions = nr.facts
    learnable = fact_weight != NO_WEIGHT
    unit = (shape[fact_positions] == 0) & (nr.fact_values[nr.fact_start] == 1.0) & ~learnable \
        if fact_positions.size else np.zeros(0, dtype=bool)
    unit_positions = fact_positions[unit]
    needs_unit = bool(np.any(offset[~is_fact] != NO_WEIGHT) or np.any(np.isin(aggregation, ("count", "one")))
                      or learnable.any())
    if unit_positions.size or needs_unit:
        layer_of[unit_positions] = len(layers)
        ordinal_of[unit_positions] = np.arange(unit_positions.size)
        layers.append(FactLayer.units("facts:unit", unit_positions.size + 1))  # the last one is the importer's
    unit_ref = (0, unit_positions.size) if layers else None
    rest = np.flatnonzero(~unit & ~learnable)  # indices into nr.facts
    for shape_id in np.unique(shape[fact_positions[rest]]) if rest.size else []:
        members = rest[shape[fact_positions[rest]] == shape_id]
        layer_of[fact_positions[members]] = len(layers)
        ordinal_of[fact_positions[members]] = np.arange(members.size)
        dims = "x".join(map(str, shapes.shapes[shape_id])) or "scalar"
        layers.append(FactLayer(f"facts:{dims}", nr.fact_block(members, shapes.shapes[shape_id])))
    # A learnable fact value (a template fact such as "0.5 x.") is its weight: a unit fact times that weight.
    for shape_id in np.unique(shape[fact_positions[learnable]]).tolist():
        members = np.flatnonzero(learnable & (shape[fact_positions] == shape_id))
        layer_of[fact_positions[members]] = len(layers)
        ordinal_of[fact_positions[members]] = np.arange(members.size)
        dims = "x".join(map(str, shapes.shapes[shape_id])) or "scalar"
        layers.append(NeuronLayer(f"facts:learnable:{dims}", counts=np.ones(members.size, np.int64),
                                  input_layer=np.full(members.size, unit_ref[0]),
                                  input_ordinal=np.full(members.size, unit_ref[1]), input_weight=fact_weight[members]))

    # Computed neurons: one layer per (depth, aggregation, transformation, shape).
    computed = np.flatnonzero(~is_fact)
    keys = (aggregation[computed] + "|" + nr.transformation[computed]).astype(str)
    key_ids = np.unique(keys, return_inverse=True)[1].reshape(-1)
    n_keys, n_shapes = int(key_ids.max(initial=0)) + 1, len(shapes.shapes)
    group = (depth[computed] * n_keys + key_ids) * n_shapes + shape[computed]  # sorts by depth first
    unique_codes, group_of = np.unique(group, return_inverse=True)
    group_of = group_of.reshape(-1)
    unique_groups = [(code // (n_keys * n_shapes), None, code % n_shapes) for code in unique_codes.tolist()]
    for g, (level, _, shape_id) in enumerate(unique_groups):
        members = computed[group_of == g]  # position order = topological order
        first = int(members[0])
        agg, (transformation, fixed_bias, steps) = aggregation[first], plan[first]
        if agg == "sum" and fixed_bias is not None and np.any(offset[members] != NO_WEIGHT):
            # The offsets take the bias slot (a scalar one broadcasts, as in NeuraLogic) and the transformation's
            # fixed bias (reverse's -1) moves to a step after it: T(v + fixed) of v = inputs + offset.
            steps = (_Step(transformation, None, fixed_bias),) + tuple(steps)
            transformation, fixed_bias = "identity", None
        # Names cost a JVM call each: name the layer after the predicates of a spread of its members.
        probe = members[np.unique(np.linspace(0, members.size - 1, min(members.size, 32)).astype(np.int64))]
        predicates = sorted({_predicate(str(kind), name) for kind, name in zip(nr.kind[probe], nr.names(probe))})
        label = "+".join(predicates[:3]) + ("+..." if len(predicates) > 3 else "")
        combination = f"{agg}:" if agg in _CONCATENATIONS else ""
        name = _unique(f"d{level}:{label}:{combination}{nr.transformation[first] or 'identity'}", layers)
        if agg == "softmax_split":
            layer = _softmax_split_layers(name, nr, members, edge_weight, layer_of, ordinal_of, constants, layers,
                                          exp_layer_of, exp_row_of)
        elif agg == "pick":
            softmax = nr.inputs[nr.ptr[members]]
            layer = NeuronLayer(name, counts=np.full(members.size, 2),
                                input_layer=np.stack([exp_layer_of[softmax], layer_of[softmax]], 1).reshape(-1),
                                input_ordinal=np.stack([exp_row_of[softmax] + pick_index[members],
                                                        ordinal_of[softmax]], 1).reshape(-1),
                                aggregation="prod", transformation=transformation)
        elif agg == "dot":
            # The elementwise products, one layer per factor length, then the sum of their elements.
            row = np.empty(members.size, dtype=np.int64)
            source = np.empty(members.size, dtype=np.int64)
            ones = np.empty(members.size, dtype=np.int64)
            for width in np.unique(dot_width[members]).tolist():
                part = np.flatnonzero(dot_width[members] == width)
                (d,) = shapes.shapes[width]
                layers.append(_neuron_layer(_unique(f"{name}:product{d}", layers), nr, members[part], "prod",
                                            "identity", None, (d,), edge_weight, edge_shape, offset, layer_of,
                                            ordinal_of, unit_ref, constants, edge_one))
                row[part], source[part] = np.arange(part.size), len(layers) - 1
                ones[part] = constants.get(f"ones(1, {d})", np.ones((1, d)))
            bias = np.full(members.size, NO_WEIGHT if fixed_bias is None else constants.get(repr(fixed_bias),
                                                                                            fixed_bias))
            layer = NeuronLayer(name, counts=np.ones(members.size, np.int64), input_layer=source,
                                input_ordinal=row, input_weight=ones, bias=bias, transformation=transformation)
        elif agg in _CONCATENATIONS:
            layer = _concat_layer(name, nr, members, transformation, fixed_bias, shapes.shapes[shape_id],
                                  edge_weight, edge_shape, offset, layer_of, ordinal_of, unit_ref, constants,
                                  weights, shapes, layers)
        else:
            layer = _neuron_layer(name, nr, members, agg, transformation, fixed_bias, shapes.shapes[shape_id],
                                  edge_weight, edge_shape, offset, layer_of, ordinal_of, unit_ref, constants,
                                  edge_one)
        layers.append(layer)
        layer_of[members] = len(layers) - 1
        ordinal_of[members] = np.arange(members.size)
        for k, step in enumerate(steps):  # e.g. signum's relu: one single-input layer per step
            if step.leaky_slope is not None:
                _leaky_relu_layers(f"{name}/{k + 1}", members.size, step.leaky_slope, constants, layers)
                layer_of[members] = len(layers) - 1
                continue
            weight = NO_WEIGHT if step.weight is None else constants.get(repr(step.weight), step.weight)
            bias = NO_WEIGHT if step.bias is None else constants.get(repr(step.bias), step.bias)
            layers.append(NeuronLayer(
                _unique(f"{name}/{k + 1}", layers), counts=np.ones(members.size, np.int64),
                input_layer=np.full(members.size, len(layers) - 1), input_ordinal=np.arange(members.size),
                input_weight=np.full(members.size, weight), bias=np.full(members.size, bias),
                aggregation="sum", transformation=step.transformation))
            layer_of[members] = len(layers) - 1
    return Graph(layers, weights, layer_of[nr.queries], ordinal_of[nr.queries])


def _leaky_relu_plans(nr: _Neurons, computed: np.ndarray) -> dict:
    """``_TRANSFORMATION`` plus a plan per LeakyReLu slope other than neurovec's ``leaky_relu`` (0.01, also
    NeuraLogic's default); the neurons with such a slope get the transformation name ``LeakyReLu(slope)``,
    so that layers (grouped by transformation name) never mix slopes."""
    table = dict(_TRANSFORMATION)
    leaky = np.flatnonzero(computed & (nr.transformation == "LeakyReLu"))
    if leaky.size == 0:
        return table
    slopes = nr.java.leaky_slopes()[leaky]
    for slope in np.unique(slopes[slopes != _LEAKY_RELU_SLOPE]).tolist():
        name = f"LeakyReLu({slope!r})"
        table[name] = ("identity", None, (_Step("leaky_relu", leaky_slope=slope),))
        nr.transformation[leaky[slopes == slope]] = name
    return table


def _leaky_relu_layers(name: str, size: int, slope: float, constants: _Constants, layers: list) -> None:
    """NeuraLogic's LeakyReLu (``v`` for ``v > 0``, else ``slope * v``) of the last layer's ``size`` neurons.

    Two layers: ``relu(v)`` and ``relu(-v)`` side by side, then ``relu(v) + (-slope) relu(-v)``. Both are
    exact: ``v + (-slope) 0`` is ``v``; ``0 + (-slope)(-v)`` is ``slope * v`` (negating both factors of a
    product does not change its rounding).
    """
    source, rows = len(layers) - 1, np.arange(size)
    layers.append(NeuronLayer(
        _unique(f"{name}:relu(v),relu(-v)", layers), counts=np.ones(2 * size, np.int64),
        input_layer=np.full(2 * size, source), input_ordinal=np.concatenate([rows, rows]),
        input_weight=np.repeat([NO_WEIGHT, constants.get(repr(-1.0), -1.0)], size), transformation="relu"))
    layers.append(NeuronLayer(
        _unique(f"{name}:leakyrelu({slope!r})", layers), counts=np.full(size, 2),
        input_layer=np.full(2 * size, len(layers) - 1), input_ordinal=np.stack([rows, size + rows], 1).reshape(-1),
        input_weight=np.tile([NO_WEIGHT, constants.get(repr(-slope), -slope)], size)))


def _refuse_stuck_at_one(nr: _Neurons, computed: np.ndarray) -> None:
    """Refuse a neuron whose running sum or average NeuraLogic keeps in its constant ONE (a softmax of one value).

    NeuraLogic 0.9.2 sets a sum's (or average's) accumulator up from its inputs' values when it builds the
    network: the first of them, cloned, with the others added in (the offset, where there is one, comes first).
    Where that first value is the shared constant ONE (a softmax aggregation of a single grounding, which NeuraLogic
    replaces by the constant, or a neuron passing it on), the clone is the constant itself, which ignores being
    zeroed and every increment: the neuron computes 1 (an average 1/n) whatever its inputs, at every evaluation.
    Chain pruning comes after that set-up: it removes the single-input softmax neuron, so the inputs then look
    ordinary, but the accumulator is still the constant. Found by experiment: ``h :- softmax of one grounding``
    then ``h :- 0.5 b`` gives h = 1 pruned or not (1.15 with the rules swapped; pruned, 0.15 plus the score).
    So ``model.test`` does not compute this neuron's function, and neurovec refuses rather than give other numbers.
    The check reads the accumulators themselves (JavaReader.stuck_at_one), not the inputs' order.
    """
    stuck = np.flatnonzero(nr.java.stuck_at_one() & computed)
    if stuck.size:
        j = int(stuck[0])
        raise NeuraLogicImportError(
            f"{nr.describe(j)}: NeuraLogic computes it as a constant (1 for a sum, 1/n for an average), whatever "
            "its inputs: its running sum was set up from NeuraLogic's constant ONE, the value of a softmax "
            "aggregation over a single grounding (which NeuraLogic replaces by that constant) read as its first "
            "input, directly or through identity neurons, and NeuraLogic 0.9.2 then adds the other inputs into "
            "that constant and loses them (with chain pruning too, which removes the softmax neuron but not the "
            f"constant in this neuron's sum; {stuck.size} neuron(s) in all). So model.test does not compute this "
            "neuron's function, and neurovec refuses rather than give other numbers: give every softmax "
            "aggregation two or more groundings, or put another input first (order the rules so that the "
            "softmax's rule is not the first of its head, or give this neuron an offset, which NeuraLogic "
            "puts first)")


def _unique(name: str, layers: list) -> str:
    taken = {layer.name for layer in layers}
    candidate, k = name, 1
    while candidate in taken:
        k += 1
        candidate = f"{name}#{k}"
    return candidate


def _softmax_split_layers(name, nr, members, edge_weight, layer_of, ordinal_of, constants, layers, exp_layer_of,
                          exp_row_of) -> NeuronLayer:
    """The softmax neurons ``members`` of groundings ``r_1..r_k`` (values of one element), split so that each
    grounding's own weight ``softmax(r)_j = e_j / sum_i e_i`` with ``e_j = exp(r_j - max_i r_i)`` can be read:

    appends a layer of ``m = max_i r_i`` and one of the ``e_j`` (``exp(r_j + (-1) m)``, one row per grounding,
    ``exp_row_of[S]`` the first of softmax S); returns the layer of ``1 / sum_i e_i``, which stands for the
    softmax neurons. A pick (AtIndex j) is then the product ``e_j * (1 / sum_i e_i)``. Subtracting the maximum
    keeps exp from overflowing, as a softmax does.
    """
    starts = nr.ptr[members]
    lengths = nr.ptr[members + 1] - starts
    edges = _edges_of(starts, lengths)
    src = nr.inputs[edges]
    layers.append(NeuronLayer(_unique(f"{name}:max", layers), counts=lengths, input_layer=layer_of[src],
                              input_ordinal=ordinal_of[src], input_weight=edge_weight[edges], aggregation="max"))
    peak = len(layers) - 1
    owner_row = np.repeat(np.arange(members.size), lengths)
    minus_one = constants.get(repr(-1.0), -1.0)
    layers.append(NeuronLayer(
        _unique(f"{name}:exp(r-max)", layers), counts=np.full(edges.size, 2),
        input_layer=np.stack([layer_of[src], np.full(edges.size, peak)], 1).reshape(-1),
        input_ordinal=np.stack([ordinal_of[src], owner_row], 1).reshape(-1),
        input_weight=np.stack([edge_weight[edges], np.full(edges.size, minus_one)], 1).reshape(-1),
        transformation="exp"))
    exp_layer_of[members] = len(layers) - 1
    exp_row_of[members] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return NeuronLayer(name, counts=lengths, input_layer=np.full(edges.size, len(layers) - 1),
                       input_ordinal=np.arange(edges.size), transformation="inverse")


def _neuron_layer(name, nr, members, agg, transformation, fixed_bias, out_shape, edge_weight, edge_shape,
                  offset, layer_of, ordinal_of, unit_ref, constants, edge_one) -> NeuronLayer:
    """One layer's CSR arrays; offsets become biases (sums) or a first input from the unit fact (others)."""
    starts, ends = nr.ptr[members], nr.ptr[members + 1]
    lengths = ends - starts
    edges = _edges_of(starts, lengths)
    src = nr.inputs[edges]
    in_layer, in_ordinal, in_weight = layer_of[src], ordinal_of[src], edge_weight[edges].copy()
    neuron_offset = offset[members]
    bias = np.full(members.size, NO_WEIGHT, dtype=np.int64)
    if agg in ("max", "min") and int(np.prod(out_shape, dtype=np.int64)) > 1:
        # NeuraLogic's Maximum/Minimum on vectors and matrices select the whole input whose *sum of elements*
        # is largest/smallest (Value.greaterThan); neurovec's max/min are elementwise.
        raise NeuraLogicImportError(f"{nr.describe(members[0])}: {agg} over {out_shape} values selects the input "
                                    "with the largest element sum in NeuraLogic; neurovec would need that "
                                    "'select by sum' aggregation (its max/min are elementwise)")
    if agg in ("count", "one"):
        # count(x_1..x_n) is n: a sum of unit facts, one per input (NeuraLogic counts the offset too);
        # NeuraLogic's ConstantOne ("one") is a single unit fact.
        lengths = lengths + (neuron_offset != NO_WEIGHT) if agg == "count" else np.ones_like(lengths)
        total = int(lengths.sum())
        if fixed_bias is not None:
            bias[:] = constants.get(repr(fixed_bias), fixed_bias)
        return NeuronLayer(name, counts=lengths, input_layer=np.full(total, unit_ref[0]),
                           input_ordinal=np.full(total, unit_ref[1]), bias=bias, aggregation="sum",
                           transformation=transformation)
    elif out_shape != ():
        # NeuraLogic broadcasts a scalar input over the others' shape; neurovec's aggregations take equal
        # shapes: widen it by a fixed weight of ones (ones * s is exactly s everywhere).
        scalar = edge_shape[edges] == 0
        weighted_scalar = scalar & (in_weight != NO_WEIGHT)
        if weighted_scalar.any():
            j = int(members[np.searchsorted(np.cumsum(lengths), np.flatnonzero(weighted_scalar)[0], "right")])
            raise NeuraLogicImportError(f"{nr.describe(j)}: a weighted scalar input among {out_shape} inputs is "
                                        "not supported")
        if scalar.any():
            in_weight[scalar] = constants.get(f"ones{out_shape}", np.ones(out_shape))
        # A NeuraLogic scalar held as one element (an AtIndex pick): a (d, 1) matrix of ones gives d copies.
        one = edge_one[edges] & (out_shape != (1,))
        if one.any():
            if len(out_shape) != 1:
                j = int(members[np.searchsorted(np.cumsum(lengths), np.flatnonzero(one)[0], "right")])
                raise NeuraLogicImportError(f"{nr.describe(j)}: an AtIndex pick (a scalar in NeuraLogic) among "
                                            f"{out_shape} matrix inputs is not supported")
            in_weight[one] = constants.get(f"ones{out_shape + (1,)}", np.ones(out_shape + (1,)))
    if fixed_bias is not None:
        bias[:] = constants.get(repr(fixed_bias), fixed_bias)
    has_offset = neuron_offset != NO_WEIGHT
    if agg == "sum" and fixed_bias is None:
        bias[has_offset] = neuron_offset[has_offset]
    elif has_offset.any():
        if agg == "prod" and out_shape != ():
            j = int(members[np.flatnonzero(has_offset)[0]])
            raise NeuraLogicImportError(f"{nr.describe(j)}: an offset in a product of {out_shape} values is not "
                                        "supported")
        scalar_weights = [w for w in np.unique(neuron_offset[has_offset]).tolist() if constants.weights[w].shape == ()]
        scalar_offset = has_offset & np.isin(neuron_offset, scalar_weights) & (out_shape != ())
        if scalar_offset.any():
            j = int(members[np.flatnonzero(scalar_offset)[0]])
            raise NeuraLogicImportError(
                f"{nr.describe(j)}: a scalar offset in a {agg} of {out_shape} values (NeuraLogic broadcasts it) is "
                "not supported; neurovec would need the offset computed first, as a layer of scalars read through "
                "a fixed weight of ones (as concatenations do), or give the offset the values' shape")
        # The offset is NeuraLogic's first input: unit fact times the offset weight.
        lengths, (in_layer, in_ordinal, in_weight) = prepend_inputs(lengths, has_offset, [in_layer, in_ordinal, in_weight],
                                                                    [unit_ref[0], unit_ref[1], neuron_offset[has_offset]])
    return NeuronLayer(name, counts=lengths, input_layer=in_layer, input_ordinal=in_ordinal,
                       input_weight=in_weight, bias=bias, aggregation=agg, transformation=transformation)


def _concat_layer(name, nr, members, transformation, fixed_bias, out_shape, edge_weight, edge_shape, offset,
                  layer_of, ordinal_of, unit_ref, constants, weights, shapes, layers) -> NeuronLayer:
    """NeuraLogic's concatenation ``[offset; y_1; ...; y_k]`` as neurovec's ``sum_i P_i y_i``.

    ``P_i`` is a fixed placement: a one-hot vector ``(L,)`` for a scalar ``y_i`` (scalar times vector
    broadcasts), a matrix ``(L, d)`` with an identity block for a vector; its entries are 0 and 1, so the sum is
    exact. One placement weight per (L, slot, size), shared by all neurons. neurovec multiplies an input by one
    weight only, so a weighted input ``y_i = W_i x_i`` and an offset (NeuraLogic's first input, here a unit
    fact times the offset weight) are computed first, by single-input neurons of layers appended to
    ``layers`` here (one per value shape); the returned layer reads them.
    """
    starts = nr.ptr[members]
    lengths = nr.ptr[members + 1] - starts
    edges = _edges_of(starts, lengths)
    src = nr.inputs[edges]
    columns = [layer_of[src], ordinal_of[src], edge_weight[edges], edge_shape[edges]]
    has_offset = offset[members] != NO_WEIGHT
    if has_offset.any():
        offsets = offset[members][has_offset]
        lengths, columns = prepend_inputs(lengths, has_offset, columns, [
            unit_ref[0], unit_ref[1], offsets, _weight_shape_ids(offsets, weights, shapes)])
    in_layer, in_ordinal, in_weight, in_shape = columns
    weighted = in_weight != NO_WEIGHT
    for shape_id in np.unique(in_shape[weighted]).tolist():
        rows = np.flatnonzero(weighted & (in_shape == shape_id))
        dims = "x".join(map(str, shapes.shapes[shape_id])) or "scalar"
        layers.append(NeuronLayer(_unique(f"{name}/inputs:{dims}", layers), counts=np.ones(rows.size, np.int64),
                                  input_layer=in_layer[rows], input_ordinal=in_ordinal[rows],
                                  input_weight=in_weight[rows]))
        in_layer[rows], in_ordinal[rows] = len(layers) - 1, np.arange(rows.size)

    # Slot of each input: where its elements start in the concatenation.
    n_elements = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes.shapes], dtype=np.int64)
    size = n_elements[in_shape]
    end = np.cumsum(size)
    first_edge = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    slot = end - size - np.repeat(end[first_edge] - size[first_edge], lengths)
    is_vector = np.array([len(s) == 1 for s in shapes.shapes])[in_shape]
    (length,) = out_shape
    keys, inverse = np.unique(np.stack([slot, size, is_vector]), axis=1, return_inverse=True)
    placement = []
    for start, d, vector in keys.T.tolist():
        if vector:
            value = np.zeros((length, d))
            value[start + np.arange(d), np.arange(d)] = 1.0
            placement.append(constants.get(f"place{length}[{start}:{start + d}]", value))
        else:
            placement.append(constants.get(f"place{length}[{start}]", np.eye(length)[start]))
    bias = np.full(members.size, NO_WEIGHT if fixed_bias is None else constants.get(repr(fixed_bias), fixed_bias))
    return NeuronLayer(name, counts=lengths, input_layer=in_layer, input_ordinal=in_ordinal,
                       input_weight=np.asarray(placement, dtype=np.int64)[inverse.reshape(-1)], bias=bias,
                       aggregation="sum", transformation=transformation)


# -- outputs and weights back -------------------------------------------------------------------------------------
def neuralogic_outputs(model, built) -> np.ndarray:
    """NeuraLogic's own evaluation (``model.test``) as an array ``(n_samples, *shape)``, float64.

    Raises ValueError naming two samples when their outputs differ in shape (e.g. softmax aggregations over
    different numbers of groundings), which no single array holds.
    """
    outputs = [np.asarray(value, dtype=np.float64) for value in model.test(built)]
    differs = [k for k, value in enumerate(outputs) if value.shape != outputs[0].shape]
    if differs:
        k = differs[0]
        raise ValueError(f"NeuraLogic's output of sample {k} has shape {outputs[k].shape} but sample 0's has "
                         f"{outputs[0].shape}: evaluate samples with equal output shapes separately")
    return np.asarray(outputs, dtype=np.float64).reshape((len(outputs),) + (outputs[0].shape if outputs else ()))


def weights_to_neuralogic(module, model) -> None:
    """Copy a neurovec module's learnable weights into the NeuraLogic model (by weight name).

    ``module`` is anything with a ``weights`` mapping name -> tensor (a compiled module or the reference
    engine built from :func:`from_neuralogic`'s graph). Afterwards NeuraLogic's evaluation of the same
    samples gives the module's outputs.
    """
    java_weights = list(model._neural_model.getAllWeights())
    names = weight_names(java_weights)
    state = model.state_dict()
    missing = []
    for w in java_weights:
        index = int(w.index)
        if index < 0 or not w.isLearnable():
            continue
        if names[index] not in module.weights:
            missing.append(names[index])
            continue
        value = module.weights[names[index]].detach().to("cpu").double().numpy()
        state["weights"][index] = float(value) if value.ndim == 0 else value.tolist()
    if missing:
        raise KeyError(f"the module has no weights named {missing[:5]} (was it imported from this model?)")
    model.load_state_dict(state)
