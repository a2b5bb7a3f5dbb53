"""Thesis 5.2.6 fact deduplication. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["dedup_facts"]


def dedup_facts(program: Program, settings: Settings) -> Program:
    return program
