"""Compiled modules equal the neuron-by-neuron reference engine on random graphs."""
import torch
from hypothesis import assume, given, settings

import neurovec
from neurovec.engines.reference import ReferenceModule

from .equivalence import assert_equivalent
from .strategies import graphs


def all_finite(graph) -> bool:
    """False where some neuron leaves the real domain (log or sqrt of a negative, ...).

    There, gradients are NaN-defined, and a vectorized layer spreads the NaN of an
    unused neuron into shared weights as 0 * NaN, so exact comparison means nothing.
    """
    with torch.no_grad():
        values = ReferenceModule(graph).neuron_values()
    return all(torch.isfinite(v).all() for layer in values for v in layer)


@settings(max_examples=200)
@given(graphs())
def test_compiled_equals_reference(graph):
    assume(all_finite(graph))
    assert_equivalent(graph, neurovec.compile(graph, dtype=torch.float64))
