"""benchmarks/kg.py (issue 27): the headline arithmetic, and one real contender run end to end."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neurovec.benchmarks import kg as bench


def _row(cell, contender, step, threads=1, valid=True):
    return {"cell": cell, "contender": contender, "threads": threads, "step_s": step, "valid": valid,
            "first_step_s": 0.1, "build_s": 1.0, "first_loss": 0.5}


def test_headline_takes_the_fastest_valid_peer():
    results = [_row("hetero-100", "default", 0.2), _row("hetero-100", "autotune", 0.1),
               _row("hetero-100", "pyg", 1.0), _row("hetero-100", "pyg-compiled", 0.4),
               _row("hetero-100", "pyg-fast", 0.05, valid=False),          # wrong: never the peer
               {"cell": "hetero-100", "contender": "pyg-fast-compiled", "threads": 1, "failed": "timeout"},
               _row("kinships-rules", "default", 0.01), _row("kinships-rules", "neuralogic", 5.0)]
    rows = {row["cell"]: row for row in bench.headline(results)}
    assert rows["hetero-100"]["peer"] == "pyg-compiled"
    assert rows["hetero-100"]["speedup"] == pytest.approx(4.0) and rows["hetero-100"]["target"] == 5.0
    assert rows["hetero-100"]["met"] is False
    assert rows["kinships-rules"]["peer"] == "neuralogic" and rows["kinships-rules"]["met"] is True
    text = bench.markdown(results, {"date": "today", "machine": "test", "load": "0"})
    assert "| hetero-100 | 1 | 400.0 (pyg-compiled) | 200.0 / 100.0 | **4.00x** | 5x | no |" in text
    assert "timeout" in text


def test_rules_cell_runs_and_checks(kg_dir):
    threads = torch.get_num_threads()
    try:  # run_child sets the process's threads, as the benchmark's child process does
        result = bench.run_child("kinships-rules", "default", threads=1, reps=1, warmup=0, data=str(kg_dir),
                                 budget=10)
    finally:
        torch.set_num_threads(threads)
    assert result["valid"] and result["step_s"] > 0 and result["queries"] > 450
    assert result["first_loss"] == pytest.approx(result["oracle_loss"], rel=1e-4)


def test_grounding_neuralogic_reports_a_timeout(kg_dir):
    row = bench.grounding_neuralogic("kinships", str(kg_dir), repeats=0, timeout=0.01)
    assert row["neuralogic_failed"] == "timeout 0.01 s" and row["neuralogic_attempts"] == []


def test_grounding_table_divides_build_dataset_by_ground():
    rows = [{"dataset": "kinships", "message_edges": 17088, "rules": 106, "queries": 498, "neurons": 6853,
             "ground_s": 0.02, "native_s": 0.03, "native_runs": 9, "neuralogic_build_dataset_s": 2.5,
             "neuralogic_total_s": 3.0, "neuralogic_first_s": 4.0, "ratio": 120.0},
            {"dataset": "umls", "message_edges": 10432, "rules": 190, "queries": 496, "neurons": 4272,
             "ground_s": 0.05, "native_s": 0.06, "native_runs": 9, "neuralogic_failed": "timeout 10 s"}]
    text = bench.grounding_markdown(rows, {"date": "today", "machine": "test", "load": "0"})
    assert "| kinships | 17,088 | 106 | 498 | 6,853 | 20.0 | 30.0 | 2.50 | 3.00 | 4.00 | **125x** (paired 120x) | 100x | 100x |" \
        in text
    assert "| umls | 10,432 | 190 | 496 | 4,272 | 50.0 | 60.0 | timeout 10 s |" in text


def test_grounding_native_times_the_rule_template(kg_dir):
    row = bench.grounding_native("kinships", str(kg_dir), repeats=2, seconds=0.0)
    assert row["native_runs"] == 2 and 0 < row["ground_s"] and 0 < row["native_s"]
    assert row["rules"] == 106 and row["queries"] > 450 and row["message_edges"] == 17088 and row["neurons"] > 0


@pytest.mark.slow
def test_grounding_neuralogic_builds_the_same_template(kg_dir):
    pytest.importorskip("neuralogic")
    native = bench.NativeGrounding("kinships", str(kg_dir))
    row = bench.grounding_neuralogic("kinships", str(kg_dir), repeats=0, timeout=600, native=native,
                                     native_repeats=2)
    assert "neuralogic_failed" not in row, row
    # neurovec ran before and after the build, and the paired ratio divides by those runs.
    assert len(native.times["ground"]) == 4 and row["ratio"] == pytest.approx(
        row["neuralogic_build_dataset_s"] / float(np.median(native.times["ground"])))
    _, triples, _, _ = bench._rules_job("kinships", str(kg_dir))
    # One built sample per query, as neurovec's graph has one output per query.
    assert len(row["neuralogic_attempts"]) == 1 and row["neuralogic_attempts"][0]["samples"] == len(triples)
    assert row["neuralogic_build_dataset_s"] > 0


def test_malloc_keep_keeps_large_blocks_in_the_heap(monkeypatch):
    from neurovec import memory

    calls = []

    class FakeLibc:
        def mallopt(self, option, value):
            calls.append((option, value))
            return 1

    monkeypatch.setattr(memory, "_LIBC", FakeLibc())
    assert bench._keep_freed_memory()
    assert calls == [(memory._M_MMAP_MAX, 0), (memory._M_TRIM_THRESHOLD, memory._KEEP)]
    monkeypatch.setattr(memory, "_LIBC", None)
    assert not bench._keep_freed_memory()
