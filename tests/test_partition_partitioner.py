"""neurovec.partition.partitioner: node partitions (METIS, BFS, contiguous) and their quality report."""
from __future__ import annotations

import numpy as np
import pytest

from neurovec.partition import partitioner
from neurovec.partition.partitioner import (PartitionError, check_parts, metis_available, partition_nodes,
                                            partition_quality, sorted_unique)

needs_metis = pytest.mark.skipif(not metis_available(), reason="pymetis is not installed (optional extra)")


def _cliques(k: int, size: int) -> np.ndarray:
    """``k`` cliques of ``size`` nodes in a ring, one edge between neighbouring cliques, both directions,
    node ids shuffled so that contiguous blocks do not follow the cliques."""
    blocks = np.arange(k * size).reshape(k, size)
    src, dst = [], []
    for b in blocks:
        s, d = np.meshgrid(b, b)
        keep = s != d
        src.append(s[keep])
        dst.append(d[keep])
    ring = np.stack([blocks[:, 0], np.roll(blocks[:, -1], 1)])
    edges = np.concatenate([np.stack([np.concatenate(src), np.concatenate(dst)]), ring, ring[::-1]], 1)
    relabel = np.random.default_rng(0).permutation(k * size)
    return relabel[edges]


@pytest.mark.parametrize("method", ["bfs", "contiguous", pytest.param("metis", marks=needs_metis)])
def test_every_rank_owns_nodes_and_the_split_is_balanced(method):
    edges = _cliques(8, 10)
    for n_parts in (1, 2, 3, 4, 8):
        parts = partition_nodes(edges, 80, n_parts, method)
        assert parts.dtype == np.int64 and parts.shape == (80,)
        sizes = np.bincount(parts, minlength=n_parts)
        assert sizes.size == n_parts and sizes.min() >= 1
        weight = np.bincount(edges[1], minlength=80) + 1
        load = np.bincount(parts, weights=weight, minlength=n_parts)
        assert load.max() <= 1.35 * load.mean()
        np.testing.assert_array_equal(parts, partition_nodes(edges, 80, n_parts, method))  # deterministic


def test_bfs_follows_the_graph_where_ids_do_not():
    """On shuffled cliques BFS blocks cut fewer edges than blocks of ids."""
    edges = _cliques(8, 10)
    bfs = partition_quality(edges, partition_nodes(edges, 80, 4, "bfs"))
    contiguous = partition_quality(edges, partition_nodes(edges, 80, 4, "contiguous"))
    assert bfs.edge_cut < 0.75 * contiguous.edge_cut


@needs_metis
def test_metis_cuts_only_the_ring_between_cliques():
    edges = _cliques(8, 10)
    quality = partition_quality(edges, partition_nodes(edges, 80, 4, "metis"), method="metis")
    assert quality.edge_cut <= 12  # 4 ring edges, both directions (+ a node moved for balance)
    assert quality.node_imbalance <= 1.1 and "metis" in str(quality)


def test_bfs_with_isolated_nodes_self_loops_and_components():
    edges = np.array([[0, 1, 1, 2, 5, 6, 7, 7], [1, 0, 2, 1, 6, 5, 7, 7]])  # nodes 3, 4, 8, 9 isolated
    order = partitioner._bfs_order(edges[0], edges[1], 10)
    np.testing.assert_array_equal(order, [0, 1, 2, 5, 6, 3, 4, 7, 8, 9])
    parts = partition_nodes(edges, 10, 3, "bfs")
    assert np.bincount(parts).min() >= 1
    assert partition_nodes(np.zeros((2, 0), np.int64), 3, 3, "bfs").tolist() == [0, 1, 2]


def test_quality_counts_cut_edges_balance_and_halo():
    # 0 -> 1, 0 -> 2, 3 -> 2, 1 -> 3, 2 -> 2; ranks: {0, 1} on 0, {2, 3} on 1.
    edges = np.array([[0, 0, 3, 1, 2], [1, 2, 2, 3, 2]])
    q = partition_quality(edges, [0, 0, 1, 1])
    assert (q.edge_cut, q.nodes, q.edges) == (2, (2, 2), (1, 4))
    assert q.halo == (0, 2)  # rank 1 reads nodes 0 and 1; rank 0 reads nothing remote
    assert q.cut_fraction == pytest.approx(0.4) and q.edge_imbalance == pytest.approx(1.6)
    assert q.as_dict()["halo"] == [0, 2]


def test_bad_input_gets_a_clear_error():
    edges = np.array([[0, 1], [1, 2]])
    with pytest.raises(PartitionError, match="5 ranks for a graph of 3 nodes"):
        partition_nodes(edges, 3, 5)
    with pytest.raises(PartitionError, match="node id 7 is outside 0..2"):
        partition_nodes(np.array([[0, 7], [1, 2]]), 3, 2)
    with pytest.raises(PartitionError, match=r"shape \(2, E\)"):
        partition_nodes(np.zeros((3, 2), np.int64), 3, 2)
    with pytest.raises(PartitionError, match="unknown partitioning method 'kway'"):
        partition_nodes(edges, 3, 2, "kway")
    with pytest.raises(PartitionError, match="one rank per node, 3 values"):
        check_parts([0, 1], 3)
    with pytest.raises(PartitionError, match="rank 1 owns no node"):
        check_parts([0, 2, 2], 3, 3)
    with pytest.raises(PartitionError, match="node 1 is given rank 4"):
        check_parts([0, 4, 1], 3, 2)
    with pytest.raises(PartitionError, match="integer ranks"):
        check_parts([0.0, 1.0, 1.0], 3)


def test_metis_missing_names_the_extra(monkeypatch):
    monkeypatch.setattr(partitioner, "metis_available", lambda: False)
    with pytest.raises(PartitionError, match="pip install pymetis"):
        partition_nodes(np.array([[0, 1], [1, 2]]), 3, 2, "metis")
    assert partition_nodes(np.array([[0, 1], [1, 2]]), 3, 2, "auto").tolist() in ([0, 0, 1], [0, 1, 1])


def test_sorted_unique_is_np_unique():
    values = np.random.default_rng(1).integers(-50, 50, 1000)
    np.testing.assert_array_equal(sorted_unique(values), np.unique(values))
    assert sorted_unique(np.zeros(0, np.int64)).size == 0
