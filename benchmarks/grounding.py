"""From template and data to a neuron graph: neurovec.relational against NeuraLogic and the hand-written templates.

    python -m neurovec.benchmarks.grounding --data ../shared/data            # everything (NeuraLogic: minutes)
    python -m neurovec.benchmarks.grounding --data ../shared/data --no-neuralogic

Three jobs, each timed side by side in one run:

* **MUTAG GCN** and **PROTEINS GCN** (all graphs): the GCN NeuraLogic's benchmarks use
  (``{H,F} h_k(I) :- h_{k-1}(J), edge(J, I). [combination=product, aggregation=sum]``, normalization in the edge
  values, two layers of 16, an average readout), the same rules in neurovec's syntax, and ``datasets.gcn`` by
  hand next to ``relational.models.gcn`` (the same model as rules);
* **Mutagenesis** (188 molecules): NeuraLogic's own template and example files against neurovec's port of that
  template (thesis 6.3 "simple") grounded from the SQLite database of ``datasets.create_database`` (joins in
  SQL) and from arrays, and ``datasets.mutagenesis_simple`` by hand.

neurovec times are medians (and minima) of ``--repeats`` runs, and more while the job's runs have taken less than
``--seconds`` (a grounding of a few milliseconds is timed a hundred times or more: the loaded-machine noise of a few
runs swamps a ratio of 1.5x), interleaved with the hand-written templates, round by round, each round starting
with the next one (what runs just before a grounding changes its time); Mutagenesis from SQL is timed on its own.
The ratio to the hand-written template is the median of each round's ratio (robust to load that comes and goes)
next to the ratio of the medians.
The timings start from the template and the relations (arrays, or the database file) and end with a validated
``neurovec.Graph``. NeuraLogic's time is ``model.build`` plus ``model.build_dataset`` in a fresh JVM, with
``chain_pruning=False, iso_value_compression=False`` (its fastest build; its defaults are slower), the second
of two builds when the first takes less than a minute (the JVM warms up); a build that has not finished within
``--timeout`` seconds is stopped and reported as such. The machine's load average is printed: these numbers
are only comparable within one run.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


def _median_min(times: list) -> tuple[float, float]:
    return float(np.median(times)), float(np.min(times))


def _paired_ratio(times: list, others: list) -> float:
    """The median over rounds of one round's ratio: both ran back to back, under the same load (on a shared machine
    the load comes and goes in phases of seconds and moves both medians; the ratio of a round moves far less)."""
    return float(np.median(np.asarray(times) / np.asarray(others)))


def _timed(function, repeats: int, *others, seconds: float = 0.0, most: int = 500) -> list:
    """Interleaved timings: ``function`` and each of ``others``, one after the other (in turn, each starts a round),
    ``repeats`` rounds and more while the rounds have taken less than ``seconds`` (at most ``most`` rounds); returns
    lists of seconds, in the order of the arguments."""
    results = [[] for _ in range(1 + len(others))]
    rounds = 0
    gc.collect()
    gc.freeze()  # what exists now is never collected here: each collection below scans only what the runs left
    try:
        while rounds < repeats or (sum(map(sum, results)) < seconds and rounds < most):
            functions = (function,) + others
            first = rounds % len(functions)  # each round starts with the next one: none always follows the same one
            rounds += 1
            for k in list(range(first, len(functions))) + list(range(first)):
                f = functions[k]
                gc.collect()
                start = time.perf_counter()
                f()
                results[k].append(time.perf_counter() - start)
    finally:
        gc.unfreeze()
    return results


# -- the jobs, neurovec's side --------------------------------------------------------------------------------------
def neuralogic_gcn_template(widths: list):
    """NeuraLogic's benchmark GCN in neurovec's syntax (weights: dimensions only, as in NeuraLogic's)."""
    from neurovec.sources.relational import Aggregation, Combination, Metadata, R, Template, Transformation, V

    t = Template()
    for k in range(1, len(widths)):
        act = Transformation.RELU if k < len(widths) - 1 else Transformation.IDENTITY
        t += (R.get(f"h{k}")(V.I)[widths[k], widths[k - 1]] <= (R.get(f"h{k - 1}")(V.J), R.edge(V.J, V.I))) | \
            Metadata(combination=Combination.PRODUCT, aggregation=Aggregation.SUM)
        t += R.get(f"h{k}") / 1 | Metadata(transformation=act)
    t += (R.predict[1, widths[-1]] <= R.get(f"h{len(widths) - 1}")(V.X)) | Metadata(aggregation=Aggregation.AVG)
    t += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    return t


def tu_job(ds, hidden: int, repeats: int, seconds: float = 0.0) -> dict:
    from neurovec import datasets
    from neurovec.sources.relational import ground, models

    widths = [ds.node_features().shape[1], hidden, hidden]
    template = neuralogic_gcn_template(widths)

    def neuralogic_rules():
        facts = models.tu_facts(ds, norm=True, edges=False)
        return ground(template, {"h0": facts["feature"], "edge": facts["norm"]}, models.tu_queries(ds))

    def rules():
        t, facts, queries = models.gcn(ds, hidden=hidden, layers=2)
        return ground(t, facts, queries)

    def hand():
        return datasets.gcn(ds, hidden=hidden, layers=2)

    first = neuralogic_rules()
    same, as_rules, by_hand = _timed(neuralogic_rules, repeats, rules, hand, seconds=seconds)
    grounding = rules()
    return {"neurovec": _median_min(same), "groundings": first.stats["groundings"], "graph": repr(first.graph),
            "rules": _median_min(as_rules), "hand": _median_min(by_hand), "ratio": _paired_ratio(as_rules, by_hand),
            "rules_groundings": grounding.stats["groundings"]}


def mutagenesis_job(database: str, repeats: int, seconds: float = 0.0) -> dict:
    from neurovec import datasets
    from neurovec.sources.relational import ground, models

    ds = datasets.load_mutagenesis(database)
    template = models.mutagenesis(ds.element_names, ds.bond_type_values, "simple")
    def from_sql():
        return ground(template, models.mutagenesis_database(database), models.mutagenesis_queries(ds, by_id=True))

    def from_arrays():
        return ground(template, models.mutagenesis_facts(ds), models.mutagenesis_queries(ds))

    def hand():
        return datasets.mutagenesis_simple(ds)

    first = from_sql()
    # the ratio to the hand-written template is from arrays: those two are timed together, the SQL grounding (tens
    # of times slower, with a heap of its own) before them
    (sql,) = _timed(from_sql, repeats, seconds=seconds)
    arrays, by_hand = _timed(from_arrays, repeats, hand, seconds=seconds)
    return {"neurovec": _median_min(sql), "arrays": _median_min(arrays), "hand": _median_min(by_hand),
            "ratio": _paired_ratio(arrays, by_hand),
            "groundings": first.stats["groundings"], "graph": repr(first.graph)}


# -- NeuraLogic's side, in a subprocess ----------------------------------------------------------------------------
def _neuralogic_child(job: str, data: str, hidden: int) -> None:
    """Runs in a fresh process: builds the job's model and dataset, prints the seconds as JSON."""
    import types

    import neuralogic.logging
    from neuralogic.core import Settings
    neuralogic.logging.clear_handlers()
    if job == "mutagenesis":
        from neuralogic.utils.data import Mutagenesis

        def make():
            return Mutagenesis()
    else:
        from neurovec.benchmarks.neuralogic_models import _tu_dataset, _tu_gcn
        from neurovec.datasets import load_tu
        ds = load_tu(job, str(Path(data) / "tu"))
        options = types.SimpleNamespace(layers=2, hidden=hidden)

        def make():
            return _tu_gcn(ds, options), _tu_dataset(ds)
    times = []
    for attempt in range(2):
        model, dataset = make()
        start = time.perf_counter()
        model.build(Settings(chain_pruning=False, iso_value_compression=False))
        built = model.build_dataset(dataset)
        times.append(time.perf_counter() - start)
        print(json.dumps({"seconds": times[-1], "samples": len(built), "attempt": attempt}), flush=True)
        if times[-1] > 60:
            break


def neuralogic_job(job: str, data: str, hidden: int, timeout: float) -> dict:
    command = [sys.executable, "-m", "neurovec.benchmarks.grounding", "--child", job, "--data", data,
               "--hidden", str(hidden)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        lines = [json.loads(line) for line in (expired.stdout or b"").decode().splitlines() if line.startswith("{")]
        return {"finished": False, "waited": time.perf_counter() - start, "partial": lines}
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"finished": False, "error": done.stderr[-500:]}
    return {"finished": True, "seconds": lines[-1]["seconds"], "samples": lines[-1]["samples"],
            "attempts": [line["seconds"] for line in lines]}


# -- the report ----------------------------------------------------------------------------------------------------
def _seconds(pair) -> str:
    return f"{pair[0]:.3f} s (min {pair[1]:.3f})"


def report(results: dict) -> str:
    lines = [f"load average {results['load']}, {results['cpus']} CPUs, numpy {results['numpy']}", ""]
    lines.append("| job | NeuraLogic build_dataset | neurovec template + data -> Graph | speed-up | groundings | "
                 "groundings/s |")
    lines.append("|---|---|---|---|---|---|")
    for name, row, ours_pair in _speed_rows(results["jobs"]):
        nl = row.get("neuralogic")
        ours = ours_pair[0]
        if nl is None:
            nl_text, speedup = "not run", ""
        elif nl.get("finished"):
            nl_text, speedup = f"{nl['seconds']:.2f} s", f"{nl['seconds'] / ours:.0f}x"
        else:
            nl_text = f"did not finish in {results['timeout']:.0f} s" if "waited" in nl else \
                f"failed: {nl.get('error', '')[:80]}"
            speedup = f"> {results['timeout'] / ours:.0f}x" if "waited" in nl else ""
        lines.append(f"| {name} | {nl_text} | {_seconds(ours_pair)} | {speedup} | {row['groundings']:,} | "
                     f"{row['groundings'] / ours / 1e6:.2f} M |")
    lines += ["", "| job | hand-written numpy template | the same model as rules | ratio (median of rounds) | "
                  "ratio of medians (of minima) |", "|---|---|---|---|---|"]
    for name, row in results["jobs"].items():
        rules = row.get("rules", row.get("arrays"))
        if "rules" not in row and "arrays" in row:  # grounded from arrays here, not from SQL
            name = name.replace("(SQLite)", "(from arrays)")
        paired = f"{row['ratio']:.2f}x" if "ratio" in row else ""
        lines.append(f"| {name} | {_seconds(row['hand'])} | {_seconds(rules)} | {paired} | "
                     f"{rules[0] / row['hand'][0]:.2f}x ({rules[1] / row['hand'][1]:.2f}x) |")
    return "\n".join(lines)


def _speed_rows(jobs: dict):
    """(name, job, neurovec's (median, min)) per row of the speed table. Mutagenesis has two rows: from arrays,
    like NeuraLogic, which reads its facts from memory, and from SQLite, where the database runs the joins."""
    for name, row in jobs.items():
        if "arrays" in row:
            yield name.replace("(SQLite)", "(from arrays)"), row, row["arrays"]
        yield name.replace("(SQLite)", "(SQLite, joins in the database)"), row, row["neurovec"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("NEUROVEC_DATA", "../shared/data"),
                        help="folder with tu/{MUTAG,PROTEINS} and mutagenesis/*.csv")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of each job at least")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="more rounds (up to 500) while a job's rounds have taken less than this")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds NeuraLogic gets per job")
    parser.add_argument("--no-neuralogic", action="store_true")
    parser.add_argument("--jobs", nargs="+", default=["MUTAG", "PROTEINS", "mutagenesis"])
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _neuralogic_child(args.child, args.data, args.hidden)
        return {}

    import tempfile

    from neurovec import datasets
    results = {"load": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(), "numpy": np.__version__,
               "timeout": args.timeout, "jobs": {}}
    for job in args.jobs:
        if job == "mutagenesis":
            with tempfile.TemporaryDirectory() as folder:
                database = str(Path(folder) / "mutagenesis.db")
                datasets.create_database(Path(args.data) / "mutagenesis", database)
                row = mutagenesis_job(database, args.repeats, args.seconds)
            name = "Mutagenesis (SQLite)"
        else:
            ds = datasets.load_tu(job, str(Path(args.data) / "tu"))
            row = tu_job(ds, args.hidden, args.repeats, args.seconds)
            name = f"{job} GCN ({ds.n_graphs} graphs)"
        if not args.no_neuralogic:
            row["neuralogic"] = neuralogic_job(job, args.data, args.hidden, args.timeout)
        results["jobs"][name] = row
        print(f"{name}: done", file=sys.stderr, flush=True)
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
