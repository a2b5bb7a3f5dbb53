"""The statements of the SQL grounder (:mod:`.sql`) that SQLAlchemy Core has no construct for: ``CREATE TEMP TABLE
... AS SELECT``, ``CROSS JOIN`` and ``ANALYZE``, and a ``CREATE UNIQUE INDEX`` on a lightweight ``sa.table`` (Core's
own needs a ``Table`` of a ``MetaData``: building one per temporary table cost 1.5 ms per Mutagenesis grounding).
Each is a small compiled construct (:mod:`sqlalchemy.ext.compiler`) that names its tables and columns through the
dialect's quoting, and that SQLAlchemy could cache like its own statements (the fields listed in
``_traverse_internals`` are its cache key; bound values stay parameters).
"""
from __future__ import annotations

from sqlalchemy import true
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ClauseElement, Executable, Join
from sqlalchemy.sql.visitors import InternalTraversal

__all__ = ["Analyze", "CreateTempTableAs", "CreateUniqueIndex", "CrossJoin"]


class CreateTempTableAs(Executable, ClauseElement):
    """``CREATE TEMP TABLE name AS query``: a temporary table of the query's rows, in the query's order."""

    inherit_cache = True
    _traverse_internals = [("name", InternalTraversal.dp_string), ("query", InternalTraversal.dp_clauseelement)]

    def __init__(self, name: str, query):
        self.name, self.query = name, query


@compiles(CreateTempTableAs)
def _create_temp_table_as(create, compiler, **kw) -> str:
    return f"CREATE TEMP TABLE {compiler.preparer.quote(create.name)} AS {compiler.process(create.query, **kw)}"


class CrossJoin(Join):
    """``left CROSS JOIN right``: a join without a condition (the conditions are in the ``WHERE`` clause), which
    SQLite runs in the order written, the left table outside (its query planner reorders the tables of a plain
    join)."""

    inherit_cache = True

    def __init__(self, left, right):
        super().__init__(left, right, true())


@compiles(CrossJoin)
def _cross_join(join, compiler, asfrom=False, from_linter=None, **kw) -> str:
    # the tables are not handed to SQLAlchemy's check for cartesian products (from_linter): they are one on purpose
    left = compiler.process(join.left, asfrom=True, **kw)
    return f"{left} CROSS JOIN {compiler.process(join.right, asfrom=True, **kw)}"


class Analyze(Executable, ClauseElement):
    """``ANALYZE table``: PostgreSQL's statistics of a table (its planner needs them; nothing analyzes temporary
    tables there on its own)."""

    inherit_cache = True
    _traverse_internals = [("table", InternalTraversal.dp_clauseelement)]

    def __init__(self, table):
        self.table = table


@compiles(Analyze)
def _analyze(analyze, compiler, **kw) -> str:
    return f"ANALYZE {compiler.preparer.format_table(analyze.table)}"


class CreateUniqueIndex(Executable, ClauseElement):
    """``CREATE UNIQUE INDEX name ON table (columns)``."""

    inherit_cache = True
    _traverse_internals = [("name", InternalTraversal.dp_string), ("table", InternalTraversal.dp_clauseelement),
                           ("columns", InternalTraversal.dp_string_list)]

    def __init__(self, name: str, table, columns: list):
        self.name, self.table, self.columns = name, table, list(columns)


@compiles(CreateUniqueIndex)
def _create_unique_index(create, compiler, **kw) -> str:
    quote = compiler.preparer.quote
    columns = ", ".join(quote(column) for column in create.columns)
    return f"CREATE UNIQUE INDEX {quote(create.name)} ON {compiler.preparer.format_table(create.table)} ({columns})"
