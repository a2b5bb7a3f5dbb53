"""Compiled modules equal the neuron-by-neuron reference engine on random graphs."""
import torch
from hypothesis import assume, given, settings

import neurovec
from neurovec.engines.reference import ReferenceModule

from .equivalence import assert_equivalent
from .strategies import graphs


# Beyond this, float64 rounding decides comparisons at 1e-9 (see all_finite).
LARGEST_VALUE = 1e8


def all_finite(graph) -> bool:
    """False where some neuron leaves the real domain (log or sqrt of a negative, ...)
    or grows beyond LARGEST_VALUE.

    Outside the domain, gradients are NaN-defined, and a vectorized layer spreads the NaN of
    an unused neuron into shared weights as 0 * NaN, so exact comparison means nothing. Huge
    values (exp of the inverse of a small product reaches 1e12) make a gradient the
    difference of terms near 1e14, where rounding alone moves it by more than 1e-9.
    """
    with torch.no_grad():
        values = ReferenceModule(graph).neuron_values()
    return all(bool((v.abs() <= LARGEST_VALUE).all()) for layer in values for v in layer)


@settings(max_examples=200)
@given(graphs())
def test_compiled_equals_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, dtype=torch.float64))
