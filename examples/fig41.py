"""Thesis Fig. 4.1: two molecules under the template

    W_h1 h(X) :- W_a a(Y), W_b b(X, Y).      [rule: sigmoid, aggregation: avg]   h/1 [sigmoid]
    W_q  q    :- W_h2 h(X).                  [rule: sigmoid, aggregation: avg]   q/0 [sigmoid]

written as a neurovec.relational template and grounded by joins. Atoms a(.) and bonds b(., .) are unit
facts, so ``W_a . a(Y)`` is just ``W_a``: an embedding. Each example is one molecule, the query ``q``
one output per molecule. Run ``python examples/fig41.py`` to print the grounded layers and the compiled
program.
"""
import numpy as np

import neurovec
from neurovec.relational import Metadata, R, Relation, Template, Transformation, V

# Molecule 0: h1 - o1 - h2; molecule 1: h3 - h4. Bonds in both directions.
ATOMS = ["h1", "o1", "h2", "h3", "h4"]
MOLECULE_OF_ATOM = [0, 0, 0, 1, 1]
BONDS = [("h1", "o1"), ("o1", "h2"), ("o1", "h1"), ("h2", "o1"), ("h3", "h4"), ("h4", "h3")]
MOLECULE_OF_BOND = [0, 0, 0, 0, 1, 1]


def fig41_template(dim: int = 3, seed: int = 0) -> Template:
    rng = np.random.default_rng(seed)
    sigmoid = Metadata(transformation=Transformation.SIGMOID)
    t = Template()
    t += (R.h(V.X)["W_h1": rng.normal(size=(dim, dim))] <=
          (R.a(V.Y)["W_a": rng.normal(size=dim)], R.b(V.X, V.Y)["W_b": rng.normal(size=dim)])) | sigmoid
    t += R.h / 1 | sigmoid
    t += (R.q["W_q": rng.normal(size=(1, dim))] <= R.h(V.X)["W_h2": rng.normal(size=(dim, dim))]) | sigmoid
    t += R.q / 0 | sigmoid
    return t


def fig41_facts() -> dict:
    return {"a": Relation(ATOMS, example=MOLECULE_OF_ATOM),
            "b": Relation(([x for x, _ in BONDS], [y for _, y in BONDS]), example=MOLECULE_OF_BOND)}


def fig41_graph(dim: int = 3, seed: int = 0) -> neurovec.Graph:
    """The grounded graph: outputs q(molecule 0), q(molecule 1)."""
    return fig41_template(dim, seed).ground(fig41_facts(), R.q)


if __name__ == "__main__":
    print(fig41_template())
    graph = fig41_graph()
    for layer in graph.layers:
        print(f"  {layer.name}: {layer.size} neurons")
    module = neurovec.compile(graph)
    print(module.code)
    print("q(molecule 0), q(molecule 1):", module().detach().reshape(-1).tolist())
