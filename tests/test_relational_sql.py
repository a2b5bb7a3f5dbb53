"""SQL push-down (SQLite): grounding in the database gives the same graph as grounding DataFrames or arrays."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from neurovec.sources.relational import (Aggregation, Database, Metadata, Query, R, Relation, SQLRelation,
                                         Template, TemplateError, Transformation, V, ground)
from neurovec.sources.relational import models

from .test_relational import _reach, assert_same_graph, outputs

pd = pytest.importorskip("pandas")


@pytest.fixture()
def small_db(tmp_path):
    """Two examples of a(X), b(X, Y), c(X) with values, a relation without examples, chains for recursion."""
    path = tmp_path / "small.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE a (x TEXT, v REAL, ex INTEGER)")
    con.executemany("INSERT INTO a VALUES (?, ?, ?)", [("x", 0.7, 0), ("z", 0.1, 0), ("x", 0.3, 1), ("y", 0.25, 1)])
    con.execute("CREATE TABLE b (x TEXT, y TEXT, v REAL, ex INTEGER)")
    con.executemany("INSERT INTO b VALUES (?, ?, ?, ?)", [("x", "y", 0.2, 0), ("x", "x", 0.9, 0),
                                                          ("x", "z", -0.4, 0), ("x", "y", 0.5, 1)])
    con.execute("CREATE TABLE c (x TEXT, v REAL, ex INTEGER)")
    con.executemany("INSERT INTO c VALUES (?, ?, ?)", [("x", 1 / 3, 0), ("z", 2.0, 0), ("y", -1.5, 1)])
    con.execute("CREATE TABLE kind (x TEXT, k1 REAL, k2 REAL)")  # no example column: holds in every example
    con.executemany("INSERT INTO kind VALUES (?, ?, ?)", [("y", 1.0, 2.0), ("x", -1.0, 0.5)])
    con.execute("CREATE TABLE edge (src TEXT, dst TEXT, chain INTEGER)")
    con.executemany("INSERT INTO edge VALUES (?, ?, ?)", [("a", "b", 0), ("b", "c", 0), ("p", "q", 1)])
    con.execute("CREATE TABLE start (node TEXT, chain INTEGER)")
    con.executemany("INSERT INTO start VALUES (?, ?)", [("a", 0), ("p", 1)])
    con.commit()
    con.close()
    return path


def _frames(path) -> dict:
    con = sqlite3.connect(path)
    frames = {name: pd.read_sql(f"SELECT * FROM {name}", con) for name in ("a", "b", "c", "kind", "edge", "start")}
    con.close()
    return frames


def _relations(frames) -> dict:
    return {"a": Relation.from_frame(frames["a"], "x", values="v", example="ex"),
            "b": Relation.from_frame(frames["b"], ["x", "y"], values="v", example="ex"),
            "c": Relation.from_frame(frames["c"], "x", values="v", example="ex"),
            "kind": Relation.from_frame(frames["kind"], "x", values=["k1", "k2"])}


def _database(path) -> Database:
    return Database(path, {"a": SQLRelation("a", args="x", values="v", example="ex"),
                           "b": SQLRelation("SELECT x, y, v, ex FROM b", args=("x", "y"), values="v", example="ex"),
                           "c": SQLRelation("c", args="x", values="v", example="ex"),
                           "kind": SQLRelation("kind", args="x", values=("k1", "k2")),
                           "edge": SQLRelation("edge", args=("src", "dst"), example="chain"),
                           "start": SQLRelation("start", args="node", example="chain")})


def _template() -> Template:
    """Offsets, two rules per head, max aggregation, negation, @neq, a hidden literal, a constant, vectors from a
    relation without examples, and template facts."""
    t = Template()
    t += (R.h(V.X)[2.0] <= (R.a(V.X)[1.5], R.b(V.X, V.Y)[-1.0], R.special.neq(V.X, V.Y), 0.25)) | \
        Metadata(aggregation=Aggregation.MAX, transformation=Transformation.TANH)
    t += R.h(V.X) <= (R.c(V.X)[3.0], ~R.a(V.X), R.hidden.b("x", V.Z))
    t += R.h / 1 | Metadata(offset=0.125, transformation=Transformation.SIGMOID)
    t += R.g(V.X)[[1.0, -1.0]] <= (R.kind(V.X)[[[0.5, 0.25], [1.0, 0.0]]], R.h(V.X), R.tag(V.X))
    t += R.tag("x")
    t += R.tag("y")[0.5]
    t += (R.q[[1.0]] <= R.h(V.X)) | Metadata(transformation=Transformation.SIGMOID)
    t += (R.q[[[0.5, 1.0]]] <= R.g(V.X)) | Metadata(aggregation=Aggregation.SUM)
    return t


def test_sql_gives_the_dataframes_graph(small_db):
    from_sql = ground(_template(), _database(small_db), R.q)
    from_frames = ground(_template(), _relations(_frames(small_db)), R.q)
    assert_same_graph(from_sql.graph, from_frames.graph)
    np.testing.assert_allclose(outputs(from_sql.graph), outputs(from_frames.graph), rtol=0, atol=0)
    assert from_sql.stats["groundings"] == from_frames.stats["groundings"] > 0


@pytest.mark.parametrize("depth", [None, 3])
def test_sql_recursion(small_db, depth):
    t = _reach(depth)  # the recursive template of test_relational, grounded here from SQL
    frames = _frames(small_db)
    relations = {"edge": Relation.from_frame(frames["edge"], ["src", "dst"], example="chain"),
                 "start": Relation.from_frame(frames["start"], "node", example="chain")}
    for queries in ([Query("q", example=[1, 0]), R.q], R.reach(V.X)):
        from_sql = ground(t, _database(small_db), queries).graph
        assert_same_graph(from_sql, ground(t, relations, queries).graph)


def test_sql_errors_name_the_relation(small_db):
    con = sqlite3.connect(small_db)
    con.execute("INSERT INTO a VALUES ('x', 0.5, 0)")
    con.commit()
    con.close()
    t = Template()
    t += R.q <= R.a(V.X)
    with pytest.raises(TemplateError, match=r"relation a/1: the fact a\(x\) is given twice in example 0"):
        ground(t, _database(small_db), R.q)
    with pytest.raises(TemplateError, match=r"query q in example 7 \(output 0\) matches nothing"):
        ground(t, Database(small_db, {"a": SQLRelation("c", args="x", example="ex")}), Query("q", example=[7]))
    with pytest.raises(TemplateError, match=r"expected an SQLRelation"):
        Database(small_db, {"a": Relation([1])})



@pytest.mark.parametrize("relation, match", [
    (SQLRelation("c", args="x", values="v", example="exx"), r"relation 'c': its example column 'exx' is not a column "
                                                            r"of 'c' \(its columns: \['x', 'v', 'ex'\]\)"),
    (SQLRelation("SELECT x, v, ex FROM c", args="xx", values="v", example="ex"),
     r"relation 'c': its argument 0 column 'xx' is not a column of 'SELECT x, v, ex FROM c'"),
    (SQLRelation("c", args="x", values="vv", example="ex"), r"relation 'c': its value column 'vv' is not a column"),
    (SQLRelation("cc", args="x", values="v", example="ex"), r"relation 'c': the database \(sqlite:///.*small.db\) "
                                                            r"has no table or view 'cc' \(it has \['a', 'b', 'c', "),
    (SQLRelation("SELECT x, v, ex FROM cc", args="x", values="v", example="ex"),
     r"relation 'c': its source 'SELECT x, v, ex FROM cc' fails in the database .*no such table: cc"),
])
def test_sql_columns_are_checked_against_the_schema(small_db, relation, match):
    """SQLite reads a quoted unknown column as a string constant: with the example column misspelled, c's one fact
    per example became c(x) in an example named 'exx', which no query asks about, so the rule grounded to nothing
    and q was another model, without a word. Every column a relation names is checked against its source."""
    t = Template()
    t += R.q <= (R.a(V.X), R.c(V.X))
    t += R.q <= R.a(V.X)
    relations = {"a": SQLRelation("a", args="x", values="v", example="ex"), "c": relation}
    with pytest.raises(TemplateError, match=match):
        ground(t, Database(small_db, relations), Query("q", example=[0, 1]))
    ground(t, Database(small_db, {**relations, "c": SQLRelation("c", args="X", values="V", example="EX")}), R.q)


def test_sql_text_values_and_missing_databases_are_named(small_db, tmp_path):
    """A value column holding text failed in numpy ("could not convert string to float"); a database path in a
    missing folder failed inside the first statement (sqlite3.OperationalError), and a missing file was created
    empty."""
    t = Template()
    t += R.q <= R.a(V.X)
    with pytest.raises(TemplateError, match=r"relation a/1: its value column 'x' holds 'x' \(a str\), not a number"):
        ground(t, Database(small_db, {"a": SQLRelation("a", args="x", values="x", example="ex")}), R.q)
    with pytest.raises(TemplateError, match=r"Database\('.*nowhere/m.db'\): no SQLite database there \(its folder "
                                            r"'.*nowhere' does not exist\)"):
        Database(tmp_path / "nowhere" / "m.db", {})
    with pytest.raises(TemplateError, match=r"no SQLite database there \(no such file\)"):
        Database(tmp_path / "m.db", {})
    assert not (tmp_path / "m.db").exists()


def test_facts_given_twice_are_named_wherever_they_come_from(small_db):
    """On SQLite the unique index of a fact table is the check: a relation without examples, and the template's own
    facts, given twice, are errors naming the fact (one per example: every example holds them)."""
    t = _template()
    t += R.tag("x")
    with pytest.raises(TemplateError, match=r"tag/1: the fact tag\(x\) is given twice in example 0"):
        ground(t, _database(small_db), R.q)
    con = sqlite3.connect(small_db)
    con.execute("INSERT INTO kind VALUES ('y', 3.0, 4.0)")
    con.commit()
    con.close()
    with pytest.raises(TemplateError, match=r"relation kind/1: the fact kind\(y\) is given twice in example 0"):
        ground(_template(), _database(small_db), R.q)

def test_mutagenesis_from_the_database(mutagenesis_dir, tmp_path):
    """The database datasets.create_database writes, grounded in SQL: the graph of the same relations as
    DataFrames, and the numbers of the hand-written template."""
    from neurovec import datasets
    url = datasets.create_database(mutagenesis_dir, tmp_path / "mutagenesis.db")
    ds = datasets.load_mutagenesis(url)
    samples = [3, 0, 41, 3]
    hand = datasets.mutagenesis_simple(ds, samples=samples)
    template = models.mutagenesis(ds.element_names, ds.bond_type_values, "simple",
                                  values={w.name: w.value for w in hand.weights})
    queries = models.mutagenesis_queries(ds, samples, by_id=True)
    from_sql = ground(template, models.mutagenesis_database(url), queries).graph
    from sqlalchemy import create_engine
    engine = create_engine(url)
    frames = {name: pd.read_sql(sql, engine) for name, sql in models.MUTAGENESIS_SQL.items()}
    engine.dispose()
    relations = {"atom_type": Relation.from_frame(frames["atom_type"], ["atom", "element"], example="molecule"),
                 "bond": Relation.from_frame(frames["bond"], ["x", "y", "bond"], example="molecule"),
                 "bond_type": Relation.from_frame(frames["bond_type"], ["bond", "type"], example="molecule")}
    assert_same_graph(from_sql, ground(template, relations, queries).graph)
    np.testing.assert_allclose(outputs(from_sql, "default"), outputs(hand, "default"), rtol=0, atol=1e-9)


@pytest.mark.parametrize("source", ["frames", "sql"])
def test_data_for_a_predicate_the_template_defines_is_refused(small_db, source):
    t = _template()
    t += R.a("x")[0.5]  # a/1 is also a relation of the data
    data = _relations(_frames(small_db)) if source == "frames" else _database(small_db)
    with pytest.raises(TemplateError, match="predicate a/1 has facts both in the template and in the data"):
        ground(t, data, R.q)


def test_integer_columns_come_back_whole_and_sorted(tmp_path):
    """SQLite returns an integer result column by column (group_concat), sorted by numpy: the rows, in the order,
    that ``SELECT ... ORDER BY`` gives; a NULL (which group_concat would skip) is an error, not a shifted column."""
    from neurovec.sources.relational.sql import SQLGrounder
    rng = np.random.default_rng(0)
    rows = rng.integers(-3, 4, (300, 3)).tolist()
    path = tmp_path / "ints.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    import sqlalchemy as sa
    t = sa.table("t", sa.column("a"), sa.column("b"), sa.column("c"))
    columns = [t.c.a, t.c.b, t.c.c]
    grounder = SQLGrounder.__new__(SQLGrounder)
    with Database(path, {}).connect() as grounder.conn:
        for order in (["a"], ["b", "a"], ["c", "b", "a"]):
            expected = grounder.conn.exec_driver_sql(f"SELECT a, b, c FROM t ORDER BY {', '.join(order)}").fetchall()
            got = grounder._ints(columns, t, [t.c[c] for c in order])
            if len(order) == 3:   # a total order: the same rows in the same order
                np.testing.assert_array_equal(got, np.array(expected))
            else:                 # ties in any order: sorted by the order's columns, the same rows
                keys = [["a", "b", "c"].index(c) for c in order]
                np.testing.assert_array_equal(got[:, keys], np.array(expected)[:, keys])
                assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected))
        above = sa.select(t.c.a).where(t.c.a > 99).subquery()
        assert grounder._ints([above.c.a], above).shape == (0, 1)
        # a column longer than SQLite's longest string: read row by row instead
        raw = grounder.conn.connection.driver_connection
        longest = raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100)
        try:
            np.testing.assert_array_equal(grounder._ints(columns, t, [t.c.c, t.c.b, t.c.a]), np.array(expected))
        finally:
            raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, longest)
        grounder.conn.exec_driver_sql("INSERT INTO t VALUES (NULL, 1, 2)")
        with pytest.raises(TemplateError, match="expected 301 integers in column t.a of t"):
            grounder._ints(columns[:2], t)


def _odd_names(path) -> tuple:
    """A table whose name and columns need quoting (a double quote, capitals, SQL's reserved words): the SQLite file,
    the relations naming it as a table and through a SELECT, and the template reading them."""
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE "Odd""Table" ("Atom ID" TEXT, "select" TEXT, "Value" REAL, "order" INTEGER)')
    con.executemany('INSERT INTO "Odd""Table" VALUES (?, ?, ?, ?)',
                    [("x", "y", 0.5, 0), ("y", "x", -1.0, 0), ("x", "x", 2.0, 1), ("x", "z", 0.25, 1)])
    con.commit()
    con.close()
    relations = {"e": SQLRelation('Odd"Table', args=("Atom ID", "select"), values="Value", example="order"),
                 "f": SQLRelation('SELECT "select", "Value" * 2 AS "Twice" FROM "Odd""Table" WHERE "order" = 1',
                                  args="select", values="Twice")}
    t = Template()
    t += (R.h(V.X)[1.5] <= (R.e(V.X, V.Y), R.f(V.Y)[-0.5])) | Metadata(transformation=Transformation.TANH)
    t += (R.q[1.0] <= R.h(V.X)) | Metadata(aggregation=Aggregation.SUM)
    return relations, t


def test_names_that_need_quoting(tmp_path):
    """SQLAlchemy quotes the relations' tables and columns (a double quote in a name, capitals, reserved words):
    the graph of the same rows as DataFrames."""
    path = tmp_path / "odd.db"
    relations, t = _odd_names(path)
    con = sqlite3.connect(path)
    frame = pd.read_sql('SELECT * FROM "Odd""Table"', con)
    con.close()
    twice = frame[frame["order"] == 1].assign(Twice=frame["Value"] * 2)
    frames = {"e": Relation.from_frame(frame, ["Atom ID", "select"], values="Value", example="order"),
              "f": Relation.from_frame(twice, "select", values="Twice")}
    from_sql = ground(t, Database(path, relations), R.q).graph
    assert_same_graph(from_sql, ground(t, frames, R.q).graph)
    assert from_sql.layers[-1].counts.sum() > 0


def test_sqlalchemy_is_needed_only_for_a_database():
    """SQLAlchemy is an optional dependency: without it the relational package imports, and a Database says what to
    install (it failed with 'No module named sqlalchemy' before)."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['sqlalchemy'] = None\n"   # as if it were not installed
            "from neurovec.sources.relational import Database, R, Template, V\n"
            "try:\n"
            "    Database('x.db', {})\n"
            "except ImportError as error:\n"
            "    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'Database needs SQLAlchemy: pip install -e ".[datasets]"' in done.stdout
