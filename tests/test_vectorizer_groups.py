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


def test_layers_reading_the_same_edges_store_one_index():
    """A node-level GCN's layers read the graph's edges through one array of the graph (the template
    shares it): the program stores one index for all of them (``_compacted``), read-only and not the
    graph's own array, so that products-like keeps one 62M-edge index, not one per layer. (SAGE's
    layers split their edges into two shape groups, the fixed zero input of isolated nodes apart: each
    group's rows are a fresh array per layer.)"""
    model = "gcn"
    from neurovec import datasets
    from neurovec.compiler.vectorizer import vectorize
    from neurovec.datasets.synthetic import rmat_dataset

    data = rmat_dataset("arxiv-like", nodes=300, edges=2000, features=8, classes=3, seed=0)
    graph = getattr(datasets, model)(data, hidden=6, layers=3, dropout=0.0)
    program = vectorize(graph)
    largest = {}
    for node in program.nodes:
        if node.op.name == "GATHER":
            index = program.constants[node.attrs["index"]]
            largest.setdefault(index.size, []).append(index)
    edge_indices = largest[max(largest)]  # per layer: the sources' rows (and a GCN's weights' rows)
    sources = [i for i in edge_indices if np.array_equal(i, edge_indices[0])]
    assert len(sources) == 3  # one gather of the edges' sources per layer ...
    assert all(index is sources[0] for index in sources)  # ... all three one stored array
    assert not sources[0].flags.writeable
    graph_arrays = [layer.input_ordinal for layer in graph.layers if hasattr(layer, "input_ordinal")]
    assert not any(np.shares_memory(sources[0], a) for a in graph_arrays)
