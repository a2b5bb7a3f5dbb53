"""How much do isomorphic compression and deduplication shrink the real datasets' layers?

    python benchmarks/compression.py [--data-dir ../shared/data]

For MUTAG, ENZYMES and PROTEINS x GCN/SAGE/GIN (one-hot node labels) and Mutagenesis
(simple and dims), prints one markdown row per graph layer: its neurons, and the rows
computed for it after the merging passes of the ``default`` pipeline (``merge_unit_facts``
through ``dedup_aggregations``). A layer's rows are those of the nodes that end it (a
REDUCE, ADD or TRANSFORM that nothing continues). docs/optimizer.md shows the table.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from neurovec import datasets
from neurovec.compiler import Settings
from neurovec.compiler.passes.dedup import layer_ends
from neurovec.compiler.pipeline import PIPELINE
from neurovec.compiler.vectorizer import vectorize
from neurovec.sources.graph import Graph, NeuronLayer

LAST_MERGING_PASS = "deduplicate"


def rows_per_layer(graph: Graph, settings: Settings | None = None) -> dict[str, int]:
    """Rows computed for each graph layer once the merging passes have run."""
    settings = settings or Settings(verify=False)
    program = vectorize(graph)
    for name, enabled, run in PIPELINE:
        if enabled(settings):
            program = run(program, settings)
        if name == LAST_MERGING_PASS:
            break
    ends = layer_ends(program)
    rows: dict[str, int] = {}
    for node in program.nodes:
        if node.name in ends and node.layer:
            rows[node.layer] = rows.get(node.layer, 0) + node.count
    return rows


def real_graphs(data_dir: Path):
    """(name, graph) for every dataset x model of the table."""
    for dataset in ("MUTAG", "ENZYMES", "PROTEINS"):
        data = datasets.load_tu(dataset, data_dir / "tu", download=False)
        for model in ("gcn", "sage", "gin"):
            yield f"{dataset} {model.upper()}", getattr(datasets, model)(data)
    with tempfile.TemporaryDirectory() as folder:
        molecules = datasets.load_mutagenesis(
            datasets.create_database(data_dir / "mutagenesis", os.path.join(folder, "mutagenesis.db")))
    yield "Mutagenesis simple", datasets.mutagenesis_simple(molecules)
    yield "Mutagenesis dims", datasets.mutagenesis_dims(molecules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("NEUROVEC_DATA", "../shared/data")))
    args = parser.parse_args()
    print("| model | layer | neurons | rows after merging |")
    print("|---|---|---:|---:|")
    for name, graph in real_graphs(args.data_dir):
        rows = rows_per_layer(graph)
        for layer in graph.layers:
            if isinstance(layer, NeuronLayer):
                print(f"| {name} | {layer.name} | {layer.size} | {rows.get(layer.name, 0)} |", flush=True)


if __name__ == "__main__":
    main()
