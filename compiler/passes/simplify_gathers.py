"""Thesis 5.2.1 gather simplification. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["simplify_gathers"]


def simplify_gathers(program: Program, settings: Settings) -> Program:
    return program
