"""Benchmark outputs: the raw JSON, markdown tables of ratios, and plots in the style of thesis chapter 6.

    paths = write(results, "benchmark-results/run1")   # results.json, results.md, *.png

* ``results.json``: everything :func:`neurovec.benchmarks.suite.run` returned, every
  raw lap of every iteration included;
* ``results.md``: first the headline (neurovec as a user gets it, the ``default``
  preset and ``autotune``'s pick, against the *fastest* PyG contender of each task),
  then the PyG contenders, the physical limit (each step against the bytes it must
  move at the measured memory bandwidth), NeuraLogic, scaling, and one detailed
  table per task;
* ``speedup.png``: the headline speed-up per task, label and continuous features,
  with parity and the targets marked; ``step.png``, ``forward.png``, ``backward.png``
  (Figs. 6.1/6.2: the time of every engine per task, box plots over the
  repetitions, outliers hidden); ``iterations.png`` (Fig. 6.3: iteration by
  iteration, warm-up included); ``best.png`` (Figs. 6.13/6.14: forward, backward and
  training step of neurovec against the PyG contenders); ``scaling.png`` when the
  run replicated a dataset. Every colour is named in a legend, and each figure
  uses one y-scale (linear or logarithmic) for all its panels.

Only engines whose outputs matched the oracle (status ``ok``) or could not be
checked (``unchecked``, marked) enter a summary; ``invalid`` ones are listed in the
detail tables with the reason.

"Best preset, picked after timing" (the fastest of all presets timed in the run)
is reported apart from the headline: choosing the fastest of 20 measurements after
the fact flatters it, and no user gets it without timing them all, which is what
``autotune`` does, at its compile-time cost.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..compiler.settings import Settings

__all__ = ["write", "markdown", "best_preset", "fastest_pyg", "headline_rows", "pyg_rows", "limit_rows",
           "neuralogic_rows", "scaling_rows", "TARGETS", "NEURALOGIC_TARGET", "bandwidth"]

#: autotune's name for the configuration the ``default`` engine runs (preset / reduce kernel)
DEFAULT_CONFIGURATION = f"default/{Settings.preset('default').reduce_kernel}"
TARGETS = {"labels": 2.0, "continuous": 1.5, "node": 2.0}  # headline speed-up over the fastest PyG contender
NEURALOGIC_TARGET = 5.0  # neurovec vs NeuraLogic, per epoch (= one full-batch training step)
USABLE = ("ok", "unchecked")
PYG_NAMES = ("pyg", "pyg-tuned", "pyg-compiled")
# Every colour a plot uses, and the legend entry that names it.
STYLE = {
    "default": ("tab:blue", "neurovec default preset"),
    "preset": ("lightsteelblue", "other neurovec presets"),
    "best": ("tab:green", "best preset, picked after timing"),
    "autotune": ("tab:purple", "neurovec autotune's pick"),
    "pyg": ("tab:orange", "PyG twin (eager, edge_index)"),
    "pyg-tuned": ("tab:brown", "PyG tuned (cached, sparse adj_t)"),
    "pyg-compiled": ("tab:red", "PyG torch.compile'd"),
    "neuralogic": ("tab:pink", "NeuraLogic (Java)"),
    "reference": ("tab:gray", "neurovec reference engine"),
    "custom": ("tab:olive", "other engine"),
    "invalid": ("lightgray", "failed the oracle check (hatched)"),
}


# -- selecting ---------------------------------------------------------------------------------------------
def _median(record: dict | None, lap: str = "step") -> float | None:
    if not record:
        return None
    return record.get("stats", {}).get(lap, {}).get("median")


def _timed(record: dict, lap: str = "step") -> list[float]:
    """A record's timed iterations (its warm-up left out); the median of these is ``stats[lap]``."""
    return record["raw"][lap][record.get("warmup", 0):]


def _usable(record: dict) -> bool:
    return record.get("status") in USABLE and _median(record) is not None


def _by_kind(group: dict, kind: str) -> dict | None:
    return next((r for r in group.get("engines", []) if r["kind"] == kind and _usable(r)), None)


def _by_name(group: dict, name: str) -> dict | None:
    return next((r for r in group.get("engines", []) if r["engine"] == name and _usable(r)), None)


def best_preset(group: dict) -> dict | None:
    """The neurovec preset with the smallest median training step (usable records only), picked after timing."""
    candidates = [r for r in group.get("engines", []) if r["kind"] == "neurovec" and _usable(r)]
    return min(candidates, key=_median, default=None)


def fastest_pyg(group: dict) -> dict | None:
    """The PyG contender with the smallest median training step (usable records only)."""
    candidates = [r for r in group.get("engines", []) if r["kind"] == "pyg" and _usable(r)]
    return min(candidates, key=_median, default=None)


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow and fast else None


def _features(group: dict) -> str:
    return group.get("features", "labels")


def _template_groups(results: dict) -> list[dict]:
    return [g for g in results["groups"] if g.get("source") == "template" and not g.get("error")]


def headline_rows(results: dict) -> list[dict]:
    """Per template task with a PyG contender: neurovec as a user gets it against the fastest PyG contender.

    ``speedup`` (> 1: neurovec is faster) is the better of the ``default`` preset and
    autotune's pick, both timed in the run; where autotune kept ``default``, the two
    timings are of one program and are pooled instead. ``best`` is the best preset picked
    after timing, reported apart.
    """
    rows = []
    for group in _template_groups(results):
        if not any(r["kind"] == "pyg" for r in group["engines"]):
            continue
        pyg, default, tuned, best = (fastest_pyg(group), _by_name(group, "default"), _by_kind(group, "autotune"),
                                     best_preset(group))
        pyg_step = _median(pyg)
        row = {"task": group["key"], "dataset": group["dataset"], "model": group["model"],
               "features": _features(group), "scale": group["scale"],
               "pyg": pyg["engine"] if pyg else None, "pyg_step": pyg_step,
               "default_step": _median(default), "default_speedup": _ratio(pyg_step, _median(default)),
               "autotune": (tuned.get("build", {}).get("chosen") or "?") if tuned else None,
               "autotune_step": _median(tuned), "autotune_speedup": _ratio(pyg_step, _median(tuned)),
               "best": best["engine"] if best else None, "best_step": _median(best),
               "best_speedup": _ratio(pyg_step, _median(best)),
               "unchecked": any(r and r["status"] != "ok" for r in (pyg, default, tuned))}
        if row["autotune"] == DEFAULT_CONFIGURATION and default and tuned:
            # autotune kept `default`: one program timed twice. The faster of two timings of the
            # same thing is a best-of-2 of noise, so the headline takes both timings pooled.
            row["speedup"] = _ratio(pyg_step, statistics.median(_timed(default) + _timed(tuned)))
        else:
            choices = [x for x in (row["default_speedup"], row["autotune_speedup"]) if x is not None]
            row["speedup"] = max(choices, default=None)
        row["target"] = TARGETS.get(row["features"])
        row["met"] = None if row["speedup"] is None or row["target"] is None else row["speedup"] >= row["target"]
        rows.append(row)
    return rows


def pyg_rows(results: dict) -> list[dict]:
    """Per template task: every PyG contender's step and compile time (None where it did not run)."""
    rows = []
    for group in _template_groups(results):
        records = {r["engine"]: r for r in group["engines"] if r["kind"] == "pyg"}
        if not records:
            continue
        fastest = fastest_pyg(group)
        row = {"task": group["key"], "fastest": fastest["engine"] if fastest else None}
        for name in PYG_NAMES:
            record = records.get(name)
            row[name] = {"step": _median(record) if record and _usable(record) else None,
                         "compile_s": record.get("compile_s") if record else None,
                         "status": record.get("status") if record else None,
                         "reason": (record.get("reason") or record.get("error")
                                    or record.get("check", {}).get("message")) if record else None}
        rows.append(row)
    return rows


def bandwidth(results: dict) -> float | None:
    """The memory bandwidth of the run in bytes/s: the mean of the start and end measurements."""
    values = [m["bytes_per_s"] for m in (results.get("bandwidth") or {}).values() if m and m.get("bytes_per_s")]
    return statistics.fmean(values) if values else None


def _bound(group: dict, results: dict) -> float | None:
    traffic, speed = group.get("traffic"), bandwidth(results)
    return traffic["bytes"] / speed if traffic and speed else None


def limit_rows(results: dict) -> list[dict]:
    """Per task with a byte model: the bandwidth bound of one step and each engine's share of it."""
    rows = []
    for group in _template_groups(results):
        bound = _bound(group, results)
        if bound is None:
            continue
        fastest, best = fastest_pyg(group), best_preset(group)
        row = {"task": group["key"], "bytes": group["traffic"]["bytes"], "bound": bound}
        for label, record in (("default", _by_name(group, "default")), ("autotune", _by_kind(group, "autotune")),
                              ("best", best), ("pyg", fastest)):
            row[label] = _ratio(bound, _median(record))
            row[f"{label}_engine"] = record["engine"] if record else None
        rows.append(row)
    return rows


def neuralogic_rows(results: dict) -> list[dict]:
    """Per NeuraLogic task: its epoch against neurovec's best step on the same imported network.

    When the import failed, neurovec's own template of that dataset and model
    stands in (``same_network`` False).
    """
    templates = {(g["dataset"], g["model"]): g for g in _template_groups(results)
                 if g.get("scale") == 1 and _features(g) == "labels"}
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
    for group in _template_groups(results):
        series.setdefault((group["dataset"], group["model"], _features(group)), []).append(group)
    rows = []
    for (dataset, model, features), groups in series.items():
        if len({g["scale"] for g in groups}) < 2:
            continue
        for group in sorted(groups, key=lambda g: g["scale"]):
            info = group.get("info", {})
            if group.get("memory"):  # the task itself: replicated data, neuron graph, oracle
                rows.append({"dataset": dataset, "model": model, "features": features, "scale": group["scale"],
                             "engine": "(task: data, graph, oracle)", "kind": "task", "neurons": info.get("neurons"),
                             "edges": info.get("edges"), "template_s": info.get("template_s"), "compile_s": None,
                             "step": None, "memory": group["memory"].get("peak_bytes"),
                             "memory_growth": group["memory"].get("growth_bytes")})
            for record in group["engines"]:
                if not _usable(record):
                    continue
                rows.append({"dataset": dataset, "model": model, "features": features, "scale": group["scale"],
                             "engine": record["engine"], "kind": record["kind"], "neurons": info.get("neurons"),
                             "edges": info.get("edges"), "template_s": info.get("template_s"),
                             "compile_s": record.get("compile_s", record.get("build_s")), "step": _median(record),
                             "memory": record.get("memory", {}).get("peak_bytes"),
                             "memory_growth": record.get("memory", {}).get("growth_bytes")})
    return rows


# -- markdown ----------------------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.2f}"


def _s(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds:.2f}"


def _x(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}x"


def _pct(fraction: float | None) -> str:
    return "–" if fraction is None else f"{fraction * 100:.0f}%"


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


def _schedule(config: dict) -> str:
    if config["schedule"] != "interleaved" or not config.get("settle"):
        return config["schedule"]
    return f"interleaved; each engine runs {config['settle']} untimed iteration(s) right before each timed one"


def _header(results: dict) -> list[str]:
    machine, config = results["machine"], results["config"]
    speed = bandwidth(results)
    lines = ["# neurovec benchmark", "",
             f"`{results['command']}`", "",
             f"* started {results['started']}, finished {results.get('finished', '?')}; "
             f"load average {results.get('load_average_start')} -> {results.get('load_average_end')}",
             f"* machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs"
             + (f" ({machine['affinity_cpus']} usable)" if machine.get("affinity_cpus") else "")
             + (f", GPU {machine['gpu']}" if machine.get("gpu") else "")
             + f"; torch {machine['torch']} with {machine['torch_threads']} thread(s); device {config['device']}, "
               f"{config['dtype']}"
             + (f"; memory bandwidth {speed / 1e9:.1f} GB/s (tensor copy)" if speed else ""),
             f"* neurovec {machine['neurovec']} at {(machine.get('neurovec_commit') or '?')[:10]}"
             + (f" ({machine['neurovec_dirty_files']} modified tracked files)" if machine.get("neurovec_dirty_files")
                else "")
             + {True: "; C++ kernels on", False: "; C++ kernels off or unavailable", None: ""}[
                 machine.get("neurovec_native_kernels")],
             f"* {config['warmup']} warm-up + {config['reps']} timed iterations per engine "
             f"({_schedule(config)}); times are medians in ms; a training step is forward + loss (MSE; node tasks: "
             "cross-entropy of the training nodes) + backward + Adam step (fused), full batch; NeuraLogic's step "
             "is one training epoch"]
    if results.get("peak_rss_bytes"):
        lines.append(f"* peak resident memory of the run: {_mb(results['peak_rss_bytes'])} MB (the largest peak of "
                     "any task build or engine)")
    if not results.get("finished"):
        lines.append("* **partial results**: written while the run was going on (or after it stopped); the "
                     "tasks below are those finished by then")
    for note in results.get("notes", []):
        lines.append(f"* note: {note}")
    return lines + [""]


def _headline(results: dict) -> list[str]:
    rows = headline_rows(results)
    if not rows:
        return []
    lines = ["## Headline: neurovec against the fastest PyG contender", "",
             "Speed-up = the fastest PyG contender's training step / neurovec's (> 1: neurovec is faster). "
             "neurovec is what a user gets: the `default` preset, and `autotune`'s pick timed in this run "
             "(interleaved with the others); the headline is the better of the two, or, where autotune "
             "kept `default` (one program timed twice), the median of both timings pooled. Targets: "
             + ", ".join(f"{t}x with {f.replace('labels', 'label')} features" for f, t in TARGETS.items())
             + ". The best preset picked "
             "after timing them all is shown apart: it is not something a user gets without timing.", ""]
    lines += _table(["task", "fastest PyG", "PyG step", "default step", "default", "autotune's pick",
                     "autotune step", "autotune", "**headline**", "target", "met",
                     "best preset, picked after timing", "its speed-up"],
                    [[r["task"] + (" (unchecked)" if r["unchecked"] else ""), r["pyg"] or "–", _ms(r["pyg_step"]),
                      _ms(r["default_step"]), _x(r["default_speedup"]), r["autotune"] or "–",
                      _ms(r["autotune_step"]), _x(r["autotune_speedup"]), f"**{_x(r['speedup'])}**",
                      _x(r["target"]), _mark(r["met"]),
                      f"{r['best']} ({_ms(r['best_step'])})" if r["best"] else "–", _x(r["best_speedup"])]
                     for r in rows])
    lines.append("")
    for features, target in TARGETS.items():
        cells = [r for r in rows if r["features"] == features]
        if cells:
            met = sum(bool(r["met"]) for r in cells)
            lines.append(f"* {features}: {met} of {len(cells)} tasks at >= {target}x")
    return lines + [""]


def _pyg_table(results: dict) -> list[str]:
    rows = pyg_rows(results)
    if not rows:
        return []
    lines = ["## The PyG contenders", "",
             "Training step in ms (compile time in s: build + first forward/backward pass, where `torch.compile` "
             "compiles, cold: a fresh inductor cache). `pyg`: the twin as written (`edge_index`, "
             "`GCNConv(cached=False)`); `pyg-tuned`: `GCNConv(cached=True)` and a sparse CSR `adj_t`; "
             "`pyg-compiled`: `torch.compile` of the cached `edge_index` configuration.", ""]

    def cell(entry: dict) -> str:
        if entry["step"] is not None:
            return f"{_ms(entry['step'])} ({_s(entry['compile_s'])} s)"
        return f"{entry['status']}: {entry['reason']}" if entry["status"] else "–"

    lines += _table(["task"] + list(PYG_NAMES) + ["fastest"],
                    [[r["task"]] + [cell(r[name]) for name in PYG_NAMES] + [r["fastest"] or "–"] for r in rows])
    return lines + [""]


def _limit_table(results: dict) -> list[str]:
    rows = limit_rows(results)
    if not rows:
        return []
    measured = results.get("bandwidth") or {}
    speeds = ", ".join(f"{when} {m['bytes_per_s'] / 1e9:.1f} GB/s" for when, m in measured.items() if m)
    copy = next((m for m in measured.values() if m), {})
    lines = ["## The physical limit", "",
             f"Memory bandwidth: a {copy.get('copy_bytes', 0) / 2 ** 20:.0f} MB tensor copy (read + write), median "
             f"of {copy.get('repeats')}, torch threads {copy.get('threads')}: {speeds}. The bound is the estimated "
             "bytes one training step must move (`neurovec.benchmarks.tasks.step_bytes`: inputs, adjacency, "
             "activations and gradients per layer, each read or written once; weights not counted) at that "
             "bandwidth; each engine's figure is bound / its step, the fraction of the bandwidth it achieves "
             "(above 100%: data stayed in cache).", ""]
    lines += _table(["task", "MB per step", "bound ms", "default", "autotune", "best preset (after timing)",
                     "fastest PyG"],
                    [[r["task"], _mb(r["bytes"]), _ms(r["bound"]), _pct(r["default"]), _pct(r["autotune"]),
                      _pct(r["best"]), f"{_pct(r['pyg'])} ({r['pyg_engine'] or '–'})"] for r in rows])
    return lines + [""]


def _neuralogic_table(results: dict) -> list[str]:
    rows = neuralogic_rows(results)
    if not rows:
        return []
    lines = [f"## neurovec against NeuraLogic's Java CPU engine (target: >= {NEURALOGIC_TARGET}x per epoch)", ""]
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
    lines.append("neurovec's figure here is its best preset, picked after timing. The target is judged on the "
                 "imported network (NeuraLogic's built samples compiled by neurovec). The last two columns time "
                 "neurovec's own template of the same architecture (run with the template task), built from the "
                 "dataset directly.")
    return lines + [""]


def _scaling_table(results: dict) -> list[str]:
    rows = scaling_rows(results)
    if not rows:
        return []
    lines = ["## Scaling (the dataset replicated k times, one batch)", "",
             "Compile s: build + first forward/backward pass. Peak RSS: the process's peak resident memory "
             "from the engine's build through its warm-up (the kernel's high-water mark where available).", ""]
    lines += _table(["dataset/model", "features", "k", "engine", "neurons", "edges", "template s", "compile s",
                     "step ms", "peak RSS MB", "growth MB"],
                    [[f"{r['dataset']}/{r['model']}", r["features"], r["scale"], r["engine"], r["neurons"] or "–",
                      r["edges"] or "–", _s(r["template_s"]), _s(r["compile_s"]), _ms(r["step"]), _mb(r["memory"]),
                      _mb(r["memory_growth"])]
                     for r in rows])
    return lines + [""]


def markdown(results: dict) -> str:
    lines = _header(results)
    for section in (_headline, _pyg_table, _limit_table, _neuralogic_table, _scaling_table):
        lines += section(results)
    lines += ["## Every engine, per task", ""]
    for group in results["groups"]:
        lines += _group_table(group, results)
    return "\n".join(lines) + "\n"


def _group_table(group: dict, results: dict) -> list[str]:
    info = group.get("info", {})
    lines = [f"### {group['key']}", ""]
    if group.get("error"):
        return lines + [f"The task could not be built: {group['error']}", ""]
    sizes = ", ".join(f"{info[k]} {k.replace('_', ' ')}" for k in ("samples", "neurons", "edges", "batch_nodes",
                                                                   "batch_edges") if k in info)
    if sizes:
        lines.append(f"{sizes}; oracle: {(group.get('oracle') or {}).get('name', 'none')}")
    for note in group.get("notes", []):
        lines.append(f"* note: {note}")
    lines.append("")
    fastest, best, bound = fastest_pyg(group), best_preset(group), _bound(group, results)
    rows = []
    for record in group["engines"]:
        name = record["engine"] + (" (best preset)" if record is best else "") \
            + (" (fastest PyG)" if record is fastest else "")
        if record["kind"] == "autotune" and record.get("build", {}).get("chosen"):
            name += f" -> {record['build']['chosen']}"
        status = record.get("status")
        if status in ("skipped", "failed", "out of memory"):
            rows.append([name, f"{status}: {record.get('reason') or record.get('error')}"] + ["–"] * 8)
            continue
        if status == "invalid":
            status = f"**invalid**: {record['check'].get('message')}"
        stats = record.get("stats", {})
        step = stats.get("step", {})
        spread = f" [{_ms(step.get('q1'))}–{_ms(step.get('q3'))}]" if step.get("n", 0) > 1 else ""
        rows.append([name, status, _s(record.get("compile_s", record.get("build_s"))),
                     _ms(_median(record, "forward")), _ms(_median(record, "backward")),
                     _ms(step.get("median")) + spread, _pct(_ratio(bound, step.get("median"))),
                     _mb(record.get("memory", {}).get("peak_bytes")), _mb(_memory_growth(record)),
                     _x(_ratio(_median(fastest), step.get("median"))) if fastest else "–"])
    lines += _table(["engine", "status", "compile s", "forward", "backward", "step [q1–q3]", "of bound",
                     "peak RSS MB", "growth MB", "vs fastest PyG"], rows)
    return lines + [""]


# -- plots -------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def _style_key(record: dict, group: dict) -> str:
    if record.get("status") == "invalid":
        return "invalid"
    if record["kind"] == "neurovec" and record["engine"] == "default":
        return "default"  # even when it is also the best preset: the headline's engine keeps its colour
    if record is best_preset(group):
        return "best"
    if record["kind"] == "neurovec":
        return "preset"
    if record["kind"] == "pyg":
        return record["engine"] if record["engine"] in STYLE else "pyg"
    return record["kind"] if record["kind"] in STYLE else "custom"


def _color(record: dict, group: dict) -> str:
    return STYLE[_style_key(record, group)][0]


def _short(record: dict) -> str:
    return {"neuralogic": "NeuraLogic", "autotune": "autotune"}.get(record["kind"], record["engine"])


def _legend(figure, keys, extra: tuple = ()) -> int:
    """One legend for the figure naming every colour used (in STYLE order); returns its number of rows."""
    from matplotlib.patches import Patch
    used = [k for k in STYLE if k in set(keys)]
    handles = [Patch(facecolor=STYLE[k][0], hatch="//" if k == "invalid" else None, label=STYLE[k][1])
               for k in used] + list(extra)
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    return math.ceil(len(handles) / 4)


def _grid(plt, n: int, width: float = 5.5, height: float = 3.6, sharey: bool = False):
    columns = min(n, 3)
    rows = math.ceil(n / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows + 0.8), squeeze=False,
                                sharey=sharey)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return figure, list(axes.flat[:n])


def _finish(figure, title: str, path: Path, legend_rows: int = 1) -> None:
    """Title at the top, the legend below the panels, then save and close."""
    figure.suptitle(title)
    height = figure.get_figheight()
    figure.tight_layout(rect=(0, (0.15 + 0.22 * legend_rows) / height, 1, 1 - 0.35 / height))
    figure.savefig(path, dpi=90)
    _plt().close(figure)


def _plain_ticks(ax) -> None:
    """Tick labels as plain numbers (``20``, not ``2 x 10^1``), on either scale."""
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}" if str(f"{y:g}")[0] in "25" else ""))


def _log_scale(values: list[float]) -> bool:
    """One y-scale for a whole figure: logarithmic when its values span more than 20x."""
    values = [v for v in values if v and v > 0]
    return bool(values) and max(values) / min(values) > 20


def _timed_groups(results: dict) -> list[dict]:
    return [g for g in results["groups"] if any(_median(r) is not None for r in g.get("engines", []))]


def plot_speedup(results: dict, path: Path) -> bool:
    """The headline speed-up per task: labels and continuous features, parity and the targets marked."""
    rows = [r for r in headline_rows(results) if r["speedup"] is not None]
    if not rows:
        return False
    plt = _plt()
    tasks = list(dict.fromkeys(f"{r['dataset']}/{r['model']}" + (f" x{r['scale']}" if r["scale"] != 1 else "")
                               for r in rows))
    modes = [m for m in TARGETS if any(r["features"] == m for r in rows)]
    colors = {"labels": "tab:blue", "continuous": "tab:cyan"}
    figure, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(tasks) + 2) + 3.5, 5.2))
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        values = {f"{r['dataset']}/{r['model']}" + (f" x{r['scale']}" if r["scale"] != 1 else ""): r["speedup"]
                  for r in rows if r["features"] == mode}
        xs = [i + (k - (len(modes) - 1) / 2) * width for i, t in enumerate(tasks) if t in values]
        ys = [values[t] for t in tasks if t in values]
        bars = ax.bar(xs, ys, width, color=colors.get(mode, "tab:gray"), label=f"{mode.replace('labels', 'label')} features")
        ax.bar_label(bars, labels=[f"{y:.2f}x" for y in ys], fontsize=7, padding=2)
    ax.axhline(1.0, color="black", linewidth=1.2, label="1x: as fast as the fastest PyG")
    ax.axhline(TARGETS["labels"], color="tab:blue", linestyle="--", linewidth=1,
               label=f"target with labels: {TARGETS['labels']}x")
    ax.axhline(TARGETS["continuous"], color="tab:cyan", linestyle=":", linewidth=1.5,
               label=f"target with continuous features: {TARGETS['continuous']}x")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(_plt().FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(tasks) - 0.4 if len(tasks) > 2 else 2.4)
    ax.set_ylabel("speed-up per training step (log scale)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("headline speed-up: neurovec (default or autotune's pick)\nagainst the fastest PyG contender "
                 "(> 1x: neurovec is faster)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


def plot_engines(results: dict, lap: str, path: Path) -> bool:
    """Figs. 6.1/6.2: one panel per task, a box per engine over its timed repetitions (outliers hidden)."""
    groups = [g for g in _timed_groups(results) if any(_median(r, lap) is not None for r in g["engines"])]
    if not groups:
        return False
    plt = _plt()
    figure, axes = _grid(plt, len(groups), width=max(5.5, 0.32 * max(len(g["engines"]) for g in groups) + 2))
    everything, used = [], []
    for ax, group in zip(axes, groups):
        records = [r for r in group["engines"] if _median(r, lap) is not None]
        data = [[v * 1e3 for v in r["raw"][lap][r["warmup"]:]] or [0.0] for r in records]
        everything += [v for d in data for v in d]
        boxes = ax.boxplot(data, showfliers=False, patch_artist=True, widths=0.6,
                           medianprops={"color": "black"})
        for patch, record in zip(boxes["boxes"], records):
            key = _style_key(record, group)
            used.append(key)
            patch.set_facecolor(STYLE[key][0])
            if key == "invalid":
                patch.set_hatch("//")
        ax.set_xticks(range(1, len(records) + 1), [_short(r) for r in records], rotation=75, fontsize=7)
        ax.set_title(group["key"], fontsize=9)
        ax.set_ylabel(f"{lap} time (ms)")
        ax.grid(axis="y", alpha=0.3)
    scale = "log" if _log_scale(everything) else "linear"
    for ax in axes:
        ax.set_yscale(scale)
        _plain_ticks(ax)
    from matplotlib.lines import Line2D
    rows = _legend(figure, used, (Line2D([], [], color="black", label="median"),))
    _finish(figure, f"{lap} time per engine ({scale} scale; boxes: quartiles over the timed repetitions)", path,
            rows)
    return True


def _baselines(group: dict) -> list[dict]:
    """default, autotune, the best preset (after timing), then every PyG contender and NeuraLogic."""
    chosen = []
    for record in (_by_name(group, "default"), _by_kind(group, "autotune"), best_preset(group)):
        if record is not None and all(record is not c for c in chosen):
            chosen.append(record)
    chosen += [r for r in group.get("engines", []) if r["kind"] in ("pyg", "neuralogic") and _usable(r)]
    return chosen


def plot_iterations(results: dict, path: Path) -> bool:
    """Fig. 6.3: training step time iteration by iteration (warm-up shaded), neurovec vs the baselines."""
    groups = [g for g in _timed_groups(results) if _baselines(g)]
    if not groups:
        return False
    plt = _plt()
    figure, axes = _grid(plt, len(groups))
    used = []
    for ax, group in zip(axes, groups):
        for record in _baselines(group):
            key = _style_key(record, group)
            used.append(key)
            values = [v * 1e3 for v in record["raw"]["step"]]
            ax.plot(range(1, len(values) + 1), values, marker=".", color=STYLE[key][0])
        warmup = max((r["warmup"] for r in _baselines(group)), default=0)
        if warmup:
            ax.axvspan(0.5, warmup + 0.5, color="0.9", zorder=0)
        ax.set_title(group["key"], fontsize=9)
        ax.set_xlabel("iteration (shaded: warm-up, not counted)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("training step (ms)")
        ax.set_yscale("log")
        _plain_ticks(ax)
        ax.grid(alpha=0.3)
    from matplotlib.patches import Patch
    rows = _legend(figure, used, (Patch(facecolor="0.9", label="warm-up (not counted)"),))
    _finish(figure, "training step per iteration (log scale)", path, rows)
    return True


def plot_best(results: dict, path: Path) -> bool:
    """Figs. 6.13/6.14: forward, backward and training step of neurovec against the PyG contenders."""
    groups = [g for g in _timed_groups(results) if _baselines(g)]
    if not groups:
        return False
    plt = _plt()
    figure, axes = _grid(plt, len(groups))
    laps = ("forward", "backward", "step")
    used = []
    for ax, group in zip(axes, groups):
        records = _baselines(group)
        width = 0.8 / len(records)
        for k, record in enumerate(records):
            key = _style_key(record, group)
            used.append(key)
            heights = [(_median(record, lap) or 0.0) * 1e3 for lap in laps]
            ax.bar([i + k * width for i in range(len(laps))], heights, width, color=STYLE[key][0])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(laps))], ["forward", "backward", "training step"])
        ax.set_title(group["key"], fontsize=9)
        ax.set_ylabel("median time (ms)")
        ax.grid(axis="y", alpha=0.3)
    rows = _legend(figure, used)
    _finish(figure, "median times (linear scale); NeuraLogic's step is an epoch", path, rows)
    return True


def plot_scaling(results: dict, path: Path) -> bool:
    """Compile time, training step and peak RSS against the replication factor, per engine (log-log)."""
    rows = scaling_rows(results)
    if not rows:
        return False
    plt = _plt()
    figure, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    series: dict[tuple, list] = {}
    for row in rows:
        if row["kind"] != "task":
            series.setdefault((f"{row['dataset']}/{row['model']} {row['features']}", row["engine"]), []).append(row)
    handles = []
    tasks = list(dict.fromkeys(task for task, _ in series))
    others = iter(f"C{k}" for k in range(4, 10))  # colours for presets that have no STYLE entry
    colors: dict[str, str] = {}
    for (task, engine), points in series.items():
        points.sort(key=lambda r: r["scale"])
        color = colors.setdefault(engine, STYLE[engine][0] if engine in STYLE else next(others, "tab:olive"))
        style = dict(marker="o", color=color, linestyle=("-", "--", ":", "-.")[tasks.index(task) % 4])
        scales = [p["scale"] for p in points]
        (line,) = axes[0].plot(scales, [p["compile_s"] for p in points], label=f"{task}: {engine}", **style)
        axes[1].plot(scales, [p["step"] * 1e3 for p in points], **style)
        axes[2].plot(scales, [(p["memory"] or 0) / 2 ** 20 for p in points], **style)
        handles.append(line)
    for task in tasks:  # the task's own memory (replicated data, neuron graph, oracle), for scale
        points = sorted((r for r in rows if r["kind"] == "task"
                         and f"{r['dataset']}/{r['model']} {r['features']}" == task), key=lambda r: r["scale"])
        if points:
            (line,) = axes[2].plot([p["scale"] for p in points], [(p["memory"] or 0) / 2 ** 20 for p in points],
                                   marker="s", color="black", linestyle=("-", "--", ":", "-.")[tasks.index(task) % 4],
                                   label=f"{task}: the task (data, graph, oracle)")
            handles.append(line)
    for ax, title in zip(axes, ("compile time (s): build + first pass", "training step (ms)", "peak RSS (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(_plt().FuncFormatter(lambda x, _: f"{x:g}"))
        _plain_ticks(ax)
        ax.set_xlabel("replication factor k")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    _finish(figure, "scaling (log-log)", path, legend_rows=math.ceil(len(handles) / 4))
    return True


# -- files -------------------------------------------------------------------------------------------------
def write(results: dict, out_dir: str | Path, plots: bool = True, raw: bool = True) -> dict[str, Path]:
    """Write ``results.json`` (unless not ``raw``), ``results.md`` and (with ``plots``) the PNGs.

    Returns the written paths by name. The JSON goes through a temporary file, so
    that a run killed while writing leaves the previous (partial) results intact.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md"}
    if raw:
        paths["json"] = out / "results.json"
        partial = out / "results.json.tmp"
        partial.write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
        partial.replace(paths["json"])
    paths["markdown"].write_text(markdown(results))
    if plots:
        if plot_speedup(results, out / "speedup.png"):
            paths["speedup"] = out / "speedup.png"
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
