"""One engine of one task in a process of its own (``benchmark.py --isolate``).

Each compiled contender then compiles alone (``torch.compile``'s and inductor's state,
the allocator's pages and the peak RSS are its own), and an engine that runs out
of memory cannot take the run down with it: a child that fails to allocate, or that
the kernel kills (SIGKILL, the OOM killer), is recorded with status ``out of
memory``. ``--memory-limit-gb G`` caps each child's address space (``RLIMIT_AS``) so
that allocations beyond G fail cleanly instead of pushing the machine into the OOM
killer (address space is a little more than resident memory: thread stacks and
libraries count too).

The parent builds the task once for its oracle and sizes, then drops the neuron
graph; each child rebuilds the task (the neuron graph only for neurovec engines),
takes the parent's oracle, and runs :func:`neurovec.benchmarks.suite.measure_engine`
(warm-up, then the timed iterations back to back: interleaving needs one process).
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["measure_isolated", "OOM_STATUS", "is_out_of_memory"]

OOM_STATUS = "out of memory"
_OOM_TEXT = ("can't allocate memory", "cannot allocate memory", "not enough memory", "memoryerror",
             "out of memory", "std::bad_alloc")


def is_out_of_memory(text: str | None) -> bool:
    return bool(text) and any(marker in text.lower() for marker in _OOM_TEXT)


def _limit(gigabytes: float | None):
    if not gigabytes:
        return None

    def apply() -> None:
        import resource
        limit = int(gigabytes * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def measure_isolated(name: str, cell: tuple, config, task) -> dict:
    """Run engine ``name`` on ``cell`` in a child process; its record, or why it has none."""
    if getattr(task, "graph", None) is not None:
        task.graph = None  # the parent keeps sizes and the oracle only: the child builds its own graph
    with tempfile.TemporaryDirectory(prefix="neurovec-isolated-") as folder:
        request, answer = Path(folder) / "request.pkl", Path(folder) / "record.pkl"
        with open(request, "wb") as handle:
            pickle.dump({"name": name, "cell": cell, "config": config, "oracle": task.oracle()}, handle)
        command = [sys.executable, "-m", "neurovec.benchmarks.isolated", str(request), str(answer)]
        done = subprocess.run(command, capture_output=True, text=True, preexec_fn=_limit(config.memory_limit_gb))
        if answer.is_file():
            with open(answer, "rb") as handle:
                record = pickle.load(handle)
        else:
            record = {"engine": name, "kind": "unknown", "valid": None}
            tail = (done.stderr or "").strip().splitlines()[-3:]
            if done.returncode == -signal.SIGKILL or is_out_of_memory(done.stderr):
                why = ("killed by the kernel (SIGKILL), most likely out of memory"
                       if done.returncode == -signal.SIGKILL else " / ".join(tail))
                record.update(status=OOM_STATUS, reason=why)
            else:
                record.update(status="failed", error=f"the engine's process exited with {done.returncode}: "
                                                     + " / ".join(tail))
    record["isolated"] = True
    if config.memory_limit_gb:
        record["memory_limit_gb"] = config.memory_limit_gb
    return record


def _child(request: Path, answer: Path) -> None:
    import torch

    from .suite import TASK_KINDS, make_engine, measure_engine

    with open(request, "rb") as handle:
        job = pickle.load(handle)
    config = job["config"]
    if config.threads:
        torch.set_num_threads(config.threads)
    cache = TASK_KINDS[config.task]["cache"](config.data_dir)
    engine = make_engine(job["name"], config)
    task = TASK_KINDS[config.task]["make"](config, cache, *job["cell"])
    if engine.kind == "pyg":
        task.graph = None  # PyG builds its own inputs
    task._oracle, task._oracle_tried = job["oracle"], True
    if engine.kind == "pyg" and getattr(engine, "compiled", False):
        from .contenders import warm_up_torch_compile
        warm_up_torch_compile()
    try:
        from neurovec.engines import native
        native.available()
    except Exception:  # noqa: BLE001 - optional
        pass
    record = measure_engine(engine, task, config)
    if record.get("status") == "failed" and is_out_of_memory(record.get("error")):
        record["status"], record["reason"] = OOM_STATUS, record.pop("error")
    with open(answer, "wb") as handle:
        pickle.dump(record, handle)


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of big heaps
