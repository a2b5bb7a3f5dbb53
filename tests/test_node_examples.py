"""examples/train_planetoid.py and examples/link_prediction.py run (a few epochs) and say what they promise."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch_geometric")

EXAMPLES = Path(__file__).parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_planetoid_agrees_with_its_twin(planetoid_dir, capsys):
    _load("train_planetoid").main(["--seeds", "1", "--epochs", "3", "--data-dir", str(planetoid_dir)])
    out = capsys.readouterr().out
    assert "seeds with the same test accuracy: 1/1" in out and "| neurovec |" in out and "| PyG twin |" in out


def test_link_prediction_reports_an_auc(planetoid_dir, capsys):
    _load("link_prediction").main(["--epochs", "3", "--data-dir", str(planetoid_dir)])
    assert "ROC AUC" in capsys.readouterr().out
