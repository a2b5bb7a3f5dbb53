"""Mutagenesis through a real SQL database: counts, round trips and bad databases."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import create_engine, text  # noqa: E402

from neurovec.datasets import MutagenesisError, create_database, load_mutagenesis  # noqa: E402


@pytest.fixture(scope="module")
def database(mutagenesis_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "mutagenesis.db"
    url = create_database(mutagenesis_dir, path)
    return path, url


def test_published_counts(database):
    path, url = database
    assert url.startswith("sqlite:///") and path.is_file()
    ds = load_mutagenesis(path)
    assert (ds.n_molecules, ds.n_atoms, ds.n_bonds, ds.n_mutagenic) == (188, 4893, 5243, 125)
    assert sorted(ds.element_names) == ["br", "c", "cl", "f", "h", "i", "n", "o"]
    assert ds.bond_type_values.tolist() == [1, 2, 3, 4, 5, 7]
    x, y, bond = ds.directed
    assert x.size == 2 * 5243 and np.array_equal(np.sort(bond), np.repeat(np.arange(5243), 2))


def test_schema_has_keys(database):
    path, _ = database
    inspector = sqlalchemy.inspect(create_engine(f"sqlite:///{path}"))
    assert inspector.get_pk_constraint("molecule")["constrained_columns"] == ["molecule_id"]
    assert inspector.get_pk_constraint("bond")["constrained_columns"] == ["atom1_id", "atom2_id"]
    atom_fk = inspector.get_foreign_keys("atom")
    assert atom_fk[0]["referred_table"] == "molecule"
    bond_fk = {(fk["constrained_columns"][0], fk["referred_table"]) for fk in inspector.get_foreign_keys("bond")}
    assert bond_fk == {("atom1_id", "atom"), ("atom2_id", "atom")}


def test_sql_matches_the_csvs(database, mutagenesis_dir):
    """Every bond read back through the joins is the CSV bond, and atoms keep their molecules."""
    import csv
    ds = load_mutagenesis(database[0])
    atoms = {row["atom_id"]: row for row in csv.DictReader(open(mutagenesis_dir / "atom.csv"))}
    for i in range(0, ds.n_atoms, 97):
        row = atoms[ds.atom_ids[i]]
        assert ds.molecule_ids[ds.atom_molecule[i]] == row["molecule_id"]
        assert int(ds.type_values[ds.atom_type[i]]) == int(row["type"])
    bonds = {(r["atom1_id"], r["atom2_id"]): int(r["type"]) for r in csv.DictReader(open(mutagenesis_dir / "bond.csv"))}
    read = {(ds.atom_ids[a], ds.atom_ids[b]): int(ds.bond_type_values[t])
            for (a, b), t in zip(ds.bond_atoms.tolist(), ds.bond_type.tolist())}
    assert read == bonds
    labels = {r["molecule_id"]: r["mutagenic"] == "yes" for r in csv.DictReader(open(mutagenesis_dir / "molecule.csv"))}
    assert all(labels[m] == bool(l) for m, l in zip(ds.molecule_ids, ds.labels))


def test_csv_folder_and_env_vars(mutagenesis_dir, tmp_path, monkeypatch):
    assert load_mutagenesis(mutagenesis_dir).n_atoms == 4893
    monkeypatch.delenv("NEUROVEC_DATA", raising=False)
    with pytest.raises(MutagenesisError, match=r"set NEUROVEC_DATA to the folder that holds mutagenesis/"):
        load_mutagenesis()
    shutil.copytree(mutagenesis_dir, tmp_path / "mutagenesis")
    monkeypatch.setenv("NEUROVEC_DATA", str(tmp_path))
    assert load_mutagenesis().n_molecules == 188


def test_url_and_refusing_to_overwrite(database, mutagenesis_dir):
    path, url = database
    assert load_mutagenesis(url).n_molecules == 188
    with pytest.raises(MutagenesisError, match=r"already has the Mutagenesis table\(s\) \['atom', 'bond', "
                                               r"'molecule'\]: read it with load_mutagenesis\('.*mutagenesis\.db'\), "
                                               r"or pass replace=True"):
        create_database(mutagenesis_dir, path)
    assert create_database(mutagenesis_dir, path, replace=True) == url


@pytest.fixture
def copy_db(database, tmp_path):
    target = tmp_path / "copy.db"
    shutil.copy(database[0], target)
    return target


def _execute(path, *statements):
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
    engine.dispose()


def test_missing_table(copy_db):
    _execute(copy_db, "DROP TABLE bond")
    with pytest.raises(MutagenesisError, match="no table 'bond'"):
        load_mutagenesis(copy_db)


def test_missing_column(copy_db):
    _execute(copy_db, "ALTER TABLE atom DROP COLUMN element")
    with pytest.raises(MutagenesisError, match="table 'atom' has no column 'element'"):
        load_mutagenesis(copy_db)


def test_dangling_bond(copy_db):
    # SQLite does not enforce foreign keys unless asked, so such a database can exist.
    _execute(copy_db, "INSERT INTO bond (atom1_id, atom2_id, type) VALUES ('d1_1', 'd999_1', 1)")
    with pytest.raises(MutagenesisError, match=r"unknown atom 'd999_1' \(column bond.atom2_id\)"):
        load_mutagenesis(copy_db)


def test_atom_of_unknown_molecule(copy_db):
    _execute(copy_db, "UPDATE atom SET molecule_id = 'nope' WHERE atom_id = 'd1_1'")
    with pytest.raises(MutagenesisError, match="atom 'd1_1' references unknown molecule 'nope'"):
        load_mutagenesis(copy_db)


def test_dangling_bond_in_csv_is_rejected_at_creation(mutagenesis_dir, tmp_path):
    csvs = tmp_path / "csv"
    shutil.copytree(mutagenesis_dir, csvs)
    with open(csvs / "bond.csv", "a") as handle:
        handle.write("d1_1,ghost_7,1\n")
    with pytest.raises(MutagenesisError, match="ghost_7"):
        create_database(csvs, tmp_path / "bad.db")


def test_malformed_csv(mutagenesis_dir, tmp_path):
    csvs = tmp_path / "csv"
    shutil.copytree(mutagenesis_dir, csvs)
    (csvs / "atom.csv").write_text("atom_id,molecule_id,element,charge\nd1_1,d1,c,0.1\n")
    with pytest.raises(MutagenesisError, match="atom.csv: missing column 'type'"):
        create_database(csvs, tmp_path / "bad.db")
    (csvs / "atom.csv").write_text("atom_id,molecule_id,element,type,charge\nd1_1,d1,c,twenty,0.1\n")
    with pytest.raises(MutagenesisError, match="atom.csv, line 2: bad value 'twenty' in column 'type'"):
        create_database(csvs, tmp_path / "bad2.db")


# -- bonds and keys: clear errors with the CSV line, also through load_mutagenesis ------------------

@pytest.fixture
def csvs(mutagenesis_dir, tmp_path):
    folder = tmp_path / "csv"
    shutil.copytree(mutagenesis_dir, folder)
    return folder


def _append(path, line):
    with open(path, "a") as handle:
        handle.write(line + "\n")


def _first_bond(csvs):
    return (csvs / "bond.csv").read_text().splitlines()[1].split(",")


@pytest.mark.parametrize("loader", ["create", "load"])
def test_bond_from_an_atom_to_itself(csvs, tmp_path, loader):
    _append(csvs / "bond.csv", "d1_1,d1_1,1")
    lines = len((csvs / "bond.csv").read_text().splitlines())
    with pytest.raises(MutagenesisError, match=rf"bond\.csv, line {lines}: bond \('d1_1', 'd1_1'\) joins atom "
                                               r"'d1_1' to itself"):
        create_database(csvs, tmp_path / "bad.db") if loader == "create" else load_mutagenesis(csvs)


@pytest.mark.parametrize("loader", ["create", "load"])
def test_reversed_duplicate_bond(csvs, tmp_path, loader):
    a, b, kind = _first_bond(csvs)
    _append(csvs / "bond.csv", f"{b},{a},{kind}")
    lines = len((csvs / "bond.csv").read_text().splitlines())
    with pytest.raises(MutagenesisError, match=rf"bond\.csv, line {lines}: bond \('{b}', '{a}'\) repeats line 2 "
                                               rf"\(line 2 lists \('{a}', '{b}'\); bonds are undirected"):
        create_database(csvs, tmp_path / "bad.db") if loader == "create" else load_mutagenesis(csvs)


@pytest.mark.parametrize("table, line, message", [
    ("atom", "d1_1,d1,c,22,-0.117", r"atom\.csv, line \d+: atom_id 'd1_1' repeats line 2"),
    ("bond", None, r"bond\.csv, line \d+: bond \('.*'\) repeats line 2$"),
    ("molecule", "d1,1,0,4.23,-1.246,maybe", r"molecule\.csv, line \d+: column mutagenic must be 'yes' or 'no' "
                                             r"\(got 'maybe'\)"),
])
def test_key_violations_are_clear_errors_not_integrity_errors(csvs, table, line, message):
    """These raised sqlalchemy's IntegrityError from load_mutagenesis before."""
    _append(csvs / f"{table}.csv", line or ",".join(_first_bond(csvs)))
    if table == "molecule":  # a new molecule id, so that only the label is wrong
        text = (csvs / "molecule.csv").read_text().replace("d1,1,0,4.23,-1.246,maybe", "dnew,1,0,4.23,-1.246,maybe")
        (csvs / "molecule.csv").write_text(text)
    with pytest.raises(MutagenesisError, match=message):
        load_mutagenesis(csvs)


def test_self_loop_and_reversed_bond_in_a_database(copy_db):
    _execute(copy_db, "INSERT INTO bond (atom1_id, atom2_id, type) VALUES ('d1_1', 'd1_1', 1)")
    with pytest.raises(MutagenesisError, match=r"bond \('d1_1', 'd1_1'\) joins atom 'd1_1' to itself"):
        load_mutagenesis(copy_db)
    _execute(copy_db, "DELETE FROM bond WHERE atom1_id = atom2_id",
             "INSERT INTO bond (atom1_id, atom2_id, type) SELECT atom2_id, atom1_id, type FROM bond LIMIT 1")
    with pytest.raises(MutagenesisError, match=r"bond \(.*\) is listed more than once \(bonds are undirected"):
        load_mutagenesis(copy_db)


# -- paths: nothing is created by reading --------------------------------------------------------

def test_missing_sqlite_file_is_an_error_not_a_new_database(tmp_path):
    missing = tmp_path / "typo.db"
    with pytest.raises(MutagenesisError, match=r"'.*typo\.db' does not exist \(expected an SQLite database"):
        load_mutagenesis(missing)
    with pytest.raises(MutagenesisError, match=r"no SQLite database file '.*typo\.db' \(from the URL"):
        load_mutagenesis(f"sqlite:///{missing}")
    assert not missing.exists()


def test_file_that_is_not_a_database(tmp_path, mutagenesis_dir):
    path = tmp_path / "molecule.csv"
    shutil.copy(mutagenesis_dir / "molecule.csv", path)
    with pytest.raises(MutagenesisError, match=r"molecule\.csv: cannot read the database \(file is not a database\)"):
        load_mutagenesis(path)


def test_create_database_in_a_missing_folder(mutagenesis_dir, tmp_path):
    with pytest.raises(MutagenesisError, match=r"folder '.*no_such_dir' does not exist"):
        create_database(mutagenesis_dir, tmp_path / "no_such_dir" / "m.db")
    with pytest.raises(MutagenesisError, match=r"CSV folder '.*nope' does not exist"):
        create_database(tmp_path / "nope", tmp_path / "m.db")
