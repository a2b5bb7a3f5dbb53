"""Shared test fixtures: where the datasets live, and hypothesis profiles."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
# Tests read the raw data next to the project (../shared/data), never a download.
SHARED_DATA = Path(os.environ.get("NEUROVEC_DATA", REPO.parent / "shared" / "data"))

# The quick suite draws the same examples every run (derandomize, as hypothesis's CI profile does):
# a red run then means a change, not a new random draw. NEUROVEC_HYPOTHESIS=explore draws new
# examples each run, to look for new failures (then add each one found as an @example).
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True,
                          derandomize=True)
settings.load_profile("explore" if os.environ.get("NEUROVEC_HYPOTHESIS") == "explore" else "ci")


# The JVM that NeuraLogic starts in this process (JPype) handles SIGSEGV, SIGBUS, SIGFPE and SIGILL
# itself: its compiled code takes a SIGSEGV on purpose (null checks, safepoints). Python does not
# see handlers installed outside it, so signal.getsignal still answers SIG_DFL, and a library that
# "restores" every signal it read (Lightning's Trainer does, at the end of fit) puts SIG_DFL back
# over the JVM's handler: the JVM's next deliberate SIGSEGV then kills the process with exit code
# 139, in whichever later test calls Java. So where a test leaves one of these signals at SIG_DFL
# that had a handler before, the handler goes back (read and written with sigaction itself). A
# handler a test installs (the JVM's, when a test starts it) stays.
_JVM_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_SIGACTION_BYTES = 256  # more than glibc's struct sigaction (152 bytes on x86-64 and aarch64)


def _sigactions() -> dict[int, bytes]:
    actions = {}
    for signum in _JVM_SIGNALS:
        action = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if _LIBC.sigaction(int(signum), None, action) == 0:
            actions[int(signum)] = action.raw
    return actions


@pytest.fixture(autouse=True)
def _native_signal_handlers_survive():
    if _LIBC is None:
        yield
        return
    before = _sigactions()
    yield
    after = _sigactions()
    for signum, action in before.items():
        if _handler(after.get(signum, action)) == 0 and _handler(action) != 0:  # reset to SIG_DFL
            _LIBC.sigaction(signum, ctypes.create_string_buffer(action, _SIGACTION_BYTES), None)


def _handler(action: bytes) -> int:
    """sa_handler, the first field of struct sigaction: 0 is SIG_DFL."""
    return int.from_bytes(action[:ctypes.sizeof(ctypes.c_void_p)], sys.byteorder)


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
