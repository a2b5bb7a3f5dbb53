"""The relational Mutagenesis dataset, stored in and read back from a SQL database.

:func:`create_database` loads the three CSV tables (``molecule``, ``atom``,
``bond``; see ``shared/README.md``) into a database through SQLAlchemy: an
SQLite file by default, or any database URL (``postgresql://...``). The
schema has primary and foreign keys::

    molecule(molecule_id PK, ind1, inda, logp, lumo, mutagenic 'yes'|'no')
    atom(atom_id PK, molecule_id FK -> molecule, element, type, charge)
    bond(atom1_id FK -> atom, atom2_id FK -> atom, type, PK(atom1_id, atom2_id))

:func:`load_mutagenesis` reads it back with SQL: integer indices are numbered
by window functions and every bond is joined to its two atoms (and thereby its
molecule), so no key is parsed in Python. Bonds are undirected; the dataset
lists each once and :attr:`Mutagenesis.directed` gives both directions.

Bad data is refused with a :class:`MutagenesisError`, never a raw database
error: a repeated id, a bond from an atom to itself, a bond listed twice (in
either direction), or a label other than yes/no names the CSV file and its
1-based line; the same checks run in SQL on any database that is read. Reading
never creates anything: a missing SQLite file is an error, not a new empty one.

As in the original source, chlorine and bromine are stored as element ``c``
with type 93 and element ``b`` with type 94; :func:`load_mutagenesis` maps them
to the elements ``cl`` and ``br`` (thesis 6.3: 8 atom types C, O, Br, I, F, H, N, Cl).
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ._common import DatasetError, Groups

__all__ = ["Mutagenesis", "MutagenesisError", "create_database", "load_mutagenesis", "find_csv_dir",
           "database_url", "SCHEMA"]

# table -> columns the loader needs (create_database writes all of the CSV's columns)
SCHEMA = {
    "molecule": ("molecule_id", "mutagenic"),
    "atom": ("atom_id", "molecule_id", "element", "type"),
    "bond": ("atom1_id", "atom2_id", "type"),
}
_CSV_COLUMNS = {
    "molecule": ("molecule_id", "ind1", "inda", "logp", "lumo", "mutagenic"),
    "atom": ("atom_id", "molecule_id", "element", "type", "charge"),
    "bond": ("atom1_id", "atom2_id", "type"),
}


class MutagenesisError(DatasetError):
    """The CSVs or the database are malformed; the message names the table, column or key."""


@dataclass(frozen=True, eq=False)
class Mutagenesis:
    """Mutagenesis as arrays; molecules, atoms and bonds are numbered 0.. in database order.

    * atoms: ``atom_molecule`` (molecule index), ``atom_element`` (index into
      ``element_names``), ``atom_type`` (index into ``type_values``);
    * bonds (undirected, each once): ``bond_atoms`` ``(n_bonds, 2)`` atom indices,
      ``bond_type`` (index into ``bond_type_values``);
    * ``labels``: 1 for a mutagenic molecule, else 0.
    """

    molecule_ids: tuple
    labels: np.ndarray
    atom_ids: tuple
    atom_molecule: np.ndarray
    atom_element: np.ndarray
    atom_type: np.ndarray
    bond_atoms: np.ndarray
    bond_type: np.ndarray
    element_names: tuple
    type_values: np.ndarray
    bond_type_values: np.ndarray

    @property
    def n_molecules(self) -> int:
        return len(self.molecule_ids)

    @property
    def n_atoms(self) -> int:
        return len(self.atom_ids)

    @property
    def n_bonds(self) -> int:
        return int(self.bond_atoms.shape[0])

    @property
    def n_mutagenic(self) -> int:
        return int(self.labels.sum())

    @property
    def bond_molecule(self) -> np.ndarray:
        return self.atom_molecule[self.bond_atoms[:, 0]]

    @property
    def directed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(x, y, bond)``: both directions of every bond, the ground ``bond(X, Y, B)`` facts."""
        a, b = self.bond_atoms[:, 0], self.bond_atoms[:, 1]
        index = np.arange(self.n_bonds)
        return np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([index, index])

    @cached_property
    def atoms(self) -> Groups:
        return Groups.of(self.atom_molecule, self.n_molecules)

    @cached_property
    def bonds(self) -> Groups:
        return Groups.of(self.bond_molecule, self.n_molecules)

    def __repr__(self) -> str:
        return (f"Mutagenesis({self.n_molecules} molecules ({self.n_mutagenic} mutagenic), "
                f"{self.n_atoms} atoms, {self.n_bonds} bonds)")


# -- locating data -------------------------------------------------------------------

def find_csv_dir(csv_dir: str | os.PathLike | None = None) -> Path:
    """The CSV folder: the argument, or ``$NEUROVEC_DATA/mutagenesis`` (the one data variable)."""
    if csv_dir is None:
        if os.environ.get("NEUROVEC_DATA"):
            csv_dir = Path(os.environ["NEUROVEC_DATA"]) / "mutagenesis"
        else:
            raise MutagenesisError("no Mutagenesis CSV folder given: set NEUROVEC_DATA to the folder that holds "
                                   "mutagenesis/ (atom.csv, bond.csv, molecule.csv; e.g. NEUROVEC_DATA=../shared/data), "
                                   "or pass the CSV folder (--data-dir in the examples)")
    folder = Path(csv_dir).expanduser()
    if not folder.is_dir():
        raise MutagenesisError(f"the Mutagenesis CSV folder {str(folder)!r} does not exist")
    for table in _CSV_COLUMNS:
        if not (folder / f"{table}.csv").is_file():
            raise MutagenesisError(f"missing {table}.csv in {folder}")
    return folder


def database_url(url_or_path: str | os.PathLike) -> str:
    """A SQLAlchemy URL: URLs pass through, a file path becomes an SQLite URL."""
    text = str(url_or_path)
    return text if "://" in text else f"sqlite:///{Path(text).expanduser().resolve()}"


def _engine(url_or_path):
    from sqlalchemy import create_engine
    return create_engine(database_url(url_or_path))


# -- writing -------------------------------------------------------------------------

def _schema():
    from sqlalchemy import (CheckConstraint, Column, Float, ForeignKey, Integer, MetaData,
                            PrimaryKeyConstraint, String, Table)
    meta = MetaData()
    Table("molecule", meta,
          Column("molecule_id", String(32), primary_key=True),
          Column("ind1", Integer), Column("inda", Integer), Column("logp", Float), Column("lumo", Float),
          Column("mutagenic", String(3), CheckConstraint("mutagenic IN ('yes', 'no')"), nullable=False))
    Table("atom", meta,
          Column("atom_id", String(32), primary_key=True),
          Column("molecule_id", String(32), ForeignKey("molecule.molecule_id"), nullable=False, index=True),
          Column("element", String(8), nullable=False),
          Column("type", Integer, nullable=False),
          Column("charge", Float))
    Table("bond", meta,
          Column("atom1_id", String(32), ForeignKey("atom.atom_id"), nullable=False),
          Column("atom2_id", String(32), ForeignKey("atom.atom_id"), nullable=False),
          Column("type", Integer, nullable=False),
          PrimaryKeyConstraint("atom1_id", "atom2_id"))
    return meta


def _read_csv(path: Path, columns: tuple[str, ...], types: dict) -> tuple[list[dict], list[int]]:
    """The rows (the needed columns, parsed) and the 1-based file line of each."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise MutagenesisError(f"{path.name}: missing column {missing[0]!r} (header: {reader.fieldnames})")
        rows, lines = [], []
        for row in reader:
            try:
                rows.append({c: types.get(c, str)(row[c].strip()) for c in columns})
            except (ValueError, AttributeError):
                bad = next(c for c in columns if row.get(c) is None or not _parses(types.get(c, str), row[c]))
                raise MutagenesisError(f"{path.name}, line {reader.line_num}: bad value {row.get(bad)!r} in "
                                       f"column {bad!r}") from None
            lines.append(reader.line_num)
    return rows, lines


def _parses(kind, text) -> bool:
    try:
        kind(text.strip())
        return True
    except (ValueError, AttributeError):
        return False


def create_database(csv_dir: str | os.PathLike | None = None, url_or_path: str | os.PathLike = "mutagenesis.db",
                    *, replace: bool = False) -> str:
    """Create the tables in ``url_or_path`` and fill them from the CSVs; returns the database URL.

    Refuses to touch a database that already has these tables unless ``replace``.
    The whole load is one transaction, checked (no bond may name an unknown atom)
    before it commits.
    """
    from sqlalchemy import inspect
    from sqlalchemy.exc import DBAPIError, IntegrityError

    folder = find_csv_dir(csv_dir)
    url = database_url(url_or_path)
    file = _sqlite_file(url)
    if file is not None and not file.parent.is_dir():
        raise MutagenesisError(f"cannot create the SQLite database {str(file)!r}: folder {str(file.parent)!r} "
                               "does not exist")
    engine = _engine(url)
    meta = _schema()
    try:
        existing = set(inspect(engine).get_table_names()) & set(meta.tables)
        if existing and not replace:
            again = str(url_or_path) if file is None else str(file)
            raise MutagenesisError(f"database {again!r} already has the Mutagenesis table(s) {sorted(existing)}: "
                                   f"read it with load_mutagenesis({again!r}), or pass replace=True to "
                                   "re-create the tables from the CSVs")
        with engine.begin() as conn:
            meta.drop_all(conn)
            _fill(conn, folder, meta)
            _check_integrity(conn, _reflect(conn))
    except IntegrityError as error:
        raise MutagenesisError(f"the Mutagenesis CSVs in {folder} violate the schema: {error.orig}") from None
    except DBAPIError as error:
        raise MutagenesisError(f"database {url!r}: {error.orig}") from None
    finally:
        engine.dispose()
    return url


# -- reading -------------------------------------------------------------------------

def _reflect(conn) -> dict:
    """The three tables as reflected from the database, after checking they have the needed columns."""
    from sqlalchemy import MetaData, Table, inspect

    inspector = inspect(conn)
    tables = set(inspector.get_table_names())
    meta = MetaData()
    reflected = {}
    for name, columns in SCHEMA.items():
        if name not in tables:
            raise MutagenesisError(f"the database has no table {name!r} (tables: {sorted(tables)})")
        present = {c["name"] for c in inspector.get_columns(name)}
        for column in columns:
            if column not in present:
                raise MutagenesisError(f"table {name!r} has no column {column!r} (columns: {sorted(present)})")
        reflected[name] = Table(name, meta, autoload_with=conn)
    return reflected


def _check_integrity(conn, t: dict) -> None:
    """Referential checks in SQL (anti-joins), so even a database without enforced keys is caught."""
    from sqlalchemy import func, select

    molecule, atom, bond = t["molecule"], t["atom"], t["bond"]
    orphan = conn.execute(
        select(atom.c.atom_id, atom.c.molecule_id)
        .select_from(atom.outerjoin(molecule, atom.c.molecule_id == molecule.c.molecule_id))
        .where(molecule.c.molecule_id.is_(None)).limit(1)).first()
    if orphan:
        raise MutagenesisError(f"atom {orphan[0]!r} references unknown molecule {orphan[1]!r} "
                               "(column atom.molecule_id)")
    for column in ("atom1_id", "atom2_id"):
        dangling = conn.execute(
            select(bond.c.atom1_id, bond.c.atom2_id)
            .select_from(bond.outerjoin(atom, bond.c[column] == atom.c.atom_id))
            .where(atom.c.atom_id.is_(None)).limit(1)).first()
        if dangling:
            unknown = dangling[0] if column == "atom1_id" else dangling[1]
            raise MutagenesisError(f"bond ({dangling[0]!r}, {dangling[1]!r}) references unknown atom "
                                   f"{unknown!r} (column bond.{column})")
    a1, a2 = atom.alias("a1"), atom.alias("a2")
    crossing = conn.execute(
        select(bond.c.atom1_id, bond.c.atom2_id, a1.c.molecule_id, a2.c.molecule_id)
        .join(a1, bond.c.atom1_id == a1.c.atom_id).join(a2, bond.c.atom2_id == a2.c.atom_id)
        .where(a1.c.molecule_id != a2.c.molecule_id).limit(1)).first()
    if crossing:
        raise MutagenesisError(f"bond ({crossing[0]!r}, {crossing[1]!r}) joins atoms of molecules "
                               f"{crossing[2]!r} and {crossing[3]!r}")
    for table, key in ((molecule, "molecule_id"), (atom, "atom_id")):
        repeated = conn.execute(select(table.c[key]).group_by(table.c[key])
                                .having(func.count() > 1).limit(1)).first()
        if repeated:
            raise MutagenesisError(f"{table.name} {repeated[0]!r} is listed more than once (column "
                                   f"{table.name}.{key} must be unique)")
    loop = conn.execute(select(bond.c.atom1_id).where(bond.c.atom1_id == bond.c.atom2_id).limit(1)).first()
    if loop:
        raise MutagenesisError(f"bond ({loop[0]!r}, {loop[0]!r}) joins atom {loop[0]!r} to itself")
    b1, b2 = bond.alias("b1"), bond.alias("b2")
    twice = conn.execute(
        select(b1.c.atom1_id, b1.c.atom2_id, func.count()).select_from(b1)
        .join(b2, ((b1.c.atom1_id == b2.c.atom1_id) & (b1.c.atom2_id == b2.c.atom2_id))
              | ((b1.c.atom1_id == b2.c.atom2_id) & (b1.c.atom2_id == b2.c.atom1_id)))
        .group_by(b1.c.atom1_id, b1.c.atom2_id).having(func.count() > 1).limit(1)).first()
    if twice:
        raise MutagenesisError(f"bond ({twice[0]!r}, {twice[1]!r}) is listed more than once (bonds are "
                               "undirected: a bond and its reverse are the same bond)")
    bad_label = conn.execute(select(molecule.c.molecule_id, molecule.c.mutagenic)
                             .where(molecule.c.mutagenic.not_in(["yes", "no"])
                                    | molecule.c.mutagenic.is_(None)).limit(1)).first()
    if bad_label:
        raise MutagenesisError(f"molecule {bad_label[0]!r}: column molecule.mutagenic must be 'yes' or 'no' "
                               f"(got {bad_label[1]!r})")


def _read(conn) -> Mutagenesis:
    from sqlalchemy import and_, case, func, select

    t = _reflect(conn)
    _check_integrity(conn, t)
    molecule, atom, bond = t["molecule"], t["atom"], t["bond"]
    index = lambda *order: func.row_number().over(order_by=order) - 1  # noqa: E731 (0-based numbering)
    rank = lambda column: func.dense_rank().over(order_by=column) - 1  # noqa: E731 (vocabulary id)

    mol = select(molecule.c.molecule_id, molecule.c.mutagenic,
                 index(molecule.c.molecule_id).label("ix")).cte("mol")
    element = case((and_(atom.c.element == "c", atom.c.type == 93), "cl"),
                   (and_(atom.c.element == "b", atom.c.type == 94), "br"),
                   else_=atom.c.element).label("element")
    atoms0 = (select(atom.c.atom_id, mol.c.ix.label("mol"), element, atom.c.type)
              .join(mol, atom.c.molecule_id == mol.c.molecule_id)).cte("atoms0")
    atoms = select(atoms0.c.atom_id, atoms0.c.mol, atoms0.c.element, atoms0.c.type,
                   index(atoms0.c.mol, atoms0.c.atom_id).label("ix"),
                   rank(atoms0.c.element).label("element_id"), rank(atoms0.c.type).label("type_id")).cte("atoms")
    a1, a2 = atoms.alias("a1"), atoms.alias("a2")

    molecules = conn.execute(select(mol.c.molecule_id, mol.c.mutagenic).order_by(mol.c.ix)).all()
    atom_rows = conn.execute(select(atoms.c.atom_id, atoms.c.mol, atoms.c.element_id, atoms.c.type_id,
                                    atoms.c.element, atoms.c.type).order_by(atoms.c.ix)).all()
    bond_rows = conn.execute(
        select(a1.c.ix, a2.c.ix, rank(bond.c.type), bond.c.type)
        .select_from(bond.join(a1, bond.c.atom1_id == a1.c.atom_id).join(a2, bond.c.atom2_id == a2.c.atom_id))
        .order_by(a1.c.mol, a1.c.ix, a2.c.ix)).all()
    if not molecules or not atom_rows:
        raise MutagenesisError("the database has no molecules or no atoms")

    atom_ids, atom_mol, element_id, type_id, element_name, type_value = zip(*atom_rows)
    element_id, type_id = np.array(element_id, np.int64), np.array(type_id, np.int64)
    bonds = np.array([row[:3] for row in bond_rows], np.int64).reshape(-1, 3)
    bond_values = np.array([row[3] for row in bond_rows], np.int64)
    return Mutagenesis(
        molecule_ids=tuple(m[0] for m in molecules),
        labels=np.array([m[1] == "yes" for m in molecules], np.int64),
        atom_ids=tuple(atom_ids),
        atom_molecule=np.array(atom_mol, np.int64),
        atom_element=element_id,
        atom_type=type_id,
        bond_atoms=np.ascontiguousarray(bonds[:, :2]),
        bond_type=bonds[:, 2].copy(),
        element_names=tuple(_vocabulary(element_id, np.array(element_name, object))),
        type_values=_vocabulary(type_id, np.array(type_value, np.int64)),
        bond_type_values=_vocabulary(bonds[:, 2], bond_values),
    )


def _vocabulary(ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The value behind each dense id ``0..k-1``."""
    out = np.empty(int(ids.max()) + 1 if ids.size else 0, dtype=values.dtype)
    out[ids] = values
    return out


def load_mutagenesis(source: str | os.PathLike | None = None) -> Mutagenesis:
    """Load Mutagenesis from a database URL, an SQLite file, or a CSV folder.

    A CSV folder (or ``None``: the folder from the environment, see
    :func:`find_csv_dir`) is first loaded into an in-memory SQLite database, so
    the data always comes back through the same SQL. Nothing is created: a
    missing SQLite file is an error, not a new empty database.
    """
    from sqlalchemy.exc import DBAPIError

    if source is None:
        return _load_csv(find_csv_dir(None))
    text = str(source)
    if "://" in text:
        file = _sqlite_file(text)
        if file is not None and not file.is_file():
            raise MutagenesisError(f"no SQLite database file {str(file)!r} (from the URL {text!r}); create it with "
                                   "create_database(csv_dir, path)")
        url, label = text, text
    else:
        path = Path(text).expanduser()
        if path.is_dir():
            return _load_csv(find_csv_dir(path))
        if not path.is_file():
            raise MutagenesisError(f"{str(path)!r} does not exist (expected an SQLite database file made by "
                                   "create_database, a folder with the Mutagenesis CSVs, or a database URL)")
        url, label = database_url(path), str(path)
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return _read(conn)
    except DBAPIError as error:
        raise MutagenesisError(f"{label}: cannot read the database ({error.orig})") from None
    finally:
        engine.dispose()


def _load_csv(folder: Path) -> Mutagenesis:
    from sqlalchemy.exc import IntegrityError

    engine = _engine("sqlite://")
    # An in-memory SQLite database lives as long as its connection: fill and read on one.
    try:
        with engine.connect() as conn:
            _fill(conn, folder, _schema())
            return _read(conn)
    except IntegrityError as error:
        raise MutagenesisError(f"the Mutagenesis CSVs in {folder} violate the schema: {error.orig}") from None
    finally:
        engine.dispose()


def _sqlite_file(url: str) -> Path | None:
    """The file behind an SQLite URL; ``None`` for other databases and in-memory SQLite."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" or \
            database.startswith("file:"):
        return None
    return Path(database).expanduser()


def _fill(conn, folder: Path, meta) -> None:
    """Create the tables on ``conn`` and insert the CSV rows, parents first (foreign keys).

    Keys are checked on the CSV rows first, so that a repeated id, a bond from an atom
    to itself or a bond listed twice (in either direction) names its file and line.
    """
    number = lambda text: float(text) if text else None  # noqa: E731 (an empty cell is NULL)
    types = {"molecule": {"ind1": int, "inda": int, "logp": number, "lumo": number},
             "atom": {"type": int, "charge": number}, "bond": {"type": int}}
    rows = {}
    for table in types:
        path = folder / f"{table}.csv"
        rows[table], lines = _read_csv(path, _CSV_COLUMNS[table], types[table])
        _check_csv_keys(path, table, rows[table], lines)
    meta.create_all(conn)
    for table in ("molecule", "atom", "bond"):
        if rows[table]:
            conn.execute(meta.tables[table].insert(), rows[table])


def _check_csv_keys(path: Path, table: str, rows: list[dict], lines: list[int]) -> None:
    seen: dict = {}
    for row, line in zip(rows, lines):
        if table == "bond":
            a, b = row["atom1_id"], row["atom2_id"]
            if a == b:
                raise MutagenesisError(f"{path.name}, line {line}: bond ({a!r}, {b!r}) joins atom {a!r} to itself")
            key, shown = frozenset((a, b)), f"bond ({a!r}, {b!r})"
        else:
            key = row[f"{table}_id"]
            shown = f"{table}_id {key!r}"
            if table == "molecule" and row["mutagenic"] not in ("yes", "no"):
                raise MutagenesisError(f"{path.name}, line {line}: column mutagenic must be 'yes' or 'no' "
                                       f"(got {row['mutagenic']!r})")
        if key in seen:
            first_line, first = seen[key]
            reversed_ = table == "bond" and first["atom1_id"] != row["atom1_id"]
            detail = (f" (line {first_line} lists ({first['atom1_id']!r}, {first['atom2_id']!r}); bonds are "
                      "undirected, so list each once)") if reversed_ else ""
            raise MutagenesisError(f"{path.name}, line {line}: {shown} repeats line {first_line}{detail}")
        seen[key] = (line, row)
