"""Moved to :mod:`neurovec.memory`: grounding (``sources/``) reuses freed memory too, and should not import the
compiler for it. This name stays for code that imports ``reusing_freed_memory`` from here."""
from __future__ import annotations

from ..memory import reusing_freed_memory

__all__ = ["reusing_freed_memory"]
