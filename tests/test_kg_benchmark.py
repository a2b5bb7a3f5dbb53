"""benchmarks/kg.py (issue 27): the headline arithmetic, and one real contender run end to end."""
from __future__ import annotations

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
