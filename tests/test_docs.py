"""The docs show what the code does: generated programs are current, and the figures' claims hold."""
import importlib.util
import re
from pathlib import Path

import neurovec
from neurovec.compiler import build_program
from neurovec.compiler.ir import Op

ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("mutag_programs", ROOT / "examples" / "mutag_programs.py")
mutag_programs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutag_programs)


def test_optimizer_doc_shows_current_programs(tu_dir):
    doc = (ROOT / "docs" / "optimizer.md").read_text()
    section = re.search(re.escape(mutag_programs.BEGIN) + r"\n(.*)" + re.escape(mutag_programs.END), doc, re.S)
    assert section, "generated section markers missing from docs/optimizer.md"
    expected = mutag_programs.render(mutag_programs.mutag_gcn(tu_dir))
    assert section.group(1) == expected, ("docs/optimizer.md is stale: run python examples/mutag_programs.py "
                                          "--data-dir ../shared/data/tu --write docs/optimizer.md")


def test_mutag_figures(tu_dir):
    graph = mutag_programs.mutag_gcn(tu_dir)

    def weight_gathers(program):
        nodes = program.by_name()
        return [n for n in program.nodes if n.op is Op.GATHER and nodes[n.srcs[0]].op is Op.WEIGHTS]

    unoptimized = build_program(graph, neurovec.Settings.preset("unoptimized"))
    assert len(weight_gathers(unoptimized)) >= 3  # Fig. 6.8: conv1, conv2 and the readout gather weights
    default = build_program(graph, mutag_programs.THESIS)
    assert weight_gathers(default) == []  # Fig. 6.9
    facts = [n for n in default.nodes if n.op is Op.FACT and n.name == "f_x"]
    assert facts and facts[0].count == 7 < 3371 // 100  # a much smaller input fact layer
    aggressive = build_program(graph, neurovec.Settings.preset("upward-17-aggressive", reorder_linear=False,
                                                               fold_constants=False))
    assert [n for n in aggressive.nodes if n.op is Op.GATHER] == []  # Fig. 6.10


SEMANTICS = "## NeuraLogic semantics for PyG users"


def _section_code(text: str, heading: str) -> str | None:
    """The python block of the section ``heading`` of a markdown text (None: no such section)."""
    section = re.search(re.escape(heading) + r"\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if section is None:
        return None
    return re.search(r"```python\n(.*?)```", section.group(1), re.S).group(1)


def test_relational_doc_semantics_section_runs():
    """docs/relational.md's "NeuraLogic semantics for PyG users": an unhidden edge is an input of value 1, so the
    rule computes W . (sum of neighbours + in-degree); a hidden one gives PyG's W . sum of neighbours (the block
    asserts both against numpy)."""
    code = _section_code((ROOT / "docs" / "relational.md").read_text(), SEMANTICS)
    assert code and "R.hidden.edge" in code
    exec(compile(code, "docs/relational.md (NeuraLogic semantics for PyG users)", "exec"), {})


def test_install_lines_and_messages_are_true():
    """neurovec is not on PyPI: no doc or message says `pip install neurovec[...]`; no message cites an issue."""
    import ast
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert not re.search(r"pip install '?neurovec\[", path.read_text()), f"{path.name}: pip install neurovec[...]"
    for path in ROOT.rglob("*.py"):
        if any(part in {".git", "build", "__pycache__"} for part in path.parts):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert not re.search(r"\bissue \d+", node.value), f"{path}: a message cites an issue: {node.value!r}"
