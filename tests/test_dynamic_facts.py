"""Facts replaced at call time (issue 11, item 2).

The rule: a fact layer can be replaced (``module(facts={name: tensor})``) if and
only if it is declared in ``Settings.dynamic_facts``. Passes fold every other
fact layer's values into constants (deduplicated, gathered, pre-concatenated),
so a replacement of an undeclared layer is refused, under every preset, rather
than applied to whatever part of the layer survived.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.engines.reference import ReferenceModule
from neurovec.sources.graph import FactLayer, GraphError

from .strategies import graphs

PRESETS = neurovec.list_presets()


def _fact_layers(graph):
    return [layer for layer in graph.layers if isinstance(layer, FactLayer)]


def _finite(graph) -> bool:
    return all(np.isfinite(layer.values).all() for layer in _fact_layers(graph))


def _new_values(graph, seed):
    rng = np.random.default_rng(seed)
    return {layer.name: torch.tensor(rng.normal(0, 1, layer.values.shape), requires_grad=True)
            for layer in _fact_layers(graph)}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), seed=st.integers(0, 2**16))
def test_only_declared_layers_are_replaced_and_exactly(graph, seed):
    _check_replacements(graph, seed)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), seed=st.integers(0, 2**16))
def test_only_declared_layers_are_replaced_and_exactly_many(graph, seed):
    _check_replacements(graph, seed)


def _check_replacements(graph, seed):
    """Under every preset: replacing an undeclared layer raises; declared layers replaced
    together give the reference engine's outputs and gradients (also w.r.t. the facts)."""
    assume(_finite(graph))
    names = tuple(layer.name for layer in _fact_layers(graph))
    new = _new_values(graph, seed)
    reference = ReferenceModule(graph)
    # NaN from a neuron no output reads (sqrt of a negative, say) reaches the facts' gradients
    # of vectorized layers as 0 * NaN: compare graphs whose every value is finite.
    assume(all(torch.isfinite(v).all() for layer in reference.neuron_values(new) for v in layer))
    expected = reference(facts=new)
    projection = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected_grads = torch.autograd.grad((expected * projection).sum(), list(new.values()), allow_unused=True)
    for preset in PRESETS:
        static = neurovec.compile(graph, preset, torch.float64)
        for name in names:
            with pytest.raises(GraphError, match=f"fact layer {name!r} cannot be replaced.*Settings.dynamic_facts"):
                static(facts={name: new[name]})
        dynamic = neurovec.compile(graph, neurovec.Settings.preset(preset, dynamic_facts=names), torch.float64)
        out = dynamic(facts=new)
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9, equal_nan=True, msg=preset)
        if not out.requires_grad:
            continue
        grads = torch.autograd.grad((out * projection).sum(), list(new.values()), allow_unused=True)
        for name, g, g_expected in zip(names, grads, expected_grads):
            if g is None or g_expected is None:  # unused by the outputs: None or zero on the other side
                other = g if g_expected is None else g_expected
                assert other is None or torch.all((other == 0) | other.isnan()), (preset, name)
                continue
            torch.testing.assert_close(g, g_expected, rtol=1e-9, atol=1e-9, equal_nan=True,
                                       msg=lambda m: f"{preset}, gradient of fact layer {name!r}: {m}")


def _two_layer_graph():
    b = neurovec.GraphBuilder()
    w = b.weight("w", [[2.0, 0.0], [0.0, 3.0]])
    x = b.facts("x", np.ones((3, 2)))
    unused = b.facts("unused", np.zeros((4, 2)))
    del unused  # a fact layer that no output depends on
    layer = b.layer("l", aggregation="sum")
    b.output(layer.neuron([(x[0], w), (x[1], w)]), layer.neuron([(x[1], w), (x[2], w), (x[2], w)]))
    return b.build()


@pytest.mark.parametrize("preset", PRESETS)
def test_undeclared_layer_is_refused_even_where_no_pass_changed_it(preset):
    # unoptimized changes nothing, and the refusal is the same: one rule for every preset.
    module = neurovec.compile(_two_layer_graph(), preset)
    with pytest.raises(GraphError, match=r"fact layer 'x' cannot be replaced at call time: it is not declared "
                                         r"dynamic; compile with Settings\(dynamic_facts=\(\.\.\., 'x'\)\)"):
        module(facts={"x": torch.zeros(3, 2)})


@pytest.mark.parametrize("preset", PRESETS)
def test_declared_layer_that_feeds_nothing_is_still_checked(preset):
    module = neurovec.compile(_two_layer_graph(), neurovec.Settings.preset(preset, dynamic_facts=("unused",)))
    torch.testing.assert_close(module(facts={"unused": torch.ones(4, 2)}), module())
    with pytest.raises(GraphError, match=r"fact layer 'unused': replacement has shape \(3, 2\), expected \(4, 2\)"):
        module(facts={"unused": torch.ones(3, 2)})


def test_replacement_errors_name_the_layer():
    module = neurovec.compile(_two_layer_graph(), neurovec.Settings(dynamic_facts=("x",)))
    with pytest.raises(GraphError, match=r"'nope' cannot be replaced at call time: the graph has no such fact "
                                         r"layer \(fact layers: \['unused', 'x'\]\)"):
        module(facts={"nope": torch.ones(3, 2)})
    with pytest.raises(GraphError, match=r"fact layer 'x': replacement has shape \(2, 2\), expected \(3, 2\)"):
        module(facts={"x": torch.ones(2, 2)})
    with pytest.raises(GraphError, match=r"fact layer 'x': replacement has dtype torch.complex128"):
        module(facts={"x": torch.ones(3, 2, dtype=torch.complex128)})
    torch.testing.assert_close(module(facts={"x": np.zeros((3, 2))}), torch.zeros(2, 2))


# -- how a module is called (issue 23 item 9, issue 28 item 3) ------------------------------------

def test_a_positional_tensor_says_how_the_module_is_called():
    """The PyG habit, ``module(x)``: the error says the graph and its facts are compiled in, and how
    features are replaced (with the module's own layers and shapes)."""
    static = neurovec.compile(_two_layer_graph())
    with pytest.raises(TypeError, match=r"CompiledModule takes no input tensor \(got a Tensor of shape \(3, 2\)\)\. "
                                        r"The graph and its facts are compiled into the module: call it as "
                                        r"module\(\)\. To replace features per call, compile with "
                                        r"Settings\(dynamic_facts=\(<layer>,\)\) and call module\(facts=\{<layer>: "
                                        r"tensor\}\) \(fact layers: 'x' \(3, 2\), 'unused' \(4, 2\)\)\. "
                                        r"New graphs are compiled anew, then load_state_dict"):
        static(torch.ones(3, 2))
    dynamic = neurovec.compile(_two_layer_graph(), neurovec.Settings(dynamic_facts=("x",)))
    message = r"call it as module\(\), or module\(facts=\{'x': tensor of shape \(3, 2\)\}\) to replace features"
    for call in (lambda: dynamic(torch.ones(3, 2)), lambda: dynamic(np.ones((3, 2))),
                 lambda: dynamic(facts=torch.ones(3, 2))):
        with pytest.raises(TypeError, match=r"takes no input tensor \(got a (Tensor|ndarray) of shape \(3, 2\)\).*"
                                            + message):
            call()
    torch.testing.assert_close(dynamic({"x": torch.zeros(3, 2)}), torch.zeros(2, 2))  # a positional dict is facts


def test_facts_that_are_not_a_dict_are_named():
    module = neurovec.compile(_two_layer_graph(), neurovec.Settings(dynamic_facts=("x",)))
    for facts in ([torch.ones(3, 2)], ("x", torch.ones(3, 2)), "x"):
        with pytest.raises(TypeError, match=rf"facts must be a dict \{{fact layer name: tensor\}} "
                                            rf"\(got {type(facts).__name__}\)\. The graph and its facts"):
            module(facts=facts)
    torch.testing.assert_close(module(facts={}), module())


def test_misspelled_keywords_name_the_accepted_one():
    module = neurovec.compile(_two_layer_graph(), neurovec.Settings(dynamic_facts=("x",)))
    with pytest.raises(TypeError, match=r"CompiledModule got unexpected keyword argument 'fact': the only keyword "
                                        r"it takes is facts=\{fact layer: tensor\}\. The graph and its facts"):
        module(fact={"x": torch.ones(3, 2)})
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'x', 'edge_index': the only keyword"):
        module(x=torch.ones(3, 2), edge_index=torch.zeros(2, 4))
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'training'"):
        module(facts={}, training=True)
    with pytest.raises(TypeError, match=r"takes at most one argument, facts=\{fact layer: tensor\} "
                                        r"\(got 2 positional\)"):
        module({}, {})
    with pytest.raises(TypeError, match=r"takes at most one argument.*\(got 1 positional and facts=\)"):
        module({}, facts={})
