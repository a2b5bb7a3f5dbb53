"""Thesis 5.2.7 upward gather propagation. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["propagate_gathers_up"]


def propagate_gathers_up(program: Program, settings: Settings) -> Program:
    return program
