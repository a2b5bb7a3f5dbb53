"""Imports go one way: the compiler makes programs and imports no engine; passes import no
pass; no import circle among the compiler, the engines and the modules above them.

Every import statement counts, also one inside a function (an import deferred to call time is an
import all the same). ``neurovec.compiling`` and ``neurovec.tuning`` sit above compiler and engines.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "neurovec"

#: What the compiler may import from outside ``neurovec.compiler``: the graph it compiles, and the
#: compile's memory and progress helpers.
COMPILER_MAY_IMPORT = ("neurovec.compiler", "neurovec.sources", "neurovec.memory", "neurovec.progress")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE,) + parts)


def imports(path: Path) -> set[str]:
    """The neurovec modules ``path`` imports (``from x import y`` counts as x.y where that is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def modules(*folders: str) -> dict[str, Path]:
    files = [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]
    return {module_name(p): p for p in files}


ALL = {**modules("compiler", "engines"), **{module_name(p): p for p in sorted(ROOT.glob("*.py"))}}


def graph() -> dict[str, set[str]]:
    """Import edges between the modules of ALL (names that are not modules are dropped, and so is a
    module's import of its own package: Python imports a package before its modules anyway)."""
    return {name: {m for m in imports(path) if m in ALL and m != name
                   and not name.startswith(m + ".")}
            for name, path in ALL.items()}


def test_the_compiler_imports_no_engine_and_nothing_above_it():
    wrong = {(name, m) for name, path in modules("compiler").items() for m in imports(path)
             if not m.startswith(COMPILER_MAY_IMPORT) and m != PACKAGE}
    assert not wrong, f"the compiler imports from outside its layer: {sorted(wrong)}"


def test_no_pass_imports_another_pass():
    prefix = "neurovec.compiler.passes."
    found = {(name[len(prefix):], m[len(prefix):].split(".")[0]) for name, path in modules("compiler/passes").items()
             if name.startswith(prefix) for m in imports(path) if m.startswith(prefix)}
    found = {(a, b) for a, b in found if a != b}
    assert not found, f"a pass imports another pass: {sorted(found)}"




def circles(edges: dict[str, set[str]]) -> set[frozenset]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), set()
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    found = circles(graph())
    assert not found, f"import circles: {[sorted(c) for c in found]}"


@pytest.mark.parametrize("source, expected", [
    ("from ...engines.torch_module import CompiledModule\n", "neurovec.engines.torch_module"),
    ("def f():\n    from ...engines import native\n", "neurovec.engines.native"),
    ("from ... import engines\n", "neurovec.engines"),
    ("import neurovec.engines.runtime\n", "neurovec.engines.runtime"),
    ("from ...compiling import compile\n", "neurovec.compiling"),
])
def test_the_check_sees_an_upward_import(tmp_path, monkeypatch, source, expected):
    # A test that cannot fail is a defect: an engine import in a pass, even inside a function, is seen.
    fake = ROOT / "compiler" / "passes" / "fold_constants.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == fake else Path.read_bytes(self).decode())
    assert expected in imports(fake)
    with pytest.raises(AssertionError, match="outside its layer"):
        test_the_compiler_imports_no_engine_and_nothing_above_it()


def test_circles_are_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == {frozenset({"a", "b", "c"})}


@pytest.mark.parametrize("source", ["def f():\n    from .simplify_gathers import simplify_gathers\n",
                                    "from . import simplify_gathers\n",
                                    "from ..passes.simplify_gathers import simplify_gathers\n",
                                    "import neurovec.compiler.passes.simplify_gathers\n"])
def test_the_check_sees_a_pass_importing_a_pass(monkeypatch, source):
    fake = ROOT / "compiler" / "passes" / "cleanup.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == fake else Path.read_bytes(self).decode())
    with pytest.raises(AssertionError, match=r"a pass imports another pass: \[\('cleanup', 'simplify_gathers'\)\]"):
        test_no_pass_imports_another_pass()


def test_the_check_sees_a_circle_in_the_engines(monkeypatch):
    # The kernels <-> ops circle is gone (ops imports only native); bringing it back fails the check.
    fake = ROOT / "engines" / "ops.py"
    source = Path.read_bytes(fake).decode() + "\ndef f():\n    from . import kernels\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == fake else Path.read_bytes(self).decode())
    with pytest.raises(AssertionError, match=r"import circles: \[\['neurovec.engines.kernels', 'neurovec.engines.ops'\]\]"):
        test_no_import_circle()
