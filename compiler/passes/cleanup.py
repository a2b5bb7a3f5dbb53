"""Thesis clean-up passes. (Placeholder: returns the program unchanged until implemented.)"""
from __future__ import annotations

from ..ir import Program
from ..settings import Settings

__all__ = ["remove_identity", "preconcatenate", "remove_unused"]


def remove_identity(program: Program, settings: Settings) -> Program:
    return program


def preconcatenate(program: Program, settings: Settings) -> Program:
    return program


def remove_unused(program: Program, settings: Settings) -> Program:
    return program
