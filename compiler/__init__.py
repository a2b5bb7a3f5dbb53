"""The compiler: IR, Vectorizer, optimizer passes, pipeline and settings."""
from .ir import Node, Op, Program
from .pipeline import build_program, compile
from .settings import Settings
from .vectorizer import vectorize

__all__ = ["Node", "Op", "Program", "Settings", "build_program", "compile", "vectorize"]
