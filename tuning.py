"""Pick the fastest compilation of one graph by timing training steps on the real device.

    module, table = neurovec.autotune(graph, device="cpu", budget_s=60)
    print(table)                 # every candidate: compile time, step times, status
    result = neurovec.autotune(graph)
    result.settings, result.preset, result.kernel   # what won

Which preset (thesis 6.2.1: the strength of upward gather propagation) and which
reduction kernel is fastest depends on the graph, its sizes and the device, so
:func:`autotune` compiles the graph under several candidates and times a
*training step* of each (forward, loss, backward, Adam step): that is the
workload the modules exist for, and a candidate that wins the forward can lose
the backward (thesis 6.4).

Candidates are tried in rounds, likely-best first, since the budget may cut the list:

1. the :data:`PRESET_ORDER` presets (``default``, then moderate upward growth),
   each with its own ``reduce_kernel`` (the cost model, ``"auto"``);
2. the other ``kernels`` on the :data:`TOP_PRESETS` fastest presets so far;
3. the :data:`LATE_PRESETS` (those that may grow layers without bound, slow to
   compile and usually to run, and ``unoptimized``) with their own kernel;
4. the other kernels on every remaining preset, fastest-measured preset first.

After round 2, if ``torch_compile`` allows it (by default: when at least
:data:`TORCH_COMPILE_MIN_S` of the budget is left), the fastest candidate so far
is also timed under ``torch.compile`` (label ``+compile``; its compile time includes
inductor's). On PROTEINS (1 thread) compiling the module helped GraphSAGE (~20%),
hardly changed GCN and slowed GIN down (~25%): worth a try, not a default.

A playoff decides, and ``default`` is its incumbent: the :data:`PLAYOFF` fastest
distinct candidates (by their own timing) and the first candidate (``default`` with
its own kernel, what ``neurovec.compile(graph)`` gives; else the first one timed) are
timed again, *interleaved* step by step in rotating order, after one untimed round,
for at least :data:`PLAYOFF_MIN_ROUNDS` rounds and :data:`PLAYOFF_S` seconds (at most
:data:`PLAYOFF_MAX_ROUNDS`). A challenger replaces the incumbent only if it was faster
by more than :data:`PLAYOFF_MIN_GAIN` in so many rounds that a fair coin would come up
that often with probability below :data:`PLAYOFF_ALPHA` (a one-sided sign test on the
paired rounds, ``playoff_p`` in the table); of the challengers that pass, the lowest
playoff median wins. Timed one after another, a candidate that happened to run while
another process was busy would lose (or win) by chance; interleaved, load falls on all
entrants alike, and a pick within the noise keeps ``default``: autotune never hands
back something slower than ``default`` by its measurement. (A 1-thread MUTAG SAGE run
once picked a candidate whose short sequential timings flattered it: 1.05 ms against
default's 0.84 ms in the benchmark.) The candidates stop starting when only the
playoff's share of the budget is left (:data:`PLAYOFF_SHARE`, or less where the
playoff needs less); the playoff runs at least one timed round whatever is left.

Presets named by the caller are compiled with ``verify=False``: the compiled
module verifies the final program anyway, and checking after every pass (which
only says *which* pass broke it) costs about 40% of the compile time. Custom
:class:`Settings` are used as given.

Two shortcuts keep the list cheap: a candidate whose :class:`Settings` equal an
earlier one is not compiled again, and one whose compiled program (generated
code and constants) equals an earlier one is not timed again; both are listed as
``same`` with the candidate they repeat. A candidate is stopped after its
warm-up (``pruned``) when its fastest steady step is :data:`PRUNE_FACTOR` times
slower than the best median so far (it cannot win) and finishing it would cost more
than :data:`PRUNE_MIN_SAVING_S`; ``+compile`` candidates are always timed in full.

Budget: ``budget_s`` counts everything from the call on (compiling, timing,
bookkeeping). A candidate is only started while the budget has time left for
it (an estimate: its preset's compile and step times where known, else the
median compile time so far), and its repeats are cut to the time left (at least
one timed step), so the call returns within ``budget_s`` plus at most one
candidate's time; the first candidate always runs, so there is always a result.
"""
from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence, get_args

import numpy as np
import torch

from .compiler.settings import Settings, list_presets
from .compiling import compile as compile_graph
from .engines.torch_module import CompiledModule
from .progress import Progress
from .sources.graph import Graph

__all__ = ["autotune", "AutotuneResult", "AutotuneTable", "Candidate", "PRESET_ORDER", "LATE_PRESETS",
           "TOP_PRESETS", "DEFAULT_KERNELS", "PRUNE_FACTOR", "PRUNE_MIN_SAVING_S", "PLAYOFF", "PLAYOFF_MIN_ROUNDS",
           "PLAYOFF_MAX_ROUNDS", "PLAYOFF_S", "PLAYOFF_SHARE", "PLAYOFF_MIN_GAIN", "PLAYOFF_ALPHA",
           "TORCH_COMPILE_MIN_S", "playoff_winner"]

#: Presets most likely to be fastest first (MUTAG / PROTEINS GCN on CPU, thesis 6.2.1):
#: the cost-model defaults, then moderate upward growth. Presets in neither this list
#: nor :data:`LATE_PRESETS` (added later) are tried after these.
PRESET_ORDER: tuple[str, ...] = (
    "default",
    "upward-05-rel-0.5", "upward-06-rel-1", "upward-15-before-linear-rel-1", "upward-07-rel-2",
    "upward-04-rel-0.25", "upward-08-rel-4", "upward-03-rel-0.1", "upward-09-abs-1k", "upward-10-abs-10k",
    "upward-02-rel-0.05", "upward-01-rel-0.01", "upward-00-free", "upward-13-depth-2",
)

#: Presets tried only after the kernels of the best ones: those whose layers may grow
#: without practical bound (3-150x slower steps than the best on MUTAG and PROTEINS GCN,
#: and up to 5x the compile time), then no optimization at all.
LATE_PRESETS: tuple[str, ...] = (
    "upward-12-depth-1", "upward-14-depth-3", "upward-11-abs-100k", "upward-16-before-linear-unlimited",
    "upward-17-aggressive", "unoptimized",
)

#: How many of the fastest presets of round 1 get the other kernels in round 2.
TOP_PRESETS = 3

#: ``kernels=None``: each preset's own ``reduce_kernel`` (``None``), then the CSR segment
#: kernels everywhere and plain-torch ``scatter_reduce`` everywhere (the latter is the
#: one to try on GPUs, where the cost model is unmeasured).
DEFAULT_KERNELS: tuple[str | None, ...] = (None, "segment", "scatter")

#: How many of the fastest distinct candidates are timed again, interleaved, against ``default``.
PLAYOFF = 3

#: The playoff's interleaved rounds: at least PLAYOFF_MIN_ROUNDS and PLAYOFF_S seconds, at most
#: PLAYOFF_MAX_ROUNDS (1 ms steps on a loaded machine vary by +-30% from one step to the next).
PLAYOFF_MIN_ROUNDS = 20
PLAYOFF_MAX_ROUNDS = 200
PLAYOFF_S = 1.0

#: At most this share of the budget is kept for the playoff (less where its rounds need less).
PLAYOFF_SHARE = 0.15

#: A challenger must be faster than ``default`` by more than this fraction in a round for the
#: round to count as its win ...
PLAYOFF_MIN_GAIN = 0.02

#: ... and win so many rounds that a fair coin does as well with probability below this.
PLAYOFF_ALPHA = 0.05

#: ``torch_compile=None``: time the fastest candidate under ``torch.compile`` only when
#: this many seconds of the budget are left (inductor's cold compile of a PROTEINS module
#: takes 20-60 s on 2 CPU cores).
TORCH_COMPILE_MIN_S = 45.0

#: A candidate whose fastest steady step is this many times the best median so far is
#: stopped after its warm-up. The minimum over >= 2 steps is used, so one slow step
#: (another process, a page fault) never prunes a candidate.
PRUNE_FACTOR = 3.0

#: Pruning also needs finishing the candidate to cost more than this many seconds: it is there
#: to save budget on candidates with long steps. On a loaded machine two 1 ms steps can
#: both take 20 ms; pruning such a candidate saved 0.1 s and dropped a real contender
#: (among them the ``+compile`` candidate, after 35 s of inductor). ``+compile``
#: candidates are never pruned: their compile time is spent already.
PRUNE_MIN_SAVING_S = 0.5

_KERNELS = get_args(Settings.model_fields["reduce_kernel"].annotation)


@dataclass
class Candidate:
    """One row of an :class:`AutotuneTable`: a preset and kernel, and what became of it.

    ``status`` is ``"ok"`` (timed), ``"same"`` (same settings or program as ``same_as``:
    not timed again), ``"pruned"`` (stopped after warm-up, see :data:`PRUNE_FACTOR`),
    ``"skipped"`` (no budget left) or ``"failed"`` (``reason`` has the exception).
    Times: ``compile_s`` (build + module, seconds; with ``compiled``, also
    ``torch.compile``'s first forward and backward), ``median_ms`` / ``min_ms`` /
    ``max_ms`` over ``steps`` timed training steps, ``seconds`` the candidate's whole
    wall time (compile, device copy, warm-up and timing). ``compiled``: the module
    runs under ``torch.compile``. ``playoff_ms``: its median in the interleaved
    playoff (its entrants only), which decides the winner; ``playoff_p``: a challenger's
    sign-test p-value against ``default`` there (module docstring; it replaces
    ``default`` only below :data:`PLAYOFF_ALPHA`).
    """

    preset: str
    kernel: str
    settings: Settings | None
    status: str = "pending"
    reason: str = ""
    same_as: str = ""
    compile_s: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    steps: int = 0
    seconds: float = 0.0
    compiled: bool = False
    playoff_ms: float | None = None
    playoff_p: float | None = None
    fingerprint: str = field(default="", repr=False)

    @property
    def label(self) -> str:
        return f"{self.preset}/{self.kernel}" + ("+compile" if self.compiled else "")

    def as_record(self) -> dict:
        """The row as plain JSON-able values (without the Settings object)."""
        return {"preset": self.preset, "kernel": self.kernel, "compiled": self.compiled, "status": self.status,
                "reason": self.reason, "same_as": self.same_as, "compile_s": self.compile_s,
                "median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "steps": self.steps,
                "playoff_ms": self.playoff_ms, "playoff_p": self.playoff_p, "seconds": self.seconds}


@dataclass
class AutotuneTable:
    """Every candidate of one :func:`autotune` call, in the order they were tried.

    ``print(table)`` shows them as a table (the winner starred); ``table.best`` is
    the winning row, ``table.find(preset, kernel)`` looks one up, ``table.elapsed_s``
    is the whole call's wall time. Iterating yields the rows.
    """

    rows: list[Candidate]
    device: str
    budget_s: float
    elapsed_s: float = 0.0
    best: Candidate | None = None

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> Candidate:
        return self.rows[k]

    def find(self, preset: str, kernel: str | None = None) -> Candidate:
        """The row of ``preset`` with ``kernel`` (None: the preset's own kernel)."""
        own = Settings.preset(preset).reduce_kernel if kernel is None and preset in list_presets() else kernel
        for row in self.rows:
            if row.preset == preset and (own is None or row.kernel == own):
                return row
        raise KeyError(f"no autotune candidate {preset!r} with kernel {kernel!r}")

    def timed(self, row: Candidate) -> Candidate | None:
        """The row whose timing applies to ``row``: itself if timed, the row it repeats if ``same``."""
        seen = set()
        while row.status == "same" and row.label not in seen:
            seen.add(row.label)
            row = next((r for r in self.rows if r.label == row.same_as), row)
        return row if row.median_ms is not None else None

    @staticmethod
    def _score(row: Candidate) -> float:
        """The playoff median where there was one (interleaved with the winner), else the median."""
        return row.playoff_ms if row.playoff_ms is not None else row.median_ms

    def as_records(self) -> list[dict]:
        return [row.as_record() for row in self.rows]

    def __str__(self) -> str:
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "same", "pruned", "skipped", "failed")}
        head = (f"autotune on {self.device}: {len(self.rows)} candidates "
                f"({', '.join(f'{n} {s}' for s, n in counts.items() if n)}) in {self.elapsed_s:.1f} s "
                f"(budget {self.budget_s:g} s)")
        if self.best is not None:
            head += f"; best {self.best.label} {self._score(self.best):.2f} ms"
            default = next((r for r in self.rows if r.preset == "default"), None)
            default = default and self.timed(default)
            if default is not None and default is not self.best:
                head += (f", {self._score(default) / self._score(self.best):.2f}x faster than default "
                         f"({self._score(default):.2f} ms)")
        width = max([len(r.preset) for r in self.rows] + [6])

        def num(value, digits):
            return "-" if value is None else f"{value:.{digits}f}"

        lines = [head, f"  {'preset':<{width}}  {'kernel':<17} {'compile s':>9} {'median ms':>10} {'min ms':>9} "
                       f"{'max ms':>9} {'steps':>5} {'playoff':>8} {'p':>6} {'total s':>7}  status"]
        for row in self.rows:
            status = row.status
            if row.same_as:
                status += f" as {row.same_as}"
            if row.reason:
                status += f": {row.reason}"
            mark = "*" if row is self.best else " "
            kernel = row.kernel + ("+compile" if row.compiled else "")
            lines.append(f"{mark} {row.preset:<{width}}  {kernel:<17} {num(row.compile_s, 2):>9} "
                         f"{num(row.median_ms, 2):>10} {num(row.min_ms, 2):>9} {num(row.max_ms, 2):>9} "
                         f"{row.steps:>5} {num(row.playoff_ms, 2):>8} {num(row.playoff_p, 3):>6} "
                         f"{row.seconds:>7.2f}  {status}")
        return "\n".join(lines)


class AutotuneResult(NamedTuple):
    """What :func:`autotune` returns: unpacks as ``module, table``.

    ``module`` is compiled with the winning settings and holds the graph's initial
    weights (its parameters are reset after timing trained them); ``settings``,
    ``preset`` and ``kernel`` say what won.
    """

    module: CompiledModule
    table: AutotuneTable

    @property
    def settings(self) -> Settings:
        return self.table.best.settings

    @property
    def preset(self) -> str:
        return self.table.best.preset

    @property
    def kernel(self) -> str:
        return self.table.best.kernel

    @property
    def compiled(self) -> bool:
        """Whether ``module`` is ``torch.compile(compiled_module)`` (the +compile candidate won)."""
        return self.table.best.compiled


def autotune(graph: Graph, presets: Sequence[str | Settings] | None = None, device: str | torch.device = "cpu",
             budget_s: float = 60.0, kernels: Sequence[str | None] | None = None, dtype: torch.dtype | None = None,
             repeat: int = 5, warmup: int = 2,
             loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
             progress: bool | None = None, torch_compile: bool | None = None) -> AutotuneResult:
    """Compile ``graph`` under several presets and kernels; return the fastest module.

    Args:
        graph: the neuron graph.
        presets: preset names (or :class:`Settings`, shown as ``custom-1``, ...) to
            choose among; None: all of ``list_presets()``. They are tried in the
            order of the module docstring, whatever order they are given in.
        device: where to time (and where the returned module lives). CUDA timings
            synchronize before and after every step.
        budget_s: seconds for the whole call, compiling included; the call returns
            within ``budget_s`` plus at most one candidate's time (module docstring).
        kernels: ``Settings.reduce_kernel`` values to try on every preset (None in
            the list: the preset's own, usually ``"auto"``); the first is tried on
            all presets before the others. None: :data:`DEFAULT_KERNELS`.
        dtype: the modules' floating dtype (default: torch's default). Compile the
            winner for float64 checks with ``neurovec.compile(graph, result.settings,
            torch.float64)``.
        repeat, warmup: timed and untimed training steps per candidate; the score is
            the median of the timed ones.
        loss: ``loss(outputs) -> scalar``; default ``outputs.pow(2).mean()``.
        progress: show the budget used and the candidate running (a tqdm bar on a
            terminal, plain lines otherwise); None: ``neurovec.set_progress``'s choice.
        torch_compile: also time the fastest candidate under ``torch.compile``: True,
            False, or None (when :data:`TORCH_COMPILE_MIN_S` of the budget are left).

    Returns:
        :class:`AutotuneResult` ``(module, table)``, with ``.settings``, ``.preset``,
        ``.kernel`` and ``.compiled`` of the winner. ``module`` is the timed winner with
        its parameters reset to the graph's initial values and no gradients: the same
        module as a fresh ``neurovec.compile(graph, result.settings, dtype)`` (compiling
        is deterministic), without a second compile outside the budget -- wrapped in
        ``torch.compile`` if ``.compiled``.

    Raises:
        RuntimeError: no candidate could be compiled and timed (the message has the table).
    """
    start = time.perf_counter()
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0 (got repeat={repeat}, warmup={warmup})")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    choices = _presets(presets)
    kernel_list = list(DEFAULT_KERNELS if kernels is None else dict.fromkeys(kernels))
    unknown = [k for k in kernel_list if k is not None and k not in _KERNELS]
    if unknown or not kernel_list:
        raise ValueError(f"unknown reduce kernels {unknown}; expected some of {_KERNELS} (or None)")
    loss = loss or _mean_square
    table = AutotuneTable([], str(device), budget_s)
    timer = _Timer(start, budget_s, device, repeat, warmup, loss)
    bar = Progress("neurovec autotune", budget_s, unit="s", enabled=progress)

    late = [choice for choice in choices if choice[0] in LATE_PRESETS]
    early = [choice for choice in choices if choice[0] not in LATE_PRESETS]

    def run(presets_: list[tuple[str, Settings]], kernels_: list[str | None]) -> None:
        for kernel in kernels_:
            for name, settings in presets_:
                candidate = _candidate(name, settings, kernel)
                if all(row.label != candidate.label for row in table.rows):  # e.g. unoptimized's own scatter
                    best = f", best {timer.best.row.label} {timer.best.row.median_ms:.2f} ms" if timer.best else ""
                    bar.update(time.perf_counter() - start, f"{candidate.label}{best}")
                    timer.run(table, candidate, graph, dtype)

    run(early, kernel_list[:1])
    run(_ranked(table, early)[:TOP_PRESETS], kernel_list[1:])
    left = timer.candidates_until() - time.perf_counter()
    if timer.best is not None and (torch_compile or (torch_compile is None and left >= TORCH_COMPILE_MIN_S)):
        eager = timer.best.row
        candidate = Candidate(eager.preset, eager.kernel, eager.settings, compiled=True)
        bar.update(time.perf_counter() - start, candidate.label)
        timer.run(table, candidate, graph, dtype)
    run(late, kernel_list[:1])
    run(_ranked(table, choices), kernel_list[1:])
    bar.update(time.perf_counter() - start, "playoff")
    timer.playoff()
    bar.close()

    if timer.winner is None:
        table.elapsed_s = time.perf_counter() - start
        raise RuntimeError(f"autotune: no candidate could be compiled and timed\n{table}")
    best = timer.winner
    table.best = best.row
    # Undo the timing's training: the initial weights, and no gradients.
    best.module.load_state_dict(best.state)
    best.module.zero_grad(set_to_none=True)
    table.elapsed_s = time.perf_counter() - start
    return AutotuneResult(best.call, table)


# --------------------------------------------------------------------------- candidates

def _presets(presets: Sequence[str | Settings] | None) -> list[tuple[str, Settings]]:
    """(name, Settings) pairs in trial order; unknown names are an error up front."""
    if isinstance(presets, (str, Settings)):
        presets = [presets]
    names = list_presets() if presets is None else list(presets)
    if not names:
        raise ValueError("autotune needs at least one preset")
    choices: dict[str, Settings] = {}
    n_custom = 0
    for entry in names:
        if isinstance(entry, Settings):
            n_custom += 1
            choices.setdefault(f"custom-{n_custom}", entry)
        else:
            choices.setdefault(entry, Settings.preset(entry, verify=False))  # raises on unknown names
    order = {name: k for k, name in enumerate(PRESET_ORDER + LATE_PRESETS)}
    unlisted = len(PRESET_ORDER) - 0.5  # after the listed early presets, before the late ones

    def rank(name: str) -> float:
        if name.startswith("custom-"):
            return 0.5  # the caller's own settings: right after `default`, in the given order
        return order.get(name, unlisted)

    return sorted(choices.items(), key=lambda kv: rank(kv[0]))  # stable: ties keep the given order


def _candidate(name: str, settings: Settings, kernel: str | None) -> Candidate:
    if kernel is not None and kernel != settings.reduce_kernel:
        settings = settings.model_copy(update={"reduce_kernel": kernel})
    return Candidate(name, settings.reduce_kernel, settings)


def _ranked(table: AutotuneTable, choices: list[tuple[str, Settings]]) -> list[tuple[str, Settings]]:
    """``choices`` by the median of their first candidate, fastest first: the timed ones, then
    those that repeat a timed program (so the first few are distinct programs), then the rest."""
    def key(choice: tuple[str, Settings]) -> tuple:
        row = next((r for r in table.rows if r.preset == choice[0]), None)
        timed = table.timed(row) if row is not None else None
        if timed is not None and timed.status == "ok":
            return (0 if row is timed else 1, timed.median_ms)
        return (2, ["pruned", "failed", "same"].index(row.status) if row and row.status in
                ("pruned", "failed", "same") else 3)

    return sorted(choices, key=key)


def _mean_square(outputs: torch.Tensor) -> torch.Tensor:
    return outputs.pow(2).mean()


def _fingerprint(module: CompiledModule) -> str:
    """A digest of what determines the module's work: its generated code and its constants."""
    digest = hashlib.blake2b(module.code.encode(), digest_size=16)
    for key in sorted(module.program.constants):
        array = np.ascontiguousarray(module.program.constants[key])
        digest.update(f"{key}:{array.dtype}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


# --------------------------------------------------------------------------- timing

@dataclass
class _Finalist:
    """A timed candidate kept for the playoff: its module, what is called (the module or its
    ``torch.compile`` wrapper), its initial weights and its training step."""

    row: Candidate
    module: CompiledModule
    call: torch.nn.Module
    state: dict
    step: Callable[[], float]
    index: int  # trial order: breaks ties in the playoff


class _Timer:
    """Runs candidates against the budget and keeps the fastest ones, and the incumbent
    (the first timed candidate: ``default``), for the playoff."""

    def __init__(self, start: float, budget_s: float, device: torch.device, repeat: int, warmup: int,
                 loss: Callable[[torch.Tensor], torch.Tensor]):
        self.start, self.deadline, self.budget_s = start, start + budget_s, budget_s
        self.device, self.repeat, self.warmup, self.loss = device, repeat, warmup, loss
        self.finalists: list[_Finalist] = []  # the fastest PLAYOFF candidates, fastest first
        self.incumbent: _Finalist | None = None  # the first candidate timed: `default` unless it failed
        self.winner: _Finalist | None = None  # set by playoff()
        self.started = 0

    @property
    def best(self) -> _Finalist | None:
        """The fastest candidate by its own timing so far (what pruning and round 2 go by)."""
        return self.finalists[0] if self.finalists else None

    def entrants(self) -> list[_Finalist]:
        """The playoff's entrants: the incumbent first, then the finalists in trial order."""
        rest = sorted((f for f in self.finalists if f is not self.incumbent), key=lambda f: f.index)
        return ([self.incumbent] if self.incumbent is not None else []) + rest

    def candidates_until(self) -> float:
        """When candidates stop starting: the deadline less what the playoff of the current
        entrants will take (at most PLAYOFF_SHARE of the budget)."""
        round_s = sum(f.row.median_ms for f in self.entrants()) / 1e3
        playoff_s = max(PLAYOFF_S, (PLAYOFF_MIN_ROUNDS + 1) * round_s) if len(self.entrants()) > 1 else 0.0
        return self.deadline - min(PLAYOFF_SHARE * self.budget_s, playoff_s)

    def run(self, table: AutotuneTable, row: Candidate, graph: Graph, dtype: torch.dtype | None) -> None:
        table.rows.append(row)
        # Same settings as a candidate already run: nothing new to compile or time.
        earlier = next((r for r in table.rows[:-1] if r.settings == row.settings and r.compiled == row.compiled
                        and r.status != "skipped"), None)
        if earlier is not None:
            row.status, row.same_as = "same", earlier.label
            return
        now = time.perf_counter()
        needed = self._estimate(table, row)
        until = self.candidates_until()
        if self.started and now + needed > until:
            row.status = "skipped"
            row.reason = f"budget: needs ~{needed:.1f} s, {max(until - now, 0):.1f} s left"
            return
        self.started += 1
        try:
            module = compile_graph(graph, row.settings, dtype)
            row.fingerprint = _fingerprint(module) + ("+compile" if row.compiled else "")
            twin = next((r for r in table.rows[:-1] if r.fingerprint == row.fingerprint), None)
            if twin is not None:
                row.compile_s = time.perf_counter() - now
                row.status, row.same_as = "same", twin.label
                return
            module.to(self.device)
            # The initial weights, to undo the timing's training if this one wins (the
            # state dict holds the weights only: constants are non-persistent buffers).
            state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            call = module
            if row.compiled:
                call = torch.compile(module)
            step = self._stepper(call, module)
            if row.compiled:
                step()  # torch.compile works on the first call (forward and backward): its compile time
            row.compile_s = time.perf_counter() - now
            self._time(row, step, until)
        except Exception as error:  # noqa: BLE001 - every failure is recorded, never dropped
            row.status, row.reason = "failed", _reason(error)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # e.g. after an out-of-memory error
            return
        finally:
            row.seconds = time.perf_counter() - now
        if row.status == "ok":
            finalist = _Finalist(row, module, call, state, step, self.started)
            if self.incumbent is None:
                self.incumbent = finalist
            self.finalists.append(finalist)
            self.finalists.sort(key=lambda f: f.row.median_ms)  # stable: ties keep the trial order
            del self.finalists[PLAYOFF:]

    def playoff(self) -> None:
        """Time the entrants again, interleaved in rotating order, and pick the winner with
        :func:`playoff_winner` (module docstring)."""
        entrants = self.entrants()
        if len(entrants) < 2:
            self.winner = entrants[0] if entrants else None
            return
        times: list[list[float]] = [[] for _ in entrants]
        round_s = sum(f.row.median_ms for f in entrants) / 1e3
        begin = time.perf_counter()
        for k in range(PLAYOFF_MAX_ROUNDS + 1):  # round 0 is untimed: caches, allocator, branch history
            now = time.perf_counter()
            if k >= PLAYOFF_MIN_ROUNDS + 1 and now - begin >= PLAYOFF_S:
                break
            if k >= 2 and now + round_s > self.deadline:
                break  # out of budget: at least one timed round
            for j in range(len(entrants)):
                i = (j + k) % len(entrants)  # rotating: no entrant always runs right after the same one
                seconds = entrants[i].step()
                if k:
                    times[i].append(seconds)
        for finalist, steps in zip(entrants, times):
            finalist.row.playoff_ms = statistics.median(steps) * 1e3
        pick, p_values = playoff_winner(times[0], times[1:])
        for finalist, p in zip(entrants[1:], p_values):
            finalist.row.playoff_p = p
        self.winner = entrants[0] if pick is None else entrants[1 + pick]


    def _estimate(self, table: AutotuneTable, row: Candidate) -> float:
        """Seconds ``row`` needs at least: its preset's compile and warm-up + one step where known."""
        same_preset = [r for r in table.rows if r.preset == row.preset and r.compile_s is not None]
        compiles = [r.compile_s for r in table.rows if r.compile_s is not None]
        if same_preset:
            needed = same_preset[0].compile_s
            timed = table.timed(same_preset[0])
            if timed is not None:
                needed += (self.warmup + 1) * timed.median_ms / 1e3
            return needed
        return statistics.median(compiles) if compiles else 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _stepper(self, call: torch.nn.Module, module: CompiledModule) -> Callable[[], float]:
        """One training step of ``call`` (the module or its compiled wrapper), in seconds."""
        params = [p for p in module.parameters() if p.requires_grad]
        # Adam, like the benchmarks; every candidate has the same parameters, so the
        # optimizer's cost is the same for all and only the module's share differs.
        optimizer = torch.optim.Adam(params, lr=1e-3) if params else None

        def step() -> float:
            self._sync()
            begin = time.perf_counter()
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            outputs = call()
            if outputs.requires_grad:
                self.loss(outputs).backward()
                if optimizer is not None:
                    optimizer.step()
            self._sync()
            return time.perf_counter() - begin

        return step

    def _time(self, row: Candidate, step: Callable[[], float], until: float | None = None) -> None:
        until = self.deadline if until is None else until
        times: list[float] = []
        steady: list[float] = []  # every step after the first (which pays one-time costs)
        for k in range(self.warmup + self.repeat):
            if k >= self.warmup and times and time.perf_counter() + times[-1] > until:
                break  # out of budget: keep what is timed (at least one step)
            seconds = step()
            if k > 0:
                steady.append(seconds)
            if k >= self.warmup:
                times.append(seconds)
            best = self.best.row.median_ms / 1e3 if self.best is not None else math.inf
            saving = (self.warmup + self.repeat - k - 1) * min(steady, default=0.0)
            if len(steady) >= 2 and min(steady) > PRUNE_FACTOR * best and saving > PRUNE_MIN_SAVING_S \
                    and not row.compiled:
                row.status = "pruned"
                row.reason = (f"steady steps >= {min(steady) * 1e3:.2f} ms > {PRUNE_FACTOR:g}x the best median "
                              f"({self.best.row.median_ms:.2f} ms)")
                times = times or steady
                break
        if row.status != "pruned":
            row.status = "ok"
        row.steps = len(times)
        row.median_ms = statistics.median(times) * 1e3
        row.min_ms, row.max_ms = min(times) * 1e3, max(times) * 1e3


def playoff_winner(incumbent: Sequence[float], challengers: Sequence[Sequence[float]],
                   min_gain: float = PLAYOFF_MIN_GAIN, alpha: float = PLAYOFF_ALPHA) -> tuple[int | None, list[float]]:
    """The playoff's rule: which challenger (index), if any, replaces the incumbent.

    ``incumbent[k]`` and ``challengers[c][k]`` are step times of round ``k`` (interleaved,
    so paired). A challenger *wins* round ``k`` when its step is below ``(1 - min_gain)``
    times the incumbent's; its p-value is the chance of at least that many wins in as many
    fair coin flips (a one-sided sign test: robust to outliers and to load that shifts whole
    rounds). Challengers with ``p < alpha`` qualify; the one with the lowest median time
    wins (ties: the earlier one); none qualifying keeps the incumbent (``None``).
    Returns the pick and every challenger's p-value.
    """
    p_values = []
    for steps in challengers:
        pairs = list(zip(incumbent, steps))
        wins = sum(challenger < (1 - min_gain) * held for held, challenger in pairs)
        n = len(pairs)
        p_values.append(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n if n else 1.0)
    qualified = [c for c, p in enumerate(p_values) if p < alpha]
    if not qualified:
        return None, p_values
    return min(qualified, key=lambda c: (statistics.median(challengers[c]), c)), p_values
