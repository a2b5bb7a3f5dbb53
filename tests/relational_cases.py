"""What the tests of rule families share (tests/test_relational_families.py, tests/test_relational_join_families.py):
the constants a family's rules differ in, relations from rows of facts, the variations of a family that hypothesis
draws, grounding one rule at a time, and the comparison of the families' graph against it and against NeuraLogic's
numbers (the brute-force oracle of tests/test_relational.py)."""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import strategies as st

from neurovec.sources.graph import Graph, NeuronLayer
from neurovec.sources.relational import Database, R, Relation, SQLRelation, ground
from neurovec.sources.relational.grounding import NumpyGrounder
from neurovec.sources.relational.template import Aggregation

from .test_relational import assert_same_graph, brute_force, outputs

KINDS = ["k0", "k1", "k2", "k3"]   # the facts have k0..k2: k3 never occurs


def relation(rows: list, values: list | None = None) -> Relation:
    """The relation of ``rows``, each ``(example, args)`` with ``args`` a tuple of constants."""
    arity = len(rows[0][1])
    return Relation(tuple(np.array([r[1][c] for r in rows]) for c in range(arity)), values=values,
                    example=[r[0] for r in rows])


@dataclass
class Family:
    """A family's rules (one per kind, in order) and their variations."""

    kinds: list              # the first two differ, the first is one that occurs; a repeated kind ends a family
    head_weights: bool       # a head weight on every rule
    literal_weight: int | None   # the rule with a weighted body literal, if any (half of the time none)
    offset: int | None       # the rule with an offset, if any (half of the time none)
    aggregation: Aggregation


def weight(draw) -> float:
    return round(draw(st.floats(-1.5, 1.5)), 2)


def draw_family(draw) -> Family:
    first = draw(st.sampled_from(KINDS[:3]))
    kinds = [first, draw(st.sampled_from([k for k in KINDS if k != first]))]
    kinds += draw(st.lists(st.sampled_from(KINDS), max_size=4))
    # half of the rules without a literal weight or offset: a family that can be kept whole is common
    one_rule = st.none() | st.sampled_from(range(len(kinds)))
    return Family(kinds, draw(st.booleans()), draw(one_rule), draw(one_rule),
                  draw(st.sampled_from([Aggregation.AVG, Aggregation.SUM, Aggregation.MAX, Aggregation.COUNT])))


def one_rule_at_a_time(patch):
    """Ground every rule alone: no family of one-constant rules, no join family."""
    patch.setattr(NumpyGrounder, "_families", lambda self, rules: [[r] for r in rules])
    patch.setattr(NumpyGrounder, "_join_families", lambda self, rules: [[r] for r in rules])


_FAMILY_LAYER = re.compile(r"rules(\d+)-(\d+):(.+)")
_RULE_LAYER = re.compile(r"rule(\d+):(.+)")


def with_join_family_layers(graph, like):
    """``graph`` (grounded one rule at a time, or by the SQL grounder, which joins rules one by one) with the
    aggregation layers of each join family that ``like`` assembled whole, a layer named ``rules{lo}-{hi}:{rest}``,
    merged as the assembly merges them: the consecutive layers ``rule{k}:{rest}`` with ``lo <= k <= hi`` become one
    layer, their neurons concatenated in order, and every reader (and output) reads the merged layer. ``graph``
    itself when ``like`` has no such layer."""
    families = [(int(m[1]), int(m[2]), m[3]) for layer in like.layers if (m := _FAMILY_LAYER.fullmatch(layer.name))]
    if not families:
        return graph
    group_of = {}
    for i, layer in enumerate(graph.layers):
        m = _RULE_LAYER.fullmatch(layer.name)
        for low, high, rest in families:
            if m and low <= int(m[1]) <= high and m[2] == rest:
                group_of[i] = (low, high, rest)
    layers, new_index, offset = [], [], []   # per layer of graph: its place in the merged graph
    i = 0
    while i < len(graph.layers):
        key, parts = group_of.get(i), [graph.layers[i]]
        while key is not None and i + len(parts) < len(graph.layers) and group_of.get(i + len(parts)) == key:
            parts.append(graph.layers[i + len(parts)])
        start = 0
        for part in parts:
            new_index.append(len(layers))
            offset.append(start)
            start += part.size
        if len(parts) == 1:
            layers.append(parts[0])
        else:
            arrays = {f: np.concatenate([getattr(p, f) for p in parts])
                      for f in ("counts", "input_layer", "input_ordinal", "input_weight", "bias")}
            assert len({(p.aggregation, p.transformation) for p in parts}) == 1
            layers.append(NeuronLayer(f"rules{key[0]}-{key[1]}:{key[2]}", **arrays, aggregation=parts[0].aggregation,
                                      transformation=parts[0].transformation))
        i += len(parts)
    new_index, offset = np.array(new_index), np.array(offset)
    layers = [replace(layer, input_layer=new_index[layer.input_layer],
                      input_ordinal=layer.input_ordinal + offset[layer.input_layer])
              if isinstance(layer, NeuronLayer) else layer for layer in layers]
    return Graph(layers, graph.weights, new_index[graph.output_layer],
                 graph.output_ordinal + offset[graph.output_layer])


def assert_families_give_one_rule_at_a_time(template, relations: dict, worlds: dict, queries=(R.q,),
                                            may_fail: bool = False) -> list:
    """The graph of ``template`` for each query, pruned and not, is the one that grounding one rule at a time gives,
    array for array (each join family's aggregation layers merged into one, see :func:`with_join_family_layers`), and
    the query's outputs are NeuraLogic's. ``may_fail``: where one rule at a time fails (e.g. no fact of a family's
    kinds), grounding with families must fail the same way. Returns the groundings (with families) for the caller to
    inspect; none where it failed."""
    try:
        with pytest.MonkeyPatch.context() as patch:
            one_rule_at_a_time(patch)
            expected = {(q, prune): ground(template, relations, queries[q], prune=prune).graph
                        for q in range(len(queries)) for prune in (True, False)}
    except Exception as error:
        if not may_fail:
            raise
        with pytest.raises(type(error), match="."):
            ground(template, relations, queries[0])
        return []
    found = []
    for (q, prune), graph in expected.items():
        found.append(ground(template, relations, queries[q], prune=prune))
        assert_same_graph(found[-1].graph, with_join_family_layers(graph, found[-1].graph))
    examples = sorted({int(e) for e in relations["a"].example})
    values = brute_force(template, worlds, [(e, "q", ()) for e in examples])
    np.testing.assert_allclose(outputs(ground(template, relations, R.q).graph).reshape(-1), values, rtol=0,
                               atol=1e-9)
    return found


def sqlite_database(path, relations: dict, columns: dict) -> Database:
    """``relations`` written to an SQLite file at ``path``, one table per relation named in ``columns`` (relation ->
    the names of its argument columns), with its values in ``v`` and its example in ``ex``."""
    con = sqlite3.connect(path)
    tables = {}
    for name, args in columns.items():
        rel = relations[name]
        cols = [(c, rel.args[k]) for k, c in enumerate(args)]
        if rel.values is not None:
            cols.append(("v", rel.values))
        cols.append(("ex", rel.example))
        kinds = ["TEXT" if column.dtype.kind in "US" else "REAL" if column.dtype.kind == "f" else "INTEGER"
                 for _, column in cols]
        con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {kind}' for (c, _), kind in zip(cols, kinds))})")
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(cols))})",
                        zip(*(column.tolist() for _, column in cols)))
        tables[name] = SQLRelation(name, args=tuple(args), values="v" if rel.values is not None else None,
                                   example="ex")
    con.commit()
    con.close()
    return Database(path, tables)
