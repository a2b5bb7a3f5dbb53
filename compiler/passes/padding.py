"""Thesis 5.2.4-5.2.5 reordering and padding of linear ops. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["reorder_and_pad"]


def reorder_and_pad(program: Program, settings: Settings) -> Program:
    return program
