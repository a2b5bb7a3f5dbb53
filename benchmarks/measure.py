"""Timing and memory primitives: what one "measurement" means in every benchmark result.

* Times are wall-clock seconds (``time.perf_counter``). On CUDA every timed region
  ends with ``torch.cuda.synchronize()``, so a time covers the kernels it launched,
  not only their launch.
* Peak memory is, on CUDA, ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats`` (exact, per engine). On CPU it is the process's
  peak resident set size: on Linux the kernel's own high-water mark (``VmHWM``),
  reset before each engine is built by writing ``5`` to ``/proc/self/clear_refs``,
  so nothing between two samples is missed; elsewhere the RSS (psutil) sampled
  between timed regions. Reported as the peak and as the growth over the RSS just
  before the engine was built (after handing freed heap pages back to the OS).
  Growth is still approximate: pages the allocator keeps can be reused without
  showing up as growth.
* Memory bandwidth (:func:`memory_bandwidth`) is the median speed of copying a
  large tensor into another one: bytes read plus bytes written per second.
* A summary of repeated measurements is the median with the quartiles, min and max;
  warm-up repetitions never enter it.
"""
from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from typing import Callable

import torch

__all__ = ["synchronizer", "release_free_memory", "rss_bytes", "reset_peak_rss", "peak_rss_bytes", "max_rss_bytes", "MemoryProbe",
           "memory_bandwidth", "summarize", "Stopwatch"]


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


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """The kernel's peak RSS of this process since start or the last :func:`reset_peak_rss` (None off Linux)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def max_rss_bytes() -> int:
    """This process's peak RSS since it started (``getrusage``; no reset): the fallback where
    :func:`peak_rss_bytes` has no kernel mark to read."""
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class MemoryProbe:
    """Peak memory of one engine, from just before its build to the end of its timing.

    ``start()`` before building, ``sample()`` whenever a peak may have been reached
    (after a forward pass, when activations are alive), ``result()`` at the end.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.baseline = 0
        self.peak = 0
        self.kernel_peak = False  # CPU: is the peak the kernel's VmHWM (exact) or our samples?

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
            self.kernel_peak = reset_peak_rss() and peak_rss_bytes() is not None
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
        if self.kernel_peak:
            self.peak = max(self.peak, peak_rss_bytes() or 0)
        return {"kind": "cpu_rss_hwm" if self.kernel_peak else "cpu_rss", "peak_bytes": int(self.peak),
                "baseline_bytes": int(self.baseline), "growth_bytes": int(max(self.peak - self.baseline, 0))}


def memory_bandwidth(device: torch.device | str = "cpu", megabytes: int = 128, repeats: int = 9) -> dict:
    """The median speed of ``dst.copy_(src)`` for two ``megabytes``-sized float32 tensors, in bytes per second.

    A copy reads and writes every byte once, so it moves ``2 * megabytes``. It runs
    with the current torch thread count, like the engines it is compared with.
    """
    device = torch.device(device)
    sync = synchronizer(device)
    n = megabytes * 2 ** 20 // 4
    source = torch.rand(n, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # first touch: page faults are not bandwidth
    seconds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        target.copy_(source)
        sync()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    moved = 2 * n * 4
    return {"bytes_per_s": moved / median, "copy_bytes": n * 4, "median_s": median, "repeats": repeats,
            "device": str(device), "threads": torch.get_num_threads()}


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
