"""One graph split across 1, 2 and 4 ranks on localhost, side by side with the whole graph in one process.

    python benchmarks/partitioned.py                                   # Cora, arxiv-like, products-like at 1/8
    python benchmarks/partitioned.py --graphs arxiv-like --ranks 2 4 --rounds 2 --out results/partitioned

Per graph, the data are made once (Cora from ``--planetoid-dir``; the synthetic
R-MAT shapes of ``neurovec.datasets.synthetic``, ``products-like`` scaled by
``--products-scale`` to what fits next to the one-process baseline) and saved as
arrays; each rank count gets its partition once, here, as DistDGL partitions
offline (METIS through pymetis where installed, else BFS blocks; its time and
quality are reported) and every rank's shard written (``partition.write_shards``:
its in-edges, its edges to other ranks, the feature rows it reads), so that a rank
loads only its share, as on separate machines. Then, round after round, every configuration is a real
launch of ``examples/train_partitioned.py``: ``whole`` (the whole graph compiled by
``neurovec.compile`` in one process, no torchrun), the same with ``fold_constants``
off (the whole-graph compile folds the first layer's aggregation of the static
features at compile time, in float64 per edge: most of its peak, and a step a
partitioned rank never takes, since its first aggregation reads exchanged rows), and
``torchrun --standalone --nproc_per_node K`` for each rank count (gloo on CPU, one
torch thread per rank).

Reported per configuration (medians over rounds): the step (forward, backward,
gradient all-reduce, Adam) as the median over epochs after the first of the
slowest rank; compile and plan time per rank; peak resident memory per rank
(``ru_maxrss``: the whole process, torch and the loaded arrays included) and the
largest rank's against the one-process peak; halo rows per exchanged layer per
rank; bytes every rank sends per step, forward plus backward (counted in the
exchange, float32); the partition's edge cut. ``--out DIR`` writes
``partitioned.json`` (every launch's records) and ``partitioned.md`` (the tables).

On a 2-core machine 4 ranks share 2 cores: the step measures memory and
communication, not parallel speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # `import neurovec` from this checkout when run as a script

from neurovec import partition  # noqa: E402

SHAPES = ("cora", "arxiv-like", "products-like")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/partitioned.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--products-scale", type=float, default=0.125,
                        help="nodes and edges of products-like times this (default 1/8: 306k nodes, 7.7M edges, "
                             "the largest whose whole-graph compile fits next to the others in 24 GB)")
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--no-whole", action="store_true", help="skip the one-process whole-graph baselines")
    parser.add_argument("--no-fold-baseline", action="store_true",
                        help="skip the second baseline: the whole graph with fold_constants off (the compile-time "
                             "fold of the first aggregation of static features, which a partitioned rank never runs)")
    parser.add_argument("--model", default="gcn", choices=list(partition.gnn.KINDS))
    parser.add_argument("--preset", default="default")
    parser.add_argument("--hidden", type=int, default=None, help="default: 16 on Cora, 128 on the synthetic graphs")
    parser.add_argument("--layers", type=int, default=None, help="default: 2 on Cora, 3 on the synthetic graphs")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--partition", default="auto", choices=list(partition.METHODS))
    parser.add_argument("--planetoid-dir", default=str(ROOT.parent / "shared" / "data" / "planetoid"))
    parser.add_argument("--out", default=None, help="folder for partitioned.json and partitioned.md")
    parser.add_argument("--project", default=None, metavar="JSON",
                        help="only print the friendster projection from a finished run's partitioned.json")
    return parser.parse_args(argv)


def make_data(name: str, args, folder: Path) -> tuple[Path, dict]:
    """The graph as arrays in ``folder``; returns the file and what making it took."""
    start = time.perf_counter()
    if name == "cora":
        from neurovec.datasets.planetoid import load_planetoid
        ds = load_planetoid("Cora", data_dir=args.planetoid_dir)
    else:
        from neurovec.datasets.synthetic import SHAPES as SYNTHETIC, rmat_dataset
        scale = args.products_scale if name == "products-like" else 1.0
        nodes, edges = SYNTHETIC[name][:2]
        ds = rmat_dataset(name, nodes=int(nodes * scale), edges=int(edges * scale), seed=0)
    path = folder / f"{name}.npz"
    np.savez(path, x=ds.x, edge_index=ds.edge_index, y=ds.y, train_mask=ds.train_mask, num_classes=ds.num_classes)
    info = {"nodes": int(ds.x.shape[0]), "edges": int(ds.edge_index.shape[1]), "features": int(ds.x.shape[1]),
            "classes": int(ds.num_classes), "make_seconds": time.perf_counter() - start}
    return path, info


def make_shards(data: Path, world: int, args, folder: Path) -> tuple[Path, dict]:
    """The partition for ``world`` ranks, made here once (timed), and every rank's shard written."""
    with np.load(data) as arrays:
        arrays = {key: arrays[key] for key in ("x", "edge_index", "y", "train_mask", "num_classes")}
    n = arrays["x"].shape[0]
    start = time.perf_counter()
    parts = partition.partition_nodes(arrays["edge_index"], n, world, args.partition) if world > 1 else \
        np.zeros(n, np.int64)
    seconds = time.perf_counter() - start
    quality = partition.partition_quality(arrays["edge_index"], parts, world, args.partition)
    target = folder / f"{data.stem}-shards-{world}"
    partition.write_shards(target, arrays["x"], arrays["edge_index"], parts, y=arrays["y"],
                           train_mask=arrays["train_mask"], num_classes=int(arrays["num_classes"]),
                           neighbour_features=args.model == "sage")
    return target, {"partition_seconds": seconds, **quality.as_dict()}


def launch(args, data: Path, ranks: int | None, shards: Path | None, hidden: int, layers: int, out: Path,
           settings: str | None = None) -> list[dict]:
    """One run; ``ranks`` None: the whole graph in one process. Returns every rank's record."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "NEUROVEC_PROGRESS": "0"}
    source = ["--dataset", f"npz:{data}"] if ranks is None else ["--shards", str(shards)]
    example = [str(ROOT / "examples" / "train_partitioned.py"), *source, "--models", args.model, "--presets",
               args.preset, "--hidden", str(hidden), "--layers", str(layers), "--epochs", str(args.epochs),
               "--out", str(out)]
    if settings:
        example += ["--settings", settings]
    if ranks is None:
        command = [sys.executable, *example, "--whole"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                   *example]
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stdout[-5000:]}\n{run.stderr[-5000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks or 1)]


def summarize(records: list[dict]) -> dict:
    """One launch: the slowest rank's step, every rank's compile, peak and exchange."""
    runs = [r["runs"][0] for r in records]
    epochs = list(zip(*(run["epoch_seconds"] for run in runs)))
    return {"step": statistics.median(max(e) for e in epochs[1:]) if len(epochs) > 1 else max(epochs[0]),
            "first": max(epochs[0]), "compile": [run["compile_seconds"] for run in runs],
            "plan": [run["plan_seconds"] for run in runs], "peak_mb": [r["peak_mb"] for r in records],
            "halo": [max(run["halo_rows"].values(), default=0) for run in runs],  # per exchanged layer
            "halo_layers": [len(run["halo_rows"]) for run in runs],
            "step_bytes": sum(sum(run["step_bytes"][0]) for run in runs),
            "edge_cut": records[0]["quality"]["edge_cut"], "cut_fraction": records[0]["quality"]["cut_fraction"],
            "loss": runs[0]["losses"][-1]}


def median_of(summaries: list[dict]) -> dict:
    """Medians over rounds (per rank for the per-rank lists)."""
    out = {}
    for key, value in summaries[0].items():
        values = [s[key] for s in summaries]
        if isinstance(value, list):
            out[key] = [statistics.median(v) for v in zip(*values)]
        elif isinstance(value, (int, float)):
            out[key] = statistics.median(values)
        else:
            out[key] = value
    return out


def table(name: str, info: dict, rows: dict, parts_info: dict) -> str:
    whole = rows.get("whole")
    nofold = rows.get("whole-nofold")
    lines = [f"### {name}: {info['nodes']:,} nodes, {info['edges']:,} edges, {info['features']} features, "
             f"{info['classes']} classes",
             "",
             "| configuration | step s | first epoch s | compile s per rank | plan s per rank | "
             "peak RSS per rank (MB) | "
             "largest / one process (/ fold off) | halo rows per rank, per exchanged layer (x layers) | "
             "bytes sent per step (all ranks) | edge cut |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for config, s in rows.items():
        ratio = f"{max(s['peak_mb']) / max(whole['peak_mb']):.2f}x" if whole else "-"
        if nofold:
            ratio += f" ({max(s['peak_mb']) / max(nofold['peak_mb']):.2f}x)"
        alone = isinstance(config, str) or config == 1
        cut = "-" if alone else f"{int(s['edge_cut']):,} ({100 * s['cut_fraction']:.1f}%)"
        halo = "-" if alone else f"{', '.join(f'{h:,.0f}' for h in s['halo'])} (x {int(s['halo_layers'][0])})"
        label = {"whole": "whole graph, one process", "whole-nofold": "whole graph, one process, fold_constants off"
                 }.get(config) or f"{config} rank{'s' if config > 1 else ''}"
        lines.append(f"| {label} | {s['step']:.3f} | {s['first']:.2f} | "
                     f"{', '.join(f'{c:.2f}' for c in s['compile'])} | {', '.join(f'{c:.2f}' for c in s['plan'])} | "
                     f"{', '.join(f'{p:.0f}' for p in s['peak_mb'])} | {ratio} | {halo} | "
                     f"{s['step_bytes'] / 2**20:.1f} MiB | {cut} |")
    made = ", ".join(f"{k} ranks {v['partition_seconds']:.1f} s (largest/mean {v['node_imbalance']:.2f} nodes, "
                     f"{v['edge_imbalance']:.2f} edges)" for k, v in parts_info.items())
    lines += ["", f"Data made in {info['make_seconds']:.1f} s; partitions: {made}.", ""]
    return "\n".join(lines)


# The projection (docs/distributed.md, "A model for friendster on 16 machines").
FRIENDSTER = {"nodes": 65_608_366, "edges": 3_612_134_270, "features": 128, "hidden": 256, "classes": 100,
              "layers": 2}
MACHINE_GB, NETWORK_GBIT = 64, 10  # seed 000's m5.4xlarge nodes and network


def _points(results: dict) -> list[dict]:
    """Every rank of every launch: what it aggregates, the row values it owns and receives, its memory."""
    points = []
    for name, graph in results["graphs"].items():
        info, layers, hidden = graph["info"], graph["layers"], graph["hidden"]
        widths = hidden * (layers - 1) + info["classes"]  # summed over the layers
        for config, launches in graph["launches"].items():
            for records in launches[-1:]:
                for r in records:
                    q, run = r["quality"], r["runs"][0]
                    nodes = r["owned_nodes"]
                    points.append({"graph": name, "edges": info["edges"], "config": config, "rank": r["rank"],
                                   "edge_layers": (q["edges"][r["rank"]] + nodes) * layers,
                                   "owned_values": nodes * widths,
                                   "halo_values": max(run["halo_rows"].values(), default=0) * widths,
                                   "above_loaded_mb": r["peak_mb"] - r["loaded_mb"], "loaded_mb": r["loaded_mb"],
                                   "step": statistics.median(run["epoch_seconds"][1:] or run["epoch_seconds"])})
    return points


def project(results: dict, machines: int = 16) -> str:
    """Friendster's GCN (seed 000's: 2 layers, 128 features, hidden 256, 100 classes) on ``machines``.

    Memory per rank above its loaded state is fitted (least squares on relative error) over
    every rank of the partitioned launches and the fold-off whole graph of the graphs with
    at least a million edges (on smaller ones torch's own allocations blur it) as bytes
    per aggregated edge and layer, per owned row value (rows x summed widths: the
    program's activations for training) and per halo row value (received rows, their
    copy after the owned rows, their gradients). Added: the smallest loaded rank (torch),
    and a friendster shard (float32 features of its rows, int64 edge ids of its in- and
    out-edges, the int32 in-edge CSR, four node-sized int64 arrays). The halo is the
    distinct sources of a rank's cut in-edges, drawn uniformly from the other ranks'
    nodes, for a range of edge cuts; the exchange's bytes are exact: every halo row of
    every exchanged layer (GCN: each convolution's output width), forward and backward.
    """
    every = _points(results)
    points = [p for p in every if p["config"] not in ("1", "whole") and p["edges"] >= 1_000_000]
    a = np.array([[p["edge_layers"], p["owned_values"], p["halo_values"]] for p in points], dtype=float)
    b = np.array([p["above_loaded_mb"] * 2**20 for p in points])
    coef, *_ = np.linalg.lstsq(a / b[:, None], np.ones_like(b), rcond=None)
    per_edge, per_owned, per_halo = (max(float(c), 0.0) for c in coef)
    worst = float(np.max(np.abs(a @ np.array([per_edge, per_owned, per_halo]) - b) / b))
    torch_mb = min(p["loaded_mb"] for p in every)
    f = FRIENDSTER
    n, layers = f["nodes"] / machines, f["layers"]
    e = f["edges"] / machines
    widths = f["hidden"] * (layers - 1) + f["classes"]
    shard_gb = (n * f["features"] * 4 + 2 * e * 16 + e * 4 + 4 * f["nodes"] * 8) / 2**30
    # Compute: seconds per aggregated edge value of the largest graph's 4-rank (or largest) partitioned step.
    largest = max(results["graphs"], key=lambda g: results["graphs"][g]["info"]["edges"])
    graph = results["graphs"][largest]
    configs = [c for c in graph["launches"] if c not in ("whole", "whole-nofold", "1")]
    runs = [p for p in every if p["graph"] == largest and p["config"] == max(configs, key=int)]
    values = sum(p["edge_layers"] for p in runs) / graph["layers"] * (graph["hidden"] * (graph["layers"] - 1)
                                                                       + graph["info"]["classes"])
    per_value_s = max(p["step"] for p in runs) * min(len(runs), 2) / values  # the ranks share 2 cores
    lines = [f"Friendster ({f['nodes']:,} nodes, {f['edges']:,} edges), GCN {layers} layers "
             f"({f['features']} -> {f['hidden']} -> {f['classes']}), one rank per machine on {machines} machines "
             f"({n / 1e6:.1f}M nodes and {e / 1e6:.0f}M in-edges each). Fitted over {len(points)} ranks: "
             f"{per_edge:.0f} B per aggregated edge and layer, {per_owned:.0f} B per owned row value, "
             f"{per_halo:.0f} B per halo row value (largest relative error {100 * worst:.0f}%); torch "
             f"{torch_mb:.0f} MB; a friendster shard {shard_gb:.1f} GB; compute {per_value_s * 1e9:.1f} ns per "
             f"aggregated edge value ({largest}, one thread per rank, loaded machine).", "",
             "| edge cut | halo rows per machine | memory per machine, GB | fits 64 GB (else: machines it fits on) | "
             f"bytes exchanged per step per machine | at {NETWORK_GBIT} Gbit/s | compute per step, one thread |",
             "|---|---|---|---|---|---|---|"]
    def per_machine(cut: float, m: int) -> tuple[float, float]:
        """(halo rows, memory in GB) of one of ``m`` machines."""
        n, e = f["nodes"] / m, f["edges"] / m
        others = f["nodes"] - n
        halo = others * (1 - np.exp(-cut * e / others))
        shard = (n * f["features"] * 4 + 2 * e * 16 + e * 4 + 4 * f["nodes"] * 8) / 2**30
        return halo, torch_mb / 1024 + shard + (per_edge * (e + n) * layers + per_owned * n * widths
                                                + per_halo * halo * widths) / 2**30

    for cut in (0.0, 0.1, 0.3, 0.5):
        halo, memory = per_machine(cut, machines)
        enough = next((m for m in (16, 32, 64, 128, 256, 512, 1024, 2048) if per_machine(cut, m)[1] <= MACHINE_GB),
                      None)
        sent = 2 * halo * widths * 4  # received forward, sent back backward (and as much the other way)
        seconds = sent / (NETWORK_GBIT / 8 * 1e9)
        compute = per_value_s * (e + n) * widths
        fits = "yes" if memory <= MACHINE_GB else f"no (fits on {enough or 'more than 2048'})"
        lines.append(f"| {100 * cut:.0f}% | {halo / 1e6:.1f}M | {memory:.0f} | {fits} | {sent / 2**30:.1f} GiB | "
                     f"{seconds:.0f} s | {compute:.0f} s |")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.project:
        print(project(json.loads(Path(args.project).read_text())))
        return
    results = {"args": vars(args), "graphs": {}}
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    report = [f"{args.model}, preset {args.preset}, float32, Adam, {args.epochs} epochs per launch, median over "
              f"{args.rounds} round(s); gloo on CPU, one torch thread per rank", ""]
    print(report[0], flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in args.graphs:
            data, info = make_data(name, args, folder)
            hidden = args.hidden or (16 if name == "cora" else 128)
            layers = args.layers or (2 if name == "cora" else 3)
            shards, parts_info = {}, {}
            for k in args.ranks:
                shards[k], made = make_shards(data, k, args, folder)
                if k > 1:
                    parts_info[k] = made
            configs = ([] if args.no_whole else ["whole"] + ([] if args.no_fold_baseline else ["whole-nofold"]))
            configs += list(args.ranks)
            launches = {c: [] for c in configs}
            for r in range(args.rounds):
                for config in configs:
                    target = folder / f"{name}-{config}-{r}"
                    whole = isinstance(config, str)
                    records = launch(args, data, None if whole else config, shards.get(config), hidden, layers, target,
                                     '{"fold_constants": false}' if config == "whole-nofold" else None)
                    launches[config].append(records)
                    print(f"{name} {config} round {r}: step {summarize(records)['step']:.3f} s, peak "
                          f"{max(x['peak_mb'] for x in records):.0f} MB", flush=True)
            rows = {c: median_of([summarize(x) for x in launches[c]]) for c in configs}
            text = table(name, info, rows, parts_info)
            print(text, flush=True)
            report.append(text)
            results["graphs"][name] = {"info": info, "partitions": parts_info, "hidden": hidden, "layers": layers,
                                       "launches": {str(c): v for c, v in launches.items()},
                                       "summary": {str(c): v for c, v in rows.items()}}
            if out:
                (out / "partitioned.json").write_text(json.dumps(results, indent=1))
                (out / "partitioned.md").write_text("\n".join(report))
    if len(results["graphs"]) > 1 and not args.no_whole:
        text = "### Projection\n\n" + project(results) + "\n"
        print(text, flush=True)
        report.append(text)
        if out:
            (out / "partitioned.md").write_text("\n".join(report))


if __name__ == "__main__":
    main()
