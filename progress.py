"""Progress reports for long work: autotune, large compiles, compiling a loader's batches.

On a terminal a tqdm bar shows what is running (which pass, which candidate);
when stderr is not a terminal (a log file, CI) plain lines do, at most one every
few seconds. Work that ends before ``delay_s`` shows nothing at all.

    neurovec.set_progress(False)        # no progress output (or NEUROVEC_PROGRESS=0)
    neurovec.set_progress(None)         # back to the default: NEUROVEC_PROGRESS, else on

Progress is not a diagnostic: diagnostics (which pass took how long, what a
loader compiled) go to the ``logging`` loggers ``neurovec.*`` at DEBUG/INFO.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO

__all__ = ["Progress", "set_progress", "progress_enabled"]

_enabled: bool | None = None


def set_progress(enabled: bool | None) -> None:
    """Switch progress output on or off for this process (None: the default)."""
    global _enabled
    _enabled = enabled


def progress_enabled(enabled: bool | None = None) -> bool:
    """Whether to report: ``enabled`` if given, else :func:`set_progress`'s, else ``$NEUROVEC_PROGRESS``."""
    if enabled is not None:
        return enabled
    if _enabled is not None:
        return _enabled
    return os.environ.get("NEUROVEC_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off", "")


class Progress:
    """One piece of long work, ``total`` units (passes, seconds, batches), shown after ``delay_s``.

    ``update(done, status)`` sets the absolute progress and says what runs now;
    use as a context manager or call :meth:`close`.
    """

    def __init__(self, desc: str, total: float, unit: str = "it", delay_s: float = 0.0,
                 enabled: bool | None = None, leave: bool = True, stream: TextIO | None = None,
                 line_interval_s: float = 5.0):
        self.desc, self.total, self.unit = desc, total, unit
        self.delay_s, self.line_interval_s = delay_s, line_interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.enabled = progress_enabled(enabled)
        self._bar = None
        self._last_line: float | None = None
        self._done, self._status = 0.0, ""
        if self.enabled and _is_terminal(self.stream):
            from tqdm.auto import tqdm

            fmt = "{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}<{remaining}{postfix}]"
            self._bar = tqdm(total=total, desc=desc, unit=unit, delay=delay_s, leave=leave, file=self.stream,
                             bar_format=fmt if unit == "s" else None, dynamic_ncols=True)

    def update(self, done: float, status: str = "") -> None:
        self._done, self._status = min(done, self.total), status
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.n = self._done
            self._bar.set_postfix_str(status, refresh=False)
            self._bar.refresh()
            return
        now = time.perf_counter()
        if now - self.start < self.delay_s:
            return
        if self._last_line is None or now - self._last_line >= self.line_interval_s:
            self._line(now)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self._last_line is not None:
            self._done, self._status = self.total, "done"
            self._line(time.perf_counter())

    def _line(self, now: float) -> None:
        self._last_line = now
        status = f": {self._status}" if self._status else ""
        print(f"{self.desc}: {self._done:.0f}/{self.total:.0f} {self.unit}, {now - self.start:.1f} s{status}",
              file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
