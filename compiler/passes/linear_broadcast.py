"""Thesis 5.2.3 linear broadcasting. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["broadcast_linear"]


def broadcast_linear(program: Program, settings: Settings) -> Program:
    return program
