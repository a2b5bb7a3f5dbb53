"""benchmarks/circuits.py runs end to end on a small circuit and writes its tables."""
from __future__ import annotations

import json

import pytest

from neurovec.benchmarks import circuits as bench


def test_benchmark_runs_on_a_shared_circuit(circuits_dir, tmp_path):
    pytest.importorskip("klay")
    bench.main(["--circuits", "sudoku_4", "--engines", "default", "klay", "--batch", "2", "--threads", "1",
                "--rounds", "1", "--warmup", "1", "--data", str(circuits_dir), "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["circuits"]["sudoku_4"]["n_vars"] == 64 and results["circuits"]["sudoku_4"]["klay_nodes"] > 0
    steps = {(c["step"], c["threads"]) for c in results["cells"]}
    assert steps == {("fwd", 1), ("fwd+bwd", 1)}
    assert all(set(c["median_ms"]) == {"default", "klay"} for c in results["cells"])
    (checked,) = results["errors"]  # each engine against KLay in float64
    assert set(checked["relative"]) == {"default", "klay"} and max(checked["relative"].values()) < 1e-3
    table = (tmp_path / "results.md").read_text()
    assert "| sudoku_4 | 2 | 1 | fwd+bwd |" in table and "Compile times" in table


def test_benchmark_skips_cells_over_the_memory_limit(circuits_dir, tmp_path):
    bench.main(["--circuits", "road_r", "--engines", "default", "--batch", "4", "--threads", "1", "--max-gb", "0",
                "--data", str(circuits_dir), "--out", str(tmp_path)])
    cells = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert len(cells) == 2 and all("skipped" in c for c in cells)
    assert "skipped: edge values" in (tmp_path / "results.md").read_text()


def test_must_show_selects_the_target_cells():
    args = bench.parse_args(["--must-show", "--threads", "1"])
    assert args.circuits == ["cnf-30", "cnf-36", "cnf-40", "cnf-44"] and args.batch == [128]
    assert args.engines == ["default", "klay"] and args.threads == [1]
    assert bench.parse_args([]).threads == [1, 2]
