"""The TU loader reads raw files as PyG's TUDataset does, and every template equals its twin on them.

Small synthetic TU folders (written to tmp_path, at ROOT/NAME/raw/ so that the real
``torch_geometric.datasets.TUDataset`` processes them offline) have self loops,
duplicate edges, isolated nodes and several node- and edge-label columns.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import neurovec
from neurovec import datasets
from neurovec.datasets import gnn
from neurovec.datasets.tu import TUDataset, load_tu

pytest.importorskip("torch_geometric")
from torch_geometric.datasets import TUDataset as PygTUDataset  # noqa: E402

from neurovec.datasets import pyg_twins as twins  # noqa: E402

# Three graphs (1-based node ids as in the files): graph 1 = nodes 1-4, graph 2 = 5-7,
# graph 3 = 8-10. Node 3 and node 5 have self loops (node 5 twice); 1->2 and 7->6 are
# listed twice; node 8 has only a self loop, so without it no edge at all. (PyG's reader
# drops a last graph without edges, so the last graph has one.)
EDGES = [(1, 2), (2, 1), (2, 3), (3, 2), (3, 3), (1, 2), (3, 4), (4, 3),
         (5, 6), (6, 5), (5, 5), (6, 7), (7, 6), (5, 5), (7, 6), (8, 8), (9, 10), (10, 9)]
EDGE_LABELS = [(0, 1), (0, 1), (1, 3), (1, 3), (2, 2), (0, 1), (1, 1), (1, 1),
               (2, 3), (2, 3), (0, 2), (1, 1), (1, 1), (0, 2), (1, 1), (1, 2), (2, 2), (2, 2)]
INDICATOR = [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
# Two node-label columns: the first starts at 1 (shifted to 0), the second has a gap (no 3).
NODE_LABELS = [(1, 0), (2, 4), (3, 2), (1, 0), (2, 1), (2, 2), (1, 4), (3, 0), (1, 2), (2, 2)]
NODE_ATTRIBUTES = [(0.5, -1.25), (1.5, 2.0), (0.25, 0.125), (-3.0, 1.0), (2.5, 0.75), (1.0, 1.0),
                   (0.0, -0.5), (4.0, 2.25), (-1.5, 0.5), (0.1, 0.3)]
GRAPH_LABELS = [-1, 1, -1]


def _lines(rows) -> str:
    return "".join(", ".join(str(v) for v in row) + "\n" for row in rows)


def write_tu(root, name="SYN", edges=EDGES, edge_labels=EDGE_LABELS, node_labels=NODE_LABELS,
             node_attributes=NODE_ATTRIBUTES, indicator=INDICATOR, graph_labels=GRAPH_LABELS):
    folder = root / name / "raw"
    folder.mkdir(parents=True)
    files = {"A": edges, "graph_indicator": [(g,) for g in indicator],
             "graph_labels": [(y,) for y in graph_labels], "node_labels": node_labels,
             "node_attributes": node_attributes, "edge_labels": edge_labels}
    for suffix, rows in files.items():
        if rows is not None:
            (folder / f"{name}_{suffix}.txt").write_text(_lines(rows))
    return folder


def _pyg_graphs(root, name, **options):
    dataset = PygTUDataset(str(root), name, **options)
    return [dataset[g] for g in range(len(dataset))]


def _graph_edges(ds: TUDataset, g: int):
    """Graph g's edges in local node ids, sorted by (source, target) as PyG stores them, and the permutation."""
    nodes = np.flatnonzero(ds.graph_of_node == g)
    mine = np.flatnonzero(ds.graph_of_node[ds.edge_index[0]] == g)
    local = ds.edge_index[:, mine] - (nodes[0] if nodes.size else 0)
    order = np.lexsort((local[1], local[0]))
    return nodes, local[:, order], mine[order]


@pytest.mark.parametrize("use_attributes", [False, True])
def test_loader_agrees_with_pyg_tudataset(tmp_path, use_attributes):
    write_tu(tmp_path)
    ds = load_tu("SYN", tmp_path)
    theirs = _pyg_graphs(tmp_path, "SYN", use_node_attr=use_attributes, use_edge_attr=use_attributes)
    assert ds.n_graphs == len(theirs)
    x = ds.node_features(use_attributes)
    # Edges listed twice here carry equal labels; PyG sums the copies' one-hots, neurovec keeps one.
    key = [tuple(e) for e in np.array(EDGES)]
    multiplicity = {e: key.count(e) for e in key}
    edge_x = ds.edge_features(use_attributes)
    for g, data in enumerate(theirs):
        nodes, edges, edge_ids = _graph_edges(ds, g)
        np.testing.assert_array_equal(x[nodes].astype(np.float32), data.x.numpy())
        np.testing.assert_array_equal(edges, data.edge_index.numpy())
        assert int(data.y) == ds.graph_labels[g]
        copies = np.array([multiplicity[(u + 1 + nodes[0], v + 1 + nodes[0])] for u, v in edges.T])
        np.testing.assert_array_equal(edge_x[edge_ids] * copies[:, None], data.edge_attr.numpy())
    # All node-label columns, one-hot each and side by side: widths 3 and 5 (4 - 0 + 1, gap included).
    assert ds.num_node_labels == 8 and ds.node_labels.shape == (10, 2) and ds.num_edge_labels == 3 + 3


def test_self_loops_and_duplicates_are_removed(tmp_path):
    write_tu(tmp_path)
    ds = load_tu("SYN", tmp_path)
    edges = [tuple(e) for e in (ds.edge_index.T + 1).tolist()]
    assert all(u != v for u, v in edges) and len(set(edges)) == len(edges)
    assert set(edges) == {(u, v) for u, v in EDGES if u != v}
    # The first listing of each edge is kept, in file order, with its labels.
    assert edges[:4] == [(1, 2), (2, 1), (2, 3), (3, 2)]
    assert ds.edge_labels[:3].tolist() == [[0, 0], [0, 0], [1, 2]]


def test_mutag_edge_labels_as_pyg(tu_dir):
    ds = load_tu("MUTAG", tu_dir)
    assert ds.edge_labels.shape == (7442, 1) and ds.num_edge_labels == 4
    assert ds.edge_features().shape == (7442, 4) and np.all(ds.edge_features().sum(1) == 1)


@pytest.mark.parametrize("node_labels", [True, False], ids=["labels", "no-features"])
def test_graphs_without_nodes_are_read_as_pyg_reads_them(tmp_path, node_labels, caplog):
    """Graph ids that no node names (real Fingerprint has 651) were refused, the whole folder. PyG's TUDataset keeps
    such a graph as one without nodes, and ends after the last node's graph, though its labels still number the
    classes: here graph 2 is empty, graph 4 (listed in the labels only) is dropped, and there are 4 classes."""
    labels = [(0,), (1,), (2,), (0,), (1,)] if node_labels else None
    write_tu(tmp_path, edges=[(1, 2), (2, 1), (3, 4), (4, 3), (4, 5)], edge_labels=None, node_labels=labels,
             node_attributes=None, indicator=[1, 1, 3, 3, 3], graph_labels=[5, 6, 7, 8])
    ds = load_tu("SYN", tmp_path)
    assert "graph 2" in caplog.text and "ends at that graph" in caplog.text
    theirs = PygTUDataset(str(tmp_path), "SYN")
    assert ds.n_graphs == len(theirs) == 3 and ds.num_classes == theirs.num_classes == 4
    assert ds.nodes.sizes.tolist() == [data.num_nodes for data in theirs] == [2, 0, 3]
    assert ds.graph_labels.tolist() == [int(data.y) for data in theirs] == [0, 1, 2]
    for g, data in enumerate(theirs):
        _, edges, _ = _graph_edges(ds, g)
        np.testing.assert_array_equal(edges, data.edge_index.numpy())
        if node_labels:
            np.testing.assert_array_equal(ds.node_features()[ds.graph_of_node == g], data.x.numpy())
    # PyG's dataset converted gives the same graphs (its storage holds the dropped graph's label too).
    converted = datasets.from_pyg(theirs)
    assert converted.nodes.sizes.tolist() == [2, 0, 3] and converted.graph_labels.tolist() == [0, 1, 2]
    assert converted.num_classes == 4
    np.testing.assert_array_equal(converted.node_features(), ds.node_features())


# -- every template equals its twin on these graphs ---------------------------------------------

TEMPLATES = {
    "gcn": (gnn.gcn, twins.gcn_twin, {}),
    "gcn-unnormalized": (gnn.gcn, twins.gcn_twin, {"normalize": False}),
    "sage": (gnn.sage, twins.sage_twin, {}),
    "gin": (gnn.gin, twins.gin_twin, {"eps": 0.5}),
}


def _with_loops(tmp_path) -> TUDataset:
    """The synthetic graphs *with* their self loops and duplicate edges, as a from-PyG dataset might hold them."""
    ds = load_tu("SYN", write_tu(tmp_path).parent.parent)
    edges = np.array(EDGES).T - 1
    return TUDataset("SYN-loops", edges, ds.graph_of_node, ds.graph_labels, ds.node_labels, ds.node_attributes)


def _compare(module, twin, ds, options):
    twins.copy_weights(module, twin)
    use_attributes = options.get("use_attributes", False)
    x, edge_index, batch, n = twins.pyg_batch(ds, None, use_attributes, dtype=torch.float64)
    ours, theirs = module(), twin(x, edge_index, batch, n)
    torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)
    probe = torch.linspace(-1.0, 1.0, ours.numel(), dtype=torch.float64).reshape(ours.shape)
    (ours * probe).sum().backward()
    (theirs * probe).sum().backward()
    params = dict(twin.named_parameters())
    for name, weight in module.weights.named_parameters():
        torch.testing.assert_close(weight.grad, params[name].grad, atol=1e-9, rtol=1e-9,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("loops", [False, True], ids=["loaded", "with-loops"])
@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_templates_equal_twins_float64(tmp_path, kind, loops):
    template, make_twin, options = TEMPLATES[kind]
    ds = _with_loops(tmp_path) if loops else load_tu("SYN", write_tu(tmp_path).parent.parent)
    if loops:
        assert np.any(ds.edge_index[0] == ds.edge_index[1])
    options = {**options, "use_attributes": True, "readout": "sum"}
    module = neurovec.compile(template(ds, hidden=[5, 4], seed=4, **options)).double()
    _compare(module, make_twin(ds, hidden=[5, 4], **options).double(), ds, options)


def test_gcn_counts_a_listed_self_loop_once():
    """One node with a listed self loop: GCNConv's normalisation is 1/deg with deg = 1, not 2."""
    ds = TUDataset("one", np.array([[0], [0]]), np.array([0]), np.array([0]), np.array([[0]]), None)
    graph = gnn.gcn(ds, hidden=[1], output_transformation="identity", readout="sum")
    norms = {w.name: float(w.value) for w in graph.weights if w.name.startswith("gcn_norm")}
    assert norms == {"gcn_norm.deg1": 1.0}
