"""How long does compiling a large synthetic graph take? (issue: 1M edges in < 10 s)

    python benchmarks/compile_speed.py --edges 1000000

Builds a random 3-layer message-passing graph with the bulk array API, then
times validation (Graph construction), the Vectorizer alone, the whole pipeline
of a preset (with its slowest passes) and module construction.
"""
import argparse
import time

import numpy as np

import neurovec
from neurovec.compiler import Settings, build_program, vectorize
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import FactLayer, Graph, NeuronLayer, Weight


def synthetic_graph(n_edges: int, n_nodes: int | None = None, dim: int = 8, layers: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    n_nodes = n_nodes or max(n_edges // 10, 1)
    per_layer = n_edges // layers
    weights = [Weight(f"W{k}", rng.normal(size=(dim, dim))) for k in range(layers)]
    graph_layers = [FactLayer("x", rng.normal(size=(n_nodes, dim)))]
    for k in range(layers):
        # Random in-degrees summing to per_layer, every node at least one input.
        counts = np.bincount(rng.integers(0, n_nodes, per_layer - n_nodes), minlength=n_nodes) + 1
        graph_layers.append(NeuronLayer(
            f"h{k}", counts=counts, input_layer=np.full(per_layer, k),
            input_ordinal=rng.integers(0, n_nodes, per_layer), input_weight=np.full(per_layer, k),
            aggregation=["sum", "mean", "max"][k % 3], transformation="relu"))
    return graph_layers, weights, n_nodes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--preset", default="default", help="optimizer preset for the full compile")
    args = parser.parse_args()
    layers, weights, n_nodes = synthetic_graph(args.edges)
    t0 = time.perf_counter()
    graph = Graph(layers, weights, np.full(n_nodes, len(layers) - 1), np.arange(n_nodes))
    t1 = time.perf_counter()
    vectorize(graph)
    t2 = time.perf_counter()
    timings: dict[str, float] = {}
    program = build_program(graph, Settings.preset(args.preset, verify=False), timings)
    t3 = time.perf_counter()
    module = CompiledModule(program)
    t4 = time.perf_counter()
    module()
    t5 = time.perf_counter()
    slowest = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(timings.items(), key=lambda kv: -kv[1])[:4])
    print(f"{graph!r}")
    print(f"validate {t1 - t0:.2f} s | vectorize alone {t2 - t1:.2f} s | {args.preset} pipeline {t3 - t2:.2f} s "
          f"({slowest}) | module {t4 - t3:.2f} s | first forward {t5 - t4:.2f} s")


if __name__ == "__main__":
    main()
