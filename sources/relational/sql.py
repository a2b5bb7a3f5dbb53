"""Grounding inside a database: every rule body is one SQL join, run by the database.

    db = Database("mutagenesis.db", {                        # an SQLite file, or any SQLAlchemy URL or Engine
        "bond": SQLRelation("SELECT atom1_id, atom2_id, type FROM bond", args=("atom1_id", "atom2_id", "type"),
                            example="molecule_id"), ...})
    graph = template.ground(db, queries)

The grounder keeps one connection open and builds temporary tables on it (``CREATE TEMP TABLE ... AS
SELECT``, SQLite and PostgreSQL alike):

* per relation, its facts numbered in the order of (example, arguments): the same numbering the numpy grounder
  gives its sorted fact tables. On SQLite a table's ``rowid`` is its number: ``CREATE TABLE ... AS SELECT ... ORDER
  BY`` inserts the rows in that order, and a unique index on (example, arguments) holds the ``rowid`` too, so a
  join reads the atom id from the index (no window function sorting the rows a second time). Other databases
  number with ``ROW_NUMBER()`` into a column ``nv_id`` (see ``SQLGrounder._numbered``);
* per rule, the groundings: one ``SELECT`` joining the body literals' tables on the example and the shared
  variables, filtering constants and special literals (``@neq`` ...), returning the head's key and the
  atom id of every input literal;
* per derived predicate, its atoms: the ``UNION`` of its rules' heads (and its facts), numbered the same way.

Only integer id columns (and the values of facts) come back to Python, as numpy arrays (on SQLite a whole
column at a time, see ``SQLGrounder._ints``): the groundings, sorted by head then inputs, ready for
:mod:`.assembly`. Recursion runs the same steps round by round.
The same template on the same data gives the same graph as the numpy grounder on SQLite (whose ``ORDER BY``
matches the numpy ids: integers by value before strings, strings by code point); other databases may order
strings by their collation, which renumbers neurons but leaves the values the same.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import numpy as np

from .encoding import FactTable, Vocabulary
from .grounder import (Grounder, Groundings, Table, _as_ids, _input_positions, needs_dedup, relations_by_key,
                       template_facts)
from .plan import make_plan
from .template import Constant, Template, TemplateError, Variable

__all__ = ["Database", "SQLRelation", "SQLGrounder"]


@dataclass(frozen=True)
class SQLRelation:
    """A relation of the database: ``source`` (a table name or a ``SELECT``), the columns that are its arguments,
    its example (optional: without it the facts hold in every example) and its values (optional: a column, or
    several for a vector; without them every fact is a unit fact)."""

    source: str
    args: tuple = ()
    values: object = None
    example: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "args", (self.args,) if isinstance(self.args, str) else tuple(self.args))

    @property
    def value_columns(self) -> tuple:
        if self.values is None:
            return ()
        return (self.values,) if isinstance(self.values, str) else tuple(self.values)

    @property
    def value_shape(self) -> tuple:
        if self.values is None or isinstance(self.values, str):
            return ()
        return (len(self.values),)


class Database:
    """Relations in a database: a SQLAlchemy URL (``postgresql://...``), an SQLite file path, or an Engine."""

    def __init__(self, url_or_engine, relations: dict):
        from sqlalchemy import create_engine
        from sqlalchemy.engine import Engine

        if isinstance(url_or_engine, Engine):
            self.engine = url_or_engine
        else:
            text = str(url_or_engine)
            self.engine = create_engine(text if "://" in text else f"sqlite:///{text}")
            _check_sqlite_file(self.engine)
        for name, relation in relations.items():
            if not isinstance(relation, SQLRelation):
                raise TemplateError(f"relation {name!r}: expected an SQLRelation (got {type(relation).__name__})")
        self.relations = dict(relations)

    def connect(self):
        return self.engine.connect()


def _check_sqlite_file(engine) -> None:
    """An SQLite database named by a path must exist: SQLite would create an empty one (or fail deep inside the first
    statement when its folder is missing)."""
    from pathlib import Path
    path = engine.url.database
    if engine.dialect.name != "sqlite" or not path or path == ":memory:" or path.startswith("file:"):
        return
    path = Path(path)
    if not path.is_file():
        where = f"its folder {str(path.parent)!r} does not exist" if not path.parent.is_dir() else "no such file"
        raise TemplateError(f"Database({str(path)!r}): no SQLite database there ({where}); give the path of an "
                            "existing database file (datasets.create_database writes one for Mutagenesis)")


def _source(relation: SQLRelation) -> str:
    """The relation's rows as a subquery (named: PostgreSQL before 16 requires it)."""
    source = relation.source.strip()
    return f"({source}) nv_source" if " " in source else _quote(source)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SQLGrounder(Grounder):
    """Grounds in the database: temporary tables for facts and atoms, one join per rule and round."""

    def __init__(self, template: Template, database: Database, queries: list, seed: int):
        relations = relations_by_key(template, ((name, len(r.args), r) for name, r in database.relations.items()))
        self.plan = make_plan(template, {key: r.value_shape for key, r in relations.items()}, seed)
        self.queries, self.relations, self.database = queries, relations, database
        self.tables: dict[str, Table] = {}
        self._names = itertools.count()
        self.fact_tables = {}

    def run(self):
        with self.database.connect() as self.conn:
            if self.conn.dialect.name == "sqlite":  # temporary tables in memory, not in a file
                self._execute("PRAGMA temp_store = MEMORY")
            for name, relation in self.database.relations.items():
                self._check_columns(name, relation)
            self._examples()
            used = self._relevant_predicates()
            for key, relation in self.relations.items():
                if key in used:
                    self.fact_tables[key] = self._facts(key, relation)
            for key, indices in template_facts(self.plan).items():
                self.fact_tables[key] = self._template_facts(key, indices)
            try:
                result = super().run()
            finally:
                self.conn.rollback()   # the temporary tables go with the transaction (PostgreSQL) ...
                if self.conn.dialect.name == "sqlite":   # ... or with the connection: sqlite3 commits DDL at once
                    self.conn.invalidate()
        return result

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _check_columns(self, name: str, relation: SQLRelation) -> None:
        """Every column the relation names is one of its source's: a table's columns as the database's schema
        lists them (SQLAlchemy's inspector), a ``SELECT``'s as its result names them. Without the check a
        misspelled column is no error on SQLite, which reads a quoted unknown name as a string constant: every
        fact gets that string as its example or argument, and the rules silently ground to something else."""
        from sqlalchemy import inspect
        from sqlalchemy.exc import DBAPIError, NoSuchTableError

        source = relation.source.strip()
        if " " in source:
            try:
                columns = list(self._execute(f"SELECT * FROM {_source(relation)} LIMIT 0").keys())
            except DBAPIError as error:
                raise TemplateError(f"relation {name!r}: its source {source!r} fails in the database "
                                    f"({self.database.engine.url!r}): {error.orig}") from None
        else:
            inspector = inspect(self.conn)
            try:
                columns = [column["name"] for column in inspector.get_columns(source)]
            except NoSuchTableError:
                tables = sorted(inspector.get_table_names() + inspector.get_view_names())
                raise TemplateError(f"relation {name!r}: the database ({self.database.engine.url!r}) has no table "
                                    f"or view {source!r} (it has {tables})") from None
        # SQLite matches column names in any case; other databases match a quoted name exactly.
        fold = str.lower if self._sqlite else (lambda text: text)
        known = {fold(column) for column in columns}
        roles = [("example", relation.example)] + [(f"argument {k}", c) for k, c in enumerate(relation.args)] + \
            [("value" if len(relation.value_columns) == 1 else f"value {k}", c)
             for k, c in enumerate(relation.value_columns)]
        for role, column in roles:
            if column is not None and fold(str(column)) not in known:
                why = "; SQLite would read the unknown name as a string constant" if self._sqlite else ""
                raise TemplateError(f"relation {name!r}: its {role} column {column!r} is not a column of {source!r} "
                                    f"(its columns: {columns}){why}")

    def _name(self) -> str:
        return f"nv_{next(self._names)}"

    @property
    def _sqlite(self) -> bool:
        return self.conn.dialect.name == "sqlite"

    def _id(self, alias: str) -> str:
        """The 0-based atom id of a row of the numbered table ``alias`` (see :meth:`_numbered`)."""
        return f"{alias}.rowid - 1" if self._sqlite else f"{alias}.nv_id - 1"

    def _numbered(self, name: str, select: str, order: str, params: dict | None = None) -> None:
        """``CREATE TEMP TABLE name`` of the rows of ``select``, numbered from 1 in ``order``.

        SQLite numbers them by their ``rowid``: a new table's rows get 1, 2, ... in the order they are inserted,
        the order of ``ORDER BY`` (a window function would sort them a second time: 4.2 against 7.7 ms for the
        atoms of a Mutagenesis layer). Other databases get a column ``nv_id`` of ``ROW_NUMBER()``."""
        if self._sqlite:
            self._execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM ({select}) s ORDER BY {order}", params)
        else:
            self._execute(f"CREATE TEMP TABLE {name} AS SELECT ROW_NUMBER() OVER (ORDER BY {order}) AS nv_id, s.* "
                          f"FROM ({select}) s", params)

    def _execute(self, sql: str, params: dict | None = None):
        from sqlalchemy import text
        return self.conn.execute(text(sql), params or {})

    def _ints(self, columns: list, source: str, order: list = (), params: dict | None = None) -> np.ndarray:
        """``SELECT columns FROM source ORDER BY order`` (integer columns) as an ``(n, len(columns))`` array.

        On SQLite each column comes back whole, as one string of ``group_concat`` that numpy parses, not as a
        Python tuple per row; numpy then sorts the rows. One aggregate reads every row once for all its columns,
        so they stay aligned whatever order SQLite reads the rows in. A column longer than SQLite's longest string
        (``SQLITE_MAX_LENGTH``, a billion bytes by default), and other databases, take the rows."""
        if self.conn.dialect.name == "sqlite":
            from sqlalchemy.exc import DBAPIError
            try:
                return self._ints_by_column(columns, source, order, params)
            except DBAPIError as error:
                if "too big" not in str(error):
                    raise
        rows = self._execute(f"SELECT {', '.join(columns)} FROM {source}" +
                             (f" ORDER BY {', '.join(order)}" if order else ""), params).cursor.fetchall()
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(columns))

    def _ints_by_column(self, columns: list, source: str, order: list, params: dict | None) -> np.ndarray:
        aggregates = ", ".join(f"group_concat({column}, ',')" for column in columns)
        n, *texts = self._execute(f"SELECT COUNT(*), {aggregates} FROM {source}", params).cursor.fetchone()
        out = np.empty((n, len(columns)), np.int64)
        for c, text in enumerate(texts):
            values = np.fromstring(text or "", dtype=np.int64, sep=",")
            if values.size != n:   # a NULL or a non-integer value: group_concat skips or mangles it
                raise TemplateError(f"expected {n} integers in column {columns[c]} of {source} (got {values.size})")
            out[:, c] = values
        if order and n > 1:
            positions = [columns.index(column) for column in order]
            out = out[np.lexsort([out[:, p] for p in positions[::-1]])]
        return out

    # -- examples and facts ----------------------------------------------------------------------------------------
    def _examples(self) -> None:
        """``nv_examples``: the examples the queries ask about (every example, when a query names none)."""
        if any(q.example is None for q in self.queries):
            columns = [f"SELECT {_quote(r.example)} AS ex FROM {_source(r)}" for r in self.relations.values()
                       if r.example is not None]
            select = " UNION ".join(columns) if columns else "SELECT 0 AS ex"
            self._execute(f"CREATE TEMP TABLE nv_examples AS SELECT DISTINCT ex FROM ({select}) e")
            return
        asked = [np.asarray(q.example).reshape(-1).tolist() for q in self.queries]
        if self._sqlite:   # one JSON array parameter, unpacked by SQLite (not a statement of a parameter each)
            self._execute("CREATE TEMP TABLE nv_examples AS SELECT DISTINCT value AS ex FROM json_each(:asked)",
                          {"asked": json.dumps(list(itertools.chain.from_iterable(asked)))})
            return
        params = {f"e{k}": value for k, value in enumerate(itertools.chain.from_iterable(asked))}
        select = " UNION ".join(f"SELECT :{p} AS ex" for p in params)
        self._execute(f"CREATE TEMP TABLE nv_examples AS SELECT DISTINCT ex FROM ({select}) e", params)

    def _facts(self, key: str, relation: SQLRelation) -> FactTable:
        """The facts of one relation as a temporary table ``(ex, a0.., v0.. or vrow)`` numbered in (example,
        arguments) order (see :meth:`_numbered`); their values come back as an array (rows ``vrow``)."""
        name = self._name()
        args = ", ".join(f"{_quote(c)} AS a{k}" for k, c in enumerate(relation.args))
        values = ", ".join(f"{_quote(c)} AS v{k}" for k, c in enumerate(relation.value_columns))
        order = ", ".join(f"a{k}" for k in range(len(relation.args)))
        width = len(relation.value_columns)
        if relation.example is not None:
            inner = ", ".join(x for x in (f"{_quote(relation.example)} AS ex", args, values) if x)
            keys = ", ".join(x for x in ("ex", order) if x)
            self._numbered(name, f"SELECT * FROM (SELECT {inner} FROM {_source(relation)}) s "
                                 "WHERE ex IN (SELECT ex FROM nv_examples)", keys)
        else:  # in every example: the rows, numbered by arguments, repeated per example (sharing their values)
            inner = ", ".join(x for x in (args, values) if x) or "1 AS unit"
            rows = self._name()
            self._numbered(rows, f"SELECT {inner} FROM {_source(relation)}", order or "unit")
            columns = [f"a{k}" for k in range(len(relation.args))] + [f"v{k}" for k in range(width)]
            self._numbered(name, f"SELECT {', '.join(['e.ex AS ex'] + [f'r.{c}' for c in columns])}, "
                                 f"{self._id('r')} AS vrow FROM {rows} r CROSS JOIN nv_examples e",
                           ", ".join(["ex"] + columns[:len(relation.args)]))
        self._index(name, len(relation.args), key)
        if relation.example is not None:  # one value per fact, in fact order
            value_row = np.arange(int(self._execute(f"SELECT COUNT(*) FROM {name}").scalar()), dtype=np.int64)
            values = f"SELECT {', '.join(f'v{k}' for k in range(width))} FROM {name} t ORDER BY {self._id('t')}"
        else:  # the copies of a row share its value
            value_row = self._ints(["vrow", self._id("t")], f"{name} t", [self._id("t")])[:, 0]
            values = f"SELECT {', '.join(f'v{k}' for k in range(width))} FROM {rows} r ORDER BY {self._id('r')}"
        data = None
        if relation.values is not None:
            fetched = self._execute(values).cursor.fetchall()
            try:
                data = np.array(fetched, dtype=np.float64).reshape((len(fetched),) + relation.value_shape)
            except (TypeError, ValueError):
                row, c = next((r, c) for r, row in enumerate(fetched) for c, v in enumerate(row)
                              if not isinstance(v, (int, float)) or isinstance(v, bool))
                raise TemplateError(f"relation {key}: its value column {relation.value_columns[c]!r} holds "
                                    f"{fetched[row][c]!r} (a {type(fetched[row][c]).__name__}), not a number; values "
                                    "must be numbers (cast the column in a SELECT, or name a numeric column)") from None
            if not np.all(np.isfinite(data)):
                raise TemplateError(f"relation {key}: values contain NULL, NaN or inf")
        return FactTable(key, None, None, value_row, data, sql=name)

    def _template_facts(self, key: str, indices: list) -> FactTable:
        """Template facts: a few rows, inserted, then repeated per example like a relation without examples."""
        facts = [self.plan.template.facts[k] for k in indices]
        arity = self.plan.arity[key]
        order = sorted(range(len(facts)), key=lambda k: tuple(_sort_key(t.value) for t in facts[k].terms))
        rows = self._name()
        selects, params = [], {}
        for vrow, k in enumerate(order):
            values = [f":p{len(params) + c}" for c in range(arity)]
            params.update({f"p{len(params) + c}": facts[k].terms[c].value for c in range(arity)})
            selects.append(f"SELECT {vrow} AS vrow" + "".join(f", {v} AS a{c}" for c, v in enumerate(values)))
        self._execute(f"CREATE TEMP TABLE {rows} AS {' UNION ALL '.join(selects)}", params)
        name = self._name()
        args = [f"a{c}" for c in range(arity)]
        self._numbered(name, f"SELECT {', '.join(['e.ex AS ex'] + [f'r.{a}' for a in args])}, r.vrow FROM {rows} r "
                             "CROSS JOIN nv_examples e", ", ".join(["ex"] + args))
        self._index(name, arity, key)
        return FactTable(key, None, None, self._ints(["vrow", self._id("t")], f"{name} t", [self._id("t")])[:, 0],
                         None, [self.plan.fact_weights[indices[k]] for k in order], sql=name)

    def _index(self, name: str, arity: int, key: str | None = None) -> None:
        """A unique index on (example, arguments): joins on the example and a prefix of the arguments use it. On
        SQLite it holds the ``rowid``, the atom id, too (a covering index: no second search in the table per row).
        Of the facts of relation ``key`` it is the check that none is given twice (:meth:`_check_duplicates` names
        the first; elsewhere than in SQLite it runs first: a failed statement there aborts the transaction)."""
        from sqlalchemy.exc import IntegrityError
        if key is not None and not self._sqlite:
            self._check_duplicates(key, name, arity)
        columns = ", ".join(["ex"] + [f"a{c}" for c in range(arity)])
        try:
            self._execute(f"CREATE UNIQUE INDEX {name}_key ON {name} ({columns})")
        except IntegrityError:
            if key is not None:
                self._check_duplicates(key, name, arity)
            raise
        if self.conn.dialect.name == "postgresql":  # nothing analyzes temporary tables there: plans need sizes
            self._execute(f"ANALYZE {name}")

    def _check_duplicates(self, key: str, name: str, arity: int) -> None:
        keys = ", ".join(["ex"] + [f"a{c}" for c in range(arity)])
        twin = self._execute(f"SELECT {keys} FROM {name} GROUP BY {keys} HAVING COUNT(*) > 1 LIMIT 1").first()
        if twin is not None:
            atom = ", ".join(map(str, twin[1:]))
            raise TemplateError(f"relation {key}: the fact {key.rsplit('/', 1)[0]}({atom}) is given twice in "
                                f"example {twin[0]!r}")

    def fact_atoms(self, predicate: str) -> Table:
        facts = self.fact_tables.get(predicate)
        if facts is None:
            name = self._name()
            self._empty(name, self.plan.arity[predicate])
            zero = np.zeros(0, np.int64)
            return Table(predicate, predicate, None, None, zero, np.zeros(0, bool), sql=name)
        n = facts.size
        return Table(predicate, predicate, None, None, np.arange(n), np.zeros(n, bool), sql=facts.sql)

    def _empty(self, name: str, arity: int) -> None:
        """An empty table of atoms (its columns untyped: a rule reading it is not joined, see :meth:`derive`)."""
        columns = ", ".join(["CAST(NULL AS BIGINT) AS nv_id", "NULL AS ex"] + [f"NULL AS a{c}" for c in range(arity)])
        self._execute(f"CREATE TEMP TABLE {name} AS SELECT {columns} LIMIT 0")

    # -- rules -----------------------------------------------------------------------------------------------------
    def derive(self, predicate: str, name: str, rules: list, reads: dict | None) -> tuple[Table, list]:
        """Each rule's groundings into a temporary table; the heads' union (and the predicate's facts) numbered
        into the atoms' table; then every grounding's head atom, sorted by head and inputs."""
        groups = [[r] for r in rules] if reads or predicate in self.plan_recursive else self._families(rules)
        reads = reads or {}
        arity = self.plan.arity[predicate]
        keys = ["ex"] + [f"h{c}" for c in range(arity)]
        groundings = []
        for group in groups:   # a family of one-constant rules is one join (its rows say whose they are)
            rule = group[0] if len(group) == 1 else tuple(group)
            body_reads = reads.get(group[0].index) or {}
            if any(self.tables[body_reads.get(k) or self.current[lit.key]].size == 0
                   for k, lit in enumerate(group[0].body) if not lit.special):
                groundings.append((rule, None))   # no groundings (and no join with an empty table of untyped NULLs)
                continue
            select, params = self._body(group[0], body_reads, group if len(group) > 1 else None)
            table = self._name()
            self._execute(f"CREATE TEMP TABLE {table} AS {select}", params)
            groundings.append((rule, table))
        heads = [f"SELECT {', '.join(keys)} FROM {table}" for _, table in groundings if table is not None]
        facts = self.fact_tables.get(predicate)
        if facts is not None:
            heads.append(f"SELECT {', '.join(['ex'] + [f'a{c} AS h{c}' for c in range(arity)])} FROM {facts.sql}")
        atoms = self._name()
        renamed = ", ".join(["ex"] + [f"h{c} AS a{c}" for c in range(arity)])
        if heads:
            self._numbered(atoms, f"SELECT DISTINCT {renamed} FROM ({' UNION ALL '.join(heads)}) h",
                           ", ".join(["ex"] + [f"a{c}" for c in range(arity)]))
        else:
            self._empty(atoms, arity)
        self._index(atoms, arity)
        n = int(self._execute(f"SELECT COUNT(*) FROM {atoms}").scalar())
        derived = np.zeros(n, bool)
        result = []
        join = " AND ".join(["a.ex = g.ex"] + [f"a.a{c} = g.h{c}" for c in range(arity)])
        for rule, table in groundings:
            family = rule if isinstance(rule, tuple) else ()
            rule = family[0] if family else rule
            positions = _input_positions(rule)
            inputs = [f"g.i{k}" for k in positions] + (["g.member"] if family else [])
            head = self._id("a")
            rows = np.zeros((0, 1 + len(inputs)), np.int64) if table is None else \
                self._ints([head] + inputs, f"{table} g JOIN {atoms} a ON {join}",
                           [head] + (["g.member"] if family else inputs))
            derived[rows[:, 0]] = True
            tables = [(reads.get(rule.index) or {}).get(k) or self.current[rule.body[k].key] for k in positions]
            result.append(Groundings(rule, name, rows[:, 0].copy(), tables,
                                     [rows[:, 1 + j].copy() for j in range(len(positions))], family,
                                     rows[:, -1].copy() if family else None))
        fact_row = np.full(n, -1, np.int64)
        if facts is not None:
            on = " AND ".join(["a.ex = f.ex"] + [f"a.a{c} = f.a{c}" for c in range(arity)])
            pairs = self._ints([self._id("a"), self._id("f")], f"{atoms} a JOIN {facts.sql} f ON {on}")
            fact_row[pairs[:, 0]] = pairs[:, 1]
        return Table(name, predicate, None, None, fact_row, derived, sql=atoms), result

    def _body(self, rule, reads: dict, family: list | None = None) -> tuple[str, dict]:
        """``SELECT ex, h0.., i<k>.. FROM <the body's tables> WHERE <joins, constants, comparisons>``; for a
        ``family`` of one-constant rules (``rule`` is the first), the constant is one of the family's, and the
        ``member`` column says whose."""
        sources, where, params, first = [], [], {}, {}
        example = None
        members = None
        if family is not None:   # the family's constants, each with its rule's position in the family
            selects = []
            for r, member in enumerate(family):
                value = next(t for t in member.body[0].terms if isinstance(t, Constant)).value
                params[f"f{r}"] = value
                selects.append(f"SELECT :f{r} AS c, {r} AS member")
            members = f"({' UNION ALL '.join(selects)}) nv_f"

        def constant(value) -> str:
            params[f"c{len(params)}"] = value
            return f":c{len(params) - 1}"

        tables = {k: self.tables[reads.get(k) or self.current[lit.key]] for k, lit in enumerate(rule.body)
                  if not lit.special}
        for k in _join_order(rule, {k: t.size for k, t in tables.items()}):
            lit, table = rule.body[k], tables[k]
            alias = f"t{k}"
            sources.append(f"{table.sql} {alias}")
            if example is None:
                example = f"{alias}.ex"
            else:
                where.append(f"{alias}.ex = {example}")
            for c, term in enumerate(lit.terms):
                column = f"{alias}.a{c}"
                if isinstance(term, Constant) and members is not None:
                    sources.append(members)
                    where.append(f"{column} = nv_f.c")
                elif isinstance(term, Constant):
                    where.append(f"{column} = {constant(term.value)}")
                elif term.name in first:
                    where.append(f"{column} = {first[term.name]}")
                else:
                    first[term.name] = column
        for lit in rule.body:
            if lit.special:
                cols = [first[t.name] if isinstance(t, Variable) else constant(t.value) for t in lit.terms]
                if lit.name == "alldiff":
                    where += [f"{a} <> {b}" for a, b in itertools.combinations(cols, 2)]
                else:
                    operator = {"neq": "<>", "eq": "=", "lt": "<", "leq": "<=", "gt": ">", "geq": ">="}[lit.name]
                    where.append(f"{cols[0]} {operator} {cols[1]}")
        head = [first[t.name] if isinstance(t, Variable) else constant(t.value) for t in rule.head.terms]
        columns = [f"{example} AS ex"] + [f"{h} AS h{c}" for c, h in enumerate(head)] + \
            [f"{self._id(f't{k}')} AS i{k}" for k in _input_positions(rule)] + (["nv_f.member"] if members else [])
        distinct = "DISTINCT " if self._needs_dedup(rule) else ""
        # CROSS JOIN keeps SQLite to the order above (each step looks up an index on the example and a variable)
        sql = f"SELECT {distinct}{', '.join(columns)} FROM {' CROSS JOIN '.join(sources)}"
        return (sql + (f" WHERE {' AND '.join(where)}" if where else "")), params

    _needs_dedup = staticmethod(needs_dedup)

    # -- queries and messages --------------------------------------------------------------------------------------
    def encoded(self, table: Table) -> Table:
        """The table's atoms fetched (keys in constants' values) and encoded with vocabularies of their own."""
        arity = self.plan.arity[table.predicate]
        rows = self._execute(f"SELECT {', '.join(['ex'] + [f'a{c}' for c in range(arity)])} FROM {table.sql} t "
                             f"ORDER BY {self._id('t')}").cursor.fetchall()
        scope = [row[0] for row in self._execute("SELECT ex FROM nv_examples").fetchall()]
        columns = [np.asarray([row[c] for row in rows]) for c in range(arity + 1)]
        constants = list(columns[1:])
        for q in self.queries:
            constants += [np.asarray(c).reshape(-1) for c in (q.args or ())] + [np.asarray([v]) for v in
                                                                                  q.constants()]
        self.constants = Vocabulary.of([_as_ids(c) for c in constants])
        example_values = [_as_ids(columns[0]), _as_ids(scope)] + \
            [_as_ids(q.example) for q in self.queries if q.example is not None]
        self.examples = Vocabulary.of(example_values)
        self.scope = np.unique(self.examples.encode(_as_ids(scope)))
        return Table(table.name, table.predicate, self.examples.encode(_as_ids(columns[0])),
                     [self.constants.encode(_as_ids(c)) for c in columns[1:]], table.fact_row, table.derived,
                     table.level)


def _join_order(rule, sizes: dict) -> list:
    """The order SQLite is held to (by CROSS JOIN): the smallest literal first, then always the literal sharing most
    variables with those joined so far (the smaller one on ties), so that each step looks up the index on the
    example and a bound variable. The numpy grounder starts elsewhere (from a literal holding the head's variables,
    so that its groundings come out sorted by head); here ``ORDER BY`` sorts them, and the graphs are the same."""
    variables = {k: set(rule.body[k].variables) for k in sizes}
    order = [min(sizes, key=lambda k: (sizes[k], k))]
    bound = set(variables[order[0]])
    while len(order) < len(sizes):
        k = max((k for k in sizes if k not in order), key=lambda k: (len(variables[k] & bound), -sizes[k], -k))
        order.append(k)
        bound |= variables[k]
    return order


def _sort_key(value):
    """SQLite's order: numbers before strings."""
    return (1, value) if isinstance(value, str) else (0, value)
