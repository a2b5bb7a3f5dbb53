"""Relational GNNs with many relation types: neurovec against PyG's RGCNConv and FastRGCNConv, and NeuraLogic.

    python -m neurovec.benchmarks.kg --data ../shared/data/kg --threads 1 2 --out kg-results   # every cell
    python -m neurovec.benchmarks.kg --cells kinships umls --contenders default pyg pyg-fast  # a part
    python -m neurovec.benchmarks.kg --grounding --data ../shared/data/kg --out kg-grounding   # grounding only

Cells (one training step each: forward, loss, backward, Adam; float32; full batch):

* ``kinships``, ``umls``: link prediction, an RGCN encoder (2 layers of 32, a weight per edge type, the inverse
  triples as their own types: 50 and 92 types) and a DistMult decoder, all training triples against as many
  fresh negatives (one each, as PyG's RGCN link-prediction example), drawn in torch each step (binary
  cross-entropy). The decoder is the same torch code for every contender. neurovec's encoder is compiled once, the
  embeddings its dynamic facts (``datasets/link_prediction.py``);
* ``hetero-10``, ``hetero-100``: entity classification on a synthetic heterogeneous graph
  (``datasets.kg.synthetic_hetero``: 100,000 nodes, 1,000,000 edges, 16 features, 4 classes) with 10 and with
  100 relation types: RGCN 16 -> 16 -> 4, cross-entropy over the training nodes;
* ``kinships-rules``: the link-prediction template written as rules (``datasets/kg_rules.py``, width 8), 250
  test triples and 250 corruptions of their tails as queries (targets 1 and 0, mean squared error; a
  corruption that is one of the triples is asked once): neurovec compiles the
  grounded graph, NeuraLogic trains the same template in its own engine (``model.train(built, epochs=1)``,
  Adam, its default build settings). Its row also gives both groundings' times.

Contenders: ``default`` and ``autotune`` (neurovec as a user gets it; autotune's tuning is its compile time),
``pyg`` (RGCNConv) and ``pyg-fast`` (FastRGCNConv) eager, ``pyg-compiled`` and ``pyg-fast-compiled`` under
``torch.compile`` (the encoder module), ``neuralogic`` (rules cell only).

Every contender runs alone in a fresh process (``--child``), under ``torch.set_num_threads`` and
``OMP_NUM_THREADS``: compiled contenders never share a process, and none inherits another's memory. Before
timing, each contender's first loss is compared with the float64 PyG twin's (relative 1e-4): a mismatch marks
the row invalid. Times are medians of ``--reps`` steps after ``--warmup``. The headline per cell: neurovec
(``default``; ``autotune``) against the fastest valid PyG contender; targets 2x on every cell and 5x at 100
relation types. Results go to ``--out`` (``results.json``, ``results.md``) as they come.

``--malloc keep``: every contender's process, once built, tells glibc's malloc to serve large blocks from its heap
and keep freed ones there (``mallopt(M_MMAP_MAX, 0)``, never trim). By default glibc maps every block over 32 MB
afresh and unmaps it when freed, so each (1M, 16) float32 intermediate of the hetero cells (66 MB) page-faults
anew at every step: a process that starts training right after ``neurovec.compile`` spent half its 100-relation
step in the kernel (loaded: 330 ms per step, 81,000 page faults; with ``keep`` 152 ms, 3,200). How much a process
pays depends on what its heap held before (the benchmark's child, which runs the float64 oracle first: 166 ms,
152 ms with ``keep``); ``keep`` makes every contender independent of that. It is off by default (not what a user
gets unless the process sets it).

``--grounding`` (instead of the cells): the rule template of the ``kinships-rules`` cell on Kinship and UMLS,
neurovec's grounding against NeuraLogic's ``build_dataset`` (``grounding.json``, ``grounding.md``; see
:func:`grounding_markdown`). NeuraLogic runs in a fresh process (one JVM), ``1 + --grounding-repeats`` builds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "CELLS", "CONTENDERS", "run_child"]

CELLS = ("kinships", "umls", "hetero-10", "hetero-100", "kinships-rules")
CONTENDERS = ("default", "autotune", "pyg", "pyg-fast", "pyg-compiled", "pyg-fast-compiled",
              "neuralogic")
PYG = ("pyg", "pyg-fast", "pyg-compiled", "pyg-fast-compiled")
TARGETS = {"hetero-100": 5.0}
DEFAULT_TARGET = 2.0
LINK_DIM, LINK_NEGATIVES, RULES_DIM, RULES_QUERIES = 32, 1, 8, 500
HETERO = dict(n_nodes=100_000, n_edges=1_000_000, n_features=16, n_classes=4)


# -- one contender on one cell (in its own process) -------------------------------------------------------------
def _adam(params):
    import torch
    try:
        return torch.optim.Adam(params, lr=1e-3, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.Adam(params, lr=1e-3)


def _compile_neurovec(graph, contender, dtype, dynamic=(), budget=120.0):
    import neurovec
    from neurovec import Settings
    from neurovec.compiler import list_presets

    start = time.perf_counter()
    if contender == "autotune":
        names = list_presets()
        # With dynamic facts every candidate must keep them replaceable: Settings objects, which autotune
        # labels custom-1, custom-2, ... in the order given (mapped back to the preset names here).
        presets = [Settings.preset(p, dynamic_facts=tuple(dynamic)) for p in names] if dynamic else None
        result = neurovec.autotune(graph, presets=presets, budget_s=budget, dtype=dtype, progress=False)
        chosen = str(result.preset)
        if dynamic and chosen.startswith("custom-"):
            chosen = names[int(chosen.split("-")[1]) - 1]
        module, details = result.module, {"chosen": f"{chosen}/{result.kernel}"}
    else:
        module = neurovec.compile(graph, Settings.preset("default", dynamic_facts=tuple(dynamic), verify=False),
                                  dtype)
        details = {}
    details["compile_s"] = time.perf_counter() - start
    return module, details


class _Step:
    """``step()`` one training step; ``first_loss`` the loss at the initial weights; ``details``."""

    def __init__(self, loss_fn, params):
        self.loss_fn, self.optimizer = loss_fn, _adam(params)
        self.details = {}

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn()
        loss.backward()
        self.optimizer.step()
        return loss


def _link_cell(name, contender, data, budget):
    import torch

    from neurovec.datasets import kg as kgmod
    from neurovec.datasets import rgcn
    from neurovec.datasets.link_prediction import LinkPredictor, NeurovecEncoder, corrupt

    graph_kg = kgmod.load_kg(name, data_dir=data)
    encoder_graph = rgcn.rgcn_encoder(graph_kg, hidden=LINK_DIM, layers=2, seed=0)
    positives = torch.from_numpy(graph_kg.train)
    edges = graph_kg.message_edges()

    def model_for(kind, dtype):
        details = {}
        if kind in ("default", "autotune"):
            module, details = _compile_neurovec(encoder_graph, kind, dtype, ("x",), budget)
            encoder = NeurovecEncoder(module)
        else:
            from neurovec.datasets import kg_twins
            base, _ = _compile_neurovec(encoder_graph, "default", torch.float64, ("x",))
            spec = rgcn.RGCNSpec.create(LINK_DIM, 2 * graph_kg.n_relations, [LINK_DIM] * 2)
            twin = kg_twins.RGCNTwin(spec, fast="fast" in kind).to(dtype)
            kg_twins.copy_weights(base, twin)
            start = time.perf_counter()
            encoder = kg_twins.TwinEncoder(twin, *edges)
            if "compiled" in kind:
                torch._dynamo.reset()
                encoder.twin = torch.compile(twin)
            details["compile_s"] = time.perf_counter() - start  # torch.compile's work is in the first step
        model = LinkPredictor(encoder, graph_kg.n_entities, graph_kg.n_relations, LINK_DIM, seed=0, dtype=dtype)
        return model, details

    def first_loss(model):
        negatives = corrupt(positives, graph_kg.n_entities, LINK_NEGATIVES, torch.Generator().manual_seed(0))
        return float(model.loss(positives, negatives).detach())

    oracle, _ = model_for("pyg", torch.float64)
    expected = first_loss(oracle)
    model, details = model_for(contender, torch.float32)
    generator = torch.Generator().manual_seed(1)
    runner = _Step(lambda: model.loss(positives, corrupt(positives, graph_kg.n_entities, LINK_NEGATIVES, generator)),
                   list(model.parameters()))
    runner.details = {**details, "triples": int(len(positives)), "edge_types": 2 * graph_kg.n_relations}
    return runner, first_loss(model), expected


def _hetero_cell(relations, contender, budget):
    import torch

    from neurovec.datasets import kg as kgmod
    from neurovec.datasets import rgcn

    data = kgmod.synthetic_hetero(n_relations=relations, seed=0, **HETERO)
    spec = rgcn.RGCNSpec.create(HETERO["n_features"], relations, [16, HETERO["n_classes"]])
    graph = rgcn.rgcn(data.x, data.edge_index, data.edge_type, spec, seed=0)
    labels = torch.from_numpy(data.labels[data.train_nodes])
    train = torch.from_numpy(data.train_nodes)
    edge_index, edge_type = torch.from_numpy(data.edge_index), torch.from_numpy(data.edge_type)

    def forward_for(kind, dtype):
        details = {}
        if kind in ("default", "autotune"):
            module, details = _compile_neurovec(graph, kind, dtype, (), budget)
            return module, (lambda: module()), list(module.parameters()), details
        from neurovec.datasets import kg_twins
        twin = kg_twins.RGCNTwin(spec, fast="fast" in kind).to(dtype)
        with torch.no_grad():
            for name, param in twin.named_parameters():
                param.copy_(torch.from_numpy(_template_value(graph, name, param.shape)))
        x = torch.from_numpy(data.x).to(dtype)
        run = twin
        if "compiled" in kind:
            torch._dynamo.reset()
            run = torch.compile(twin)
        return twin, (lambda: run(x, edge_index, edge_type)), list(twin.parameters()), details

    def loss_of(out):
        return torch.nn.functional.cross_entropy(out[train], labels)

    _, oracle_forward, _, _ = forward_for("pyg", torch.float64)
    expected = float(loss_of(oracle_forward()).detach())
    _, forward, params, details = forward_for(contender, torch.float32)
    runner = _Step(lambda: loss_of(forward()), params)
    runner.details = {**details, "nodes": HETERO["n_nodes"], "edges": HETERO["n_edges"], "edge_types": relations}
    return runner, float(loss_of(forward()).detach()), expected


def _template_value(graph, twin_name, shape):
    """The template's initial value of a twin parameter (neurovec weights translated to PyG's layout)."""
    import torch

    from neurovec.datasets.kg_twins import neurovec_to_twin

    weights = {w.name: torch.from_numpy(w.value) for w in graph.weights}
    return neurovec_to_twin(weights, {twin_name: shape})[twin_name].numpy()


def _rules_cell(contender, data, budget):
    import torch

    from neurovec.datasets import kg as kgmod
    from neurovec.datasets import kg_rules

    graph_kg = kgmod.load_kg("kinships", data_dir=data)
    triples, targets = _rules_queries(graph_kg)
    n_types = 2 * graph_kg.n_relations
    values = kg_rules.initial_values(graph_kg.n_entities, n_types, graph_kg.n_relations, RULES_DIM)
    template = kg_rules.template(graph_kg.n_entities, n_types, graph_kg.n_relations, RULES_DIM, values=values)
    facts, queries = kg_rules.facts(graph_kg, triples), kg_rules.queries(triples)
    start = time.perf_counter()
    graph = template.ground(facts, queries)
    ground_s = time.perf_counter() - start
    details = {"ground_s": ground_s, "queries": len(triples), "neurons": graph.n_neurons}
    if contender == "neuralogic":
        return _neuralogic_rules(graph_kg, triples, targets, values, details)
    import neurovec
    reference = neurovec.compile(graph, "unoptimized", torch.float64)
    expected = float(((reference().reshape(-1) - torch.from_numpy(targets)) ** 2).mean())
    module, compile_details = _compile_neurovec(graph, contender, torch.float32, (), budget)
    target = torch.from_numpy(targets).float()
    runner = _Step(lambda: ((module().reshape(-1) - target) ** 2).mean(), list(module.parameters()))
    runner.details = {**details, **compile_details}
    return runner, float(runner.loss_fn().detach()), expected


def _rules_queries(graph_kg) -> tuple[np.ndarray, np.ndarray]:
    """The rules cell's queries: ``RULES_QUERIES / 2`` test triples and as many corruptions of their tails (targets
    1 and 0), a corruption that is one of the triples asked once."""
    rng = np.random.default_rng(0)
    positives = graph_kg.test[:RULES_QUERIES // 2]
    negatives = positives.copy()
    negatives[:, 2] = rng.integers(0, graph_kg.n_entities, len(negatives))
    triples = np.concatenate([positives, negatives])
    targets = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
    _, first = np.unique(triples, axis=0, return_index=True)
    keep = np.sort(first)
    return triples[keep], targets[keep]


class _NeuraLogicStep:
    def __init__(self, model, built, details):
        self.model, self.built, self.details = model, built, details

    def step(self):
        self.model.train(self.built, epochs=1)


def _neuralogic_rules(graph_kg, triples, targets, values, details):
    import neuralogic.logging
    from neuralogic.core import R, Settings
    from neuralogic.nn.loss import MSE
    from neuralogic.nn.optim import Adam

    from neurovec.datasets import kg_rules

    neuralogic.logging.clear_handlers()
    model, dataset = kg_rules.neuralogic_model(graph_kg, triples, RULES_DIM, values=values)
    sample = dataset.samples[0]
    sample.query = [R.score(str(q.terms[0]), str(q.terms[1]), str(q.terms[2]))[float(t)]
                    for q, t in zip(sample.query, targets)]
    start = time.perf_counter()
    model.build(Settings(optimizer=Adam(lr=1e-3), error_function=MSE()))
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    built = model.build_dataset(dataset)
    details = {**details, "neuralogic_build_s": build_s, "neuralogic_build_dataset_s": time.perf_counter() - start}
    outputs = np.asarray(model.test(built), dtype=np.float64).reshape(-1)
    loss = float(((outputs - targets) ** 2).mean())
    return _NeuraLogicStep(model, built, details), loss, None


def _keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve large blocks from its heap and keep freed ones there (see ``--malloc``)."""
    from neurovec import memory
    libc = memory._LIBC
    if libc is None:
        return False
    libc.mallopt(memory._M_MMAP_MAX, 0)
    libc.mallopt(memory._M_TRIM_THRESHOLD, memory._KEEP)
    return True


def run_child(cell: str, contender: str, threads: int, reps: int, warmup: int, data: str | None,
              budget: float, malloc: str = "default") -> dict:
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    if cell in ("kinships", "umls"):
        runner, loss, expected = _link_cell(cell, contender, data, budget)
    elif cell.startswith("hetero-"):
        runner, loss, expected = _hetero_cell(int(cell.split("-")[1]), contender, budget)
    else:
        runner, loss, expected = _rules_cell(contender, data, budget)
    build_s = time.perf_counter() - start
    if malloc == "keep" and not _keep_freed_memory():
        malloc = "default (not glibc)"
    valid = expected is None or abs(loss - expected) <= 1e-4 * max(1.0, abs(expected))
    start = time.perf_counter()
    runner.step()                    # torch.compile compiles here; PyG caches its masks
    first_s = time.perf_counter() - start
    for _ in range(warmup):
        runner.step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        runner.step()
        times.append(time.perf_counter() - start)
    return {"cell": cell, "contender": contender, "threads": threads, "valid": bool(valid), "first_loss": loss,
            "oracle_loss": expected, "build_s": build_s, "first_step_s": first_s, "step_s": float(np.median(times)),
            "steps_s": times, "malloc": malloc, **runner.details}


# -- grounding: the rule template, native against NeuraLogic's build_dataset -----------------------------------------
def _rules_job(name: str, data: str | None):
    from neurovec.datasets import kg as kgmod
    from neurovec.datasets import kg_rules

    graph_kg = kgmod.load_kg(name, data_dir=data)
    triples, _ = _rules_queries(graph_kg)
    n_types = 2 * graph_kg.n_relations
    values = kg_rules.initial_values(graph_kg.n_entities, n_types, graph_kg.n_relations, RULES_DIM)
    return graph_kg, triples, n_types, values


class NativeGrounding:
    """neurovec's grounding of the rule template on one knowledge graph, timed two ways (:meth:`burst`)."""

    def __init__(self, name: str, data: str | None):
        from neurovec.datasets import kg_rules

        self.name = name
        graph_kg, triples, n_types, values = _rules_job(name, data)
        self._kg, self._triples, self._n_types, self._values = graph_kg, triples, n_types, values
        self.template, self.facts = self._make_template(), kg_rules.facts(graph_kg, triples)
        self.queries = kg_rules.queries(triples)
        graph = self.everything()  # imports and first-use costs out of the timings
        self.info = {"dataset": name, "queries": int(len(triples)),
                     "message_edges": int(graph_kg.message_edges()[1].size), "rules": int(2 * (n_types + 2) + 2),
                     "neurons": int(graph.n_neurons)}
        self.times = {"ground": [], "native": []}

    def _make_template(self):
        from neurovec.datasets import kg_rules

        return kg_rules.template(self._kg.n_entities, self._n_types, self._kg.n_relations, RULES_DIM,
                                 values=self._values)

    def ground(self):
        """``template.ground(facts, queries)``, the template and the relations made beforehand (as NeuraLogic's
        ``build_dataset`` starts from a built model and a dataset made in Python)."""
        return self.template.ground(self.facts, self.queries)

    def everything(self):
        """From the weights and the relation arrays to a validated ``neurovec.Graph``."""
        from neurovec.datasets import kg_rules

        return self._make_template().ground(kg_rules.facts(self._kg, self._triples), kg_rules.queries(self._triples))

    def burst(self, repeats: int, seconds: float = 0.0) -> list:
        """``repeats`` runs of each way (interleaved), more while they took under ``seconds``; the ground times."""
        import gc

        gc.collect()
        gc.freeze()  # what exists now is never collected again: a collection is not part of a grounding
        mine, started = [], time.perf_counter()
        while len(mine) < repeats or (time.perf_counter() - started < seconds and len(mine) < 500):
            for key, run in (("ground", self.ground), ("native", self.everything)):
                start = time.perf_counter()
                run()
                self.times[key].append(time.perf_counter() - start)
            mine.append(self.times["ground"][-1])
        gc.unfreeze()
        return mine

    def result(self) -> dict:
        return {**self.info, "ground_s": float(np.median(self.times["ground"])),
                "native_s": float(np.median(self.times["native"])), "native_runs": len(self.times["ground"])}


def grounding_native(name: str, data: str | None, repeats: int, seconds: float) -> dict:
    """Medians of :class:`NativeGrounding`'s two timings (``ground_s``, ``native_s``)."""
    job = NativeGrounding(name, data)
    job.burst(repeats, seconds)
    return job.result()


def _grounding_neuralogic_child(name: str, data: str | None, repeats: int) -> None:
    """In a fresh process (one JVM): NeuraLogic's ``model.build`` and ``build_dataset`` of the same template and data,
    1 + ``repeats`` times (the first warms the JVM up; an attempt over a minute ends the series), each when a line
    comes on stdin (the parent times neurovec in between), a JSON line per attempt."""
    import neuralogic.logging
    from neuralogic.core import Settings

    from neurovec.datasets import kg_rules

    neuralogic.logging.clear_handlers()
    graph_kg, triples, _, values = _rules_job(name, data)
    for attempt in range(1 + repeats):
        model, dataset = kg_rules.neuralogic_model(graph_kg, triples, RULES_DIM, values=values)
        if not sys.stdin.readline():
            return
        start = time.perf_counter()
        # NeuraLogic's fastest build (its default chain pruning and value compression are slower).
        model.build(Settings(chain_pruning=False, iso_value_compression=False))
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        built = model.build_dataset(dataset)
        dataset_s = time.perf_counter() - start
        print(json.dumps({"attempt": attempt, "build_s": build_s, "build_dataset_s": dataset_s,
                          "samples": len(built)}), flush=True)
        if build_s + dataset_s > 60:
            break


def grounding_neuralogic(name: str, data: str | None, repeats: int, timeout: float,
                         native: NativeGrounding | None = None, native_repeats: int = 10) -> dict:
    """NeuraLogic's builds in a fresh process; with ``native``, a burst of neurovec's grounding before the first
    build and after each, so that each warm build has neurovec's runs of just before and just after it, under
    the same load: ``ratio`` is the median over those builds of build_dataset / the median of those runs."""
    import threading

    command = [sys.executable, "-m", "neurovec.benchmarks.kg", "--grounding-child", name,
               "--grounding-repeats", str(repeats)] + (["--data", data] if data else [])
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    expired = threading.Event()

    def stop():
        expired.set()
        child.kill()

    timer = threading.Timer(timeout, stop)
    timer.start()
    attempts, bursts = [], []
    try:
        for _ in range(1 + repeats):
            if native is not None:
                bursts.append(native.burst(native_repeats))
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
            while line and not line.startswith("{"):  # anything else the JVM prints
                line = child.stdout.readline()
            if not line:
                break
            attempts.append(json.loads(line))
            if attempts[-1]["build_s"] + attempts[-1]["build_dataset_s"] > 60:
                break
        if native is not None and attempts:
            bursts.append(native.burst(native_repeats))
        child.stdin.close()
        error = child.stderr.read()[-400:] if child.wait() else ""
    except (BrokenPipeError, OSError) as failure:
        error = str(failure)
    finally:
        timer.cancel()
        if child.poll() is None:
            child.kill()
    result = {"neuralogic_attempts": attempts}
    if expired.is_set():
        error = f"timeout {timeout} s"
    if error and len(attempts) < 1 + repeats:
        result["neuralogic_failed"] = error.strip().splitlines()[-1] if error.strip() else "failed"
    if attempts:
        warm = attempts[1:] or attempts  # the first build warms the JVM up
        result["neuralogic_build_dataset_s"] = float(np.median([a["build_dataset_s"] for a in warm]))
        result["neuralogic_total_s"] = float(np.median([a["build_s"] + a["build_dataset_s"] for a in warm]))
        result["neuralogic_first_s"] = attempts[0]["build_s"] + attempts[0]["build_dataset_s"]
        if native is not None and len(bursts) > len(attempts):
            rounds = range(1, len(attempts)) if len(attempts) > 1 else range(len(attempts))
            result["ratio"] = float(np.median([attempts[k]["build_dataset_s"] /
                                               np.median(bursts[k] + bursts[k + 1]) for k in rounds]))
    return result


def grounding_markdown(rows: list, meta: dict) -> str:
    lines = [f"# neurovec.benchmarks.kg --grounding ({meta['date']}, {meta['machine']}, load {meta['load']})", "",
             f"The rule template of `datasets/kg_rules.py` (width {RULES_DIM}, 2 layers, a rule per edge type), "
             f"{RULES_QUERIES // 2} test triples and as many corruptions of their tails as queries. neurovec, medians "
             "of its runs: `template.ground(facts, queries)` (template and relations made beforehand), and everything "
             "from the weights and the relation arrays to a validated Graph (making the template, facts and queries, "
             "and grounding). NeuraLogic, one fresh JVM, chain_pruning=False and iso_value_compression=False (its "
             "fastest build), medians of the builds after the first (which warms the JVM up): `build_dataset` (the "
             "model built, the dataset made in Python beforehand), and `build` + `build_dataset`. neurovec runs "
             "before the first build and after each: paired, the median over the warm builds of build_dataset / "
             "the median of neurovec's runs just before and just after it (load that comes and goes moves both).",
             "",
             "| dataset | message edges | rules | queries | neurons | neurovec ground, ms | neurovec everything, ms "
             "| NeuraLogic build_dataset, s | build + build_dataset, s | first build, s | speed-up: build_dataset / "
             "ground | (build + build_dataset) / everything | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nl = r.get("neuralogic_build_dataset_s")
        if nl is None:
            neuralogic = f"{r.get('neuralogic_failed', 'not run')} | | | | |"
        else:
            paired = f" (paired {r['ratio']:.0f}x)" if "ratio" in r else ""
            neuralogic = (f"{nl:.2f} | {r['neuralogic_total_s']:.2f} | {r['neuralogic_first_s']:.2f} | "
                          f"**{nl / r['ground_s']:.0f}x**{paired} | {r['neuralogic_total_s'] / r['native_s']:.0f}x |")
        lines.append(f"| {r['dataset']} | {r['message_edges']:,} | {r['rules']} | {r['queries']} | {r['neurons']:,} | "
                     f"{1000 * r['ground_s']:.1f} | {1000 * r['native_s']:.1f} | {neuralogic} 100x |")
    return "\n".join(lines) + "\n"


def _save(folder, stem: str, meta: dict, rows: list, table: str) -> None:
    """``folder/stem.json`` (``{"meta": ..., stem: rows}``) and ``folder/stem.md`` (the table), as they stand so far."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, stem: rows}, indent=1))
    (out / f"{stem}.md").write_text(table)


def grounding(args, meta: dict) -> list:
    rows = []
    for name in args.grounding_sets:
        native = NativeGrounding(name, args.data)
        extra = {}
        if not args.no_neuralogic:
            extra = grounding_neuralogic(name, args.data, args.grounding_repeats, args.timeout, native)
        native.burst(3, args.grounding_seconds)
        row = {**native.result(), **extra}
        rows.append(row)
        print(f"grounding {name}: neurovec {1000 * row['ground_s']:.1f} ms, NeuraLogic build_dataset "
              f"{row.get('neuralogic_build_dataset_s', row.get('neuralogic_failed'))}", flush=True)
        if args.out:
            _save(args.out, "grounding", meta, rows, grounding_markdown(rows, meta))
    print(grounding_markdown(rows, meta))
    return rows


# -- the parent: one process per contender, the table -------------------------------------------------------------
def _spawn(cell, contender, threads, args) -> dict:
    command = [sys.executable, "-m", "neurovec.benchmarks.kg", "--child", cell, contender, "--threads", str(threads),
               "--reps", str(args.reps if not cell.startswith("hetero") else args.hetero_reps),
               "--warmup", str(args.warmup), "--budget", str(args.budget), "--malloc", args.malloc]
    if args.data:
        command += ["--data", args.data]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"cell": cell, "contender": contender, "threads": threads, "failed": f"timeout {args.timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"cell": cell, "contender": contender, "threads": threads,
                "failed": f"exit {done.returncode}: {' | '.join(tail)[:400]}", "wall_s": time.perf_counter() - start}
    return {**json.loads(lines[-1]), "wall_s": time.perf_counter() - start}


def headline(results: list) -> list[dict]:
    rows = []
    for (cell, threads) in dict.fromkeys((r["cell"], r["threads"]) for r in results):
        mine = {r["contender"]: r for r in results if r["cell"] == cell and r["threads"] == threads
                and "step_s" in r and r.get("valid")}
        pyg = {k: v["step_s"] for k, v in mine.items() if k in PYG}
        others = {k: v["step_s"] for k, v in mine.items() if k == "neuralogic"}
        best_name, best = min((pyg or others).items(), key=lambda kv: kv[1], default=(None, None))
        ours = [mine[k]["step_s"] for k in ("default", "autotune") if k in mine]
        row = {"cell": cell, "threads": threads, "peer": best_name, "peer_s": best,
               "default_s": mine.get("default", {}).get("step_s"), "autotune_s": mine.get("autotune", {}).get("step_s"),
               "target": TARGETS.get(cell, DEFAULT_TARGET)}
        if best and ours:
            row["speedup"] = best / min(ours)
            row["met"] = row["speedup"] >= row["target"]
        rows.append(row)
    return rows


def _ms(value) -> str:
    return "" if value is None else f"{1000 * value:.1f}"


def markdown(results: list, meta: dict) -> str:
    lines = [f"# neurovec.benchmarks.kg ({meta['date']}, {meta['machine']}, load {meta['load']})", "",
             "| cell | threads | fastest peer, ms | neurovec default / autotune, ms | speedup | target | met |",
             "|---|---|---|---|---|---|---|"]
    for row in headline(results):
        speed = f"**{row['speedup']:.2f}x**" if "speedup" in row else ""
        lines.append(f"| {row['cell']} | {row['threads']} | {_ms(row['peer_s'])} ({row['peer']}) | "
                     f"{_ms(row['default_s'])} / {_ms(row['autotune_s'])} | {speed} | {row['target']:g}x | "
                     f"{'yes' if row.get('met') else 'no' if 'met' in row else ''} |")
    lines += ["", "| cell | threads | contender | step, ms | first step, s | build/compile, s | valid | notes |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        notes = r.get("failed", "") or ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in r.items() if k in ("chosen", "ground_s",
                                                                                "neuralogic_build_dataset_s",
                                                                                "compile_s", "first_loss"))
        lines.append(f"| {r['cell']} | {r['threads']} | {r['contender']} | {_ms(r.get('step_s'))} | "
                     f"{r.get('first_step_s', 0):.2f} | {r.get('build_s', 0):.2f} | {r.get('valid', '')} | {notes} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=CELLS)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS),
                        choices=CONTENDERS)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--hetero-reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget", type=float, default=120.0, help="autotune's budget, seconds")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per contender and cell")
    parser.add_argument("--data", default=None, help="folder with kinships/ and umls/ (default: $NEUROVEC_DATA)")
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument("--malloc", choices=("default", "keep"), default="default",
                        help="keep: every contender's process keeps freed large blocks in malloc's heap while it "
                             "trains (glibc; see the module doc)")
    parser.add_argument("--grounding", action="store_true",
                        help="instead of the cells: the rule template's grounding, neurovec against NeuraLogic")
    parser.add_argument("--grounding-sets", nargs="+", default=["kinships", "umls"], choices=("kinships", "umls"))
    parser.add_argument("--grounding-repeats", type=int, default=3,
                        help="NeuraLogic builds after its first (neurovec: 3x as many runs, and more for "
                             "--grounding-seconds)")
    parser.add_argument("--grounding-seconds", type=float, default=5.0)
    parser.add_argument("--no-neuralogic", action="store_true", help="--grounding: neurovec's side only")
    parser.add_argument("--grounding-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, metavar=("CELL", "CONTENDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_child(*args.child, args.threads[0], args.reps, args.warmup, args.data, args.budget, args.malloc)
        print(json.dumps(result))
        return [result]
    if args.grounding_child:
        _grounding_neuralogic_child(args.grounding_child, args.data, args.grounding_repeats)
        return []
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()), "argv": sys.argv[1:]}
    if args.grounding:
        return grounding(args, meta)
    results = []
    for threads in args.threads:
        for cell in args.cells:
            for contender in args.contenders:
                if (contender == "neuralogic") != (cell == "kinships-rules") and contender not in ("default",
                                                                                                  "autotune"):
                    continue
                result = _spawn(cell, contender, threads, args)
                results.append(result)
                print(f"{cell} {contender} {threads}t: " +
                      (f"{_ms(result['step_s'])} ms{'' if result.get('valid') else ' (INVALID)'}"
                       if "step_s" in result else result.get("failed", "")), flush=True)
                if args.out:
                    _save(args.out, "results", meta, results, markdown(results, meta))
    print(markdown(results, meta))
    return results


if __name__ == "__main__":
    main()
