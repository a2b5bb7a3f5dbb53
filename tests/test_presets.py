"""Every preset, and random combinations of pass switches, keep the function exactly."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec.compiler.settings import Settings

from .equivalence import assert_equivalent
from .strategies import gnn_graphs, graphs
from .test_equivalence import all_finite

PRESETS = neurovec.list_presets()


def test_presets_listed_and_complete():
    assert PRESETS[:2] == ["unoptimized", "default"]
    assert len([p for p in PRESETS if p.startswith("upward-")]) == 18
    assert dict(neurovec.iter_presets())["default"] == Settings()
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        Settings.preset("fast")


@pytest.mark.parametrize("preset", PRESETS)
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          deadline=None)
@given(graph=graphs())
def test_preset_equals_reference(preset, graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


@pytest.mark.parametrize("preset", PRESETS)
@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          deadline=None)
@given(graph=gnn_graphs())
def test_preset_equals_reference_on_gnn_graphs(preset, graph):
    """Message-passing shapes (shared weights, fixed factors, readouts) that the algebra passes rewrite."""
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, preset, dtype=torch.float64))


SWITCHES = [name for name, field in Settings.model_fields.items() if field.annotation is bool
            and name not in ("verify",)]


@st.composite
def random_settings(draw):
    values = {name: draw(st.booleans()) for name in SWITCHES}
    values["linear_padding"] = draw(st.sampled_from(["off", "none", "left", "right", "both", "advanced", "auto"]))
    values["upward_growth_abs"] = draw(st.sampled_from([0, 10, None]))
    values["upward_growth_rel"] = draw(st.sampled_from([0.0, 0.5, None]))
    values["upward_max_depth"] = draw(st.sampled_from([None, 1, 2]))
    values["reduce_kernel"] = draw(st.sampled_from(["auto", "scatter", "segment", "dense", "sparse_mm"]))
    return Settings(**values)


@settings(max_examples=200, deadline=None)
@given(graph=graphs(), options=random_settings())
def test_random_pass_combinations_equal_reference(graph, options):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))


@settings(max_examples=80, deadline=None)
@given(graph=gnn_graphs(), options=random_settings())
def test_random_pass_combinations_on_gnn_graphs(graph, options):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, options, dtype=torch.float64))


@settings(max_examples=100, deadline=None)
@given(graph=st.one_of(graphs(), gnn_graphs()), preset=st.sampled_from(PRESETS), seed=st.integers(0, 2**16))
def test_dynamic_facts_replaced_at_call_time(graph, preset, seed):
    """Declared dynamic facts (unit ones included) may take any values at call time, under every preset."""
    assume(all_finite(graph))
    fact_layers = [layer for layer in graph.layers if isinstance(layer, neurovec.FactLayer)]
    options = Settings.preset(preset, dynamic_facts=tuple(layer.name for layer in fact_layers))
    module = neurovec.compile(graph, options, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    facts = {layer.name: torch.rand(layer.values.shape, generator=generator, dtype=torch.float64) + 0.5
             for layer in fact_layers}
    reference = neurovec.ReferenceModule(graph)
    expected = reference(facts).detach()
    assume(bool(torch.isfinite(expected).all()))
    torch.testing.assert_close(module(facts).detach(), expected, atol=1e-9, rtol=1e-9)


# -- strict settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("iso_compression", "no", "Input should be a valid boolean"),
    ("iso_compression", 0, "Input should be a valid boolean"),
    ("upward", "True", "Input should be a valid boolean"),
    ("upward_growth_abs", True, "Input should be a valid integer"),
    ("upward_growth_abs", 1.5, "Input should be a valid integer"),
    ("upward_growth_rel", True, "Input should be a valid number"),
    ("upward_growth_rel", "0.5", "Input should be a valid number"),
    ("upward_max_depth", "3", "Input should be a valid integer"),
])
def test_settings_take_values_as_they_are(field, value, expected):
    # Settings(iso_compression="no") was False, upward_growth_abs=True was 1.
    with pytest.raises(ValueError, match=expected) as error:
        Settings(**{field: value})
    assert field in str(error.value)


def test_settings_take_numpy_scalars_and_lists_of_layers():
    settings = Settings(upward_growth_abs=np.int64(3), upward_growth_rel=1, verify=np.bool_(False),
                        dynamic_facts=["x"])
    assert settings.upward_growth_abs == 3 and type(settings.upward_growth_abs) is int
    assert settings.upward_growth_rel == 1.0 and settings.verify is False and settings.dynamic_facts == ("x",)


def test_a_misspelled_setting_is_named_with_the_closest_field():
    # pydantic said only "Extra inputs are not permitted".
    with pytest.raises(ValueError, match=r"unknown settings 'iso_compresion' \(did you mean 'iso_compression'\?\)"):
        Settings(iso_compresion=False)
    with pytest.raises(ValueError, match=r"unknown settings 'upwards' \(did you mean 'upward'\?\)"):
        Settings.preset("default", upwards=False)


@pytest.mark.parametrize("removed", ["segment_reductions", "dense_reductions"])
def test_the_removed_reduction_switches_are_unknown_settings(removed):
    # Reductions are always segment (or dense) reductions now; the kernel is the engine's choice.
    with pytest.raises(ValueError, match=rf"unknown settings '{removed}' \(did you mean 'transposed_reductions'\?\)"):
        Settings.preset("default", **{removed: False})
