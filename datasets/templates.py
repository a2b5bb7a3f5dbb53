"""All model templates in one place: GNNs over TU datasets and the relational Mutagenesis ones.

See :mod:`neurovec.datasets.gnn` and :mod:`neurovec.datasets.relational` for their semantics.
"""
from .gnn import GNNSpec, build_gnn, gcn, gin, sage
from .relational import ARCHITECTURES, mutagenesis_dims, mutagenesis_simple, mutagenesis_template

__all__ = ["ARCHITECTURES", "GNNSpec", "build_gnn", "gcn", "gin", "sage", "mutagenesis_dims",
           "mutagenesis_simple", "mutagenesis_template"]
