"""Thesis per-layer kernel choice. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["choose_kernels"]


def choose_kernels(program: Program, settings: Settings) -> Program:
    return program
