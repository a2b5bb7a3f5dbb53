"""Compile work against depth: deep chains with skip connections (issue 23 item 2).

No wall-clock asserts (issue 28): the work is measured as the number of Python function calls a
compile makes (``python_calls``, deterministic for a given program), and a compile that goes over
its budget is stopped there, so that an exponential compile fails at once instead of hanging.
"""
import inspect
import sys

import pytest
import torch

import neurovec
from neurovec.compiler import Settings, build_program

from .equivalence import assert_equivalent
from .strategies import deep_chain


class OverBudget(Exception):
    pass


_GENERATORS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def python_calls(run, budget: int | None = None) -> int:
    """How many Python functions ``run()`` calls; raises :class:`OverBudget` past ``budget``."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1
            # Not into a generator: one being closed would only print the exception and run on.
            if budget is not None and count > budget and not frame.f_code.co_flags & _GENERATORS:
                raise OverBudget(f"over {budget} calls")

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


def compile_calls(depth: int, preset: str, budget: int | None = None) -> int:
    graph = deep_chain(depth)
    return python_calls(lambda: build_program(graph, Settings.preset(preset, verify=False)), budget)


def test_default_compile_work_grows_linearly_with_depth():
    # The label hand-over of 20a7f92 re-walked every path below a node: a 10-layer chain went over
    # 3M calls (16 layers 0.16 s, 28 layers 16 s, 40 layers never); now 40 layers make about 4x the
    # calls of 10 (167k against 41k).
    small = compile_calls(10, "default", budget=200_000)  # about 41k (the old labelling: over 3M)
    assert compile_calls(40, "default", budget=5 * small) <= 5 * small


# Presets whose growth allows a copy of a 4-row layer: before NOTE: [copies once] in
# compiler/row_planner.py they copied a layer once per path through the chain above it (depth 8
# 0.54 s, depth 12 over 60 s); now at most once per distinct row selection.
COPYING = ["upward-07-rel-2", "upward-08-rel-4", "upward-11-abs-100k"]


@pytest.mark.parametrize("preset", COPYING)
def test_copying_presets_compile_work_grows_linearly_with_depth(preset):
    # About 105k calls at depth 14 (default: about 40k); the copy per path made millions.
    budget = 4 * compile_calls(14, "default")
    assert compile_calls(14, preset, budget=budget) <= budget


@pytest.mark.parametrize("preset", COPYING)
@pytest.mark.parametrize("skip, width, weighted", [(2, 4, None), (3, 4, 5), (3, 3, 1)])
def test_copying_presets_compile_deep_chains_exactly(preset, skip, width, weighted):
    # The copies read again (NOTE: [copies once]) hold the rows their new readers ask for: the
    # first two chains read copies again (8 and 3 times), the third makes none to read.
    graph = deep_chain(10, width=width, skip=skip, weighted_layers=weighted, aggregation="max",
                       transformation="sigmoid")
    assert_equivalent(graph, neurovec.compile(graph, preset, torch.float64))


# Presets that let upward propagation grow nodes plan every gather's way up through every layer
# above it: O(depth^2) planning on a chain (the plans within one gather's way are made once each,
# NOTE: [plans once] in compiler/row_planner.py). The others are linear.
QUADRATIC = {name for name, settings in neurovec.iter_presets()
             if settings.upward and (settings.upward_growth_rel != 0 or settings.upward_growth_abs != 0)}


@pytest.mark.slow
@pytest.mark.parametrize("preset", neurovec.list_presets())
def test_sixty_layer_chain_compiles_within_budget_under_every_preset(preset):
    small = compile_calls(15, preset)
    growth = 16 if preset in QUADRATIC else 4  # depth 60 against 15
    budget = int(1.5 * growth * small)
    calls = compile_calls(60, preset, budget=budget)
    assert calls <= budget
    graph = deep_chain(60)
    module = neurovec.compile(graph, preset)
    assert module().shape == (4, 3)
