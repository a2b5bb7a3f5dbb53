"""TU graph datasets (neurovec's loader) as PyNeuraLogic datasets, and PyNeuraLogic GNN templates.

Used by the tests and the import benchmarks; handy for users comparing neurovec with NeuraLogic
on the same graphs::

    tu = neurovec.datasets.tu.load_tu("MUTAG", data_dir)
    model = gnn_model("gcn", tu.node_features().shape[1], hidden=8)
    model.build(Settings(chain_pruning=False, iso_value_compression=False))
    built = model.build_dataset(tu_dataset(tu))
"""
from __future__ import annotations

import numpy as np

__all__ = ["tu_dataset", "gnn_model"]


def tu_dataset(tu, samples=None, use_attributes: bool = False):
    """A ``neuralogic.dataset.TensorDataset`` of TU graphs: node features ``node_feature(i)``, edges
    ``edge(u, v)`` (value 1), one query ``predict`` per graph labelled with the class index."""
    from neuralogic.dataset import Data, TensorDataset

    features = tu.node_features(use_attributes)
    graphs = range(tu.n_graphs) if samples is None else np.asarray(samples).reshape(-1)
    edge_graph = tu.graph_of_node[tu.edge_index[0]]
    data = []
    for g in graphs:
        nodes = np.flatnonzero(tu.graph_of_node == g)
        edges = tu.edge_index[:, edge_graph == g] - nodes[0]  # TU numbers a graph's nodes contiguously
        data.append(Data(x=features[nodes], edge_index=edges, y=float(tu.graph_labels[g])))
    return TensorDataset(data, number_of_classes=1)


def gnn_model(kind: str, in_dim: int, hidden: int = 8, layers: int = 2, readout_aggregation=None):
    """A PyNeuraLogic ``Model`` of ``layers`` GCN (``kind="gcn"``), GraphSAGE (``"sage"``) or GATv2
    (``"gatv2"``) layers from ``neuralogic.nn.module``, ReLU between them, then ``predict`` =
    sigmoid(W . avg_i h(i))."""
    from neuralogic.core import Aggregation, Metadata, Model, R, Transformation, V
    from neuralogic.nn.module import GATv2Conv, GCNConv, SAGEConv

    conv = {"gcn": GCNConv, "sage": SAGEConv, "gatv2": GATv2Conv}[kind]
    model, source, dim = Model(), "node_feature", in_dim
    for k in range(1, layers + 1):
        activation = Transformation.RELU if k < layers else Transformation.IDENTITY
        model += conv(dim, hidden, f"h{k}", source, "edge", activation=activation)
        source, dim = f"h{k}", hidden
    readout = R.predict[1, hidden] <= R.get(source)(V.X)
    if readout_aggregation is not None:
        readout = readout | Metadata(aggregation=readout_aggregation)
    else:
        readout = readout | Metadata(aggregation=Aggregation.AVG)
    model += readout
    model += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    return model
