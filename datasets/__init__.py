"""Benchmark datasets and the model templates that turn them into neuron graphs.

* :func:`load_tu` (TU graph classification: MUTAG, ENZYMES, PROTEINS, ...),
  templates :func:`gcn`, :func:`sage`, :func:`gin`;
* :func:`create_database` / :func:`load_mutagenesis` (relational Mutagenesis via
  SQL), templates :func:`mutagenesis_simple`, :func:`mutagenesis_dims`;
* :func:`load_planetoid` (Cora, CiteSeer, PubMed: one graph, a label per node) and
  :func:`rmat_dataset` (skewed synthetic graphs, ``"arxiv-like"``, ``"products-like"``), both
  :class:`NodeDataset`; the same templates with ``readout=None`` predict per node;
* :func:`load_kg` (Kinship, UMLS: triples with filtered ranking) and the RGCN template
  :mod:`neurovec.datasets.rgcn` with its PyG twins :mod:`neurovec.datasets.kg_twins`;
* :func:`from_pyg` / :func:`to_pyg`: PyTorch Geometric ``Data``, ``Batch`` or
  ``InMemoryDataset`` in and out (:mod:`neurovec.datasets.pyg_convert`);
* :mod:`neurovec.datasets.pyg_twins`: PyTorch Geometric models equal to the GNN
  templates (needs ``torch_geometric``).

``python -m neurovec.datasets`` times loading and building the graphs.
"""
from . import pyg_twins  # torch_geometric itself is imported only when a twin is built
from ._common import DatasetError
from .gnn import GNNSpec, TUBatch, build_gnn, gcn, gin, sage, tu_batch
from . import kg, kg_rules, kg_twins, link_prediction, rgcn  # the function rgcn stays datasets.rgcn.rgcn
from .kg import KGFormatError, KnowledgeGraph, load_kg, synthetic_hetero, synthetic_kg
from .nodes import NodeDataset
from .planetoid import load_planetoid, normalize_features
from .synthetic import rmat_dataset
from .mutagenesis import Mutagenesis, MutagenesisError, create_database, load_mutagenesis
from .pyg_convert import PygGraphs, from_pyg, to_pyg
from .relational import mutagenesis_dims, mutagenesis_simple, mutagenesis_template
from .tu import TUDataset, TUFormatError, load_tu

__all__ = [
    "DatasetError", "GNNSpec", "Mutagenesis", "MutagenesisError", "TUBatch", "TUDataset", "TUFormatError",
    "build_gnn", "create_database", "gcn", "gin", "load_mutagenesis", "load_tu", "mutagenesis_dims",
    "mutagenesis_simple", "mutagenesis_template", "pyg_twins", "sage", "tu_batch", "PygGraphs", "from_pyg",
    "to_pyg", "NodeDataset", "load_planetoid", "normalize_features", "rmat_dataset",
    "kg", "kg_rules", "kg_twins", "link_prediction", "rgcn", "KGFormatError", "KnowledgeGraph", "load_kg",
    "synthetic_hetero", "synthetic_kg",
]
