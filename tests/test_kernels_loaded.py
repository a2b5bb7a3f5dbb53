"""Threads on a busy machine (NOTE: [threads on a busy machine] in engines/native.py): the one-time
warning, and benchmarks/kernels_loaded.py, which times a step idle and beside a competing process
(no timing asserted here)."""
from __future__ import annotations

import logging

import pytest
import torch

from neurovec.benchmarks import kernels_loaded
from neurovec.engines import native


@pytest.fixture
def busy(monkeypatch):
    """A machine whose load average is twice its CPUs, torch at 2 threads, no wait policy set."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setattr(native.os, "getloadavg", lambda: (4.0 * native.os.cpu_count(), 0.0, 0.0))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield monkeypatch
    torch.set_num_threads(before)


@pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(), reason="torch's threads are not OpenMP here")
def test_spinning_threads_on_a_busy_machine_are_named(busy, caplog):
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        native._warn_if_spinning_on_a_busy_machine()
    assert "OMP_WAIT_POLICY=passive" in caplog.text and "torch.set_num_threads(1)" in caplog.text
    assert "load average" in caplog.text


def test_no_warning_when_threads_sleep_or_are_one(busy):
    assert native._spinning_on_a_busy_machine() is not None or "OpenMP" not in torch.__config__.parallel_info()
    busy.setenv("OMP_WAIT_POLICY", "passive")
    assert native._spinning_on_a_busy_machine() is None
    busy.delenv("OMP_WAIT_POLICY")
    torch.set_num_threads(1)
    assert native._spinning_on_a_busy_machine() is None
    torch.set_num_threads(2)
    busy.setattr(native.os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert native._spinning_on_a_busy_machine() is None


def test_benchmark_times_idle_and_loaded_steps(tu_dir):
    rows = kernels_loaded.measure(["MUTAG/gcn/labels"], rounds=1, steps=2, warmup=1, data_dir=str(tu_dir.parent))
    assert set(rows["MUTAG/gcn/labels"]) == {"idle", "loaded"}
    assert all(t > 0 for t in rows["MUTAG/gcn/labels"].values())
