"""Thesis 5.2.2 and 5.2.9 segment and dense reductions. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["scatter_to_segment"]


def scatter_to_segment(program: Program, settings: Settings) -> Program:
    return program
