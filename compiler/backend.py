"""What the compiler asks of the engine that will run its programs, without importing it.

The compiler makes programs; ``engines/`` runs them; ``neurovec/compiling.py`` sits above both and
registers the torch engine's answers here when it is imported (``neurovec`` imports it). Two passes
need them:

* ``fold_constants`` computes constant values by running the program itself (``evaluate``), so
  that they are exactly what the module would compute, and the folded sums of gathered facts from
  the engine's fold kernel where it has one (``sequential_sums``, optional);
* ``grouping`` adds up the multiset hashes of dedup's labelling with the engine's kernel where it
  has one (``gathered_wrapping_sums``, optional);
* ``choose_kernels`` shapes reductions for the engine's kernels: whether a sum after a gather is
  one fused sparse sum (``fuses_gather``), and whether a large gather with a backward is better run
  as a sparse sum of one row per segment (``gathers_as_sum``). Which kernel then runs a reduction
  of ``kernel="auto"`` is the engine's choice when it builds the module (NOTE: [kernels chosen by
  the engine] in ``engines/torch_module.py``); the program does not depend on the machine that
  compiled it.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .ir import Program

__all__ = ["Backend", "register", "current", "optional"]


class Backend(Protocol):
    def evaluate(self, program: Program) -> np.ndarray:
        """The float64 value of ``program``'s output, as the engine computes it."""

    def fuses_gather(self, n_edges: int, counts: np.ndarray, feature_size: int, reduce: str) -> bool:
        """Whether a ``reduce`` ("sum"; a mean counts as a sum) of ``n_edges`` gathered rows of
        ``feature_size`` values into segments of ``counts`` rows runs best as one fused sparse sum."""

    def gathers_as_sum(self, count: int, feature_size: int, needs_grad: bool) -> bool:
        """Whether a gather of ``count`` rows (of a value that needs a gradient, or not) runs best as
        a sparse sum of one row per segment."""

    def sequential_sums(self, facts: np.ndarray, index: np.ndarray, coef: np.ndarray | None,
                        counts: np.ndarray) -> np.ndarray | None:
        """Optional: ``fold_constants.sequential_sums(facts, index, coef, counts)``'s values bit for bit
        (float64, one row per segment), or None where the engine cannot compute them now; the pass asks
        for it with ``getattr`` and computes them itself without it."""

    def gathered_wrapping_sums(self, words: np.ndarray, index: np.ndarray, counts: np.ndarray
                               ) -> np.ndarray | None:
        """Optional: per segment (``counts[j]`` consecutive entries), the sum modulo 2**64 of
        ``words[index[e]]`` (uint64), or None where the engine cannot compute them now
        (``grouping._multiset_hashes`` asks with ``optional`` and adds them up itself without it)."""


_registered: list[Backend] = []


def register(backend: Backend) -> None:
    """Make ``backend`` the one the passes ask (``neurovec/compiling.py`` registers the torch engine)."""
    _registered[:] = [backend]


def current() -> Backend:
    if not _registered:
        raise RuntimeError("no engine is registered for the compiler's passes: import neurovec (its "
                           "neurovec.compiling module registers the torch engine), or call "
                           "neurovec.compiler.backend.register(...)")
    return _registered[0]


def optional(name: str):
    """The registered engine's method ``name``, or None where no engine is registered or it has none."""
    return getattr(_registered[0], name, None) if _registered else None
