"""The vectorizer's shape groups: where the ranges of a layer's sources and weights prove one group,
the group and the source layer read are those that counting every edge's key gives."""
import numpy as np
import pytest

from neurovec.compiler.vectorizer import _edge_counts, _one_group
from neurovec.sources.graph import NO_WEIGHT


@pytest.mark.parametrize("seed", range(40))
def test_one_group_agrees_with_the_counted_keys(seed):
    rng = np.random.default_rng(seed)
    n_layers, n_weights = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    n_weight_cls = 3
    key_of_layer = rng.integers(0, 2, n_layers) * n_weight_cls
    key_of_weight = np.append(rng.integers(1, 3, n_weights), 0)  # weight class + 1; NO_WEIGHT -> 0
    edges = int(rng.integers(1, 50))
    src = rng.integers(0, n_layers, edges) if rng.random() < 0.5 else np.full(edges, n_layers - 1)
    weight = rng.integers(NO_WEIGHT, n_weights, edges) if rng.random() < 0.5 else np.full(edges, n_weights - 1)
    counted = np.flatnonzero(_edge_counts(key_of_layer, src, key_of_weight, weight, 2 * n_weight_cls))
    keys, used = _one_group(key_of_layer, src, key_of_weight, weight)
    if keys is not None:
        assert keys.tolist() == counted.tolist()
        if used is not None:
            assert used.tolist() == np.flatnonzero(np.bincount(src)).tolist()
    else:  # no proof from the ranges: then they span more than one key
        layer_keys = key_of_layer[src.min():src.max() + 1]
        weight_keys = np.append(key_of_weight[max(weight.min(), 0):weight.max() + 1],
                                key_of_weight[-1] if weight.min() == NO_WEIGHT else [])
        assert np.unique(layer_keys).size > 1 or np.unique(weight_keys).size > 1
