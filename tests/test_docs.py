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
