"""SQL push-down on PostgreSQL: the graphs of grounding DataFrames, from a live server.

Skipped unless ``NEUROVEC_POSTGRES_URL`` names a database the tests may write tables into (they replace ``atom``,
``bond``, ``molecule``, ``a``, ``b``, ``c``, ``kind``, ``edge``, ``start`` and ``Odd"Table``), e.g.::

    NEUROVEC_POSTGRES_URL=postgresql+psycopg2://user@localhost:5432/scratch python -m pytest tests/test_relational_postgres.py

Locally and in CI, Debian's server over its socket (``apt-get install postgresql``, then a database owned by the
user; ``.ci/run`` does so and sets ``NEUROVEC_POSTGRES_URL=postgresql+psycopg2:///neurovec_test``; the driver is
``pip install psycopg2-binary``). Last run: PostgreSQL 15, psycopg2 2.9.13, collation C.UTF-8, under which strings
sort by code point as in SQLite, so the graphs are equal array for array.
"""
from __future__ import annotations

import os
import sqlite3

import pytest

from neurovec.sources.relational import Database, Query, R, Relation, TemplateError, V, ground, models

from .test_relational import _reach, assert_same_graph
from .test_relational_sql import _database, _frames, _odd_names, _relations, _template, small_db  # noqa: F401

URL = os.environ.get("NEUROVEC_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="NEUROVEC_POSTGRES_URL is not set")
pd = pytest.importorskip("pandas")


@pytest.fixture()
def engine():
    from sqlalchemy import create_engine
    engine = create_engine(URL)
    yield engine
    engine.dispose()


@pytest.fixture()
def small_postgres(small_db, engine):
    """The SQLite fixture's tables copied to the server; the same relations as a Database over it."""
    con = sqlite3.connect(small_db)
    for name in ("a", "b", "c", "kind", "edge", "start"):
        pd.read_sql(f"SELECT * FROM {name}", con).to_sql(name, engine, index=False, if_exists="replace")
    con.close()
    database = _database(small_db)
    database.engine = engine
    return database, _frames(small_db)


def test_postgres_gives_the_dataframes_graph(small_postgres):
    database, frames = small_postgres
    for queries in (R.q, Query("q", example=[1, 0])):
        assert_same_graph(ground(_template(), database, queries).graph,
                          ground(_template(), _relations(frames), queries).graph)


@pytest.mark.parametrize("depth", [None, 3])
def test_postgres_recursion(small_postgres, depth):
    database, frames = small_postgres
    relations = {"edge": Relation.from_frame(frames["edge"], ["src", "dst"], example="chain"),
                 "start": Relation.from_frame(frames["start"], "node", example="chain")}
    for queries in ([Query("q", example=[1, 0]), R.q], R.reach(V.X)):
        assert_same_graph(ground(_reach(depth), database, queries).graph,
                          ground(_reach(depth), relations, queries).graph)


def test_postgres_names_a_fact_given_twice(small_postgres, engine):
    from sqlalchemy import text
    database, _ = small_postgres
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO a VALUES ('x', 0.5, 0)"))
    with pytest.raises(TemplateError, match=r"relation a/1: the fact a\(x\) is given twice in example 0"):
        ground(_template(), database, R.q)


def test_postgres_mutagenesis(mutagenesis_dir, engine):
    from neurovec import datasets
    datasets.create_database(mutagenesis_dir, URL, replace=True)
    ds = datasets.load_mutagenesis(URL)
    template = models.mutagenesis(ds.element_names, ds.bond_type_values, "simple")
    queries = models.mutagenesis_queries(ds, [3, 0, 41, 3], by_id=True)
    frames = {name: pd.read_sql(sql, engine) for name, sql in models.MUTAGENESIS_SQL.items()}
    relations = {"atom_type": Relation.from_frame(frames["atom_type"], ["atom", "element"], example="molecule"),
                 "bond": Relation.from_frame(frames["bond"], ["x", "y", "bond"], example="molecule"),
                 "bond_type": Relation.from_frame(frames["bond_type"], ["bond", "type"], example="molecule")}
    assert_same_graph(ground(template, models.mutagenesis_database(URL), queries).graph,
                      ground(template, relations, queries).graph)


def test_postgres_names_that_need_quoting(tmp_path, engine):
    """PostgreSQL keeps capitals only in quoted names (and refuses unquoted reserved words): SQLAlchemy quotes the
    relations' tables and columns, and the graph is SQLite's."""
    path = tmp_path / "odd.db"
    relations, t = _odd_names(path)
    con = sqlite3.connect(path)
    pd.read_sql('SELECT * FROM "Odd""Table"', con).to_sql('Odd"Table', engine, index=False, if_exists="replace")
    con.close()
    on_postgres = ground(t, Database(engine, relations), R.q).graph
    assert_same_graph(on_postgres, ground(t, Database(path, relations), R.q).graph)
