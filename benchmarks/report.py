"""Benchmark outputs: the raw JSON, markdown tables of ratios, and plots in the style of thesis chapter 6.

    paths = write(results, "benchmark-results/run1")   # results.json, results.md, *.png

* ``results.json``: everything :func:`neurovec.benchmarks.suite.run` returned, every
  raw lap of every iteration included;
* ``results.md``: the summaries (best neurovec preset against PyG per training step,
  neurovec against NeuraLogic per epoch, scaling) and one detailed table per task;
* ``step.png``, ``forward.png``, ``backward.png`` (Figs. 6.1/6.2: the time of every
  engine and preset per task, box plots over the repetitions, outliers hidden);
  ``iterations.png`` (Fig. 6.3: iteration by iteration, best preset against the
  baselines, warm-up included); ``best.png`` (Figs. 6.13/6.14: forward, backward and
  training step of the best preset against the baselines); ``scaling.png`` when the
  run replicated a dataset.

Only engines whose outputs matched the oracle (status ``ok``) or could not be
checked (``unchecked``, marked) enter a summary; ``invalid`` ones are listed in the
detail tables with the reason.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["write", "markdown", "best_preset", "pyg_rows", "neuralogic_rows", "scaling_rows",
           "PYG_TARGET", "NEURALOGIC_TARGET"]

PYG_TARGET = 1.5         # neurovec's best preset vs PyG, per training step
NEURALOGIC_TARGET = 5.0  # neurovec vs NeuraLogic, per epoch (= one full-batch training step)
USABLE = ("ok", "unchecked")
COLORS = {"neurovec": "tab:blue", "best": "tab:green", "pyg": "tab:orange", "neuralogic": "tab:red",
          "reference": "tab:gray", "autotune": "tab:purple", "custom": "tab:brown"}
BASELINE_LABELS = {"pyg": "PyG", "neuralogic": "NeuraLogic", "reference": "reference"}


# -- selecting ---------------------------------------------------------------------------------------------
def _median(record: dict | None, lap: str = "step") -> float | None:
    if not record:
        return None
    return record.get("stats", {}).get(lap, {}).get("median")


def _usable(record: dict) -> bool:
    return record.get("status") in USABLE and _median(record) is not None


def _by_kind(group: dict, kind: str) -> dict | None:
    return next((r for r in group["engines"] if r["kind"] == kind and _usable(r)), None)


def best_preset(group: dict) -> dict | None:
    """The neurovec preset with the smallest median training step (usable records only)."""
    candidates = [r for r in group.get("engines", []) if r["kind"] == "neurovec" and _usable(r)]
    return min(candidates, key=_median, default=None)


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow and fast else None


def pyg_rows(results: dict) -> list[dict]:
    """Per template task: the best preset's step against PyG's (speed-up > 1: neurovec is faster)."""
    rows = []
    for group in results["groups"]:
        if group.get("source") != "template" or not any(r["kind"] == "pyg" for r in group.get("engines", [])):
            continue
        best, pyg = best_preset(group), _by_kind(group, "pyg")
        if pyg is None and best is None:
            continue
        row = {"task": group["key"], "dataset": group["dataset"], "model": group["model"], "scale": group["scale"],
               "best": best["engine"] if best else None, "unchecked": bool(best and best["status"] != "ok")}
        for lap in ("forward", "backward", "step"):
            row[f"neurovec_{lap}"], row[f"pyg_{lap}"] = _median(best, lap), _median(pyg, lap)
            row[f"speedup_{lap}"] = _ratio(row[f"pyg_{lap}"], row[f"neurovec_{lap}"])
        autotune = _by_kind(group, "autotune")
        row["autotune_step"] = _median(autotune)
        row["met"] = None if row["speedup_step"] is None else row["speedup_step"] >= PYG_TARGET
        rows.append(row)
    return rows


def neuralogic_rows(results: dict) -> list[dict]:
    """Per NeuraLogic task: its epoch against neurovec's best step on the same imported network.

    When the import failed, neurovec's own template of that dataset and model
    stands in (``same_network`` False).
    """
    templates = {(g["dataset"], g["model"]): g for g in results["groups"]
                 if g.get("source") == "template" and g.get("scale") == 1}
    rows = []
    for group in results["groups"]:
        if group.get("source") != "neuralogic":
            continue
        nl = _by_kind(group, "neuralogic")
        template = best_preset(templates.get((group["dataset"], group["model"]), {}))
        best, same = best_preset(group), True
        if best is None:
            best, same = template, False
        nl_record = next((r for r in group["engines"] if r["kind"] == "neuralogic"), {})
        row = {"task": group["key"], "dataset": group["dataset"], "model": group["model"],
               "neuralogic_epoch": _median(nl), "neuralogic_forward": _median(nl, "forward"),
               "neuralogic_status": nl_record.get("status"), "neuralogic_reason": nl_record.get("reason"),
               "best": best["engine"] if best else None, "neurovec_step": _median(best),
               "neurovec_forward": _median(best, "forward"), "same_network": same,
               "template_best": template["engine"] if template else None, "template_step": _median(template)}
        row["speedup"] = _ratio(row["neuralogic_epoch"], row["neurovec_step"])
        row["template_speedup"] = _ratio(row["neuralogic_epoch"], row["template_step"])
        row["met"] = None if row["speedup"] is None else row["speedup"] >= NEURALOGIC_TARGET
        rows.append(row)
    return rows


def scaling_rows(results: dict) -> list[dict]:
    """Per template task run at several scales: each engine's compile time, step and memory per scale."""
    series: dict[tuple, list] = {}
    for group in results["groups"]:
        if group.get("source") == "template":
            series.setdefault((group["dataset"], group["model"]), []).append(group)
    rows = []
    for (dataset, model), groups in series.items():
        if len({g["scale"] for g in groups}) < 2:
            continue
        for group in sorted(groups, key=lambda g: g["scale"]):
            for record in group["engines"]:
                if not _usable(record):
                    continue
                rows.append({"dataset": dataset, "model": model, "scale": group["scale"], "engine": record["engine"],
                             "kind": record["kind"], "neurons": group.get("info", {}).get("neurons"),
                             "template_s": group.get("info", {}).get("template_s"),
                             "compile_s": record.get("build_s"), "step": _median(record),
                             "memory": record.get("memory", {}).get("peak_bytes"),
                             "memory_growth": record.get("memory", {}).get("growth_bytes")})
    return rows


# -- markdown ----------------------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.2f}"


def _x(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}x"


def _mb(count: int | None) -> str:
    return "–" if count is None else f"{count / 2 ** 20:.1f}"


def _memory_growth(record: dict) -> int | None:
    """Peak memory growth; for NeuraLogic, whose model was built with the task, the larger of build and run."""
    growth = record.get("memory", {}).get("growth_bytes")
    built = record.get("build", {}).get("rss_growth_bytes")
    return max(g for g in (growth, built) if g is not None) if growth is not None or built is not None else None


def _mark(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "–"}[met]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def markdown(results: dict) -> str:
    machine, config = results["machine"], results["config"]
    lines = ["# neurovec benchmark", "",
             f"`{results['command']}`", "",
             f"* started {results['started']}, finished {results.get('finished', '?')}; "
             f"load average {results.get('load_average_start')} -> {results.get('load_average_end')}",
             f"* machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs"
             + (f" ({machine['affinity_cpus']} usable)" if machine.get("affinity_cpus") else "")
             + (f", GPU {machine['gpu']}" if machine.get("gpu") else "")
             + f"; torch {machine['torch']} with {machine['torch_threads']} threads; device {config['device']}, "
               f"{config['dtype']}",
             f"* neurovec {machine['neurovec']} at {(machine.get('neurovec_commit') or '?')[:10]}"
             + (f" ({machine['neurovec_dirty_files']} modified tracked files)" if machine.get("neurovec_dirty_files")
                else ""),
             f"* {config['warmup']} warm-up + {config['reps']} timed iterations per engine "
             f"({config['schedule']}); times are medians in ms; a training step is forward + MSE loss + "
             "backward + Adam step, full batch; NeuraLogic's step is one training epoch", ""]
    for note in results.get("notes", []):
        lines.append(f"* note: {note}")
    rows = pyg_rows(results)
    if rows:
        lines += ["", f"## Best neurovec preset against PyG (target: >= {PYG_TARGET}x per training step)", ""]
        lines += _table(["task", "best preset", "neurovec step", "PyG step", "speed-up", "forward", "backward",
                         f">= {PYG_TARGET}x"],
                        [[r["task"], (r["best"] or "–") + (" (unchecked)" if r["unchecked"] else ""),
                          _ms(r["neurovec_step"]), _ms(r["pyg_step"]), _x(r["speedup_step"]),
                          _x(r["speedup_forward"]), _x(r["speedup_backward"]), _mark(r["met"])] for r in rows])
        lines.append("")
        lines.append("Speed-up = PyG time / neurovec time (> 1: neurovec is faster); forward and backward "
                     "columns are the same ratio for those parts of the step.")
    rows = neuralogic_rows(results)
    if rows:
        lines += ["", f"## neurovec against NeuraLogic's Java CPU engine (target: >= {NEURALOGIC_TARGET}x per "
                      "epoch)", ""]
        lines += _table(["task", "NeuraLogic epoch", "neurovec engine", "neurovec step", "speed-up",
                         "same network", f">= {NEURALOGIC_TARGET}x", "neurovec template step", "speed-up"],
                        [[r["task"], _ms(r["neuralogic_epoch"]) if r["neuralogic_epoch"] else
                          f"– ({r['neuralogic_status']}: {r['neuralogic_reason']})", r["best"] or "–",
                          _ms(r["neurovec_step"]), _x(r["speedup"]),
                          "yes (imported)" if r["same_network"] else "no (neurovec's template)", _mark(r["met"]),
                          f"{_ms(r['template_step'])} ({r['template_best']})" if r["template_best"] else "–",
                          _x(r["template_speedup"])]
                         for r in rows])
        lines.append("")
        lines.append("The target is judged on the imported network (NeuraLogic's built samples compiled by "
                     "neurovec). The last two columns time neurovec's own template of the same architecture "
                     "(run with the template task), built from the dataset directly.")
    rows = scaling_rows(results)
    if rows:
        lines += ["", "## Scaling (the dataset replicated k times, one batch)", ""]
        lines += _table(["dataset/model", "k", "engine", "neurons", "template s", "compile s", "step ms",
                         "peak MB", "growth MB"],
                        [[f"{r['dataset']}/{r['model']}", r["scale"], r["engine"], r["neurons"] or "–",
                          f"{r['template_s']:.2f}" if r["template_s"] is not None else "–",
                          f"{r['compile_s']:.2f}", _ms(r["step"]), _mb(r["memory"]), _mb(r["memory_growth"])]
                         for r in rows])
    lines += ["", "## Every engine, per task", ""]
    for group in results["groups"]:
        lines += _group_table(group)
    return "\n".join(lines) + "\n"


def _group_table(group: dict) -> list[str]:
    info = group.get("info", {})
    lines = [f"### {group['key']}", ""]
    if group.get("error"):
        return lines + [f"The task could not be built: {group['error']}", ""]
    sizes = ", ".join(f"{info[k]} {k}" for k in ("samples", "neurons", "edges") if k in info)
    if sizes:
        lines.append(f"{sizes}; oracle: {(group.get('oracle') or {}).get('name', 'none')}")
    for note in group.get("notes", []):
        lines.append(f"* note: {note}")
    lines.append("")
    pyg = _by_kind(group, "pyg")
    best = best_preset(group)
    rows = []
    for record in group["engines"]:
        name = record["engine"] + (" (best)" if record is best else "")
        status = record.get("status")
        if status in ("skipped", "failed"):
            rows.append([name, f"{status}: {record.get('reason') or record.get('error')}"] + ["–"] * 6)
            continue
        if status == "invalid":
            status = f"**invalid**: {record['check'].get('message')}"
        stats = record.get("stats", {})
        step = stats.get("step", {})
        spread = f" [{_ms(step.get('q1'))}–{_ms(step.get('q3'))}]" if step.get("n", 0) > 1 else ""
        rows.append([name, status, f"{record.get('build_s', float('nan')):.2f}",
                     _ms(_median(record, "forward")), _ms(_median(record, "backward")),
                     _ms(step.get("median")) + spread, _mb(_memory_growth(record)),
                     _x(_ratio(_median(pyg), step.get("median"))) if record is not pyg else "1.00x"])
    lines += _table(["engine", "status", "compile s", "forward", "backward", "step [q1–q3]", "memory MB",
                     "vs PyG"], rows)
    return lines + [""]


# -- plots -------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def _label(record: dict) -> str:
    return BASELINE_LABELS.get(record["kind"], record["engine"])


def _color(record: dict, best: dict | None) -> str:
    if record is best:
        return COLORS["best"]
    return COLORS.get(record["kind"], "tab:blue")


def _grid(plt, n: int, width: float = 5.5, height: float = 3.6):
    columns = min(n, 3)
    rows = math.ceil(n / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return figure, list(axes.flat[:n])


def _title(figure, text: str) -> None:
    """A figure title with half an inch kept free for it, whatever the figure's height."""
    figure.suptitle(text)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / figure.get_figheight()))


def _timed_groups(results: dict) -> list[dict]:
    return [g for g in results["groups"] if any(_median(r) is not None for r in g.get("engines", []))]


def plot_engines(results: dict, lap: str, path: Path) -> bool:
    """Figs. 6.1/6.2: one panel per task, a box per engine over its timed repetitions (outliers hidden)."""
    groups = [g for g in _timed_groups(results) if any(_median(r, lap) is not None for r in g["engines"])]
    if not groups:
        return False
    plt = _plt()
    figure, axes = _grid(plt, len(groups), width=max(5.5, 0.32 * max(len(g["engines"]) for g in groups) + 2))
    for ax, group in zip(axes, groups):
        best = best_preset(group)
        records = [r for r in group["engines"] if _median(r, lap) is not None]
        data = [[v * 1e3 for v in r["raw"][lap][r["warmup"]:]] or [0.0] for r in records]
        boxes = ax.boxplot(data, showfliers=False, patch_artist=True, widths=0.6)
        for patch, record in zip(boxes["boxes"], records):
            patch.set_facecolor(_color(record, best))
            if record["status"] == "invalid":
                patch.set_facecolor("lightgray")
                patch.set_hatch("//")
        pyg = _by_kind(group, "pyg")
        if pyg is not None and _median(pyg, lap):
            ax.axhline(_median(pyg, lap) * 1e3, color=COLORS["pyg"], linestyle="--", linewidth=1, label="PyG median")
            ax.legend(loc="best", fontsize=7)
        ax.set_xticks(range(1, len(records) + 1), [_label(r) for r in records], rotation=75, fontsize=7)
        ax.set_title(group["key"], fontsize=9)
        ax.set_ylabel(f"{lap} time (ms)")
        values = [v for d in data for v in d if v > 0]
        if values and max(values) / min(values) > 50:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    _title(figure, f"{lap} time per engine and preset (green: best preset; hatched: failed the check)")
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


def _baselines(group: dict) -> list[dict]:
    best = best_preset(group)
    chosen = [best] if best else []
    for kind in ("autotune", "pyg", "neuralogic"):
        record = _by_kind(group, kind)
        if record is not None:
            chosen.append(record)
    return chosen


def plot_iterations(results: dict, path: Path) -> bool:
    """Fig. 6.3: training step time iteration by iteration (warm-up shaded), best preset vs baselines."""
    groups = [g for g in _timed_groups(results) if _baselines(g)]
    if not groups:
        return False
    plt = _plt()
    figure, axes = _grid(plt, len(groups))
    for ax, group in zip(axes, groups):
        best = best_preset(group)
        for record in _baselines(group):
            values = [v * 1e3 for v in record["raw"]["step"]]
            ax.plot(range(1, len(values) + 1), values, marker=".", color=_color(record, best),
                    label=f"{_label(record)}" + (" (best preset)" if record is best else ""))
        warmup = max((r["warmup"] for r in _baselines(group)), default=0)
        if warmup:
            ax.axvspan(0.5, warmup + 0.5, color="0.9", zorder=0)
        ax.set_title(group["key"], fontsize=9)
        ax.set_xlabel("iteration (shaded: warm-up, not counted)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("training step (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _title(figure, "training step per iteration: best neurovec preset against the baselines")
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


def plot_best(results: dict, path: Path) -> bool:
    """Figs. 6.13/6.14: forward, backward and training step of the best preset against the baselines."""
    groups = [g for g in _timed_groups(results) if _baselines(g)]
    if not groups:
        return False
    plt = _plt()
    figure, axes = _grid(plt, len(groups))
    laps = ("forward", "backward", "step")
    for ax, group in zip(axes, groups):
        best = best_preset(group)
        records = _baselines(group)
        width = 0.8 / len(records)
        for k, record in enumerate(records):
            heights = [(_median(record, lap) or 0.0) * 1e3 for lap in laps]
            ax.bar([i + k * width for i in range(len(laps))], heights, width, color=_color(record, best),
                   label=_label(record) + (" (best preset)" if record is best else ""))
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(laps))], ["forward", "backward", "training step"])
        ax.set_title(group["key"], fontsize=9)
        ax.set_ylabel("median time (ms)")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    _title(figure, "best neurovec preset (by training step) against the baselines; NeuraLogic's step is an epoch")
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


def plot_scaling(results: dict, path: Path) -> bool:
    """Compile time, training step and peak memory against the replication factor, per engine."""
    rows = scaling_rows(results)
    if not rows:
        return False
    plt = _plt()
    figure, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    series: dict[tuple, list] = {}
    for row in rows:
        series.setdefault((f"{row['dataset']}/{row['model']}", row["engine"], row["kind"]), []).append(row)
    for (task, engine, kind), points in series.items():
        points.sort(key=lambda r: r["scale"])
        scales = [p["scale"] for p in points]
        style = dict(marker="o", label=f"{task} {BASELINE_LABELS.get(kind, engine)}")
        axes[0].plot(scales, [p["compile_s"] for p in points], **style)
        axes[1].plot(scales, [p["step"] * 1e3 for p in points], **style)
        axes[2].plot(scales, [(p["memory_growth"] or 0) / 2 ** 20 for p in points], **style)
    for ax, title in zip(axes, ("compile / build time (s)", "training step (ms)", "memory growth (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("replication factor k")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


# -- files -------------------------------------------------------------------------------------------------
def write(results: dict, out_dir: str | Path, plots: bool = True, raw: bool = True) -> dict[str, Path]:
    """Write ``results.json`` (unless not ``raw``), ``results.md`` and (with ``plots``) the PNGs.

    Returns the written paths by name.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md"}
    if raw:
        paths["json"] = out / "results.json"
        paths["json"].write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
    paths["markdown"].write_text(markdown(results))
    if plots:
        for lap in ("step", "forward", "backward"):
            if plot_engines(results, lap, out / f"{lap}.png"):
                paths[lap] = out / f"{lap}.png"
        for name, plot in (("iterations", plot_iterations), ("best", plot_best), ("scaling", plot_scaling)):
            if plot(results, out / f"{name}.png"):
                paths[name] = out / f"{name}.png"
    return paths


def _jsonable(value):
    """numpy scalars and arrays (and anything else odd) in the results."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
