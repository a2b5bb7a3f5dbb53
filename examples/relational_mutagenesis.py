"""Thesis 6.3's Mutagenesis model written as rules, grounded straight from SQLite, compiled and trained.

    python examples/relational_mutagenesis.py --data ../shared/data/mutagenesis [--epochs 30]

The relations are SQL over the tables ``datasets.create_database`` writes; the joins of every rule
run in SQLite (docs/relational.md, "SQL push-down"). The template, in PyNeuraLogic's syntax::

    W_e atom_embed(A) :- atom_type(A, e).            for every element e: an embedding
    W_t bond_embed(B) :- bond_type(B, t).            for every bond type t
    layer_k(X) :- W_x h(X), W_y h(Y), _bond(X, Y, B), bond_embed(B).   [tanh, avg]   k = 1, 2, 3
    W_out predict :- layer_3(X).                     [avg]  predict/0 [sigmoid]
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import neurovec
from neurovec import datasets
from neurovec.relational import (Aggregation, Database, Metadata, Query, R, SQLRelation, Template,
                                 Transformation, V)

ELEMENT = ("CASE WHEN element = 'c' AND type = 93 THEN 'cl' WHEN element = 'b' AND type = 94 THEN 'br' "
           "ELSE element END")
RELATIONS = {
    "atom_type": SQLRelation(f"SELECT atom_id, {ELEMENT} AS element, molecule_id FROM atom",
                             args=("atom_id", "element"), example="molecule_id"),
    # bonds are stored once: both directions, the bond named by its two atoms
    "bond": SQLRelation("SELECT b.atom1_id AS x, b.atom2_id AS y, b.atom1_id || '-' || b.atom2_id AS bond, "
                        "a.molecule_id FROM bond b JOIN atom a ON a.atom_id = b.atom1_id UNION ALL "
                        "SELECT b.atom2_id, b.atom1_id, b.atom1_id || '-' || b.atom2_id, a.molecule_id "
                        "FROM bond b JOIN atom a ON a.atom_id = b.atom1_id",
                        args=("x", "y", "bond"), example="molecule_id"),
    "bond_type": SQLRelation("SELECT b.atom1_id || '-' || b.atom2_id AS bond, b.type, a.molecule_id "
                             "FROM bond b JOIN atom a ON a.atom_id = b.atom1_id",
                             args=("bond", "type"), example="molecule_id"),
}


def template(elements, bond_types, dim: int = 3) -> Template:
    tanh = Metadata(transformation=Transformation.TANH)
    t = Template()
    for e in elements:
        t += R.atom_embed(V.A)[f"atom_embed.{e}": (dim,)] <= R.atom_type(V.A, e)
    for b in bond_types:
        t += R.bond_embed(V.B)[f"bond_embed.type{b}": (dim,)] <= R.bond_type(V.B, int(b))
    t += R.atom_embed / 1 | tanh
    t += R.bond_embed / 1 | tanh
    previous = "atom_embed"
    for k in (1, 2, 3):
        t += (R.get(f"layer{k}")(V.X) <= (R.get(previous)(V.X)[dim, dim], R.get(previous)(V.Y)[dim, dim],
                                          R.hidden.bond(V.X, V.Y, V.B), R.bond_embed(V.B))) | \
            Metadata(transformation=Transformation.TANH, aggregation=Aggregation.AVG)
        t += R.get(f"layer{k}") / 1 | tanh
        previous = f"layer{k}"
    t += (R.predict[1, dim] <= R.layer3(V.X)) | Metadata(aggregation=Aggregation.AVG)
    t += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    return t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", "--data", default=None,
                        help="folder with the Mutagenesis CSVs (default: $NEUROVEC_DATA/mutagenesis)")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = datasets.create_database(args.data_dir, Path(folder) / "mutagenesis.db")
        ds = datasets.load_mutagenesis(url)      # for the labels, the element names and the bond types
        start = time.perf_counter()
        graph = template(ds.element_names, ds.bond_type_values).ground(
            Database(url, RELATIONS), Query("predict", example=list(ds.molecule_ids)))
        print(f"grounded in SQLite in {time.perf_counter() - start:.2f} s: {graph}")
    module = neurovec.compile(graph)
    target = torch.tensor(ds.labels, dtype=torch.float32)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    for epoch in range(1, args.epochs + 1):
        optimizer.zero_grad()
        out = module().reshape(-1)
        loss = torch.nn.functional.binary_cross_entropy(out, target)
        loss.backward()
        optimizer.step()
        if epoch % 10 == 0 or epoch == 1:
            accuracy = ((out.detach() > 0.5).float() == target).float().mean().item()
            print(f"epoch {epoch:3d}: loss {loss.item():.4f}, training accuracy {accuracy:.3f}")
    print("first outputs:", np.round(module().detach().reshape(-1)[:5].double().numpy(), 3).tolist())


if __name__ == "__main__":
    main()
