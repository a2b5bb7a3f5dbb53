"""The relational Mutagenesis architectures of thesis 6.3, as pre-grouped neuron graphs.

Template rules ("simple"; ``d`` = ``dim``, ``act`` = tanh)::

    W_i[d]    AtomEmbed(A) :- AtomType_i(A).        for every element i
    W_j[d]    BondEmbed(B) :- BondStrength_j(B).    for every bond type j
    Layer1(X) :- W_3[d,d] AtomEmbed(X), W_4[d,d] AtomEmbed(Y), _Bond(X, Y, B), BondEmbed(B).
    Layer2(X) :- W_5[d,d] Layer1(X),    W_6[d,d] Layer1(Y),    _Bond(X, Y, B), BondEmbed(B).
    Layer3(X) :- W_7[d,d] Layer2(X),    W_8[d,d] Layer2(Y),    _Bond(X, Y, B), BondEmbed(B).
    W_9[1,d]  Out :- Layer3(X).

"dims" gives bonds embeddings of another size ``bond_dim`` (``W_j[bond_dim]``),
maps them with a matrix per layer (``W[d, bond_dim] BondEmbed(B)``), and uses
``Bond(X, Y, B)`` explicitly: the ground fact (value 1) is then an input of the
rule neuron too. Inputs of a neuron must share one shape, so that fact is
stored as a vector of ones of size ``d`` (the thesis' compiled graph, Appendix
A, holds it as a ``(d, 1)`` unit tensor).

Neurons and layers (grouped by rule and head predicate, thesis 5.1.8):

* facts ``atom_type`` / ``bond_type``: one unit fact per atom / bond;
  ``bond``: (dims) one fact per directed bond ``bond(X, Y, B)``;
* ``atom_embed`` / ``bond_embed``: ``act(W_type . unit)``, one per atom / bond;
* ``layerK_rule``: one rule neuron per ground ``bond(X, Y, B)`` (both directions
  of each bond): ``act(W_x h(X) + W_y h(Y) + [W_b] e(B) [+ bond fact])``;
* ``layerK``: ``act(mean of the rule neurons with head X)``, one per bonded atom;
* ``out``: one per sample molecule, ``sigmoid(mean_X W_out layer3(X))``
  (the head weight is linear, so it commutes with the mean).

An atom without bonds has no ``LayerK`` neuron (nothing grounds the rule), as
in NeuraLogic; it still has an embedding.
"""
from __future__ import annotations

import numpy as np

from ..sources.graph import FactLayer, Graph, NeuronLayer
from ._common import DatasetError, WeightTable, as_samples, csr, glorot
from .mutagenesis import Mutagenesis

__all__ = ["mutagenesis_simple", "mutagenesis_dims", "mutagenesis_template", "ARCHITECTURES"]

ARCHITECTURES = ("simple", "dims")


def mutagenesis_simple(ds: Mutagenesis, dim: int = 3, *, layers: int = 3, aggregation: str = "mean",
                       activation: str = "tanh", samples=None, seed: int = 0) -> Graph:
    """Thesis 6.3 "simple": ``dim``-sized atom and bond embeddings, implicit ``_Bond``."""
    return mutagenesis_template(ds, "simple", dim, layers=layers, aggregation=aggregation,
                                activation=activation, samples=samples, seed=seed)


def mutagenesis_dims(ds: Mutagenesis, dim: int = 3, bond_dim: int = 1, *, layers: int = 3,
                     aggregation: str = "mean", activation: str = "tanh", samples=None, seed: int = 0) -> Graph:
    """Thesis 6.3 "dims": ``bond_dim``-sized bond embeddings mapped by a matrix, explicit ``Bond``."""
    return mutagenesis_template(ds, "dims", dim, bond_dim, layers=layers, aggregation=aggregation,
                                activation=activation, samples=samples, seed=seed)


def mutagenesis_template(ds: Mutagenesis, architecture: str = "simple", dim: int = 3, bond_dim: int | None = None,
                         *, layers: int = 3, aggregation: str = "mean", activation: str = "tanh",
                         samples=None, seed: int = 0) -> Graph:
    """Build either architecture over the molecules ``samples`` (indices or ids; default all).

    Outputs (shape ``(1,)``) follow the sample list, one neuron per entry.
    """
    if architecture not in ARCHITECTURES:
        raise DatasetError(f"unknown architecture {architecture!r} (expected one of {ARCHITECTURES})")
    dims = architecture == "dims"
    bond_dim = (bond_dim or 1) if dims else dim
    if dim < 1 or bond_dim < 1 or layers < 1:
        raise DatasetError(f"dim, bond_dim and layers must be positive (got {dim}, {bond_dim}, {layers})")
    samples = as_samples(samples, ds.n_molecules, ds.molecule_ids)
    rng = np.random.default_rng(seed)
    weights = WeightTable()

    # -- the selected molecules' atoms and bonds, renumbered in sample-list order ---------------
    atoms, atom_copy, atom_start = ds.atoms.take(samples)
    bonds, bond_copy, _ = ds.bonds.take(samples)
    n_atoms, n_bonds = atoms.size, bonds.size
    local = ds.atoms.local
    a = atom_start[bond_copy] + local[ds.bond_atoms[bonds, 0]]
    b = atom_start[bond_copy] + local[ds.bond_atoms[bonds, 1]]
    # Ground bond(X, Y, B) facts, both directions, sorted by head X so each atom's rule
    # neurons are contiguous.
    x, y, bond_of = np.concatenate([a, b]), np.concatenate([b, a]), np.tile(np.arange(n_bonds), 2)
    order = np.lexsort((y, x))
    x, y, bond_of = x[order], y[order], bond_of[order]
    n_rules = x.size

    bonded = np.bincount(x, minlength=n_atoms) > 0
    rank = np.cumsum(bonded) - 1  # atom -> ordinal of its LayerK neuron
    has_layer = np.bincount(atom_copy[bonded], minlength=samples.size) > 0
    if not has_layer.all():
        k = int(np.flatnonzero(~has_layer)[0])
        raise DatasetError(f"molecule {ds.molecule_ids[samples[k]]!r} has no bonds, so the template derives "
                           "nothing for it")

    stack: list = []

    def add(layer) -> int:
        stack.append(layer)
        return len(stack) - 1

    def embeddings(name: str, n: int, kind: np.ndarray, names, size: int) -> int:
        """``act(W_kind . unit)`` per item: one learnable vector per kind = an embedding table."""
        ids = np.array([weights.add(f"{name}.{v}", rng.uniform(-1, 1, size)) for v in names])
        facts = add(FactLayer.units(name.replace("_embed", "_type"), n))
        return add(NeuronLayer(name, np.ones(n, np.int64), np.full(n, facts), np.arange(n),
                               ids[kind], transformation=activation, copy=False))

    atom_embed = embeddings("atom_embed", n_atoms, ds.atom_element[atoms], ds.element_names, dim)
    bond_embed = embeddings("bond_embed", n_bonds, ds.bond_type[bonds],
                            [f"type{v}" for v in ds.bond_type_values.tolist()], bond_dim)
    bond_facts = add(FactLayer("bond", np.ones((n_rules, dim)), copy=False)) if dims else None

    h, h_ordinal = atom_embed, np.arange(n_atoms)  # previous representation and atom -> ordinal
    for k in range(1, layers + 1):
        w_x = weights.add(f"layer{k}.atom_x", glorot(rng, (dim, dim)))
        w_y = weights.add(f"layer{k}.atom_y", glorot(rng, (dim, dim)))
        w_b = weights.add(f"layer{k}.bond", glorot(rng, (dim, bond_dim))) if dims else -1
        # Rule neuron r reads h(X), h(Y), e(B) [and its bond fact]: interleave per neuron.
        columns = [(np.full(n_rules, h), h_ordinal[x], np.full(n_rules, w_x)),
                   (np.full(n_rules, h), h_ordinal[y], np.full(n_rules, w_y)),
                   (np.full(n_rules, bond_embed), bond_of, np.full(n_rules, w_b))]
        if dims:
            columns.append((np.full(n_rules, bond_facts), np.arange(n_rules), np.full(n_rules, -1)))
        src, ordinal, weight = (np.stack([c[i] for c in columns], 1).ravel() for i in range(3))
        rule = add(NeuronLayer(f"layer{k}_rule", np.full(n_rules, len(columns)), src, ordinal, weight,
                               transformation=activation, copy=False))
        counts = np.bincount(rank[x], minlength=int(bonded.sum()))
        h = add(NeuronLayer(f"layer{k}", counts, np.full(n_rules, rule), np.arange(n_rules),
                            aggregation=aggregation, transformation=activation, copy=False))
        h_ordinal = rank

    # Readout: the bonded atoms of each sample position, in order.
    owner = atom_copy[bonded]
    counts, ordinal = csr(owner, samples.size, np.arange(int(bonded.sum())))
    w_out = weights.add("out.weight", glorot(rng, (1, dim)))
    out = add(NeuronLayer("out", counts, np.full(ordinal.size, h), ordinal, np.full(ordinal.size, w_out),
                          aggregation="mean", transformation="sigmoid", copy=False))
    return Graph(stack, weights.weights, np.full(samples.size, out), np.arange(samples.size))
