"""Shared test fixtures: where the datasets live, and hypothesis profiles."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
# Tests read the raw data next to the project (../shared/data), never a download.
SHARED_DATA = Path(os.environ.get("NEUROVEC_DATA", REPO.parent / "shared" / "data"))

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# On CI (the CI variable set), the same examples every run, as hypothesis's own CI profile does: a
# red run then means a change, not a new random draw. Runs elsewhere keep exploring new examples.
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True,
                          derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session")
def tu_dir() -> Path:
    path = SHARED_DATA / "tu"
    if not path.is_dir():
        pytest.skip(f"TU data not found at {path} (set NEUROVEC_DATA to the folder holding tu/, mutagenesis/, planetoid/, kg/, circuits/)")
    return path


@pytest.fixture(scope="session")
def mutagenesis_dir() -> Path:
    path = SHARED_DATA / "mutagenesis"
    if not path.is_dir():
        pytest.skip(f"Mutagenesis CSVs not found at {path} (set NEUROVEC_DATA to the folder holding tu/, mutagenesis/, planetoid/, kg/, circuits/)")
    return path


def _shared(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"{name} data not found at {path} (set NEUROVEC_DATA to the folder holding tu/, mutagenesis/, planetoid/, kg/, circuits/)")
    return path


@pytest.fixture(scope="session")
def planetoid_dir() -> Path:
    """The Planetoid root: ``planetoid_dir / "Cora" / "raw"`` holds Cora's raw files."""
    return _shared("planetoid")


@pytest.fixture(scope="session")
def kg_dir() -> Path:
    """Knowledge-graph triples: ``kg_dir / "kinships" / "train.txt"``, and ``umls``."""
    return _shared("kg")


@pytest.fixture(scope="session")
def circuits_dir() -> Path:
    """SDD circuits with their vtrees: ``circuits_dir / "sudoku_4.sdd"``, ``road_r``, ``4-grid``."""
    return _shared("circuits")
