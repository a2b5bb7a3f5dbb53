"""Thesis 5.2.8 unit facts. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["merge_unit_facts", "simplify_unit_linear", "materialize_units"]


def merge_unit_facts(program: Program, settings: Settings) -> Program:
    return program


def simplify_unit_linear(program: Program, settings: Settings) -> Program:
    return program


def materialize_units(program: Program, settings: Settings) -> Program:
    return program
