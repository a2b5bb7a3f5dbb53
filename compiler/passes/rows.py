"""Transitional: the row vocabulary moved to ``compiler/indexing.py`` (and ``freeze_facts`` to
``compiler/rewrite.py``). These names stay importable from here only for passes/fold_constants.py
and passes/relation_products.py until they import them from there (tests/test_layers.py lists
this allowance); then this module goes.
"""
from ..indexing import is_constant, layout_rows, trace_rows  # noqa: F401
from ..rewrite import freeze_facts  # noqa: F401
