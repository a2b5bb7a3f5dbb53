"""Thesis 5.2.6 isomorphic compression. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["iso_compress"]


def iso_compress(program: Program, settings: Settings) -> Program:
    return program
