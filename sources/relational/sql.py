"""Grounding inside a database: every rule body is one SQL join, run by the database.

    db = Database("mutagenesis.db", {                        # an SQLite file, or any SQLAlchemy URL or Engine
        "bond": SQLRelation("SELECT atom1_id, atom2_id, type FROM bond", args=("atom1_id", "atom2_id", "type"),
                            example="molecule_id"), ...})
    graph = template.ground(db, queries)

The grounder keeps one connection open and builds temporary tables on it (``CREATE TEMP TABLE ... AS
SELECT``, SQLite and PostgreSQL alike). Every statement is SQLAlchemy Core, which quotes the tables and columns
of the relations and binds the values; :mod:`.sql_statements` adds the three it lacks (``CREATE TEMP TABLE ...
AS``, ``CROSS JOIN``, ``ANALYZE``):

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

import functools
import itertools
import json
import operator
from dataclasses import dataclass

import numpy as np

from .encoding import FactTable, Vocabulary
from .grounder import (Grounder, Groundings, Table, _as_ids, _input_positions, needs_dedup, relations_by_key,
                       template_facts)
from .plan import make_plan
from .template import Constant, Template, TemplateError, Variable

try:   # SQLAlchemy is an optional dependency (pip install -e ".[datasets]"): Database says so when it is missing
    import sqlalchemy as sa

    from .sql_statements import Analyze, CreateTempTableAs, CreateUniqueIndex, CrossJoin
except ModuleNotFoundError as missing:
    if missing.name != "sqlalchemy":
        raise
    sa = None

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
        if sa is None:
            raise ImportError('Database needs SQLAlchemy: pip install -e ".[datasets]" in the neurovec checkout')
        if isinstance(url_or_engine, sa.Engine):
            self.engine = url_or_engine
        else:
            text = str(url_or_engine)
            self.engine = sa.create_engine(text if "://" in text else f"sqlite:///{text}")
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


def _source(relation: SQLRelation):
    """The relation's rows, with the columns it names: its table, or its ``SELECT`` as a subquery (named: PostgreSQL
    before 16 requires it)."""
    names = [relation.example] + list(relation.args) + list(relation.value_columns)
    columns = [sa.column(name) for name in dict.fromkeys(names) if name is not None]
    source = relation.source.strip()
    if " " in source:
        return sa.text(source).columns(*columns).subquery("nv_source")
    return sa.table(source, *columns)


_COMPARISONS = {"neq": operator.ne, "eq": operator.eq, "lt": operator.lt, "leq": operator.le, "gt": operator.gt,
                "geq": operator.ge}


class SQLGrounder(Grounder):
    """Grounds in the database: temporary tables for facts and atoms, one join per rule and round.

    Every statement is SQLAlchemy Core; each temporary table is described by an ``sa.table`` (in ``Table.sql`` and
    ``FactTable.sql``) with its columns: ``ex`` (the example), ``a0..`` (the arguments), ``v0..`` (values), ``h0..``
    and ``i<k>`` (a grounding's head and the atom id of body literal ``k``), and the row number (:meth:`_id`)."""

    def __init__(self, template: Template, database: Database, queries: list, seed: int):
        relations = relations_by_key(template, ((name, len(r.args), r) for name, r in database.relations.items()))
        self.plan = make_plan(template, {key: r.value_shape for key, r in relations.items()}, seed)
        self.queries, self.relations, self.database = queries, relations, database
        self.tables: dict[str, Table] = {}
        self._names = itertools.count()
        self.fact_tables = {}

    def run(self):
        with self.database.connect() as self.conn:
            # the statements name this grounding's temporary tables: SQLAlchemy's cache of compiled statements could
            # only serve the same template grounded again through this Database, and its keys cost more than that
            # saves (Mutagenesis: 9 ms more per grounding through a new Database, 7 ms less through the same one)
            self.conn.execution_options(compiled_cache=None)
            if self._sqlite:  # temporary tables in memory, not in a file
                self.conn.exec_driver_sql("PRAGMA temp_store = MEMORY")
            for name, relation in self.database.relations.items():
                self._check_columns(name, relation)
            self.examples_table = self._examples()
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
                if self._sqlite:       # ... or with the connection: sqlite3 commits DDL at once
                    self.conn.invalidate()
        return result

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _check_columns(self, name: str, relation: SQLRelation) -> None:
        """Every column the relation names is one of its source's: a table's columns as the database's schema
        lists them (SQLAlchemy's inspector), a ``SELECT``'s as its result names them. Without the check a
        misspelled column is no error on SQLite, which reads a quoted unknown name as a string constant: every
        fact gets that string as its example or argument, and the rules silently ground to something else."""
        source = relation.source.strip()
        if " " in source:
            try:
                everything = sa.select(sa.literal_column("*")).select_from(_source(relation)).limit(0)
                columns = list(self.conn.execute(everything).keys())
            except sa.exc.DBAPIError as error:
                raise TemplateError(f"relation {name!r}: its source {source!r} fails in the database "
                                    f"({self.database.engine.url!r}): {error.orig}") from None
        else:
            inspector = sa.inspect(self.conn)
            try:
                columns = [column["name"] for column in inspector.get_columns(source)]
            except sa.exc.NoSuchTableError:
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

    def _id(self, table):
        """The 0-based atom id of a row of the numbered table ``table`` (see :meth:`_numbered`)."""
        return (table.c.rowid if self._sqlite else table.c.nv_id) - 1

    def _create(self, name: str, select) -> sa.TableClause:
        """``CREATE TEMP TABLE name AS select``; returns the table's description: the select's columns, and on
        SQLite the ``rowid`` every table has."""
        self.conn.execute(CreateTempTableAs(name, select))
        columns = [column.name for column in select.selected_columns] + (["rowid"] if self._sqlite else [])
        return sa.table(name, *(sa.column(column) for column in columns))

    def _numbered(self, name: str, select, order: list) -> sa.TableClause:
        """A temporary table of the rows of ``select``, numbered from 1 in the order of its columns ``order``.

        SQLite numbers them by their ``rowid``: a new table's rows get 1, 2, ... in the order they are inserted,
        the order of ``ORDER BY`` (a window function would sort them a second time: 4.2 against 7.7 ms for the
        atoms of a Mutagenesis layer). Other databases get a column ``nv_id`` of ``ROW_NUMBER()``."""
        rows = select.subquery("s")   # (ordering the select itself is slower in SQLite where it has DISTINCT)
        keys = [rows.c[column] for column in order]
        if self._sqlite:
            return self._create(name, sa.select(rows).order_by(*keys))
        return self._create(name, sa.select(sa.func.row_number().over(order_by=keys).label("nv_id"), rows))

    def _count(self, table) -> int:
        return int(self.conn.execute(sa.select(sa.func.count()).select_from(table)).scalar())

    def _ints(self, columns: list, source, order: list = ()) -> np.ndarray:
        """``SELECT columns FROM source ORDER BY order`` (integer columns; ``order`` some of ``columns``) as an
        ``(n, len(columns))`` array.

        On SQLite each column comes back whole, as one string of ``group_concat`` that numpy parses, not as a
        Python tuple per row; numpy then sorts the rows. One aggregate reads every row once for all its columns,
        so they stay aligned whatever order SQLite reads the rows in. A column longer than SQLite's longest string
        (``SQLITE_MAX_LENGTH``, a billion bytes by default), and other databases, take the rows."""
        if self._sqlite:
            try:
                return self._ints_by_column(columns, source, order)
            except sa.exc.DBAPIError as error:
                if "too big" not in str(error):
                    raise
        select = sa.select(*columns).select_from(source).order_by(*order)
        rows = self.conn.execute(select).cursor.fetchall()
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(columns))

    def _ints_by_column(self, columns: list, source, order: list) -> np.ndarray:
        # the separator written into the statement: SQLite reads a bound one again for every row (30-70% slower)
        comma = sa.literal(",", literal_execute=True)
        aggregates = [sa.func.group_concat(column, comma) for column in columns]
        n, *texts = self.conn.execute(sa.select(sa.func.count(), *aggregates).select_from(source)).cursor.fetchone()
        out = np.empty((n, len(columns)), np.int64)
        for c, text in enumerate(texts):
            values = np.fromstring(text or "", dtype=np.int64, sep=",")
            if values.size != n:   # a NULL or a non-integer value: group_concat skips or mangles it
                raise TemplateError(f"expected {n} integers in column {columns[c]} of {source} (got {values.size})")
            out[:, c] = values
        if order and n > 1:
            positions = [next(p for p, column in enumerate(columns) if column is key) for key in order]
            out = out[np.lexsort([out[:, p] for p in positions[::-1]])]
        return out

    # -- examples and facts ----------------------------------------------------------------------------------------
    def _examples(self) -> sa.TableClause:
        """``nv_examples``: the examples the queries ask about (every example, when a query names none)."""
        if any(q.example is None for q in self.queries):
            selects = []
            for relation in self.relations.values():
                if relation.example is not None:
                    source = _source(relation)
                    selects.append(sa.select(source.c[relation.example].label("ex")))
            examples = sa.union(*selects or [sa.select(sa.literal(0).label("ex"))]).subquery("e")
            return self._create("nv_examples", sa.select(examples.c.ex).distinct())
        asked = list(itertools.chain.from_iterable(np.asarray(q.example).reshape(-1).tolist() for q in self.queries))
        if self._sqlite:   # one JSON array parameter, unpacked by SQLite (not a statement of a parameter each)
            values = sa.func.json_each(json.dumps(asked)).table_valued("value")
            return self._create("nv_examples", sa.select(values.c.value.label("ex")).distinct())
        examples = sa.union(*(sa.select(sa.literal(value).label("ex")) for value in asked)).subquery("e")
        return self._create("nv_examples", sa.select(examples.c.ex).distinct())

    def _facts(self, key: str, relation: SQLRelation) -> FactTable:
        """The facts of one relation as a temporary table ``(ex, a0.., v0.. or vrow)`` numbered in (example,
        arguments) order (see :meth:`_numbered`); their values come back as an array (rows ``vrow``)."""
        name = self._name()
        source = _source(relation)
        args = [source.c[column].label(f"a{k}") for k, column in enumerate(relation.args)]
        values = [source.c[column].label(f"v{k}") for k, column in enumerate(relation.value_columns)]
        order = [f"a{k}" for k in range(len(relation.args))]
        width = len(relation.value_columns)
        if relation.example is not None:
            in_scope = source.c[relation.example].in_(sa.select(self.examples_table.c.ex))
            rows = sa.select(source.c[relation.example].label("ex"), *args, *values).where(in_scope)
            facts = self._numbered(name, rows, ["ex"] + order)
        else:  # in every example: the rows, numbered by arguments, repeated per example (sharing their values)
            columns = args + values or [sa.literal(1).label("unit")]
            rows = self._numbered(self._name(), sa.select(*columns).select_from(source), order or ["unit"])
            copies = [rows.c[column] for column in order + [f"v{k}" for k in range(width)]]
            examples = self.examples_table
            facts = self._numbered(name, sa.select(examples.c.ex, *copies, self._id(rows).label("vrow"))
                                   .select_from(CrossJoin(rows, examples)), ["ex"] + order)
        self._index(facts, len(relation.args), key)
        if relation.example is not None:  # one value per fact, in fact order
            value_row = np.arange(self._count(facts), dtype=np.int64)
            in_order = sa.select(*(facts.c[f"v{k}"] for k in range(width))).order_by(self._id(facts))
        else:  # the copies of a row share its value
            fact_id = self._id(facts)
            value_row = self._ints([facts.c.vrow, fact_id], facts, [fact_id])[:, 0]
            in_order = sa.select(*(rows.c[f"v{k}"] for k in range(width))).order_by(self._id(rows))
        data = None
        if relation.values is not None:
            fetched = self.conn.execute(in_order).cursor.fetchall()
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
        return FactTable(key, None, None, value_row, data, sql=facts)

    def _template_facts(self, key: str, indices: list) -> FactTable:
        """Template facts: a few rows, inserted, then repeated per example like a relation without examples."""
        facts = [self.plan.template.facts[k] for k in indices]
        arity = self.plan.arity[key]
        order = sorted(range(len(facts)), key=lambda k: tuple(_sort_key(t.value) for t in facts[k].terms))
        given = [sa.select(sa.literal(vrow).label("vrow"),
                           *(sa.literal(facts[k].terms[c].value).label(f"a{c}") for c in range(arity)))
                 for vrow, k in enumerate(order)]
        rows, examples = self._create(self._name(), sa.union_all(*given)), self.examples_table
        args = [f"a{c}" for c in range(arity)]
        table = self._numbered(self._name(), sa.select(examples.c.ex, *(rows.c[a] for a in args), rows.c.vrow)
                               .select_from(CrossJoin(rows, examples)), ["ex"] + args)
        self._index(table, arity, key)
        fact_id = self._id(table)
        return FactTable(key, None, None, self._ints([table.c.vrow, fact_id], table, [fact_id])[:, 0],
                         None, [self.plan.fact_weights[indices[k]] for k in order], sql=table)

    def _index(self, table: sa.TableClause, arity: int, key: str | None = None) -> None:
        """A unique index on (example, arguments): joins on the example and a prefix of the arguments use it. On
        SQLite it holds the ``rowid``, the atom id, too (a covering index: no second search in the table per row).
        Of the facts of relation ``key`` it is the check that none is given twice (:meth:`_check_duplicates` names
        the first; elsewhere than in SQLite it runs first: a failed statement there aborts the transaction)."""
        if key is not None and not self._sqlite:
            self._check_duplicates(key, table, arity)
        try:
            self.conn.execute(CreateUniqueIndex(f"{table.name}_key", table, ["ex"] + [f"a{c}" for c in range(arity)]))
        except sa.exc.IntegrityError:
            if key is not None:
                self._check_duplicates(key, table, arity)
            raise
        if self.conn.dialect.name == "postgresql":  # nothing analyzes temporary tables there: plans need sizes
            self.conn.execute(Analyze(table))

    def _check_duplicates(self, key: str, table: sa.TableClause, arity: int) -> None:
        keys = [table.c.ex] + [table.c[f"a{c}"] for c in range(arity)]
        twin = self.conn.execute(sa.select(*keys).group_by(*keys).having(sa.func.count() > 1).limit(1)).first()
        if twin is not None:
            atom = ", ".join(map(str, twin[1:]))
            raise TemplateError(f"relation {key}: the fact {key.rsplit('/', 1)[0]}({atom}) is given twice in "
                                f"example {twin[0]!r}")

    def fact_atoms(self, predicate: str) -> Table:
        facts = self.fact_tables.get(predicate)
        if facts is None:
            table = self._empty(self._name(), self.plan.arity[predicate])
            zero = np.zeros(0, np.int64)
            return Table(predicate, predicate, None, None, zero, np.zeros(0, bool), sql=table)
        n = facts.size
        return Table(predicate, predicate, None, None, np.arange(n), np.zeros(n, bool), sql=facts.sql)

    def _empty(self, name: str, arity: int) -> sa.TableClause:
        """An empty table of atoms (its columns untyped: a rule reading it is not joined, see :meth:`derive`)."""
        columns = [sa.cast(sa.null(), sa.BigInteger).label("nv_id"), sa.null().label("ex")] + \
            [sa.null().label(f"a{c}") for c in range(arity)]
        return self._create(name, sa.select(*columns).limit(0))

    # -- rules -----------------------------------------------------------------------------------------------------
    def derive(self, predicate: str, name: str, rules: list, reads: dict | None) -> tuple[Table, list]:
        """Each rule's groundings into a temporary table; the heads' union (and the predicate's facts) numbered
        into the atoms' table; then every grounding's head atom, sorted by head and inputs."""
        groups = [[r] for r in rules] if reads or predicate in self.plan_recursive else self._families(rules)
        reads = reads or {}
        arity = self.plan.arity[predicate]
        heads = [f"h{c}" for c in range(arity)]
        args = [f"a{c}" for c in range(arity)]
        groundings = []
        for group in groups:   # a family of one-constant rules is one join (its rows say whose they are)
            rule = group[0] if len(group) == 1 else tuple(group)
            body_reads = reads.get(group[0].index) or {}
            if any(self.tables[body_reads.get(k) or self.current[lit.key]].size == 0
                   for k, lit in enumerate(group[0].body) if not lit.special):
                groundings.append((rule, None))   # no groundings (and no join with an empty table of untyped NULLs)
                continue
            select = self._body(group[0], body_reads, group if len(group) > 1 else None)
            groundings.append((rule, self._create(self._name(), select)))
        union = [sa.select(table.c.ex, *(table.c[h] for h in heads)) for _, table in groundings if table is not None]
        facts = self.fact_tables.get(predicate)
        if facts is not None:
            union.append(sa.select(facts.sql.c.ex, *(facts.sql.c[a].label(h) for a, h in zip(args, heads))))
        if union:
            h = sa.union_all(*union).subquery("h")
            renamed = [h.c[head].label(a) for head, a in zip(heads, args)]
            atoms = self._numbered(self._name(), sa.select(h.c.ex, *renamed).distinct(), ["ex"] + args)
        else:
            atoms = self._empty(self._name(), arity)
        self._index(atoms, arity)
        n = self._count(atoms)
        derived = np.zeros(n, bool)
        result = []
        head = self._id(atoms)
        for rule, table in groundings:
            family = rule if isinstance(rule, tuple) else ()
            rule = family[0] if family else rule
            positions = _input_positions(rule)
            if table is None:
                rows = np.zeros((0, 1 + len(positions) + bool(family)), np.int64)
            else:
                inputs = [table.c[f"i{k}"] for k in positions] + ([table.c.member] if family else [])
                on = sa.and_(atoms.c.ex == table.c.ex, *(atoms.c[a] == table.c[h] for a, h in zip(args, heads)))
                order = [head] + ([table.c.member] if family else inputs)
                rows = self._ints([head] + inputs, table.join(atoms, on), order)
            derived[rows[:, 0]] = True
            tables = [(reads.get(rule.index) or {}).get(k) or self.current[rule.body[k].key] for k in positions]
            result.append(Groundings(rule, name, rows[:, 0].copy(), tables,
                                     [rows[:, 1 + j].copy() for j in range(len(positions))], family,
                                     rows[:, -1].copy() if family else None))
        fact_row = np.full(n, -1, np.int64)
        if facts is not None:
            on = sa.and_(atoms.c.ex == facts.sql.c.ex, *(atoms.c[a] == facts.sql.c[a] for a in args))
            pairs = self._ints([head, self._id(facts.sql)], atoms.join(facts.sql, on))
            fact_row[pairs[:, 0]] = pairs[:, 1]
        return Table(name, predicate, None, None, fact_row, derived, sql=atoms), result

    def _body(self, rule, reads: dict, family: list | None = None):
        """``SELECT ex, h0.., i<k>.. FROM <the body's tables> WHERE <joins, constants, comparisons>``; for a
        ``family`` of one-constant rules (``rule`` is the first), the constant is one of the family's, and the
        ``member`` column says whose."""
        joined, where, first, aliases = [], [], {}, {}
        example = members = None
        if family is not None:   # the family's constants, each with its rule's position in the family
            constants = [next(t for t in member.body[0].terms if isinstance(t, Constant)).value for member in family]
            members = sa.union_all(*(sa.select(sa.literal(value).label("c"), sa.literal(r).label("member"))
                                     for r, value in enumerate(constants))).subquery("nv_f")

        def term(t):
            return first[t.name] if isinstance(t, Variable) else sa.literal(t.value)

        tables = {k: self.tables[reads.get(k) or self.current[lit.key]] for k, lit in enumerate(rule.body)
                  if not lit.special}
        for k in _join_order(rule, {k: t.size for k, t in tables.items()}):
            lit, t = rule.body[k], tables[k].sql.alias(f"t{k}")
            aliases[k] = t
            joined.append(t)
            if example is None:
                example = t.c.ex
            else:
                where.append(t.c.ex == example)
            for c, value in enumerate(lit.terms):
                column = t.c[f"a{c}"]
                if isinstance(value, Constant) and members is not None:
                    joined.append(members)
                    where.append(column == members.c.c)
                elif isinstance(value, Constant):
                    where.append(column == sa.literal(value.value))
                elif value.name in first:
                    where.append(column == first[value.name])
                else:
                    first[value.name] = column
        for lit in rule.body:
            if lit.special:
                columns = [term(t) for t in lit.terms]
                if lit.name == "alldiff":
                    where += [a != b for a, b in itertools.combinations(columns, 2)]
                else:
                    where.append(_COMPARISONS[lit.name](columns[0], columns[1]))
        columns = [example.label("ex")] + [term(t).label(f"h{c}") for c, t in enumerate(rule.head.terms)] + \
            [self._id(aliases[k]).label(f"i{k}") for k in _input_positions(rule)] + \
            ([members.c.member] if members is not None else [])
        # CROSS JOIN keeps SQLite to the order above (each step looks up an index on the example and a variable)
        select = sa.select(*columns).select_from(functools.reduce(CrossJoin, joined)).where(*where)
        return select.distinct() if self._needs_dedup(rule) else select

    _needs_dedup = staticmethod(needs_dedup)

    # -- queries and messages --------------------------------------------------------------------------------------
    def encoded(self, table: Table) -> Table:
        """The table's atoms fetched (keys in constants' values) and encoded with vocabularies of their own."""
        arity = self.plan.arity[table.predicate]
        t = table.sql
        atoms = sa.select(t.c.ex, *(t.c[f"a{c}"] for c in range(arity))).order_by(self._id(t))
        rows = self.conn.execute(atoms).cursor.fetchall()
        scope = [row[0] for row in self.conn.execute(sa.select(self.examples_table.c.ex)).fetchall()]
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
