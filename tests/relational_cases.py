"""What the tests of rule families share (tests/test_relational_families.py, tests/test_relational_join_families.py):
the constants a family's rules differ in, relations from rows of facts, the variations of a family that hypothesis
draws, grounding one rule at a time, and the comparison of the families' graph against it and against NeuraLogic's
numbers (the brute-force oracle of tests/test_relational.py)."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import strategies as st

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


def assert_families_give_one_rule_at_a_time(template, relations: dict, worlds: dict, queries=(R.q,),
                                            may_fail: bool = False) -> list:
    """The graph of ``template`` for each query, pruned and not, is the one that grounding one rule at a time gives,
    array for array, and the query's outputs are NeuraLogic's. ``may_fail``: where one rule at a time fails (e.g. no
    fact of a family's kinds), grounding with families must fail the same way. Returns the groundings (with
    families) for the caller to inspect; none where it failed."""
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
        assert_same_graph(found[-1].graph, graph)
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
