"""What inference on unseen graphs costs: build, compile, load the trained weights, run.

    python benchmarks/inference.py --data-dir ../shared/data/tu
    python benchmarks/inference.py --datasets PROTEINS --models gcn gin --presets unoptimized default

A compiled module holds its graph, so new graphs are compiled anew and given the trained
weights by ``load_state_dict`` (docs/export.md). For each dataset and model this script
takes the last 10% of the graphs as the unseen ones and times, in a fresh module each
repetition: building their graph with the template, ``neurovec.compile`` under each preset,
``load_state_dict`` of weights trained elsewhere (a module compiled on the first 90%), the
first forward under ``torch.no_grad()`` and then the median of later ones; and, for the
exported program (``engines/export.py``), ``export`` and one call of it. Medians of
``--reps`` repetitions, in ms. The C++ kernels are built (or loaded from their cache) before
anything is timed.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import neurovec
from neurovec import datasets
from neurovec.engines import export as export_module

STEPS = ("build", "compile", "load_state_dict", "first forward", "forward", "export", "exported forward")


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1e3


def measure(ds, model: str, preset: str, reps: int, forwards: int = 20) -> dict[str, float]:
    template = getattr(datasets, model)
    n = ds.n_graphs
    seen, unseen = list(range(n - n // 10)), list(range(n - n // 10, n))
    trained = neurovec.compile(template(ds, samples=seen[:64], seed=1), "unoptimized").state_dict()
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    for _ in range(reps):
        graph, t = _timed(lambda: template(ds, samples=unseen))
        times["build"].append(t)
        settings = neurovec.Settings.preset(preset, dynamic_facts=("x",))
        module, t = _timed(lambda: neurovec.compile(graph, settings))
        times["compile"].append(t)
        _, t = _timed(lambda: module.load_state_dict(trained))
        times["load_state_dict"].append(t)
        with torch.no_grad():
            _, t = _timed(module)
            times["first forward"].append(t)
            times["forward"].append(statistics.median(_timed(module)[1] for _ in range(forwards)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program, t = _timed(lambda: export_module.export(module))
        times["export"].append(t)
        runnable = program.module()
        facts = export_module.example_facts(module)
        with torch.no_grad():
            times["exported forward"].append(statistics.median(_timed(lambda: runnable(facts=facts))[1]
                                                               for _ in range(forwards)))
    return {step: statistics.median(values) for step, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="TU data folder (default: $NEUROVEC_DATA)")
    parser.add_argument("--datasets", nargs="+", default=["MUTAG", "PROTEINS"])
    parser.add_argument("--models", nargs="+", default=["gcn", "gin"])
    parser.add_argument("--presets", nargs="+", default=["unoptimized", "default"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    neurovec.set_progress(False)
    header = f"{'dataset':<9} {'model':<5} {'preset':<12} {'unseen':>6} " + " ".join(f"{s:>16}" for s in STEPS)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; times in ms (medians of {args.reps})")
    print(header)
    for name in args.datasets:
        ds = datasets.load_tu(name, args.data_dir, download=False)
        neurovec.compile(datasets.gcn(ds, samples=[0]))()  # builds or loads the C++ kernels
        for model in args.models:
            for preset in args.presets:
                row = measure(ds, model, preset, args.reps)
                print(f"{name:<9} {model:<5} {preset:<12} {ds.n_graphs // 10:>6} "
                      + " ".join(f"{row[s]:>16.2f}" for s in STEPS), flush=True)


if __name__ == "__main__":
    main()
