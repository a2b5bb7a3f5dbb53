"""Compiler settings: one pydantic model with every knob."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Settings"]


class Settings(BaseModel):
    """How to compile a graph. Every field is documented; unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dynamic_facts: tuple[str, ...] = Field(
        (), description="Fact layers whose values may be replaced at call time "
                        "(`module(facts={name: tensor})`); passes never optimize using their values.")
    verify: bool = Field(True, description="Check the program's shapes and indices after every pass.")
