"""benchmarks/node_scale.py on a tiny R-MAT graph: one process per cell, every phase recorded, tables written.

No assertion here is about speed: only that the script runs what it says and records it.
"""
from __future__ import annotations

import importlib.util
import json

import pytest

from neurovec.benchmarks import node_scale

PYG = ["pyg-tuned"] if importlib.util.find_spec("torch_geometric") else []


@pytest.mark.parametrize("pyg", [[], pytest.param(PYG, marks=pytest.mark.slow, id="pyg")], ids=["neurovec", "pyg"])
def test_node_scale_records_every_phase_of_a_tiny_run(tmp_path, pyg):
    assert node_scale.main(["--dataset", "arxiv-like", "--fraction", "0.002", "--model", "gcn", "--hidden", "8",
                            "--steps", "2", "--out", str(tmp_path), "--label", "test", "--pyg", *pyg]) == 0
    cells = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [cell["engine"] for cell in cells] == ["neurovec default", *pyg]
    neurovec = cells[0]
    assert neurovec["outcome"] == "ok" and neurovec["returncode"] == 0
    phases = [row["phase"] for row in neurovec["phases"]]
    assert phases[:4] == ["generate", "build", "validate", "vectorize"]
    assert "fold_constants" in phases and phases[-3:] == ["module", "step 1", "step 2"]
    assert all(row["peak_rss"] > 0 and row["seconds"] >= 0 for row in neurovec["phases"])
    assert neurovec["info"]["edges"] == round(1_166_243 * 0.002) and neurovec["info"]["neuron_edges"] > 0
    assert neurovec["summary"]["compile_s"] > 0 and neurovec["summary"]["step_s"] is not None
    for cell in cells[1:]:
        assert cell["outcome"] == "ok" and [row["phase"] for row in cell["phases"]] == [
            "generate", "pyg-tuned build", "pyg-tuned step 1", "pyg-tuned step 2"]
    readme = (tmp_path / "README.md").read_text()
    assert "# Node-level scale (test)" in readme and "| arxiv-like x 0.002 | neurovec default | GCN | ok |" in readme


def test_a_cell_out_of_memory_is_reported_with_its_phase_and_no_compile_rate():
    row = dict(group="compile", seconds=2.0, cpu_seconds=1.0, verify_seconds=0.0, peak_rss=int(15e9))
    cell = {"dataset": "products-like x 0.5", "engine": "neurovec default", "model": "gcn", "threads": 1,
            "outcome": "out of memory in fold_constants, 16 GB cap", "error": "out of memory: RuntimeError: ...",
            "info": {"edges": 1000}, "phases": [{**row, "phase": "vectorize"},
                                                {**row, "phase": "fold_constants", "error": "out of memory: ..."}]}
    summary = node_scale.summary(cell)
    assert summary["compile_s"] == 0 and "compile_edges_per_s" not in summary and summary["peak_rss"] == int(15e9)
    text = node_scale.markdown([cell], "test")
    assert "| out of memory in fold_constants, 16 GB cap | - | - | - |" in text
    assert "| fold_constants (out of memory) |" in text
    assert node_scale.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
