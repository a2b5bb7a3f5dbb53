"""Print the compiled forward programs of a 2-layer GCN on MUTAG (thesis 6.2.3, Figs. 6.8-6.10).

    python examples/mutag_programs.py [--data-dir ../shared/data/tu] [--write docs/optimizer.md]

`unoptimized` gathers every weight per edge (Fig. 6.8); `default` with the thesis'
passes only has no weight gathers, runs the linear ops on the few distinct rows
before gathering, and its input fact layer is tiny (Fig. 6.9); `default` adds the
algebra passes; `upward-17-aggressive` has no gathers at all (Fig. 6.10). With --write, the programs replace the generated section of
the given markdown file.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import neurovec
from neurovec import datasets

# The thesis' passes only: `default` without the algebra passes of issue 10.
THESIS = neurovec.Settings(reduce_coefficients=False, reorder_linear=False, fold_constants=False)
PRESETS = {
    "unoptimized": ("unoptimized", "Thesis Fig. 6.8: every weight is gathered once per row."),
    "default, thesis passes only": (THESIS, (
        "Thesis Fig. 6.9: one GEMM per layer on the distinct rows, then the gathers (here fused with the "
        "sums into sparse matrix products); 7 input rows.")),
    "default": ("default", (
        "The algebra passes on top: the first layer's weight moves after its sum, which, over constant "
        "facts, is computed at compile time; the output weight moves down through the pooling, the bias "
        "and the second sum, so that sum aggregates 1-wide rows.")),
    "upward-17-aggressive": ("upward-17-aggressive",
                             "Thesis Fig. 6.10: no gathers left; the input is duplicated instead."),
}
BEGIN, END = "<!-- BEGIN GENERATED PROGRAMS -->", "<!-- END GENERATED PROGRAMS -->"


def mutag_gcn(data_dir=None) -> neurovec.Graph:
    return datasets.gcn(datasets.load_tu("MUTAG", data_dir), hidden=16, layers=2, normalize=False)


def render(graph: neurovec.Graph) -> str:
    parts = []
    for title, (settings, caption) in PRESETS.items():
        module = neurovec.compile(graph, settings)
        parts.append(f"### `{title}`\n\n{caption}\n\n```python\n{module.code}```\n")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    text = render(mutag_gcn(args.data_dir))
    if args.write is None:
        print(text)
        return
    doc = args.write.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    args.write.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}{END}", doc))


if __name__ == "__main__":
    main()
