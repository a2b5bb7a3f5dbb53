"""Cluster mini-batches on one graph (neurovec.clusters): partitions, batches compiled once, training."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neurovec
from neurovec.clusters import ClusterLoader
from neurovec.datasets import gnn
from neurovec.datasets.nodes import induced_edges
from neurovec.datasets.synthetic import rmat_dataset
from neurovec.partition.partitioner import partition_nodes


@pytest.fixture(scope="module")
def graph():
    return rmat_dataset(nodes=600, edges=4000, features=6, classes=3, seed=2)


def test_clusters_come_from_the_one_partitioner(graph):
    """ClusterLoader's clusters are neurovec.partition's partition (one partitioner in the package)."""
    model = neurovec.MiniBatchModel(functools.partial(gnn.gcn, graph, 8, 2, subgraph="induced", seed=1))
    for method in ("bfs", "contiguous"):
        loader = ClusterLoader(model, graph, parts=6, clusters_per_batch=2, seed=3, method=method)
        expected = partition_nodes(graph.edge_index, graph.n_nodes, 6, method=method, seed=3)
        assert np.array_equal(loader.membership, expected)
    with pytest.raises(ValueError, match="method: unknown partitioning method 'kmeans'"):
        ClusterLoader(model, graph, parts=6, method="kmeans")


def test_batches_compile_once_and_are_their_induced_subgraphs(graph):
    build = functools.partial(gnn.gcn, graph, 8, 2, subgraph="induced", seed=1)
    model = neurovec.MiniBatchModel(build, dtype=torch.float64)
    loader = ClusterLoader(model, graph, parts=6, clusters_per_batch=2, seed=3, method="bfs")
    assert len(loader) == 3
    first = list(loader)
    second = list(loader)
    assert model.n_compiled == 3                                    # compiled once, reused
    assert {b.samples.tobytes() for b in first} == {b.samples.tobytes() for b in second}
    assert np.array_equal(np.sort(np.concatenate([b.samples for b in first])), np.arange(600))
    twins = pytest.importorskip("neurovec.datasets.pyg_twins")
    pytest.importorskip("torch_geometric")
    twin = twins.make_twin(gnn.GNNSpec.create("gcn", graph, 8, 2)).double()
    twins.copy_weights(model, twin)
    nodes = first[0].samples
    edge_index, _ = induced_edges(graph.edge_index, 600, nodes)
    expected = twin(torch.as_tensor(graph.x[nodes], dtype=torch.float64), torch.from_numpy(edge_index))
    torch.testing.assert_close(model(first[0]), expected, atol=1e-9, rtol=1e-9)


def test_cluster_training_lowers_the_loss(graph):
    build = functools.partial(gnn.sage, graph, 16, 2, subgraph="induced", seed=0)
    model = neurovec.MiniBatchModel(build)
    loader = ClusterLoader(model, graph, parts=4, clusters_per_batch=2, method="bfs")
    y = torch.as_tensor(graph.y)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(8):
        total = 0.0
        for batch in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(batch), y[batch.samples])
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total)
    assert losses[-1] < 0.8 * losses[0]


def test_bad_arguments(graph):
    model = neurovec.MiniBatchModel(functools.partial(gnn.gcn, graph, 4, 2, subgraph="induced"))
    with pytest.raises(ValueError, match="parts must be between 1 and the 600 nodes"):
        ClusterLoader(model, graph, parts=0)
    with pytest.raises(ValueError, match="membership must give a cluster to each of the 600 nodes"):
        ClusterLoader(model, graph, membership=np.zeros(5, np.int64))
    with pytest.raises(TypeError, match="needs a MiniBatchModel"):
        ClusterLoader(object(), graph)
