"""benchmarks/kernels_overhead.py runs and reports every phase of the step (no timing asserted)."""
from __future__ import annotations

from neurovec.benchmarks import kernels_overhead


def test_phases_of_a_step(tu_dir, capsys):
    rows = kernels_overhead.measure("MUTAG", ["gcn/labels", "gin/continuous"], reps=3, warmup=1,
                                    data_dir=str(tu_dir))
    assert set(rows) == {"gcn/labels", "gin/continuous"}
    for row in rows.values():
        assert row["statements"] > 0 and row["reductions"] >= 1
        assert all(row[phase] > 0 for phase in kernels_overhead.PHASES)
    kernels_overhead.main(["--data-dir", str(tu_dir), "--tasks", "gcn/labels", "--reps", "2"])
    out = capsys.readouterr().out
    assert "| MUTAG/gcn/labels |" in out and "no-grad forward" in out
