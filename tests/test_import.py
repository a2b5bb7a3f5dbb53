"""The package imports a second time under another name.

The checkout's root is the package, so pytest (and any tool that imports by path)
loads its ``__init__.py`` again under the checkout directory's name: CI clones into
``.../main`` and pytest imports ``main`` beside ``neurovec``.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import neurovec


def test_second_import_under_the_checkout_directory_name():
    code = textwrap.dedent("""
        import importlib.util, pathlib, sys
        import neurovec
        root = pathlib.Path(neurovec.__file__).parent
        spec = importlib.util.spec_from_file_location("main", root / "__init__.py",
                                                      submodule_search_locations=[str(root)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["main"] = module
        spec.loader.exec_module(module)
        assert module is not neurovec and module.compile is not neurovec.compile
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(neurovec.__file__).parent.parent)
    assert result.returncode == 0, result.stderr[-2000:]
