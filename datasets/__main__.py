"""Time loading the datasets and building their template graphs.

    python -m neurovec.datasets [--data DIR] [--compile]

``DIR`` holds ``tu/`` and ``mutagenesis/`` (default: ``$NEUROVEC_DATA``, else
``../shared/data`` next to the repository).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from . import gcn, gin, load_mutagenesis, load_tu, mutagenesis_dims, mutagenesis_simple, sage
from .mutagenesis import create_database


def _timed(label: str, fn):
    start = time.perf_counter()
    result = fn()
    print(f"{label:<44} {time.perf_counter() - start:8.3f} s   {result!r}")
    return result


def main(argv=None) -> None:
    default = os.environ.get("NEUROVEC_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data"
    parser = argparse.ArgumentParser(prog="python -m neurovec.datasets", description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(default))
    parser.add_argument("--compile", action="store_true", help="also time neurovec.compile on each graph")
    args = parser.parse_args(argv)
    data = Path(args.data)

    graphs = []
    for name in ("MUTAG", "ENZYMES", "PROTEINS"):
        ds = _timed(f"load {name}", lambda: load_tu(name, data / "tu"))
        for template in (gcn, sage, gin):
            graphs.append((f"{name} {template.__name__}", _timed(f"  build {name} {template.__name__}", lambda: template(ds))))
        if name == "PROTEINS":
            _timed("PROTEINS GCN from raw files (load + build)", lambda: gcn(load_tu(name, data / "tu")))
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "mutagenesis.db"
        _timed("create Mutagenesis SQLite database", lambda: create_database(data / "mutagenesis", db))
        mut = _timed("load Mutagenesis via SQL", lambda: load_mutagenesis(db))
    for template in (mutagenesis_simple, mutagenesis_dims):
        graphs.append((template.__name__, _timed(f"  build {template.__name__}", lambda: template(mut))))
    if args.compile:
        import neurovec
        for label, graph in graphs:
            _timed(f"compile {label}", lambda: type(neurovec.compile(graph)).__name__)


if __name__ == "__main__":
    main()
