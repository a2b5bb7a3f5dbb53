"""Thesis 5.2.6 deduplication and downward gather propagation. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["dedup_linear", "dedup_aggregations"]


def dedup_linear(program: Program, settings: Settings) -> Program:
    return program


def dedup_aggregations(program: Program, settings: Settings) -> Program:
    return program
