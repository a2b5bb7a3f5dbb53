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


def test_submodules_of_neurovec_relational_import_by_that_name():
    """README.md names ``neurovec.relational.models``: ``import neurovec.relational.models`` (in a fresh process,
    where nothing imported it yet) gives the one module ``neurovec.sources.relational.models``, its spec its own;
    it failed with "No module named 'neurovec.graph'" while Python loaded the file a second time."""
    code = textwrap.dedent("""
        import importlib, sys
        import neurovec.relational.models as models
        import neurovec.relational.joins
        from neurovec.relational.models import gcn
        assert models is sys.modules["neurovec.sources.relational.models"], models
        assert models.__name__ == models.__spec__.name == "neurovec.sources.relational.models"
        assert neurovec.relational.joins is sys.modules["neurovec.sources.relational.joins"]
        importlib.reload(models)
        try:
            import neurovec.relational.no_such_module
        except ModuleNotFoundError as error:
            assert "no_such_module" in str(error), error
        else:
            raise AssertionError("imported a module that does not exist")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(neurovec.__file__).parent.parent)
    assert result.returncode == 0, result.stderr[-2000:]


def _module_imports(folder: Path) -> dict:
    """Each module of ``folder`` -> the sibling modules it imports (relative imports anywhere in it, lazy ones too)."""
    import ast
    graph = {}
    for path in sorted(folder.glob("*.py")):
        siblings = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    siblings.add(node.module.split(".")[0])
                else:
                    siblings.update(alias.name for alias in node.names)
        graph[path.stem] = siblings & {p.stem for p in folder.glob("*.py")}
    return graph


def _cycle(graph: dict) -> list:
    """One import circle of ``graph`` (a list of modules, the first repeated at the end), or []."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path + [target])
                if found:
                    return found
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return []


def test_no_import_circles_in_the_sources():
    """sources/relational imported one way (template <- data, plan, encoding, joins <- grounder <- assembly, sql <-
    grounding): its seven files were in circles, through lazy imports inside functions too, which this counts."""
    root = Path(neurovec.__file__).parent / "sources"
    for folder in (root, root / "relational"):
        graph = _module_imports(folder)
        assert _cycle(graph) == [], f"an import circle in {folder}: {' -> '.join(_cycle(graph))}"
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]   # the check finds one
