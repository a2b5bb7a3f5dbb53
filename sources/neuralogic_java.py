"""Bulk reads of NeuraLogic's Java neuron networks, a few JPype calls per *sample*.

Reading a network neuron by neuron through JPype costs one Python-Java round trip
per attribute per neuron (and per input), which for a dataset such as PROTEINS is
slower than NeuraLogic's own build. Instead, this module turns Java getters into
Java functional objects (``java.lang.invoke`` method handles wrapped by
``MethodHandleProxies``) and runs ``Stream`` pipelines over a sample's
``allNeuronsTopologic`` list entirely inside the JVM: each attribute of all the
neurons of a sample comes back as one ``int[]``, one ``double[]`` or one joined
string. Nothing here needs to be compiled, and no neuron is modified.

(NeuraLogic's own ``NeuralSerializer`` is not used: it renumbers the neurons in
place, which breaks the identity of neurons shared between samples, it prints
values with two decimals and it reports a missing offset as weight 0.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SampleArrays", "JavaReader"]

_NEURONS = "cz.cvut.fel.ida.neural.networks.structure.components.neurons."


@dataclass
class SampleArrays:
    """The distinct neurons of all samples, in NeuraLogic's topological order.

    Per neuron: ``index``, ``count`` (inputs), ``kind`` (Java simple class name), ``transformation`` and
    ``combination`` (simple class names of its functions, ``""`` for none). Per edge: ``inputs`` (neuron
    indices). Per *weighted* neuron (``weighted`` mask, in order): its input weight indices flattened into
    ``weights``, and ``offset`` (weight index). Per fact neuron (``kind == "FactNeuron"``, in order): its
    value flattened into ``fact_values`` (``fact_lengths`` each), ``fact_shapes`` (Java ``size()``:
    ``()``, ``(n, 1)`` column, ``(1, n)`` row or ``(r, c)``), ``fact_classes`` and ``fact_learnable``.
    ``query``: each sample's output neuron index. :meth:`names` reads neuron names on demand.
    """

    index: np.ndarray
    count: np.ndarray
    kind: np.ndarray
    transformation: np.ndarray
    combination: np.ndarray
    inputs: np.ndarray
    weighted: np.ndarray
    weights: np.ndarray
    offset: np.ndarray
    fact_values: np.ndarray
    fact_lengths: np.ndarray
    fact_shapes: list
    fact_classes: np.ndarray
    fact_learnable: np.ndarray
    query: np.ndarray
    java_neurons: object = None
    # () -> per neuron, the class of the function its state computes with (see JavaReader.state_function).
    state_functions: object = None
    # () -> per neuron, the slope of its LeakyReLu transformation (NaN for other transformations).
    leaky_slopes: object = None
    # () -> per neuron, the index its AtIndex transformation picks (-1 for other transformations).
    at_indices: object = None
    # () -> per neuron, whether its running sum or average is NeuraLogic's constant ONE (JavaReader.stuck_at_one).
    stuck_at_one: object = None

    def names(self, positions) -> list:
        """Neuron names (NeuraLogic's ``getName()``), one JVM call each: for messages and layer names."""
        return [str(self.java_neurons.get(int(k)).getName()) for k in positions]


def _simple_name(java_object) -> str:
    return "" if java_object is None else str(java_object.getClass().getSimpleName())


class JavaReader:
    """Builds the Java functional objects once per JVM; :meth:`read` reads one sample."""

    def __init__(self):
        import jpype

        J = jpype.JClass
        self._jpype = jpype
        MH = J("java.lang.invoke.MethodHandles")
        MT = J("java.lang.invoke.MethodType")
        proxies = J("java.lang.invoke.MethodHandleProxies")
        lookup = MH.publicLookup()
        cls = lambda name: J(name).class_  # noqa: E731
        base, weighted = cls(_NEURONS + "BaseNeuron"), cls(_NEURONS + "WeightedNeuron")
        fact = cls(_NEURONS + "types.FactNeuron")
        weight, value = cls("cz.cvut.fel.ida.algebra.weights.Weight"), cls("cz.cvut.fel.ida.algebra.values.Value")
        obj, string, klass = cls("java.lang.Object"), cls("java.lang.String"), cls("java.lang.Class")
        array_list, collection = cls("java.util.ArrayList"), cls("java.util.Collection")
        stream, double_stream = cls("java.util.stream.Stream"), cls("java.util.stream.DoubleStream")
        arrays, objects = cls("java.util.Arrays"), cls("java.util.Objects")
        int_t, bool_t = J("java.lang.Integer").TYPE, J("java.lang.Boolean").TYPE
        int_array, double_array = jpype.JArray(jpype.JInt).class_, jpype.JArray(jpype.JDouble).class_
        computation = cls(_NEURONS + "states.State$Neural$Computation")

        def then(first, second):
            """``second(first(x))`` as one method handle (casting between the two)."""
            second = second.asType(MT.methodType(second.type().returnType(), first.type().returnType()))
            return MH.filterReturnValue(first, second)

        def fn(handle, interface="java.util.function.Function"):
            return proxies.asInterfaceInstance(cls(interface), handle)

        virtual = lambda c, name, ret, *args: lookup.findVirtual(c, name, MT.methodType(ret, *args))  # noqa: E731
        neuron_index = lookup.findGetter(base, "index", int_t)
        weight_index = lookup.findGetter(weight, "index", int_t)
        offset = lookup.findGetter(weighted, "offset", weight)
        as_stream = virtual(collection, "stream", stream)
        # A neuron's current value: for facts, the value they were built with (1.0 when none was given).
        state_value = then(MH.insertArguments(virtual(base, "getComputationView", computation, int_t), 1,
                                              J("java.lang.Integer").valueOf(0)),
                           virtual(computation, "getValue", value))
        as_array = virtual(value, "getAsArray", double_array)
        is_instance = virtual(klass, "isInstance", bool_t, obj)

        self.index = fn(neuron_index, "java.util.function.ToIntFunction")
        self.count = fn(virtual(base, "inputCount", int_t), "java.util.function.ToIntFunction")
        self.inputs = fn(then(virtual(base, "getInputs", array_list), as_stream))
        # A function's class as an int (hash of its class name; null as that of "null"), decoded in Python
        # from one representative per code: per-neuron strings would cost more than the whole read.
        sentinel = lookup.findStatic(objects, "requireNonNullElse", MT.methodType(obj, obj, obj))
        class_code = then(then(then(MH.insertArguments(sentinel, 1, J("java.lang.String")("null")),
                                    virtual(obj, "getClass", klass)), virtual(klass, "getName", string)),
                          virtual(string, "hashCode", int_t))
        to_int = "java.util.function.ToIntFunction"
        self.kind = fn(class_code, to_int)
        self.transformation = fn(then(virtual(base, "getTransformation",
                                              cls("cz.cvut.fel.ida.algebra.functions.Transformation")), class_code),
                                 to_int)
        self.combination = fn(then(virtual(base, "getCombination",
                                           cls("cz.cvut.fel.ida.algebra.functions.Combination")), class_code),
                              to_int)
        self.is_weighted = fn(is_instance.bindTo(weighted), "java.util.function.Predicate")
        self.is_fact = fn(is_instance.bindTo(fact), "java.util.function.Predicate")
        self.weights = fn(then(virtual(weighted, "getWeights", array_list), as_stream))
        self.weight_index = fn(weight_index, "java.util.function.ToIntFunction")
        self.offset = fn(then(offset, weight_index), "java.util.function.ToIntFunction")
        self.fact_values = fn(then(then(state_value, as_array),
                                   lookup.findStatic(arrays, "stream", MT.methodType(double_stream, double_array))))
        self.fact_lengths = fn(then(then(state_value, as_array), MH.arrayLength(double_array)),
                               "java.util.function.ToIntFunction")
        size = then(state_value, virtual(value, "size", int_array))
        self.fact_ndim = fn(then(size, MH.arrayLength(int_array)), to_int)
        self.fact_sizes = fn(then(size, lookup.findStatic(arrays, "stream", MT.methodType(
            cls("java.util.stream.IntStream"), int_array))))
        self.fact_classes = fn(then(state_value, class_code), to_int)
        self.fact_learnable = fn(then(then(offset, virtual(weight, "isLearnable", bool_t)),
                                      lookup.findStatic(cls("java.lang.Boolean"), "hashCode",
                                                        MT.methodType(int_t, bool_t))), to_int)
        self.to_list = J("java.util.stream.Collectors").toList
        self._unbox = fn(virtual(cls("java.lang.Integer"), "intValue", int_t), "java.util.function.ToIntFunction")
        self._hash_set = J("java.util.HashSet")
        self._set_add = virtual(self._hash_set.class_, "add", bool_t, obj)
        self._fn = fn
        # sample -> its neurons' stream, and sample -> its output neuron's index, through public fields.
        field = lambda c, name: lookup.unreflectGetter(cls(c).getField(name))  # noqa: E731
        query = field("cz.cvut.fel.ida.learning.LearningSample", "query")
        evidence = then(query, field("cz.cvut.fel.ida.learning.Query", "evidence"))
        topologic = then(evidence, field("cz.cvut.fel.ida.neural.networks.structure.components.types."
                                         "TopologicNetwork", "allNeuronsTopologic"))
        self.sample_neurons = fn(then(topologic, as_stream))
        self.query_index = fn(then(then(query, field(_NEURONS + "QueryNeuron", "neuron")),
                                   virtual(cls(_NEURONS + "Neurons"), "getIndex", cls("java.lang.Integer"))))
        self._array_list = J("java.util.ArrayList")
        # The function a neuron's state really computes with. Usually it is what getCombination() and
        # getTransformation() say, but NeuraLogic replaces a softmax/sparsemax of a single input by a constant
        # one (ConstantOne) and then reports neither. The field is private: read it through a getter made from
        # the reflected field (setAccessible is allowed: NeuraLogic runs in the unnamed module).
        standard = cls(_NEURONS + "states.States$ComputationStateStandard")
        fcn_field = standard.getDeclaredField("fcnState")
        fcn_field.setAccessible(True)
        state = MH.insertArguments(virtual(base, "getComputationView", computation, int_t), 1,
                                   J("java.lang.Integer").valueOf(0))
        self._fcn_field = fcn_field
        self.state_function = fn(MH.guardWithTest(
            then(state, is_instance.bindTo(standard)),
            then(then(state, lookup.unreflectGetter(fcn_field)), class_code),
            MH.dropArguments(MH.constant(int_t, J("java.lang.Integer").valueOf(0)), 0, base)), to_int)

        # LeakyReLu(slope) keeps its slope in the function object (transformation=leakyrelu(0.2), as in GATv2):
        # per neuron, slope() if the transformation is a LeakyReLu, else NaN.
        leaky = cls("cz.cvut.fel.ida.algebra.functions.transformation.elementwise.LeakyReLu")
        transformation = virtual(base, "getTransformation", cls("cz.cvut.fel.ida.algebra.functions.Transformation"))
        double_t = J("java.lang.Double").TYPE
        self.leaky_slope = fn(MH.guardWithTest(
            then(transformation, is_instance.bindTo(leaky)), then(transformation, virtual(leaky, "slope", double_t)),
            MH.dropArguments(MH.constant(double_t, J("java.lang.Double")(float("nan"))), 0, base)),
            "java.util.function.ToDoubleFunction")

        # AtIndex (softmax(agg_terms=[...]), as in GATv2) keeps the element it picks in a private field: per
        # neuron, that index if the transformation is an AtIndex, else -1.
        at_index = cls("cz.cvut.fel.ida.algebra.functions.transformation.joint.AtIndex")
        index_field = at_index.getDeclaredField("index")
        index_field.setAccessible(True)
        self.at_index = fn(MH.guardWithTest(
            then(transformation, is_instance.bindTo(at_index)), then(transformation, lookup.unreflectGetter(index_field)),
            MH.dropArguments(MH.constant(int_t, J("java.lang.Integer").valueOf(-1)), 0, base)), to_int)

        # A running sum or average that accumulates into NeuraLogic's constant ONE (see from_neuralogic): per
        # neuron, whether its state's accumulator (combinedInputs, private to Aggregation$State; inside a
        # CompoundState when the neuron also has a transformation) is the constant. Only Sum and Average keep
        # their accumulator between evaluations (invalidate() zeroes it in place; the constant ignores that and
        # every increment); Maximum and Minimum reset theirs to null, so holding ONE there is a legitimate value.
        compound = cls("cz.cvut.fel.ida.algebra.functions.CompoundState")
        compound_field = compound.getDeclaredField("combinationState")
        compound_field.setAccessible(True)
        combined_field = cls("cz.cvut.fel.ida.algebra.functions.Aggregation$State").getDeclaredField("combinedInputs")
        combined_field.setAccessible(True)
        to_object = lambda handle: handle.asType(MT.methodType(obj, obj))  # noqa: E731
        null = MH.dropArguments(MH.constant(obj, None), 0, obj)
        guard = lambda c, then_handle, else_handle: MH.guardWithTest(  # noqa: E731
            is_instance.bindTo(c), to_object(then_handle), else_handle)
        fcn_state = guard(standard, lookup.unreflectGetter(fcn_field), null)
        combination_state = guard(compound, lookup.unreflectGetter(compound_field), MH.identity(obj))
        combined = lookup.unreflectGetter(combined_field)
        accumulator = guard(cls("cz.cvut.fel.ida.algebra.functions.aggregation.Sum$AggregationState"), combined,
                            guard(cls("cz.cvut.fel.ida.algebra.functions.aggregation.Average$AggregationState"),
                                  combined, null))
        is_one = then(is_instance.bindTo(cls("cz.cvut.fel.ida.algebra.values.One")),
                      lookup.findStatic(cls("java.lang.Boolean"), "hashCode", MT.methodType(int_t, bool_t)))
        self.stuck_at_one = fn(then(then(then(then(state, fcn_state), combination_state), accumulator), is_one),
                               to_int)

    def _state_function_name(self, neuron) -> str:
        """The class of a neuron's state function, e.g. ``ConstantOne$State`` (``""`` for none)."""
        state = neuron.getComputationView(0)
        if not self._fcn_field.getDeclaringClass().isInstance(state):
            return ""
        function = self._fcn_field.get(state)
        return "" if function is None else str(function.getClass().getName()).rsplit(".", 1)[-1]


    def _ints(self, int_stream) -> np.ndarray:
        return np.asarray(memoryview(int_stream.toArray()), dtype=np.int64).copy()

    @staticmethod
    def _decode(codes: np.ndarray, neurons, get, positions=None, named=False) -> np.ndarray:
        """Class-name codes -> simple class names, reading one representative neuron per distinct code
        (``get(neuron)`` is the Java object whose class is named, or the name itself if ``named``)."""
        unique, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        rows = first if positions is None else positions[first]
        name = (lambda n: get(n)) if named else (lambda n: _simple_name(get(n)))  # noqa: E731
        names = np.array([name(neurons.get(int(k))) for k in rows] + [""], dtype=object)
        return names[inverse.reshape(-1)] if codes.size else names[:0]

    def read(self, java_samples) -> SampleArrays:
        """The distinct neurons of all samples in a few dozen JVM calls (not per sample, not per neuron).

        Samples of one example share neurons (Nations: thousands of queries over one network); a neuron
        is kept at its first appearance, which keeps the concatenated order topological.
        """
        samples = self._array_list(java_samples)
        seen = self._fn(self._set_add.bindTo(self._hash_set()), "java.util.function.Predicate")
        neurons = samples.stream().flatMap(self.sample_neurons).filter(seen).collect(self.to_list())
        queries = self._ints(samples.stream().map(self.query_index).mapToInt(self._unbox))
        stream = neurons.stream
        weighted_stream = lambda: stream().filter(self.is_weighted)  # noqa: E731
        fact_stream = lambda: stream().filter(self.is_fact)  # noqa: E731
        decode = lambda codes, get: self._decode(codes, neurons, get)  # noqa: E731
        kind = decode(self._ints(stream().mapToInt(self.kind)), lambda n: n)
        ndim = self._ints(fact_stream().mapToInt(self.fact_ndim))
        sizes = self._ints(fact_stream().flatMapToInt(self.fact_sizes))
        split = np.split(sizes, np.cumsum(ndim)[:-1]) if ndim.size else []
        facts = np.flatnonzero(kind == "FactNeuron")
        fact_codes = self._ints(fact_stream().mapToInt(self.fact_classes))
        arrays = SampleArrays(
            index=self._ints(stream().mapToInt(self.index)),
            count=self._ints(stream().mapToInt(self.count)),
            kind=kind,
            transformation=decode(self._ints(stream().mapToInt(self.transformation)),
                                  lambda n: n.getTransformation()),
            combination=decode(self._ints(stream().mapToInt(self.combination)), lambda n: n.getCombination()),
            inputs=self._ints(stream().flatMap(self.inputs).mapToInt(self.index)),
            weighted=np.isin(kind, list(_WEIGHTED_KINDS)),
            weights=self._ints(weighted_stream().flatMap(self.weights).mapToInt(self.weight_index)),
            offset=self._ints(weighted_stream().mapToInt(self.offset)),
            fact_values=np.asarray(memoryview(fact_stream().flatMapToDouble(self.fact_values).toArray()),
                                   dtype=np.float64).copy(),
            fact_lengths=self._ints(fact_stream().mapToInt(self.fact_lengths)),
            fact_shapes=[tuple(int(d) for d in s) for s in split],
            fact_classes=self._decode(fact_codes, neurons, lambda n: n.getComputationView(0).getValue(),
                                      positions=facts),
            fact_learnable=self._ints(fact_stream().mapToInt(self.fact_learnable)) == 1231,  # Boolean.hashCode
            query=queries,
            java_neurons=neurons,
        )
        if int(arrays.weighted.sum()) != arrays.offset.size:
            # A WeightedNeuron subclass this module does not know: the per-weighted-neuron arrays would misalign.
            unknown = sorted(set(arrays.kind.tolist()) - _WEIGHTED_KINDS - _UNWEIGHTED_KINDS)
            raise NotImplementedError(f"NeuraLogic neuron classes {unknown} are not supported by neurovec's importer")
        arrays.state_functions = lambda: self._decode(  # on demand: only for neurons reporting no function
            self._ints(neurons.stream().mapToInt(self.state_function)), neurons, self._state_function_name,
            named=True)
        arrays.leaky_slopes = lambda: np.asarray(memoryview(  # on demand: only if some neuron has a LeakyReLu
            neurons.stream().mapToDouble(self.leaky_slope).toArray()), dtype=np.float64).copy()
        arrays.at_indices = lambda: self._ints(  # on demand: only if some neuron has an AtIndex
            neurons.stream().mapToInt(self.at_index))
        arrays.stuck_at_one = lambda: self._ints(  # on demand: only where a sum or average could hold it
            neurons.stream().mapToInt(self.stuck_at_one)) == 1231  # Boolean.hashCode(true)
        return arrays


# Subclasses of WeightedNeuron in NeuraLogic 0.9.2 (checked against the Java predicate in tests).
_WEIGHTED_KINDS = frozenset({"FactNeuron", "WeightedAtomNeuron", "WeightedRuleNeuron"})
_UNWEIGHTED_KINDS = frozenset({"AtomNeuron", "RuleNeuron", "AggregationNeuron", "SplittableAggregationNeuron",
                               "NegationNeuron"})
