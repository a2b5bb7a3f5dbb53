"""from_pyg / to_pyg: PyG's Data, Batch and InMemoryDataset become datasets the GNN templates take."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import neurovec
from neurovec import datasets
from neurovec.datasets import DatasetError
from neurovec.datasets import pyg_twins as twins
from neurovec.datasets.tu import load_tu

pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402


@pytest.fixture(scope="module")
def mutag(tu_dir):
    return load_tu("MUTAG", tu_dir)


@pytest.fixture(scope="module")
def pyg_mutag(tu_dir, tmp_path_factory):
    """PyG's own TUDataset reader on the same raw files (no download)."""
    from torch_geometric.datasets import TUDataset

    root = tmp_path_factory.mktemp("pyg")
    shutil.copytree(tu_dir / "MUTAG", root / "MUTAG" / "raw")
    return TUDataset(str(root), "MUTAG")


def _edges_by_graph(ds) -> list[set]:
    local = ds.nodes.local[ds.edge_index]
    graph = ds.graph_of_node[ds.edge_index[0]]
    return [set(map(tuple, local[:, graph == g].T.tolist())) for g in range(ds.n_graphs)]


def _assert_same(ds, original):
    assert ds.n_graphs == original.n_graphs and ds.n_nodes == original.n_nodes
    np.testing.assert_array_equal(ds.graph_of_node, original.graph_of_node)
    np.testing.assert_array_equal(ds.graph_labels, original.graph_labels)
    np.testing.assert_array_equal(ds.node_features(), original.node_features())


def test_mutag_round_trip(mutag):
    back = datasets.from_pyg(datasets.to_pyg(mutag, dtype=torch.float64))
    _assert_same(back, mutag)
    np.testing.assert_array_equal(back.edge_index, mutag.edge_index)  # same edges, same order
    # Through a PyG Batch too, and a single Data is one graph.
    batch = Batch.from_data_list(datasets.to_pyg(mutag))
    np.testing.assert_array_equal(datasets.from_pyg(batch).edge_index, mutag.edge_index)
    one = datasets.from_pyg(datasets.to_pyg(mutag)[5])
    assert one.n_graphs == 1 and one.n_nodes == int(mutag.nodes.sizes[5])


def test_pyg_tudataset_equals_the_tu_loader(mutag, pyg_mutag):
    converted = datasets.from_pyg(pyg_mutag)       # the bulk path over the collated storage
    _assert_same(converted, mutag)
    assert _edges_by_graph(converted) == _edges_by_graph(mutag)
    # A subset view goes through the general path, graphs in the view's order.
    subset = datasets.from_pyg(pyg_mutag[[7, 3, 100]])
    np.testing.assert_array_equal(subset.graph_labels, mutag.graph_labels[[7, 3, 100]])
    assert subset.n_nodes == int(mutag.nodes.sizes[[7, 3, 100]].sum())


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
def test_templates_on_converted_data_equal_the_twin(pyg_mutag, kind):
    """The template over from_pyg's dataset computes what the twin computes on PyG's own batch."""
    ds = datasets.from_pyg(pyg_mutag)
    samples = np.array([0, 17, 5, 120, 187])
    module = neurovec.compile(getattr(datasets, kind)(ds, hidden=8, samples=samples, seed=2), dtype=torch.float64)
    twin = getattr(twins, f"{kind}_twin")(ds, hidden=8).double()
    twins.copy_weights(module, twin)
    batch = Batch.from_data_list([pyg_mutag[int(s)] for s in samples])
    theirs = twin(batch.x.double(), batch.edge_index, batch.batch, batch.num_graphs)
    ours = module()
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)
    ours.sum().backward()
    theirs.sum().backward()
    params = dict(twin.named_parameters())
    for name, weight in module.weights.named_parameters():
        torch.testing.assert_close(weight.grad, params[name].grad.reshape(weight.shape), rtol=1e-9, atol=1e-9)


def test_bad_input_is_refused():
    x, edges = torch.ones(3, 2), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(DatasetError, match="no graph labels"):
        datasets.from_pyg(Data(x=x, edge_index=edges))
    with pytest.raises(DatasetError, match="one class label per graph"):
        datasets.from_pyg(Data(x=x, edge_index=edges, y=torch.tensor([0, 1, 0])))
    with pytest.raises(DatasetError, match="outside 0..2"):
        datasets.from_pyg(Data(x=x, edge_index=torch.tensor([[0], [3]]), y=torch.tensor([1])))
    with pytest.raises(DatasetError, match="two different graphs"):
        datasets.from_pyg(Batch.from_data_list([Data(x=x, edge_index=edges, y=torch.tensor([1]))] * 2)
                          .update({"edge_index": torch.tensor([[0], [4]])}))
    with pytest.raises(DatasetError, match="expects a torch_geometric"):
        datasets.from_pyg(42)
    graph = datasets.from_pyg(Data(edge_index=edges, num_nodes=3, y=torch.tensor([-2.0])))
    assert graph.node_features().tolist() == [[1.0]] * 3 and graph.label_values.tolist() == [-2.0]


def test_graphs_without_node_features():
    """A Batch or list of Data without x (the way the InMemoryDataset path used to recommend) failed with a
    TypeError; every node gets the constant feature 1, as the TU loader gives."""
    edges = torch.tensor([[0, 1], [1, 2]])
    items = [Data(edge_index=edges, num_nodes=3, y=torch.tensor([1])), Data(edge_index=edges, num_nodes=4,
                                                                            y=torch.tensor([0]))]
    for data in (items, Batch.from_data_list(items)):
        ds = datasets.from_pyg(data)
        assert ds.nodes.sizes.tolist() == [3, 4] and ds.node_features().tolist() == [[1.0]] * 7
        assert ds.graph_labels.tolist() == [1, 0] and ds.edge_index.tolist() == [[0, 1, 3, 4], [1, 2, 4, 5]]


def test_zero_feature_columns_and_float_targets_are_refused():
    """x of shape (n, 0) was accepted and every template then failed with an OverflowError; float targets 0.2 /
    0.7 / 1.5 silently became three classes."""
    edges = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(DatasetError, match=r"x has no columns \(shape \(3, 0\)\).*leave x out"):
        datasets.from_pyg(Data(x=torch.ones(3, 0), edge_index=edges, y=torch.tensor([1])))
    targets = [Data(x=torch.ones(3, 2), edge_index=edges, y=torch.tensor([v])) for v in (0.2, 0.7, 1.5)]
    with pytest.raises(DatasetError, match=r"y of graph 0 is 0.2, not a whole number: a regression target"):
        datasets.from_pyg(targets)
    with pytest.raises(DatasetError, match=r"y of graph 1 is nan"):
        datasets.from_pyg([Data(x=torch.ones(3, 2), edge_index=edges, y=torch.tensor([v])) for v in (1.0, np.nan)])
    # Whole numbers held as floats are classes, in sorted order (the originals kept).
    ds = datasets.from_pyg([Data(x=torch.ones(3, 2), edge_index=edges, y=torch.tensor([v])) for v in (1.0, -1.0)])
    assert ds.graph_labels.tolist() == [1, 0] and ds.label_values.tolist() == [-1.0, 1.0]
