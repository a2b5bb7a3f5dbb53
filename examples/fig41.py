"""Thesis Fig. 4.1: two molecules under the template

    W_h1 h(X) :- W_a a(Y), W_b b(X, Y).
    W_q  q    :- W_h2 h(X).

Atoms a(.) and bonds b(., .) are unit facts, so ``W_a . a(Y)`` is just ``W_a``:
an embedding. Run ``python examples/fig41.py`` to compile and print the program.
"""
import numpy as np

import neurovec

# Molecule 1: h1 - o1 - h2; molecule 2: h3 - h4. Bonds in both directions.
ATOMS = ["h1", "o1", "h2", "h3", "h4"]
MOLECULE_OF_ATOM = [0, 0, 0, 1, 1]
BONDS = [("h1", "o1"), ("o1", "h2"), ("o1", "h1"), ("h2", "o1"), ("h3", "h4"), ("h4", "h3")]


def fig41_graph(dim: int = 3, seed: int = 0) -> neurovec.Graph:
    rng = np.random.default_rng(seed)
    b = neurovec.GraphBuilder()
    W_a, W_b = b.weight("W_a", rng.normal(size=dim)), b.weight("W_b", rng.normal(size=dim))
    W_h1, W_h2 = b.weight("W_h1", rng.normal(size=(dim, dim))), b.weight("W_h2", rng.normal(size=(dim, dim)))
    W_q = b.weight("W_q", rng.normal(size=(1, dim)))
    a, bond = b.unit_facts("a", len(ATOMS)), b.unit_facts("b", len(BONDS))
    atom = {name: i for i, name in enumerate(ATOMS)}

    # One rule neuron per grounding (X, Y) of the body, then aggregate per head h(X).
    rule_h = b.layer("rule_h", aggregation="sum", transformation="sigmoid")
    groundings = {x: [] for x in ATOMS}
    for k, (x, y) in enumerate(BONDS):
        groundings[x].append(rule_h.neuron([(a[atom[y]], W_a), (bond[k], W_b)]))
    agg_h = b.layer("agg_h", aggregation="mean")
    aggregated = [agg_h.neuron(groundings[x]) for x in ATOMS]
    h = b.layer("h", transformation="sigmoid")
    h_atoms = [h.neuron([(aggregated[i], W_h1)]) for i in range(len(ATOMS))]

    rule_q = b.layer("rule_q", transformation="sigmoid")
    rules = [rule_q.neuron([(h_atoms[i], W_h2)]) for i in range(len(ATOMS))]
    agg_q = b.layer("agg_q", aggregation="mean")
    q = b.layer("q", transformation="sigmoid")
    for m in range(2):
        members = [rules[i] for i in range(len(ATOMS)) if MOLECULE_OF_ATOM[i] == m]
        b.output(q.neuron([(agg_q.neuron(members), W_q)]))
    return b.build()


if __name__ == "__main__":
    graph = fig41_graph()
    module = neurovec.compile(graph)
    print(module.code)
    print("q(molecule 1), q(molecule 2):", module().detach().reshape(-1).tolist())
