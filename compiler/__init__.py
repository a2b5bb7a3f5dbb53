"""The compiler: IR, Vectorizer, optimizer passes, pipeline and settings."""
from .ir import Node, Op, Program
from .pipeline import PIPELINE, build_program, enabled_passes
from .settings import PRESETS, Settings, iter_presets, list_presets
from .vectorizer import vectorize

__all__ = ["Node", "Op", "PIPELINE", "PRESETS", "Program", "Settings", "build_program",
           "enabled_passes", "iter_presets", "list_presets", "vectorize"]
