"""The NeuraLogic importer against PyNeuraLogic 0.9.2 itself (no mocks).

Every check compares three numbers per sample: NeuraLogic's ``model.test``, neurovec's reference
engine, and the compiled module under the default and the most aggressive preset, in float64.
One JVM serves the whole session (PyNeuraLogic starts it on first use).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

neuralogic = pytest.importorskip("neuralogic", reason='PyNeuraLogic is not installed (pip install -e ".[neuralogic]")')
if shutil.which("java") is None:  # pragma: no cover - CI has Java
    pytest.skip("PyNeuraLogic needs a Java runtime and none is on the PATH", allow_module_level=True)

import neuralogic.logging  # noqa: E402
from neuralogic.core import (  # noqa: E402
    Aggregation, Combination, Metadata, Model, R, Settings, Transformation, V)
from neuralogic.dataset import Dataset  # noqa: E402
from neuralogic.utils import data as nl_data  # noqa: E402

import neurovec  # noqa: E402
from neurovec.compiler import Settings as CompileSettings, list_presets  # noqa: E402
from neurovec.engines.reference import ReferenceModule  # noqa: E402
from neurovec.sources.neuralogic import (  # noqa: E402
    NeuraLogicImportError, from_neuralogic, neuralogic_outputs, weights_to_neuralogic)
from neurovec.sources.neuralogic_tu import gnn_model, tu_dataset  # noqa: E402

from .equivalence import assert_equivalent  # noqa: E402

neuralogic.logging.clear_handlers()

PRUNED = dict(chain_pruning=True, iso_value_compression=True)       # NeuraLogic's defaults
UNPRUNED = dict(chain_pruning=False, iso_value_compression=False)   # the template's neurons, one for one
PRESETS = ["default", list_presets()[-1]]                           # default and the most aggressive


def build(model, dataset, **settings):
    model.build(Settings(**settings))
    return model.build_dataset(dataset)


def assert_same(model, built, presets=PRESETS, atol=1e-9):
    """NeuraLogic, the reference engine and the compiled modules agree; returns the graph."""
    graph = from_neuralogic(model, built, warn=False)
    expected = neuralogic_outputs(model, built)
    if graph.n_neurons <= 5000:  # the neuron-by-neuron engine is slow; big graphs rely on the compiled ones
        reference = ReferenceModule(graph, torch.float64)().detach().numpy()
        np.testing.assert_allclose(reference.reshape(expected.shape), expected, rtol=0, atol=atol)
    for preset in presets:
        module = neurovec.compile(graph, CompileSettings.preset(preset), dtype=torch.float64)
        got = module().detach().numpy()
        np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=0, atol=atol, err_msg=preset)
    return graph


def assert_same_gradients(model, built, graph, eps=1e-6, atol=1e-6):
    """The reference engine's gradients of the summed outputs equal NeuraLogic's central finite differences, for
    every learnable scalar weight (NeuraLogic 0.9.2 has no gradient API that would give them directly)."""
    reference = ReferenceModule(graph, torch.float64)
    reference().sum().backward()
    names = {name.split(".", 1)[1]: p for name, p in reference.named_parameters()}
    state = model.state_dict()
    java = {int(w.index): str(w.name) for w in model._neural_model.getAllWeights()}
    checked = 0
    for index, value in list(state["weights"].items()):
        if not isinstance(value, float) or java.get(index) not in names:
            continue
        sums = []
        for step in (eps, -eps):
            state["weights"][index] = value + step
            model.load_state_dict(state)
            sums.append(neuralogic_outputs(model, built).sum())
        state["weights"][index] = value
        model.load_state_dict(state)
        expected = (sums[0] - sums[1]) / (2 * eps)
        grad = names[java[index]].grad  # None: unused (NeuraLogic's iso compression merged its neurons away)
        np.testing.assert_allclose(0.0 if grad is None else float(grad), expected, rtol=0, atol=atol,
                                   err_msg=java[index])
        checked += 1
    assert checked


def template(text: str, tmp_path, name="template.txt") -> Model:
    path = tmp_path / name
    path.write_text(text)
    return Model(model_file=str(path))


def scalar_dataset(values, head="h") -> Dataset:
    ds = Dataset()
    for a, b in values:
        ds.add(R.get(head)[1.0], [R.a[a], R.b[b]])
    return ds


INPUTS = [(-1.3, 0.25), (0.0, 2.0), (0.4, -0.5), (2.0, 3.0)]


# -- neuron semantics ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transformation", [
    "sigmoid", "tanh", "signum", "lukasiewicz", "relu", "leakyrelu", "reverse", "inverse", "exp", "identity"])
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_transformations(tmp_path, transformation, settings):
    model = template(f"h :- 1.5 a, -2.0 b, 0.25. [transformation={transformation}]\n"
                     "h/0 [transformation=identity]\n", tmp_path)
    assert_same(model, build(model, scalar_dataset(INPUTS), **settings))


@pytest.mark.parametrize("combination", ["sum", "avg", "max", "min", "product", "elproduct", "count"])
@pytest.mark.parametrize("offset", ["", ", 0.5"], ids=["no-offset", "offset"])
def test_combinations_and_offsets(tmp_path, combination, offset):
    """The offset is NeuraLogic's first combination input: it counts in an average, a max, a product."""
    model = template(f"h :- 1.0 a, 1.0 b{offset}. [combination={combination}, transformation=tanh]\n"
                     "h/0 [transformation=identity]\n", tmp_path)
    assert_same(model, build(model, scalar_dataset(INPUTS), **UNPRUNED))


def test_negation_is_one_minus(tmp_path):
    model = template("h :- 1.5 a, ~b. [transformation=sigmoid]\nh/0 [transformation=identity]\n", tmp_path)
    assert_same(model, build(model, scalar_dataset(INPUTS), **PRUNED))
    graph = assert_same(model, build(model, scalar_dataset(INPUTS), **UNPRUNED))
    assert any(":Reverse" in layer.name for layer in graph.layers)  # the NegationNeuron's 1 - x


@pytest.mark.parametrize("aggregation", ["sum", "avg", "max", "min"])
def test_aggregations_and_predicate_offset(tmp_path, aggregation):
    model = template(f"2.0 h(X) :- 1.5 a(X), -1.0 b(X), 0.25. [aggregation={aggregation}]\n"
                     "h(X) :- 3.0 c(X).\n"
                     f"q :- h(X). [aggregation={aggregation}, transformation=sigmoid]\n"
                     "h/1 0.1\n", tmp_path)
    ds = Dataset()
    ds.add(R.q[1.0], [R.a("x")[0.7], R.b("x")[0.2], R.a("y")[0.3], R.b("y")[-1.0], R.c("x")[1 / 3], R.c("z")])
    ds.add(R.q[0.0], [R.a("x")[-0.7], R.b("x")[0.9], R.c("x")[2.0]])
    for settings in (PRUNED, UNPRUNED):
        assert_same(model, build(model, ds, **settings))


@pytest.mark.parametrize("slope", [0.2, 0.01, 1.5, -0.5])
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_leaky_relu_slope(slope, settings):
    """Transformation.LEAKY_RELU(0.2) (GATv2's) keeps its slope: it was imported as neurovec's 0.01. Vector
    values, and a second rule with the default slope in the same depth (its layer must not be merged)."""
    model = Model()
    model += (R.h <= (R.a[1.5], R.b[-2.0])) | Metadata(transformation=Transformation.LEAKY_RELU(slope))
    model += (R.g <= (R.a[1.5], R.b[-2.0])) | Metadata(transformation=Transformation.LEAKY_RELU)
    model += (R.v <= (R.c[[[1.0, -2.0], [0.5, 0.25]]], R.a[[0.5, -1.0]])) | \
        Metadata(transformation=Transformation.LEAKY_RELU(slope))
    model += R.q <= (R.h, R.g, R.v[[[0.5, -1.0]]])
    for predicate in ("h", "g", "v", "q"):
        model += R.get(predicate) / 0 | Metadata(transformation=Transformation.IDENTITY)
    built = build(model, _leaky_dataset(), **settings)
    graph = assert_same(model, built)
    assert_same_gradients(model, built, graph)
    if slope == 0.01:  # the default is neurovec's own leaky_relu, no extra layers
        assert not any("leakyrelu(" in layer.name for layer in graph.layers)


def _leaky_dataset() -> Dataset:
    ds = Dataset()
    for a, b, c in [(-1.3, 0.25, [1.0, 2.0]), (0.4, -0.5, [-1.0, 3.0]), (2.0, 3.0, [0.5, -0.5])]:
        ds.add(R.q[1.0], [R.a[a], R.b[b], R.c[c]])
    return ds


@pytest.mark.parametrize("transformation", ["reverse", "lukasiewicz", "tanh"])
def test_scalar_offset_of_vector_rules(tmp_path, transformation):
    """A scalar offset broadcasts over a rule's vector value. In a sum it is the bias (reverse's own fixed bias
    then moves to a layer after it: this was a GraphError about input shapes); in an average it is refused."""
    model = template(f"h :- {{2,2}} a, {{2,2}} b, 0.3. [transformation={transformation}]\n"
                     "q :- {1,2} h.\nh/0 [transformation=identity]\nq/0 [transformation=identity]\n", tmp_path)
    ds = Dataset()
    ds.add(R.q[0.0], [R.a[[1.0, -2.0]], R.b[[0.5, 0.25]]])
    ds.add(R.q[1.0], [R.a[[-0.5, 1.0]], R.b[[2.0, -1.0]]])
    built = build(model, ds, **UNPRUNED)
    assert_same_gradients(model, built, assert_same(model, built))
    model = template("h :- {2,2} a, {2,2} b, 0.3. [combination=avg]\nq :- {1,2} h.\n", tmp_path, "avg.txt")
    with pytest.raises(NeuraLogicImportError, match=r"WeightedRuleNeuron .*a scalar offset in a mean of \(2,\) "
                                                    r"values .*neurovec would need"):
        from_neuralogic(model, build(model, ds, **UNPRUNED), warn=False)


def test_vector_and_matrix_weights():
    """W . x: matrices multiply column vectors and matrices, scalars broadcast, {1, n} is a row vector."""
    matrix = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    model = Model()
    model += R.h <= (R.a[[1.0, 2.0]], R.b[matrix], R.c[[[0.5, -1.0, 0.0], [2.0, 1.0, -3.0]]])
    model += R.g[1, 2] <= R.h
    model += R.q <= (R.g, R.e)  # g is a vector of length 1 here: {1, 2} is a row vector (see docs)
    model += R.h / 0 | Metadata(transformation=Transformation.TANH)
    model += R.q / 0 | Metadata(transformation=Transformation.SIGMOID)
    ds = Dataset()
    ds.add(R.q[1.0], [R.a, R.b[[1.0, 10.0, 100.0]], R.c[[0.1, 0.2, 0.3]], R.e])
    ds.add(R.q[0.0], [R.a[2.0], R.b[[-1.0, 0.5, 0.0]], R.c[[1.0, -0.2, 0.3]], R.e])
    for settings in (PRUNED, UNPRUNED):
        assert_same(model, build(model, ds, **settings))


def test_softmax_transformation_on_vectors():
    model = Model()
    model += R.h <= (R.a[[1.0, 2.0]], R.b[[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]])
    model += R.h / 0 | Metadata(transformation=Transformation.SOFTMAX)
    ds = Dataset()
    ds.add(R.h[[1.0, 0.0]], [R.a, R.b[[1.0, -1.0, 3.0]]])
    assert_same(model, build(model, ds, **UNPRUNED))


# -- concat and softmax combinations ---------------------------------------------------------------------------
def three_scalars() -> Dataset:
    ds = Dataset()
    for a, b, c in [(-1.3, 0.25, 2.0), (0.0, 2.0, -0.5), (0.4, -0.5, 0.0)]:
        ds.add(R.h[1.0], [R.a[a], R.b[b], R.c[c]])
    return ds


@pytest.mark.parametrize("combination", ["concat", "softmax"])
@pytest.mark.parametrize("body, transformation", [
    ("a, b, c, a", "identity"),               # unweighted scalars, a repeated: one slot per input, in body order
    ("2.0 a, -1.5 b, c, 0.25", "identity"),   # weighted, and the offset: the first slot
    ("2.0 a, -1.5 b, c, 0.25", "reverse"),    # the neuron's transformation comes after the combination
    ("2.0 a", "identity"),                    # one input: no combination, except softmax: the constant 1
    ("2.0 a", "sigmoid"),                     # ... unless transformed: then softmax of a length-1 vector
], ids=["unweighted", "weighted-offset", "weighted-reverse", "one-input", "one-input-sigmoid"])
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_concat_and_softmax_of_scalars(tmp_path, combination, body, transformation, settings):
    model = template(f"h :- {body}. [combination={combination}, transformation={transformation}]\n", tmp_path)
    assert_same(model, build(model, three_scalars(), **settings))


@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_concat_of_vectors_and_scalars(tmp_path, settings):
    """Slots of any length: a matrix-weighted vector, a vector, a scalar fact, a vector weight times a scalar and a
    vector offset (first), then a layer reading the concatenation as a column vector."""
    model = template("h :- {3,2} a, b, c, {2} c, [0.5, -1.0]. [combination=concat, transformation=tanh]\n"
                     "q :- {2,10} h. [transformation=sigmoid]\n", tmp_path)
    ds = Dataset()
    ds.add(R.q[[1.0, 0.0]], [R.a[[1.0, 2.0]], R.b[[0.5, -0.25]], R.c[0.3]])
    ds.add(R.q[[0.0, 1.0]], [R.a[[-1.0, 0.5]], R.b[[2.0, 1.0]], R.c[-1.7]])
    graph = assert_same(model, build(model, ds, **settings))
    # Placements are fixed and shared: one per (length, slot); offset and weighted inputs get a layer first.
    placements = [w for w in graph.weights if w.name.startswith("neuralogic:place")]
    assert all(not w.learnable for w in placements) and len(placements) == 5
    assert any("/inputs" in layer.name for layer in graph.layers)


@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_softmax_over_scalars_from_vectors(settings):
    """softmax over a neuron's inputs (NeuraLogic's softmax takes scalar inputs only: vector inputs fail its
    build), here of dot products of vectors: in a rule (s), and in an atom combining two rules (t); both feed
    a vector layer."""
    model = Model()
    model += (R.s <= (R.a[[[1.0, -0.5]]], R.b[[[0.25, 2.0]]], R.a[[[-1.0, 0.0]]])) | \
        Metadata(combination=Combination.SOFTMAX)
    model += R.t <= (R.a[[[0.5, 0.5]]], R.b[[[1.0, 1.0]]])
    model += R.t <= R.b[[[0.5, -0.5]]]
    model += R.t / 0 | Metadata(combination=Combination.SOFTMAX)
    model += (R.h <= (R.s[[[1.0, 0.0, -1.0], [2.0, 1.0, 0.5]]], R.t[[[1.0, 2.0], [-1.0, 0.5]]])) | \
        Metadata(transformation=Transformation.TANH)
    ds = Dataset()
    ds.add(R.h[[1.0, 0.0]], [R.a[[1.0, 2.0]], R.b[[0.5, -0.25]]])
    ds.add(R.h[[0.0, 1.0]], [R.a[[-1.0, 0.5]], R.b[[2.0, 1.0]]])
    assert_same(model, build(model, ds, **settings))


@pytest.mark.parametrize("combination, facts, match", [
    ("sparsemax", [R.a[0.5], R.b[-1.0]], r"combination 'Sparsemax' .*'sparsemax' transformation"),
    ("concat", [R.a[[[1.0, 2.0], [3.0, 4.0]]], R.b[[1.0, 2.0]]], r"concatenation of matrix values"),
])
def test_unsupported_combination_names_neuron(tmp_path, combination, facts, match):
    model = template(f"h :- a, b. [combination={combination}]\n", tmp_path)
    ds = Dataset()
    ds.add(R.h[1.0], facts)
    built = build(model, ds, **UNPRUNED)
    with pytest.raises(NeuraLogicImportError, match=r"neuron \d+ \(RuleNeuron .*" + match):
        from_neuralogic(model, built, warn=False)


def softmax_of_one_grounding(first: bool) -> Model:
    """h is a softmax aggregation over the groundings of a(X) (one here: NeuraLogic's constant ONE) plus a second
    rule; ``first``: the softmax rule is h's first input."""
    model = Model()
    softmax_rule = (R.h <= R.a(V.X)[2.0]) | Metadata(aggregation=Aggregation.SOFTMAX)
    other_rule = R.h <= R.b[0.5]
    model += [softmax_rule, other_rule] if first else [other_rule, softmax_rule]
    model += R.q[1.5] <= R.h
    model += R.h / 0 | Metadata(transformation=Transformation.IDENTITY)
    model += R.q / 0 | Metadata(transformation=Transformation.IDENTITY)
    return model


STUCK = r"neuron \d+ \({kind} '{name}'\): NeuraLogic computes it as a constant .*constant ONE.*two or more groundings"


@pytest.mark.parametrize("settings", [UNPRUNED, dict(chain_pruning=True, iso_value_compression=False),
                                      dict(prune_only_identities=True, iso_value_compression=False)],
                         ids=["unpruned", "pruned", "identities-pruned"])
def test_softmax_aggregation_of_one_grounding(settings):
    """NeuraLogic replaces a softmax of one value by its constant ONE and, when that is the first value of a neuron's
    running sum, adds the other inputs into the constant, which loses them (h = 1, not 1 + 0.15): refused, with the
    way out. Chain pruning removes the softmax neuron but not the constant in h's sum (h's inputs then look like
    two scores; it was imported as 1.5 * (1.4 + 0.15) = 2.325 where model.test gives 1.5).
    Second, the sum is right in NeuraLogic too, and imported (value and gradients)."""
    ds = Dataset()
    ds.add(R.q[0.0], [R.a("1")[0.7], R.b[0.3]])
    ds.add(R.q[0.0], [R.a("1")[1.3], R.b[-0.6]])
    model = softmax_of_one_grounding(first=True)
    built = build(model, ds, **settings)
    assert neuralogic_outputs(model, built).tolist() == [1.5, 1.5]  # NeuraLogic's own number: 1.5 * 1
    with pytest.raises(NeuraLogicImportError, match=STUCK.format(kind="AtomNeuron", name="h")):
        from_neuralogic(model, built, warn=False)
    model = softmax_of_one_grounding(first=False)
    built = build(model, ds, **settings)
    graph = assert_same(model, built)
    assert_same_gradients(model, built, graph)
    # The constant passes unchanged through identity neurons: here q's aggregation of h(p) and h(r) reads it first.
    model = Model()
    model += (R.h(V.Y) <= R.a(V.Y, V.X)) | Metadata(aggregation=Aggregation.SOFTMAX)
    model += R.q <= R.h(V.Y)
    model += R.h / 1 | Metadata(transformation=Transformation.IDENTITY)
    ds = Dataset()
    ds.add(R.q[0.0], [R.a("p", "1")[1.0], R.a("p", "2")[2.0], R.a("r", "1")[3.0]])
    with pytest.raises(NeuraLogicImportError, match=STUCK.format(kind="AggregationNeuron", name=r"q :- h\(Y\)\.")):
        from_neuralogic(model, build(model, ds, **settings), warn=False)


@pytest.mark.parametrize("settings", [UNPRUNED, dict(chain_pruning=True, iso_value_compression=False)],
                         ids=["unpruned", "pruned"])
def test_constant_one_after_an_offset(tmp_path, settings):
    """NeuraLogic lists a neuron's offset first: q's sum starts from its offset 0.2, then adds 1.5 times the
    softmax of one grounding (the constant ONE), so model.test computes q's function, 0.2 + 1.5 = 1.7. It was
    refused (the check read q's first listed input, the constant)."""
    model = template("h(Y) :- 2.0 a(Y, X). [aggregation=softmax]\n"
                     "q :- 1.5 h(Y), 0.2. [transformation=identity]\n"
                     "h/1 [transformation=identity]\nq/0 [transformation=identity]\n", tmp_path)
    ds = Dataset()
    for a in (0.7, -1.3):
        ds.add(R.q[0.0], [R.a("x", "1")[a]])
    built = build(model, ds, **settings)
    if settings is UNPRUNED:
        np.testing.assert_allclose(neuralogic_outputs(model, built), [1.7, 1.7], atol=1e-6)  # 0.2 is a float32
    graph = assert_same(model, built)
    assert_same_gradients(model, built, graph)


@pytest.mark.parametrize("aggregation", [Aggregation.SOFTMAX, Aggregation.CONCAT])
def test_outputs_of_different_lengths(aggregation):
    """A softmax or concat aggregation is as long as its groundings: samples whose outputs differ in length
    cannot be one graph's outputs."""
    model = Model()
    model += (R.h(V.Y) <= R.a(V.Y, V.X)) | Metadata(aggregation=aggregation)
    model += R.h / 1 | Metadata(transformation=Transformation.IDENTITY)
    ds = Dataset()
    ds.add(R.h("p")[0.0], [R.a("p", "1")[1.0], R.a("p", "2")[2.0]])
    ds.add(R.h("r")[0.0], [R.a("r", "1")[3.0], R.a("r", "2")[3.0], R.a("r", "3")[3.0]])
    built = build(model, ds, **UNPRUNED)
    with pytest.raises(NeuraLogicImportError, match=r"sample 1's output, neuron \d+ \(AtomNeuron 'h\(r\)'\), has "
                                                    r"shape \(3,\) but sample 0's .* has \(2,\)"):
        from_neuralogic(model, built, warn=False)
    with pytest.raises(ValueError, match=r"output of sample 1 has shape \(3,\) but sample 0's has \(2,\)"):
        neuralogic_outputs(model, built)


def _gatv2_model_and_dataset(activation=Transformation.IDENTITY):
    """Two GATv2Conv layers on 5 nodes; node 3 has only its self loop (a softmax of one grounding, which
    NeuraLogic replaces by its constant ONE) and node 4 only an edge out."""
    from neuralogic.nn.module import GATv2Conv
    model = Model()
    model += GATv2Conv(3, 2, "h1", "x", "edge", activation=Transformation.TANH)()
    model += GATv2Conv(2, 2, "h2", "h1", "edge", activation=activation, share_weights=True)()
    rng = np.random.default_rng(0)
    facts = [R.x(str(i))[rng.normal(size=3).tolist()] for i in range(5)] + \
        [R.edge(str(a), str(b)) for a, b in [(0, 1), (1, 0), (1, 2), (2, 1), (0, 2), (4, 0)]]
    ds = Dataset()
    for node in range(5):
        ds.add(R.h2(str(node))[[0.0, 0.0]], facts)
    return model, ds


def test_gatv2_equals_neuralogic():
    """GATv2's softmax(agg_terms=[J]) with AtIndex picks: each edge's attention weight exp(s_e - max) / sum, then
    a product with a vector (the weight is a scalar in NeuraLogic, a one-element vector here)."""
    model, ds = _gatv2_model_and_dataset()
    presets = ["unoptimized"] + PRESETS
    graph = assert_same(model, build(model, ds, **UNPRUNED), presets=presets)
    assert any(layer.name.endswith(":exp(r-max)") for layer in graph.layers)
    for preset in presets:
        assert_equivalent(graph, neurovec.compile(graph, CompileSettings.preset(preset), dtype=torch.float64))


@pytest.mark.slow
def test_gatv2_under_every_preset():
    model, ds = _gatv2_model_and_dataset()
    graph = assert_same(model, build(model, ds, **UNPRUNED), presets=list_presets())
    for preset in list_presets():
        assert_equivalent(graph, neurovec.compile(graph, CompileSettings.preset(preset), dtype=torch.float64))


def test_gatv2_with_chain_pruning_is_refused():
    """NeuraLogic's chain pruning removes the softmax of a single grounding but keeps the AtIndex reading it."""
    model, ds = _gatv2_model_and_dataset()
    with pytest.raises(NeuraLogicImportError, match=r"AtomNeuron '_h1__attention\(([34]), \1\)'\): an AtIndex transformation "
                                                    r"of .*not a softmax aggregation.*chain_pruning=False"):
        from_neuralogic(model, build(model, ds, chain_pruning=True, iso_value_compression=False), warn=False)


def _attention_model_and_dataset(module):
    """Queries, keys and values projected from x(i) of 4 tokens, then ``module`` (neuralogic.nn attention)."""
    model = Model()
    model += (R.q(V.X)[2, 3] <= R.x(V.X))
    model += (R.k(V.X)[2, 3] <= R.x(V.X))
    model += (R.v(V.X)[2, 3] <= R.x(V.X)) | Metadata(transformation=Transformation.TANH)
    model += module
    rng = np.random.default_rng(1)
    facts = [R.x(str(i))[rng.normal(size=3).tolist()] for i in range(4)]
    ds = Dataset()
    for i in range(4):
        ds.add(R.out(str(i))[[0.0, 0.0]], facts)
    return model, ds


@pytest.mark.parametrize("module", ["Attention", "MultiheadAttention"])
def test_attention_equals_neuralogic(module):
    """neuralogic.nn's Attention: dot(X, Y) = dk * transpose(k(Y)) * q(X) (a product combination, imported as the
    sum of an elementwise product), a softmax over Y with AtIndex picks, then sum_Y dot(X, Y) * v(Y)."""
    from neuralogic.nn.module import Attention, MultiheadAttention
    rules = Attention(2, "out", "q", "k", "v")() if module == "Attention" else \
        MultiheadAttention(2, 1, "out", "q", "k", "v")()
    model, ds = _attention_model_and_dataset(rules)
    presets = ["unoptimized"] + PRESETS
    graph = assert_same(model, build(model, ds, **UNPRUNED), presets=presets)
    assert any(":product2" in layer.name for layer in graph.layers)
    for preset in presets:
        assert_equivalent(graph, neurovec.compile(graph, CompileSettings.preset(preset), dtype=torch.float64))


@pytest.mark.parametrize("module", ["TransformerEncoder", "MultiheadAttention"])
def test_attention_modules_that_stay_out_name_what_is_missing(module):
    from neuralogic.nn.module import MultiheadAttention, TransformerEncoder
    if module == "TransformerEncoder":
        rules, message = TransformerEncoder(2, 1, 4, "out", "q")(), r"'Normalization' .*a 'norm' transformation"
    else:
        rules, message = MultiheadAttention(2, 2, "out", "q", "k", "v")(), r"'Slice' .*a 'slice' transformation"
    model, ds = _attention_model_and_dataset(rules)
    with pytest.raises(NeuraLogicImportError, match=r"transformation " + message):
        from_neuralogic(model, build(model, ds, **UNPRUNED), warn=False)


@pytest.mark.parametrize("case", ["read-whole", "outer-product"])
def test_other_transpositions_are_refused(case):
    """A transposed vector is imported only as the left factor of a dot product."""
    model = Model()
    model += (R.q(V.X)[2, 3] <= R.x(V.X))
    model += (R.k(V.X)[2, 3] <= R.x(V.X))
    ds = Dataset()
    facts = [R.x("0")[[1.0, 2.0, 3.0]], R.x("1")[[0.5, 0.0, -1.0]]]
    if case == "read-whole":
        model += R.h(V.X) <= R.k(V.X).T
        ds.add(R.h("0")[[0.0, 0.0]], facts)
        message = (r"RuleNeuron 'h\(X\) :- transpose\(k\(X\)\)\.'\): reads .*NegationNeuron.*a transposition; neurovec imports a transposed "
                   r"vector only as the left factor of a dot product")
    else:  # q . transpose(k) is an outer product in NeuraLogic
        model += (R.h(V.X, V.Y) <= (R.q(V.X), R.k(V.Y).T)) | [Combination.PRODUCT]
        ds.add(R.h("0", "1")[0.0], facts)
        message = (r"RuleNeuron .*: a product of a transposed value with input shapes \[\(2,\), \(2,\)\].*scalars "
                   r"times transpose\(k\) times q")
    with pytest.raises(NeuraLogicImportError, match=message):
        from_neuralogic(model, build(model, ds, **UNPRUNED), warn=False)


def test_learnable_template_facts(tmp_path):
    """A template fact with a learnable value ('0.5 x.', '{2} z.', not '<0.5> x.') is imported as its weight;
    per-sample learnable facts (build_dataset(..., learnable_facts=True)) are refused, named as such."""
    model = template("0.5 x.\n{2} z.\n<0.25> w.\n0 u.\nh :- 2.0 x, y, w, u. [transformation=tanh]\n"
                     "g :- {1, 2} z. [transformation=tanh]\nq :- h, g.\n", tmp_path)
    ds = Dataset()
    ds.add(R.q[1.0], [R.y[2.0]])
    ds.add(R.q[0.0], [R.y[-1.0]])
    built = build(model, ds, **UNPRUNED)
    graph = assert_same(model, built)
    assert_same_gradients(model, built, graph)
    assert any(layer.name.startswith("facts:learnable") for layer in graph.layers)
    model = Model()
    model += R.h[2.0] <= (R.x, R.y)
    ds = Dataset()
    ds.add(R.h[1.0], [R.x[0.5], R.y[2.0]])
    model.build(Settings(**UNPRUNED))
    built = model.build_dataset(ds, learnable_facts=True)
    with pytest.raises(NeuraLogicImportError, match=r"FactNeuron .*learnable weight .*not among the template's "
                                                    r"weights.*learnable_facts=True"):
        from_neuralogic(model, built, warn=False)


def test_bad_input_and_settings_warning(tmp_path):
    with pytest.raises(TypeError, match="Expected the samples built by model.build_dataset"):
        from_neuralogic(Model(), [1, 2])
    model = template("h :- 1.0 a, 1.0 b.\n", tmp_path)
    built = build(model, scalar_dataset(INPUTS[:1]), **PRUNED)
    with pytest.warns(UserWarning, match="iso_value_compression"):
        from_neuralogic(model, built)


# -- built-in datasets -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["XOR", "XOR_Vectorized", "Trains"])
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_builtin_datasets(name, settings):
    model, dataset = getattr(nl_data, name)()
    assert_same(model, build(model, dataset, **settings))


@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_mutagenesis_first_molecules(settings):
    model, dataset = nl_data.Mutagenesis()
    assert_same(model, build(model, dataset, **settings)[:12])


@pytest.mark.slow
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_mutagenesis_all(settings):
    model, dataset = nl_data.Mutagenesis()
    assert_same(model, build(model, dataset, **settings))


@pytest.mark.slow
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_nations_shared_neurons_are_imported_once(settings):
    """Nations: thousands of queries over one example's network; shared neurons are kept once."""
    model, dataset = nl_data.Nations()
    built = build(model, dataset, **settings)
    graph = assert_same(model, built, presets=["default"])
    assert graph.output_layer.size == len(built)
    per_query = sum(len(s._java_sample.query.evidence.allNeuronsTopologic) for s in built)
    assert graph.n_neurons < per_query / 2  # not one network per query


def test_grouping_merges_equal_signatures():
    """XOR's eight hidden predicates have equal signatures at one depth: one layer, not eight."""
    model, dataset = nl_data.XOR()
    graph = from_neuralogic(model, build(model, dataset, **UNPRUNED), warn=False)
    hidden = [layer for layer in graph.layers if "hidden" in layer.name]
    assert len({layer.name.split(":")[0] for layer in hidden}) == len(hidden)  # one layer per depth
    assert max(layer.size for layer in hidden) >= 8 * 4


# -- GNNs from neuralogic.nn on TU MUTAG ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mutag(tu_dir):
    from neurovec.datasets.tu import load_tu
    return load_tu("MUTAG", data_dir=tu_dir, download=False)


@pytest.mark.parametrize("kind", ["gcn", "sage"])
@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_gnn_on_mutag(mutag, kind, settings):
    model = gnn_model(kind, mutag.node_features().shape[1], hidden=8)
    assert_same(model, build(model, tu_dataset(mutag, samples=np.arange(24)), **settings))


@pytest.mark.parametrize("settings", [PRUNED, UNPRUNED], ids=["pruned", "unpruned"])
def test_gatv2_on_mutag(mutag, settings):
    """Two GATv2Conv layers (every MUTAG node has a neighbour, so no softmax is of a single grounding and
    NeuraLogic's chain pruning keeps them all)."""
    model = gnn_model("gatv2", mutag.node_features().shape[1], hidden=4)
    assert_same(model, build(model, tu_dataset(mutag, samples=np.arange(4)), **settings))


def test_vector_max_readout_is_refused(mutag):
    """NeuraLogic's max of vectors picks the input with the largest element sum, not an elementwise max."""
    model = gnn_model("sage", mutag.node_features().shape[1], hidden=8, readout_aggregation=Aggregation.MAX)
    built = build(model, tu_dataset(mutag, samples=np.arange(4)), **UNPRUNED)
    with pytest.raises(NeuraLogicImportError, match=r"AggregationNeuron .*largest element sum"):
        from_neuralogic(model, built, warn=False)


def test_scalar_max_readout_on_mutag(mutag):
    """Max over scalars (the readout's score per node, then max) is exact."""
    model = Model()
    model += gnn_model("gcn", mutag.node_features().shape[1], hidden=8)._model[:-2]
    model += (R.score(V.X)[1, 8] <= R.h2(V.X)) | Metadata(transformation=Transformation.TANH)
    model += (R.predict <= R.score(V.X)) | Metadata(aggregation=Aggregation.MAX)
    model += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    assert_same(model, build(model, tu_dataset(mutag, samples=np.arange(24)), **UNPRUNED))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_gnn_on_all_of_mutag(mutag, kind):
    model = gnn_model(kind, mutag.node_features().shape[1], hidden=16)
    assert_same(model, build(model, tu_dataset(mutag), **UNPRUNED), presets=["default"])


# -- training in neurovec, weights back into NeuraLogic ---------------------------------------------------------
@pytest.mark.parametrize("case", ["xor", "gcn", "softmax", "learnable-fact"])
def test_training_step_then_weights_back(case, mutag, tmp_path):
    if case == "xor":
        model, dataset = nl_data.XOR()
    elif case == "learnable-fact":  # template facts with learnable values go back into NeuraLogic too
        model = template("0.5 x.\n{2} z.\nh :- 2.0 x, y. [transformation=tanh]\ng :- {1, 2} z.\n"
                         "q :- h, g. [transformation=sigmoid]\n", tmp_path)
        dataset = Dataset()
        for k, y in enumerate([2.0, -1.0, 0.5]):
            dataset.add(R.q[float(k % 2)], [R.y[y]])
    elif case == "softmax":  # learnable weights and offset inside a softmax combination
        model = template("h :- 2.0 a, -1.5 b, c, 0.25. [combination=softmax]\nq :- {1,4} h. [transformation=sigmoid]\n",
                         tmp_path)
        dataset = Dataset()
        for k, (a, b, c) in enumerate([(-1.3, 0.25, 2.0), (0.0, 2.0, -0.5), (0.4, -0.5, 0.0)]):
            dataset.add(R.q[float(k % 2)], [R.a[a], R.b[b], R.c[c]])
    else:
        model = gnn_model("gcn", mutag.node_features().shape[1], hidden=8)
        dataset = tu_dataset(mutag, samples=np.arange(12))
    built = build(model, dataset, **UNPRUNED)
    graph = from_neuralogic(model, built, warn=False)
    module = neurovec.compile(graph, dtype=torch.float64)
    # NeuraLogic's own initial weights depend on what its JVM drew before (XOR's can start saturated, and one
    # step then moves the outputs by 1e-8): start from fixed weights, put back into NeuraLogic the same way
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=generator, dtype=p.dtype) - 0.5)
    weights_to_neuralogic(module, model)
    before = neuralogic_outputs(model, built)
    np.testing.assert_allclose(module().detach().numpy().reshape(before.shape), before, rtol=0, atol=1e-9)
    target = torch.tensor(np.asarray([float(s._java_sample.target.get(0)) for s in built]))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    loss = ((module().reshape(-1) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    trained = module().detach().numpy().reshape(before.shape)
    assert np.abs(trained - before).max() > 1e-6  # the step changed something
    weights_to_neuralogic(module, model)
    np.testing.assert_allclose(neuralogic_outputs(model, built), trained, rtol=0, atol=1e-9)
