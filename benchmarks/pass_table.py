"""What each pass buys: leave-one-out on the benchmark programs.

    python benchmarks/pass_table.py                          # print the table
    python benchmarks/pass_table.py --write docs/optimizer.md

For every pipeline entry that ``default`` runs, each benchmark program (``program_digests.PROGRAMS``:
MUTAG, ENZYMES, PROTEINS x GCN, SAGE, GIN x labels, continuous; Mutagenesis simple and dims) is
compiled with that one entry left out, and compared with ``default``:

* **changed**: the programs whose generated code or constants differ without the entry;
* **work**: the summed work estimate of a training step over all programs without the entry, in
  percent of ``default``'s (``step_work``: values every node reads or writes, a matrix product's
  multiply-adds; forward and backward alike), and the largest ratio of one program's work without
  the entry to its work under ``default``;
* **nodes**: the summed node count, likewise.

The estimate is deterministic (no timing, so the table is the same on any machine); it counts
what the passes remove, not the kernels' speed. An entry that changes no program says why it stays
(``WHY_IT_STAYS``, also read by ``tests/test_pass_table.py``).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: import this checkout as the package neurovec
    sys.path.insert(0, str(_ROOT.parent))

import neurovec  # noqa: E402,F401  (registers the engine the passes ask)
from neurovec.benchmarks.program_digests import PROGRAMS, code_digest, suite_graphs  # noqa: E402
from neurovec.compiler.ir import Op, Program  # noqa: E402
from neurovec.compiler.pipeline import PIPELINE, resolve_settings  # noqa: E402
from neurovec.compiler.vectorizer import vectorize  # noqa: E402

__all__ = ["step_work", "leave_one_out", "WHY_IT_STAYS", "table", "BEGIN", "END"]

BEGIN, END = "<!-- BEGIN PASS TABLE -->", "<!-- END PASS TABLE -->"

#: Entries of ``default`` that change none of the benchmark programs, and why they stay (a name
#: that is no pipeline entry is not used).
WHY_IT_STAYS = {
    "merge_unit_facts": "Mutagenesis's two unit-fact layers (the only ones here) give the same program "
                        "without it, as simplify_unit_linear drops the products over either; without "
                        "simplify_unit_linear it changes both programs",
    "clean_up": "no CONCAT of facts or of weights that only it reads is left here (preconcatenate); "
                "every pass here drops what it leaves unread, and no input fact is left unread",
    "scatter_to_segment": "choose_kernels leaves the kernel to the engine (\"auto\") anyway, and no "
                          "equal-count reduction here reads a gather that the transposed (k, n) order "
                          "removes",
    "simplify_gathers (after algebra)": "the algebra passes plan their own gathers (emit_plan) and leave no "
                                        "identity op here; random graphs (tests/passes/test_cleanup.py) have them",
    "relation_products": "no product here uses one of many weight matrices; RGCN's per-relation products "
                         "do (docs/knowledge_graphs.md)",
    "sparse_facts": "no product of static facts here is both sparse and large enough "
                    "(sparse_fact_density, MIN_WORK multiply-adds) to run faster as a sparse sum of weight columns",
}


def _size(shape: tuple) -> int:
    return math.prod(shape) if shape else 1


def step_work(program: Program) -> int:
    """Values a training step reads or writes: every node's rows x values per row, a REDUCE's input
    rows (its gathered rows where it has an index), a matrix product's rows x weight size."""
    nodes = program.by_name()
    work = 0
    for node in program.nodes:
        if node.op in (Op.FACT, Op.WEIGHTS):
            continue
        width = _size(node.shape)
        if node.op is Op.REDUCE:
            rows = program.constants[node.attrs["index"]].size if "index" in node.attrs else nodes[node.srcs[0]].count
            work += rows * width
        elif node.op is Op.LINEAR and node.attrs.get("kind") == "matmul":
            w, x = (nodes[s] for s in node.srcs)
            work += node.count * _size(w.shape) if len(w.shape) == 2 else node.count * width
        else:
            work += node.count * width
    return work


def _compile(graph, settings, skip: str | None) -> Program:
    program = vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts))
    for name, enabled, run in PIPELINE:
        if enabled(settings) and name != skip:
            program = run(program, settings)
    return program


def leave_one_out(data_dir: Path, preset: str = "default", programs=PROGRAMS) -> tuple[list[str], dict]:
    """``(entries, {entry: [(changed, work, nodes, default work, default nodes) per program]})``:
    the pipeline entries ``preset`` runs, each left out in turn."""
    settings = resolve_settings(preset)
    entries = [name for name, enabled, _ in PIPELINE if enabled(settings)]
    rows: dict[str, list] = {name: [] for name in entries}
    for key, graph in suite_graphs(data_dir, programs):
        base = _compile(graph, settings, None)
        base_code, base_work = code_digest(base), step_work(base)
        for name in entries:
            without = _compile(graph, settings, name)
            rows[name].append((code_digest(without) != base_code, step_work(without), len(without.nodes),
                               base_work, len(base.nodes)))
        print(f"  {key}", file=sys.stderr, flush=True)
    return entries, rows


def table(entries: list[str], rows: dict) -> str:
    """The markdown table: one row per entry, a reason from ``WHY_IT_STAYS`` where it changes nothing."""
    first = rows[entries[0]]
    lines = [f"`default` over the {len(first)} programs: {sum(r[4] for r in first)} nodes, step work "
             f"{sum(r[3] for r in first):,} values (the 100% below).",
             "",
             "| pass left out | programs changed | step work without it | worst program | nodes without it | why it stays |",
             "|---|---:|---:|---:|---:|---|"]
    for name in entries:
        results = rows[name]
        changed = sum(r[0] for r in results)
        work = 100 * sum(r[1] for r in results) / sum(r[3] for r in results)
        worst = max(r[1] / r[3] for r in results)
        nodes = 100 * sum(r[2] for r in results) / sum(r[4] for r in results)
        why = WHY_IT_STAYS.get(name, "") if changed == 0 else ""
        lines.append(f"| `{name}` | {changed} of {len(results)} | {work:.1f}% | {worst:.2f}x | {nodes:.1f}% | {why} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=_ROOT.parent / "shared" / "data")
    parser.add_argument("--write", type=Path, default=None, help="replace the table in this markdown file")
    args = parser.parse_args()
    text = table(*leave_one_out(args.data_dir))
    if args.write is None:
        print(text)
        return
    doc = args.write.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{args.write} has no {BEGIN} ... {END} section")
    args.write.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}{END}", doc))


if __name__ == "__main__":
    main()
