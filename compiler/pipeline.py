"""The optimizer pipeline: graph -> Vectorizer -> optimizer passes -> program.

``neurovec.compile`` (``neurovec/compiling.py``, above compiler and engines) makes a torch module
of the program. The passes run in the order of thesis 5.2.10. Each line names the switch in
:class:`Settings` that enables it and says why it sits where it does. Passes
are functions ``(Program, Settings) -> Program``; with ``settings.verify`` the
program is checked after each one, and a failure names the pass.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Callable, Mapping

from ..progress import Progress
from ..sources.graph import FactLayer, Graph
from ..memory import reusing_freed_memory
from .ir import IRError, Program
from .passes import (broadcast_adds, cleanup, coefficients, compose_gathers, compose_sums, dedup, fold_constants,
                     fuse_fact_products, join_sums, kernels, linear_broadcast, padding, relation_products,
                     reorder_linear, segments, simplify_gathers, sparse_facts, split_products, stack_products,
                     sum_parts, unit_facts, unstack_weights, upward)
from .settings import Settings, unknown_settings
from .vectorizer import vectorize

__all__ = ["build_program", "resolve_settings", "PIPELINE", "enabled_passes", "PROGRESS_DELAY_S"]

logger = logging.getLogger(__name__)

#: A compile running longer than this shows which pass runs (a tqdm bar, or plain lines; neurovec.progress).
PROGRESS_DELAY_S = 3.0

Pass = Callable[[Program, Settings], Program]


def _together(*steps: tuple[Callable[[Settings], bool], Pass]) -> tuple[Callable[[Settings], bool], Pass]:
    """One pipeline entry for passes that finish each other's work: each runs, in order, where its
    own switch is on (the entry runs where any is)."""
    def run(program: Program, settings: Settings) -> Program:
        for enabled, step in steps:
            if enabled(settings):
                program = step(program, settings)
        return program

    return (lambda s: any(enabled(s) for enabled, _ in steps)), run


_SIMPLIFY = _together((lambda s: s.simplify_gathers, simplify_gathers.simplify_gathers),
                      (lambda s: s.remove_identity, cleanup.remove_identity))

PIPELINE: list[tuple[str, Callable[[Settings], bool], Pass]] = [
    # One unit row first, so every later pass sees all unit references as the same value.
    ("merge_unit_facts", lambda s: s.merge_unit_facts, unit_facts.merge_unit_facts),
    # W . 1 = W: drops whole products over unit facts (embeddings).
    ("simplify_unit_linear", lambda s: s.simplify_unit_linear, unit_facts.simplify_unit_linear),
    # Shrink the input facts before anything is computed from them; merge equal values layer by
    # layer, before dedup makes use of the smaller layers; compute each distinct (weight, value)
    # pair once, then each distinct aggregation group (one labelling, four switches).
    ("deduplicate", lambda s: s.dedup_facts or s.iso_compression or s.dedup_linear or s.dedup_aggregations,
     dedup.deduplicate),
    # Optionally move gathers up before the linear symmetries (it disrupts padding).
    ("upward (before linear)", lambda s: s.upward and s.upward_before_linear, upward.propagate_gathers_up),
    # Reorder/pad linear ops so that their sides repeat, then exploit the repetition.
    ("linear_padding", lambda s: s.linear_padding != "off", padding.reorder_and_pad),
    ("linear_broadcasting", lambda s: s.linear_broadcasting, linear_broadcast.broadcast_linear),
    ("upward", lambda s: s.upward and not s.upward_before_linear, upward.propagate_gathers_up),
    # Many weight matrices, one per block of rows (RGCN's relations): chunks of rows, one batched GEMM.
    ("relation_products", lambda s: s.relation_products, relation_products.relation_products),
    # Whatever gathers remain: identity -> nothing, ranges -> slices, repeats -> tile/interleave;
    # then identity ops go and chains of indexing ops merge.
    ("simplify_gathers", *_SIMPLIFY),
    # Reductions last: the gathers before them are final now.
    ("scatter_to_segment", lambda s: s.transposed_reductions, segments.scatter_to_segment),
    # Thesis 5.2.10 steps 19-20 on the final row structure: facts or weights that are only read
    # together pre-concatenated, and what nothing reads dropped (units stay scalar ones: verify).
    ("clean_up", lambda s: s.preconcatenate, cleanup.preconcatenate),
    # Algebra on the final row structure (reductions keep their rows from here on).
    ("reduce_coefficients", lambda s: s.reduce_coefficients, coefficients.reduce_coefficients),
    # Single weights out of their stacks; one GEMM per weight matrix, and sums of whole values
    # as additions: shared products for the reordering below.
    ("unstack_weights", lambda s: s.unstack_weights, unstack_weights.unstack_weights),
    ("split_products", lambda s: s.split_products, split_products.split_products),
    ("sum_parts", lambda s: s.sum_parts, sum_parts.sum_parts),
    # Widening products after the sums (then the sums over facts are constants: fold them),
    # narrowing ones towards the inputs.
    ("pull_linear_up", lambda s: s.reorder_linear, reorder_linear.pull_linear_up),
    ("fold_constants", lambda s: s.fold_constants, fold_constants.fold_constants),
    ("push_linear_down", lambda s: s.reorder_linear, reorder_linear.push_linear_down),
    # The algebra leaves new gathers next to old ones: compose and simplify them again.
    ("simplify_gathers (after algebra)", *_SIMPLIFY),
    ("broadcast_adds", lambda s: s.broadcast_adds, broadcast_adds.broadcast_adds),
    ("choose_kernels", lambda s: True, kernels.choose_kernels),
    # Needs the kernels: a gather of a fused sum's rows becomes part of the sparse matrix.
    ("compose_gathers", lambda s: s.compose_gathers, compose_gathers.compose_gathers),
    # A fused sum plus another term of its rows (SAGE's mean plus the node's own) is one fused sum,
    # which compose_sums may then compose with a readout.
    ("join_sums", lambda s: s.join_sums, join_sums.join_sums),
    # Then a sum of a fused sum's rows is one sparse sum over the product of the matrices; a composed
    # sum is smaller, so a gather after it (the outputs) may now join it too.
    ("compose_sums", lambda s: s.compose_sums,
     _together((lambda s: True, compose_sums.compose_sums),
               (lambda s: s.compose_gathers, compose_gathers.compose_gathers))[1]),
    # The compositions move biases past sums: two one-row additions in a row become one.
    ("merge_row_adds", lambda s: s.broadcast_adds, broadcast_adds.merge_row_adds),
    # Products of one value that a sparse sum reads side by side (SAGE's last layer): one GEMM.
    ("stack_products", lambda s: s.stack_products, stack_products.stack_products),
    # Last: a hint for the code generator on the final products.
    ("fuse_fact_products", lambda s: s.fuse_fact_products, fuse_fact_products.fuse_fact_products),
    # Then the products of sparse static facts (and side-by-side ones) become sparse sums of weight columns.
    ("sparse_facts", lambda s: s.sparse_fact_density > 0, sparse_facts.sparse_facts),
]


def enabled_passes(settings: Settings) -> list[str]:
    return [name for name, enabled, _ in PIPELINE if enabled(settings)]


def build_program(graph: Graph, settings: Settings | str | dict | None = None, timings: dict | None = None,
                  dtype=None) -> Program:
    """Vectorize ``graph`` and run the optimizer passes chosen by ``settings`` (anything
    :func:`compile` accepts), for a module that computes in ``dtype`` (``Settings.for_dtype``).

    ``timings``, if given, receives the seconds spent in each pass.
    """
    settings = resolve_settings(settings).for_dtype(dtype)
    start = time.perf_counter()
    unknown = set(settings.dynamic_facts) - {layer.name for layer in graph.layers if isinstance(layer, FactLayer)}
    if unknown:
        raise ValueError(f"Settings.dynamic_facts names {sorted(unknown)}, which are not fact layers of the graph")
    bar = Progress("neurovec compile", 1 + len(enabled_passes(settings)), "passes", PROGRESS_DELAY_S, leave=False)
    bar.update(0, "vectorize")
    # The passes' edge-sized temporaries reuse each other's pages.
    with reusing_freed_memory():
        program = _run_passes(graph, settings, timings, start, bar)
    bar.close()
    return program


def _run_passes(graph: Graph, settings: Settings, timings: dict | None, start: float, bar) -> Program:
    program = vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts))
    if timings is not None:
        timings["vectorize"] = time.perf_counter() - start
    ran: list[str] = []
    verified = None  # the last program that verified: its unchanged nodes are not checked again
    for name, enabled, run in PIPELINE:
        if not enabled(settings):
            continue
        bar.update(len(ran) + 1, name)
        start = time.perf_counter()
        with _recursion_room(program):
            program = run(program, settings)
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        logger.debug("pass %s: %.3f s, %d nodes", name, time.perf_counter() - start, len(program.nodes))
        ran.append(name)
        if settings.verify:
            try:
                program.verify(unchanged_since=verified)
            except IRError as error:
                raise IRError(f"after pass {name!r} (ran: {', '.join(ran)}): {error}\n{program}") from error
            verified = program
    return program


@contextlib.contextmanager
def _recursion_room(program: Program):
    """Let a pass recurse as deep as the program's layers go: labels (``dedup.RowIds``) and row
    plans (``row_planner.RowPlanner``) follow a node's inputs recursively, a few calls per op, and a
    60-layer chain nests about 2,000 calls (Python stops at 1,000). Restored afterwards."""
    before = sys.getrecursionlimit()
    layers = len({node.layer for node in program.nodes})
    sys.setrecursionlimit(max(before, 1000 + 60 * layers))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def resolve_settings(settings: Settings | str | dict | None) -> Settings:
    """A :class:`Settings` from what ``compile`` accepts: one, a preset name, a dict of
    fields (like ``Settings(**fields)``) or None (the ``default`` preset)."""
    if settings is None or isinstance(settings, Settings):
        return settings or Settings()
    if isinstance(settings, str):
        return Settings.preset(settings)
    if isinstance(settings, Mapping):
        unknown = [key for key in settings if key not in Settings.model_fields]
        if unknown:
            raise ValueError(unknown_settings(unknown))
        return Settings(**settings)
    raise TypeError(f"settings must be a neurovec.Settings, a preset name, a dict of settings or None "
                    f"(got {type(settings).__name__})")
