"""Timing and memory primitives: what one "measurement" means in every benchmark result.

* Times are wall-clock seconds (``time.perf_counter``). On CUDA every timed region
  ends with ``torch.cuda.synchronize()``, so a time covers the kernels it launched,
  not only their launch.
* Peak memory is, on CUDA, ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats`` (exact, per engine). On CPU it is the process's
  resident set size (psutil) sampled between timed regions: reported as the peak
  and as the growth over the RSS just before the engine was built (after handing
  freed heap pages back to the OS). Still approximate: pages the allocator keeps
  can be reused without showing up as growth.
* A summary of repeated measurements is the median with the quartiles, min and max;
  warm-up repetitions never enter it.
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import torch

__all__ = ["synchronizer", "release_free_memory", "rss_bytes", "MemoryProbe", "summarize", "Stopwatch"]


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``), so RSS growth shows new allocations.

    Without it, memory freed by an earlier engine stays resident and is silently reused
    by the next one, which then seems to need nothing. A no-op off glibc.
    """
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes() -> int:
    """This process's resident set size in bytes (0 when psutil is missing)."""
    try:
        import psutil
    except ImportError:
        return 0
    return int(psutil.Process().memory_info().rss)


class MemoryProbe:
    """Peak memory of one engine, from just before its build to the end of its timing.

    ``start()`` before building, ``sample()`` whenever a peak may have been reached
    (after a forward pass, when activations are alive), ``result()`` at the end.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.baseline = 0
        self.peak = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            release_free_memory()
            self.baseline = rss_bytes()
        self.peak = self.baseline

    def sample(self) -> None:
        # CUDA keeps its own running maximum; only RSS needs sampling.
        if not self.cuda:
            self.peak = max(self.peak, rss_bytes())

    def result(self) -> dict:
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            return {"kind": "cuda_max_allocated", "peak_bytes": int(peak), "baseline_bytes": int(self.baseline),
                    "growth_bytes": int(peak - self.baseline)}
        self.sample()
        return {"kind": "cpu_rss", "peak_bytes": int(self.peak), "baseline_bytes": int(self.baseline),
                "growth_bytes": int(max(self.peak - self.baseline, 0))}


class Stopwatch:
    """Splits one iteration into named laps, each ending with a device synchronisation.

    Work done between laps (memory sampling) is excluded: ``pause()`` ... ``resume()``.
    """

    def __init__(self, sync: Callable[[], None]):
        self.sync = sync
        self.laps: dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, name: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self._start
        self._start = now

    def resume(self) -> None:
        """Restart the clock after untimed work."""
        self._start = time.perf_counter()


def summarize(values: list[float]) -> dict:
    """Median, quartiles, min, max, mean and count of ``values`` (``None`` entries dropped)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {"n": len(ordered), "median": statistics.median(ordered), "q1": q1, "q3": q3, "iqr": q3 - q1,
            "min": ordered[0], "max": ordered[-1], "mean": statistics.fmean(ordered)}
