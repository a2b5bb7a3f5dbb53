"""Cluster mini-batches on one graph (neurovec.clusters): partitions, batches compiled once, training."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neurovec
from neurovec import clusters
from neurovec.clusters import ClusterLoader, bfs_partition, partition
from neurovec.datasets import gnn
from neurovec.datasets.nodes import induced_edges
from neurovec.datasets.synthetic import rmat_dataset


@pytest.fixture(scope="module")
def graph():
    return rmat_dataset(nodes=600, edges=4000, features=6, classes=3, seed=2)


@pytest.mark.parametrize("method", ["bfs", pytest.param("metis", marks=pytest.mark.skipif(
    not clusters.has_metis(), reason="pymetis is not installed (pip install pymetis)"))])
def test_partition_covers_every_node_in_balanced_parts(graph, method):
    membership = partition(graph.edge_index, graph.n_nodes, 6, method=method)
    assert membership.shape == (600,) and set(np.unique(membership)) == set(range(6))
    sizes = np.bincount(membership)
    assert sizes.max() <= 1.2 * sizes.mean()
    src, dst = graph.edge_index
    random = np.random.default_rng(0).integers(0, 6, 600)
    assert (membership[src] == membership[dst]).mean() > (random[src] == random[dst]).mean()  # keeps locality


def test_bfs_partition_of_a_graph_in_pieces():
    edges = np.array([[0, 2, 4, 6], [1, 3, 5, 7]])  # four pieces of two, and two nodes without edges
    membership = bfs_partition(edges, 10, 5)
    assert np.array_equal(np.sort(np.bincount(membership)), [2, 2, 2, 2, 2])


def test_auto_falls_back_to_numpy_without_pymetis(graph, monkeypatch):
    monkeypatch.setattr(clusters, "has_metis", lambda: False)
    assert np.array_equal(partition(graph.edge_index, 600, 4), bfs_partition(graph.edge_index, 600, 4))


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
        partition(graph.edge_index, 600, 0)
    with pytest.raises(ValueError, match="membership must give a cluster to each of the 600 nodes"):
        ClusterLoader(model, graph, membership=np.zeros(5, np.int64))
    with pytest.raises(TypeError, match="needs a MiniBatchModel"):
        ClusterLoader(object(), graph)
