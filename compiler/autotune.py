"""``neurovec.autotune`` lives in ``neurovec/tuning.py``, above the compiler and the engine; this
name stays for code that imports it from here (``neurovec/__init__.py`` until it imports
``neurovec.tuning``)."""
from ..tuning import *  # noqa: F401,F403  (the layer above: allowed in tests/test_layers.py)
from ..tuning import __all__  # noqa: F401
