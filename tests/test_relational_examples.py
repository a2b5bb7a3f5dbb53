"""The relational examples and docs/relational.md's first program run as a reader runs them."""
from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[1]


def test_fig41_example_prints_its_template_layers_and_outputs(capsys):
    runpy.run_path(str(ROOT / "examples" / "fig41.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "h(X) :- $W_a" in printed and "q/0 [transformation=sigmoid]" in printed
    assert "def forward" in printed
    outputs = re.search(r"q\(molecule 0\), q\(molecule 1\): \[(.*)\]", printed).group(1).split(", ")
    assert len(outputs) == 2 and all(0 < float(q) < 1 for q in outputs)


def test_relational_mutagenesis_example_grounds_in_sqlite_and_trains(mutagenesis_dir, monkeypatch, capsys):
    pytest.importorskip("sqlalchemy")
    monkeypatch.setattr(sys, "argv", ["relational_mutagenesis.py", "--data", str(mutagenesis_dir), "--epochs", "2"])
    runpy.run_path(str(ROOT / "examples" / "relational_mutagenesis.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert re.search(r"grounded in SQLite in .* s: Graph\(.*188 outputs\)", printed), printed
    assert "epoch   1: loss" in printed and "first outputs:" in printed


def test_docs_first_program_runs_and_is_fig41():
    """docs/relational.md opens with Fig. 4.1: the same graph as examples/fig41.py up to its weights' values."""
    doc = (ROOT / "docs" / "relational.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/relational.md", "exec"), namespace)
    example = runpy.run_path(str(ROOT / "examples" / "fig41.py"))
    graph, other = namespace["graph"], example["fig41_graph"]()
    assert [(layer.name, layer.size) for layer in graph.layers] == [(layer.name, layer.size) for layer in other.layers]
    out = namespace["module"]()
    assert out.shape == (2, 1) and torch.all((out > 0) & (out < 1))
    assert isinstance(namespace["module"], torch.nn.Module)
