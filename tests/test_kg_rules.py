"""Link prediction as rules (datasets/kg_rules.py, issue 27): NeuraLogic's own numbers, the numpy template's
numbers, and gradients equal to finite differences."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import neurovec
from neurovec import Settings
from neurovec.datasets import kg as kgmod
from neurovec.datasets import kg_rules, rgcn
from neurovec.engines.reference import ReferenceModule


def subset(graph: kgmod.KnowledgeGraph, relations: int) -> kgmod.KnowledgeGraph:
    """The triples of the first ``relations`` relations only (the message graph shrinks with them)."""
    keep = {split: graph.split(split)[graph.split(split)[:, 1] < relations] for split in kgmod.SPLITS}
    return kgmod.KnowledgeGraph(f"{graph.name}[:{relations}]", graph.entities, graph.relations[:relations],
                                keep["train"], keep["valid"], keep["test"])


@pytest.fixture(scope="module")
def kinship(kg_dir):
    return kgmod.load_kg("kinships", data_dir=kg_dir)


def _ground(graph, triples, dim, values=None, layers=2):
    n_types = 2 * graph.n_relations
    values = values or kg_rules.initial_values(graph.n_entities, n_types, graph.n_relations, dim, layers, seed=1)
    template = kg_rules.template(graph.n_entities, n_types, graph.n_relations, dim, layers, values)
    return template.ground(kg_rules.facts(graph, triples), kg_rules.queries(triples)), values


def test_rules_equal_the_numpy_template(kinship):
    """The rules give what rgcn_encoder + DistMult give with the same weights (the twin of which is PyG's)."""
    small = subset(kinship, 6)
    triples = small.test[:40]
    dim = 5
    graph, values = _ground(small, triples, dim)
    scores = neurovec.compile(graph, dtype=torch.float64)().detach().reshape(-1)
    n_types = 2 * small.n_relations
    encoder = rgcn.rgcn_encoder(small, hidden=dim, layers=2, values={
        **{f"conv{k}.weight": np.stack([values[f"conv{k}.weight.{t}"].T for t in range(n_types)]) for k in (1, 2)},
        **{f"conv{k}.root": values[f"conv{k}.root"].T for k in (1, 2)},
        **{f"conv{k}.bias": values[f"conv{k}.bias"] for k in (1, 2)}})
    module = neurovec.compile(encoder, Settings.preset("default", dynamic_facts=("x",)), dtype=torch.float64)
    z = module(facts={"x": torch.tensor(values["node_emb"].T)}).detach()
    rel = torch.tensor(values["rel_emb"].T)
    h, r, t = torch.tensor(triples).T
    expected = (z[h] * rel[r] * z[t]).sum(-1)
    torch.testing.assert_close(scores, expected, rtol=1e-12, atol=1e-12 * float(expected.abs().max()))


def test_gradients_equal_finite_differences(kinship):
    small = subset(kinship, 3)
    graph, _ = _ground(small, small.test[:15], dim=3)
    module = neurovec.compile(graph, dtype=torch.float64)
    probe = torch.tensor(np.random.default_rng(0).normal(size=15), dtype=torch.float64)

    def loss():
        return (module().reshape(-1) * probe).sum()

    loss().backward()
    rng = np.random.default_rng(1)
    checked = 0
    for name in ("node_emb", "rel_emb", "conv1.weight.0", "conv1.weight.5", "conv1.root", "conv2.root",
                 "conv1.bias", "conv2.bias"):
        param = module.weights[name]
        flat = param.data.view(-1)
        for k in rng.choice(flat.numel(), size=3, replace=False):
            eps = 1e-6
            with torch.no_grad():
                old = float(flat[k])
                flat[k] = old + eps
                up = float(loss())
                flat[k] = old - eps
                down = float(loss())
                flat[k] = old
            numeric = (up - down) / (2 * eps)
            analytic = float(param.grad.view(-1)[k])
            assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (name, int(k), numeric, analytic)
            checked += 1
    assert checked == 24


# -- against NeuraLogic --------------------------------------------------------------------------------------------
def _neuralogic():
    pytest.importorskip("neuralogic", reason="PyNeuraLogic is not installed (pip install neurovec[neuralogic])")
    if shutil.which("java") is None:  # pragma: no cover
        pytest.skip("PyNeuraLogic needs a Java runtime and none is on the PATH")
    import neuralogic.logging
    neuralogic.logging.clear_handlers()
    from neuralogic.core import Settings as NeuraLogicSettings
    return NeuraLogicSettings


def _against_neuralogic(graph_kg, triples, dim, presets=("default", "unoptimized"), reference=True):
    settings = _neuralogic()
    graph, values = _ground(graph_kg, triples, dim)
    model, dataset = kg_rules.neuralogic_model(graph_kg, triples, dim, values=values)
    model.build(settings(chain_pruning=False, iso_value_compression=False))
    built = model.build_dataset(dataset)
    expected = np.asarray(model.test(built), dtype=np.float64).reshape(-1)
    assert expected.shape == (len(triples),)
    scale = np.abs(expected).max()
    got = {preset: neurovec.compile(graph, preset, dtype=torch.float64)() for preset in presets}
    if reference:
        got["reference"] = ReferenceModule(graph, torch.float64)()
    for name, out in got.items():
        np.testing.assert_allclose(out.detach().numpy().reshape(-1), expected, rtol=0, atol=1e-12 * scale,
                                   err_msg=name)


def test_rules_equal_neuralogic_on_kinship_subset(kinship):
    """Kinship's first 3 relations (6 edge types with the inverses), 15 test triples scored by both."""
    small = subset(kinship, 3)
    _against_neuralogic(small, small.test[:15], dim=3)


@pytest.mark.slow
def test_rules_equal_neuralogic_on_kinship(kinship):
    """All of Kinship (25 relations, 50 edge types, 17,088 message edges), 200 test triples."""
    _against_neuralogic(kinship, kinship.test[:200], dim=8, reference=False)


def test_the_rules_grounded_in_sqlite_give_the_arrays_graph(kinship, tmp_path):
    """The template's facts in an SQLite database (one-hot values as columns): the SQL grounder joins the rule per
    edge type one by one, the array grounder as one join family; the graphs are the same, array for array, but for
    the family's aggregation neurons, one layer per rule from SQL, one layer in all from the arrays."""
    import sqlite3

    from neurovec.sources.relational import Database, SQLRelation

    from .relational_cases import with_join_family_layers
    from .test_relational import assert_same_graph

    small = subset(kinship, 4)
    triples = small.test[:30]
    n_types = 2 * small.n_relations
    values = kg_rules.initial_values(small.n_entities, n_types, small.n_relations, 3, 2, seed=1)
    template = kg_rules.template(small.n_entities, n_types, small.n_relations, 3, 2, values)
    facts = kg_rules.facts(small, triples)
    path = tmp_path / "kinship.db"
    con = sqlite3.connect(path)
    relations = {}
    for name, relation in facts.items():
        args = [f"a{c}" for c in range(len(relation.args))]
        width = 0 if relation.values is None else relation.values.shape[1]
        columns = args + [f"v{j}" for j in range(width)]
        con.execute(f"CREATE TABLE {name} ({', '.join(columns)})")
        rows = np.column_stack([np.asarray(a) for a in relation.args] +
                               ([relation.values] if width else [])).tolist()
        rows = [[int(v) for v in row[:len(args)]] + row[len(args):] for row in rows]
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(columns))})", rows)
        relations[name] = SQLRelation(name, args=tuple(args),
                                      values=tuple(columns[len(args):]) if width else None)
    con.commit()
    con.close()
    in_arrays = neurovec.relational.ground(template, facts, kg_rules.queries(triples))
    assert any(g.joined for stage in in_arrays.stages for g in stage.groundings)
    in_sql = neurovec.relational.ground(template, Database(path, relations), kg_rules.queries(triples))
    assert any(layer.name.startswith("rules") for layer in in_arrays.graph.layers)
    assert_same_graph(in_arrays.graph, with_join_family_layers(in_sql.graph, in_arrays.graph))
