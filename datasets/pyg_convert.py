"""PyTorch Geometric data in and out: :func:`from_pyg` and :func:`to_pyg`.

    ds = datasets.from_pyg(pyg_dataset)          # a PyG Data, Batch, InMemoryDataset or list of Data
    graph = datasets.gin(ds, hidden=32)          # the GCN, SAGE and GIN templates take it
    data_list = datasets.to_pyg(ds)              # one torch_geometric Data per graph, for PyG loaders

A converted dataset is a :class:`PygGraphs`, a :class:`~neurovec.datasets.tu.TUDataset`
whose node features are PyG's ``x`` as given (float64), whatever ``use_attributes``
says; a graph without ``x`` gets the constant feature 1 per node, as the TU loader
does (an ``x`` with no columns is refused). ``y`` must hold one class label per graph:
non-negative integers are the class indices as they are (PyG's convention); other
labels (-1/1, whole numbers held as floats) become the classes ``0..C-1`` in sorted
order, and ``label_values`` keeps the originals. A ``y`` that is not a whole number
(a regression target) is refused, not turned into a class per distinct value. Graphs
without nodes are kept, as PyG keeps them.
``edge_attr``, if present, is kept as ``edge_attributes`` (the GNN templates do
not read it). Node-level or multi-column ``y`` is refused with a
:class:`~neurovec.datasets.DatasetError`.

Requires ``torch_geometric`` for :func:`to_pyg` and for converting datasets;
:func:`from_pyg` imports it only to recognise its input.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._common import DatasetError
from .tu import TUDataset

__all__ = ["PygGraphs", "from_pyg", "to_pyg"]


@dataclass(frozen=True, eq=False)
class PygGraphs(TUDataset):
    """Graphs converted from PyTorch Geometric; ``x`` is the node feature matrix."""

    x: np.ndarray = None

    def node_features(self, use_attributes: bool = False) -> np.ndarray:
        """PyG's ``x`` (``use_attributes`` is accepted for the templates and ignored)."""
        return self.x

    def num_node_features(self, use_attributes: bool = False) -> int:
        return int(self.x.shape[1])

    def __repr__(self) -> str:
        return (f"PygGraphs({self.name!r}, {self.n_graphs} graphs, {self.n_nodes} nodes, {self.n_edges} edges, "
                f"{self.x.shape[1]} features, {self.num_classes} classes)")


def from_pyg(data, name: str | None = None) -> PygGraphs:
    """Convert a PyG ``Data`` (one graph), ``Batch``, ``InMemoryDataset`` or list of ``Data``.

    Graphs keep their order: sample ``k`` of the result is graph ``k`` of the input.
    """
    from torch_geometric.data import Batch, Data, InMemoryDataset

    if isinstance(data, Batch):
        return _convert(name or "pyg-batch", data.x, data.edge_index, data.batch, data.num_graphs, data.y,
                        getattr(data, "edge_attr", None), num_nodes=data.num_nodes)
    if isinstance(data, Data):
        return _convert(name or "pyg-data", data.x, data.edge_index, None, 1, data.y,
                        getattr(data, "edge_attr", None), num_nodes=data.num_nodes)
    if isinstance(data, InMemoryDataset) and _plain_storage(data):
        return _from_storage(data, name or getattr(data, "name", type(data).__name__))
    try:
        items = list(data)
    except TypeError:
        raise DatasetError(f"from_pyg expects a torch_geometric Data, Batch, InMemoryDataset or a list of Data "
                           f"(got {type(data).__name__})") from None
    if not items or not all(isinstance(item, Data) for item in items):
        kinds = sorted({type(item).__name__ for item in items}) or ["nothing"]
        raise DatasetError(f"from_pyg: expected a non-empty sequence of torch_geometric Data (got {kinds})")
    return from_pyg(Batch.from_data_list(items), name or getattr(data, "name", type(data).__name__))


def _plain_storage(dataset) -> bool:
    """An InMemoryDataset whose collated storage is exactly its items (no subset view, no transform)."""
    return (dataset._indices is None and dataset.transform is None and dataset.slices is not None
            and "edge_index" in dataset.slices)


def _from_storage(dataset, name: str) -> PygGraphs:
    """Read an InMemoryDataset's collated storage in bulk (edge ids there are local to each graph)."""
    store, slices = dataset._data, dataset.slices
    n_graphs = len(slices["edge_index"]) - 1
    if "x" in slices:
        node_ptr = _numpy(slices["x"])
    else:  # no x: PyG keeps each graph's node count (TUDataset without node labels, as IMDB-BINARY)
        counts = getattr(store, "_num_nodes", None)
        if counts is None or len(counts) != n_graphs:
            return from_pyg(list(dataset), name)
        node_ptr = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])
    graph_of_node = np.repeat(np.arange(n_graphs), np.diff(node_ptr))
    edge_ptr = _numpy(slices["edge_index"])
    graph_of_edge = np.repeat(np.arange(n_graphs), np.diff(edge_ptr))
    edge_index = _numpy(store.edge_index) + node_ptr[graph_of_edge]
    y, classes = store.y, None
    if y is not None and "y" in slices:  # one label per graph; PyG's TUDataset keeps labels past its last graph
        y_ptr = _numpy(slices["y"])
        if np.all(np.diff(y_ptr) == 1):
            y, classes = _numpy(y)[y_ptr[:-1]], _numpy(y)   # ... which still number its classes
    return _convert(name, store.x, edge_index, graph_of_node, n_graphs, y, getattr(store, "edge_attr", None),
                    classes=classes)


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def _convert(name, x, edge_index, graph_of_node, n_graphs, y, edge_attr, num_nodes=None, classes=None) -> PygGraphs:
    """``classes``: every label the dataset holds (PyG's TUDataset keeps some past its last graph), else ``y``."""
    if edge_index is None:
        raise DatasetError(f"from_pyg({name}): no edge_index")
    edge_index = _numpy(edge_index)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2 or not np.issubdtype(edge_index.dtype, np.integer):
        raise DatasetError(f"from_pyg({name}): edge_index must be an integer array of shape (2, E) "
                           f"(got {edge_index.dtype} {edge_index.shape})")
    graph_of_node = None if graph_of_node is None else _numpy(graph_of_node).astype(np.int64)
    if x is not None:
        x = _numpy(x)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2 or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
                               or x.dtype == np.bool_):
            raise DatasetError(f"from_pyg({name}): x must be a real (n_nodes, features) array "
                               f"(got {x.dtype} {x.shape})")
        if x.shape[1] == 0:
            raise DatasetError(f"from_pyg({name}): x has no columns (shape {tuple(x.shape)}), and the templates "
                               "need at least one feature per node; leave x out (del data.x) and every node gets "
                               "the constant feature 1, as for a dataset without node features")
        x = x.astype(np.float64)
        n_nodes = x.shape[0]
    else:
        if num_nodes is None and graph_of_node is None:
            raise DatasetError(f"from_pyg({name}): no x and no num_nodes: the number of nodes is unknown")
        n_nodes = int(num_nodes if num_nodes is not None else graph_of_node.size)
        x = np.ones((n_nodes, 1))
    graph_of_node = np.zeros(n_nodes, np.int64) if graph_of_node is None else graph_of_node
    if graph_of_node.size != n_nodes:
        raise DatasetError(f"from_pyg({name}): {graph_of_node.size} graph indices for {n_nodes} nodes")
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= n_nodes):
        raise DatasetError(f"from_pyg({name}): edge_index refers to node {int(edge_index.max())} "
                           f"(or {int(edge_index.min())}), outside 0..{n_nodes - 1}")
    edge_index = np.ascontiguousarray(edge_index, dtype=np.int64)
    if np.any(graph_of_node[edge_index[0]] != graph_of_node[edge_index[1]]):
        raise DatasetError(f"from_pyg({name}): an edge joins nodes of two different graphs")
    if graph_of_node.size and (graph_of_node.min() < 0 or graph_of_node.max() >= n_graphs):
        raise DatasetError(f"from_pyg({name}): batch refers to graph {int(graph_of_node.max())} (or "
                           f"{int(graph_of_node.min())}), outside 0..{n_graphs - 1}")
    if y is None:
        raise DatasetError(f"from_pyg({name}): no graph labels (y); the templates need one label per graph")
    y = _numpy(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 0:
        y = y.reshape(1)
    if y.ndim != 1 or y.size != n_graphs:
        raise DatasetError(f"from_pyg({name}): y must hold one class label per graph ({n_graphs}), got shape "
                           f"{tuple(y.shape)} (node-level or multi-column labels are not graph classes)")
    if np.issubdtype(y.dtype, np.floating) and not np.isfinite(y).all():
        k = int(np.flatnonzero(~np.isfinite(y))[0])
        raise DatasetError(f"from_pyg({name}): y of graph {k} is {y[k]}, not a class label")
    if np.issubdtype(y.dtype, np.floating) and np.any(y != np.round(y)):
        k = int(np.flatnonzero(y != np.round(y))[0])
        raise DatasetError(
            f"from_pyg({name}): y of graph {k} is {y[k]:g}, not a whole number: a regression target, not a class "
            "label. from_pyg converts graph classification data (the templates and loaders take one class per "
            "graph, and would turn every distinct float into a class of its own); for regression, convert "
            "with integer placeholder labels (e.g. data.y = torch.zeros(n_graphs, dtype=torch.long)) and keep "
            "your targets beside it: sample k of the result is graph k of the input")
    if not (np.issubdtype(y.dtype, np.floating) or np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        raise DatasetError(f"from_pyg({name}): y must hold numbers, one class label per graph (got {y.dtype})")
    classes = y if classes is None else np.concatenate([y, np.asarray(classes).reshape(-1)])
    if np.issubdtype(y.dtype, np.integer) and classes.min() >= 0:
        labels, label_values = y, np.arange(int(classes.max()) + 1)       # already class indices (PyG's way)
    else:
        label_values = np.unique(classes)
        labels = np.searchsorted(label_values, y)
    edge_attributes = None if edge_attr is None else _numpy(edge_attr).astype(np.float64)
    return PygGraphs(name, edge_index, graph_of_node, labels.reshape(-1).astype(np.int64), None, None,
                     label_values, x=x, edge_attributes=edge_attributes)


def to_pyg(ds: TUDataset, use_attributes: bool = False, dtype=None) -> list:
    """One ``torch_geometric.data.Data(x, edge_index, y)`` per graph of ``ds``, in sample order.

    ``x`` is ``ds.node_features(use_attributes)`` (what the templates read), ``y``
    the class index; feed the list to ``torch_geometric.loader.DataLoader``.
    """
    import torch
    from torch_geometric.data import Data

    dtype = dtype or torch.get_default_dtype()
    x = torch.tensor(ds.node_features(use_attributes), dtype=dtype)
    nodes, edges = ds.nodes, ds.edges
    local = torch.from_numpy(ds.nodes.local[ds.edge_index])
    y = torch.from_numpy(ds.graph_labels)
    out = []
    for g in range(ds.n_graphs):
        node_ids = torch.from_numpy(nodes.order[nodes.ptr[g]:nodes.ptr[g + 1]])
        edge_ids = torch.from_numpy(edges.order[edges.ptr[g]:edges.ptr[g + 1]])
        out.append(Data(x=x[node_ids], edge_index=local[:, edge_ids], y=y[g:g + 1]))
    return out
