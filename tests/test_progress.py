"""Progress output: plain lines off a terminal, tqdm on one, nothing when switched off; pass times to logging."""
from __future__ import annotations

import io
import logging

import numpy as np
import pytest

import neurovec
from neurovec.compiler import pipeline
from neurovec.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _graph():
    b = neurovec.GraphBuilder()
    w = b.weight("W", np.ones((2, 2)))
    x = b.facts("x", np.arange(6.0).reshape(3, 2))
    h = b.layer("h", aggregation="sum", transformation="tanh")
    b.output(h.neuron([(x[0], w), (x[1], w)]), h.neuron([(x[2], w)]))
    return b.build()


@pytest.fixture(autouse=True)
def default_switch():
    neurovec.set_progress(None)
    yield
    neurovec.set_progress(None)


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    bar = Progress("work", 4, "steps", delay_s=0.0, enabled=True, stream=out, line_interval_s=0.0)
    for k in range(4):
        bar.update(k, f"step {k}")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("work: 0/4 steps") and lines[0].endswith(": step 0")
    assert lines[-1].startswith("work: 4/4 steps") and lines[-1].endswith(": done")
    assert "\r" not in out.getvalue()


def test_nothing_before_the_delay_or_when_off(monkeypatch):
    out = io.StringIO()
    with Progress("work", 2, delay_s=60.0, enabled=True, stream=out) as bar:
        bar.update(1, "quick")
    assert out.getvalue() == ""
    neurovec.set_progress(False)
    with Progress("work", 2, delay_s=0.0, stream=out, line_interval_s=0.0) as bar:
        bar.update(1, "off")
    assert out.getvalue() == ""
    neurovec.set_progress(None)
    monkeypatch.setenv("NEUROVEC_PROGRESS", "0")
    with Progress("work", 2, delay_s=0.0, stream=out, line_interval_s=0.0) as bar:
        bar.update(1, "off by environment")
    assert out.getvalue() == ""


def test_tqdm_on_a_terminal():
    out = Terminal()
    with Progress("work", 3, "passes", delay_s=0.0, enabled=True, stream=out) as bar:
        bar.update(2, "iso_compression")
    assert "work" in out.getvalue() and "iso_compression" in out.getvalue() and "\r" in out.getvalue()


def test_slow_compiles_say_which_pass_runs(monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "PROGRESS_DELAY_S", 0.0)
    neurovec.set_progress(True)
    neurovec.compile(_graph())
    err = capsys.readouterr().err
    assert "neurovec compile" in err and "vectorize" in err
    neurovec.set_progress(False)
    neurovec.compile(_graph())
    assert capsys.readouterr().err == ""


def test_autotune_progress(capsys):
    neurovec.autotune(_graph(), presets=["default", "unoptimized"], kernels=[None], budget_s=30, repeat=1,
                      warmup=0, progress=True)
    err = capsys.readouterr().err
    assert "neurovec autotune" in err and "default" in err
    neurovec.autotune(_graph(), presets=["default"], kernels=[None], budget_s=30, repeat=1, warmup=0, progress=False)
    assert "neurovec autotune" not in capsys.readouterr().err


def test_pass_times_go_to_logging(caplog):
    with caplog.at_level(logging.DEBUG, logger="neurovec"):
        neurovec.compile(_graph())
    assert any(r.name == "neurovec.compiler.pipeline" and "pass " in r.getMessage() for r in caplog.records)
