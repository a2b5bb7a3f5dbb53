"""Digests of the programs the optimizer makes on the benchmark suite: the check that a
restructuring of the compiler is behaviour-preserving.

    python benchmarks/program_digests.py                      # one line per program, then the total
    python benchmarks/program_digests.py --passes             # and every pass's output digest
    python benchmarks/program_digests.py --presets default upward-17-aggressive
    python benchmarks/program_digests.py --canonical          # digests with names canonicalised
    python benchmarks/program_digests.py --node               # the node-level programs instead

The programs are the benchmark suite's: MUTAG, ENZYMES and PROTEINS x GCN, SAGE and GIN x one-hot
``labels`` and ``continuous`` features, and relational Mutagenesis ``simple`` and ``dims``
(``benchmarks/tasks.make_task`` at scale 1, its default model sizes and seed). With ``--node``, the
node-level programs instead (``NODE_PROGRAMS``): Cora's GCN, SAGE and GIN 2 x 16, and GCN, SAGE and
GIN 3 x 128 on ``arxiv-like`` x 0.05 and ``products-like`` x 0.01 (``benchmarks/node_scale``'s
graphs, seed 0), the graphs the large-graph compile work changes. For each, and each
preset asked for, the script runs the Vectorizer and every enabled pass of ``PIPELINE`` and prints

* ``code``: a digest of the generated forward's source (``engines.torch_module.generate_source``)
  and of every constant it reads (key, dtype, shape and bytes) -- what a compiled module computes
  with, byte for byte;
* ``program``: a digest of the final program (every node's name, op, inputs, rows, shape, layer and
  attributes, the constants, the output, the weights' names);
* with ``--passes``, the program digest after the Vectorizer and after every pass, by pass name;
* with ``--canonical``, both digests of the final program with its nodes and constants renamed by
  position (``canonical``): equal canonical digests and different plain ones mean that a change
  only renamed nodes or constants.

Two runs that print the same lines made byte-identical programs. The last line digests all of them.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: import this checkout as the package neurovec
    sys.path.insert(0, str(_ROOT.parent))

from neurovec.compiler.ir import CONST_ATTRS, Program  # noqa: E402
from neurovec.compiler.pipeline import PIPELINE, resolve_settings  # noqa: E402
from neurovec.compiler.vectorizer import vectorize  # noqa: E402

__all__ = ["PROGRAMS", "program_digest", "code_digest", "canonical", "suite_graphs", "digests"]

PROGRAMS = ([(d, m, f) for d in ("MUTAG", "ENZYMES", "PROTEINS") for m in ("gcn", "sage", "gin")
             for f in ("labels", "continuous")] + [("mutagenesis", "simple", "labels"), ("mutagenesis", "dims", "labels")])

NODE_PROGRAMS = ([("Cora", m, 16, 2) for m in ("gcn", "sage", "gin")]
                 + [(f"{d}@{f:g}", m, 128, 3) for d, f in (("arxiv-like", 0.05), ("products-like", 0.01))
                    for m in ("gcn", "sage", "gin")])


def _hash_value(h, value) -> None:
    """Feed an attribute value (nested tuples, dicts, numbers, strings, arrays) into ``h``."""
    if isinstance(value, np.ndarray):
        h.update(f"array{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _hash_value(h, value[key])
        h.update(b"}")
    elif isinstance(value, (tuple, list)):
        h.update(b"(")
        for item in value:
            _hash_value(h, item)
        h.update(b")")
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def _hash_constants(h, constants: dict) -> None:
    for key in sorted(constants):
        h.update(key.encode())
        _hash_value(h, np.asarray(constants[key]))


def program_digest(program: Program) -> str:
    """A digest of everything that defines ``program`` (nodes in order, constants, output, weights)."""
    h = hashlib.sha256()
    for node in program.nodes:
        h.update(f"{node.name}|{node.op.name}|{node.srcs}|{node.count}|{node.shape}|{node.layer}|".encode())
        _hash_value(h, dict(node.attrs))
    _hash_constants(h, program.constants)
    h.update(f"out:{program.output}|weights:{[w.name for w in program.weights]}|dyn:{program.dynamic_facts}".encode())
    return h.hexdigest()[:16]


def code_digest(program: Program) -> str:
    """A digest of the generated forward's source and every constant it reads."""
    from neurovec.engines.torch_module import generate_source
    h = hashlib.sha256(generate_source(program).encode())
    _hash_constants(h, program.constants)
    return h.hexdigest()[:16]


def canonical(program: Program) -> Program:
    """``program`` with node ``i`` (in program order) named ``n{i}`` and its constants named
    ``c{j}`` in the order the nodes first read them (any unread ones ``u{j}``, in their order);
    node names in attributes (``hcat_weights``) renamed too."""
    nodes = {n.name: f"n{i}" for i, n in enumerate(program.nodes)}
    keys: dict[str, str] = {}
    for node in program.nodes:
        for key in node.consts:
            keys.setdefault(key, f"c{len(keys)}")
    for key in program.constants:
        keys.setdefault(key, f"u{len(keys)}")
    renamed = tuple(n.with_(name=nodes[n.name], srcs=tuple(nodes[s] for s in n.srcs), attrs={
        k: keys[v] if k in CONST_ATTRS.get(n.op, ()) else tuple(nodes[w] for w in v) if k == "hcat_weights" else v
        for k, v in n.attrs.items()}) for n in program.nodes)
    return program.replace(nodes=renamed, constants={keys[k]: v for k, v in program.constants.items()},
                           output=nodes[program.output])


def suite_graphs(data_dir: Path, programs=PROGRAMS):
    """``(key, graph)`` of each benchmark program (``benchmarks/tasks.make_task``, scale 1)."""
    from neurovec.benchmarks.tasks import DataCache, make_task
    cache = DataCache(data_dir)
    for dataset, model, features in programs:
        task = make_task(cache, dataset, model, features=features)
        yield f"{dataset}/{model} {features}", task.graph


def node_graphs(data_dir: Path, programs=NODE_PROGRAMS):
    """``(key, graph)`` of each node-level program: full-batch, one output per node."""
    from neurovec.benchmarks.node_scale import make_dataset
    from neurovec.datasets import gnn
    from neurovec.datasets.planetoid import load_planetoid
    for name, model, hidden, layers in programs:
        if "@" in name:
            shape, fraction = name.split("@")
            data = make_dataset(shape, float(fraction))
        else:
            data = load_planetoid(name, data_dir / "planetoid", download=False)
        graph = gnn.build_gnn(data, gnn.GNNSpec.create(model, data, hidden, layers), None, 0)
        yield f"{name}/{model} {layers}x{hidden}", graph


def digests(graph, settings) -> tuple[list[tuple[str, str]], Program]:
    """Every step's ``(name, program digest)`` and the final program."""
    settings = resolve_settings(settings)
    program = vectorize(graph).replace(dynamic_facts=tuple(settings.dynamic_facts))
    steps = [("vectorize", program_digest(program))]
    for name, enabled, run in PIPELINE:
        if enabled(settings):
            program = run(program, settings)
            steps.append((name, program_digest(program)))
    return steps, program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=_ROOT.parent / "shared" / "data")
    parser.add_argument("--presets", nargs="+", default=["default"])
    parser.add_argument("--passes", action="store_true", help="print every pass's output digest too")
    parser.add_argument("--canonical", action="store_true", help="digest the programs with names canonicalised")
    parser.add_argument("--node", action="store_true", help="the node-level programs (NODE_PROGRAMS) instead")
    args = parser.parse_args()
    total = hashlib.sha256()
    for key, graph in (node_graphs if args.node else suite_graphs)(args.data_dir):
        for preset in args.presets:
            steps, program = digests(graph, preset)
            if args.canonical:
                program = canonical(program)
                steps[-1] = (steps[-1][0], program_digest(program))
            line = f"{key:28s} {preset:22s} code {code_digest(program)}  program {steps[-1][1]}"
            print(line, flush=True)
            total.update(line.encode())
            if args.passes:
                for name, digest in steps:
                    print(f"    {name:40s} {digest}")
    print(f"all {total.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
