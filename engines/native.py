"""neurovec's C++ CPU kernels (``native_kernels.cpp``): built on first use, cached, loaded with ctypes.

The kernels reduce sorted, static CSR segments -- a fused gather -> per-edge
coefficient -> sum (and its transpose for the backward), plain segment sums and
means, segment max / min and their tie-splitting backward -- without ever
materialising per-edge rows, on OpenMP threads (as many as ``torch.get_num_threads()``).
``engines/ops.py`` wraps them as autograd-aware torch ops; this module only builds,
loads and calls them.

Build: the first call of :func:`library` compiles the source with the system C++
compiler (``$CXX``, else ``g++``/``c++``; ``-O3 -march=native -fopenmp``, no torch
headers, a few seconds) into
``$NEUROVEC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/neurovec`` or ``~/.cache/neurovec``)
``/native/<key>/``, where ``key`` hashes the source, the flags, the compiler's version,
the CPU's instruction set and the torch version. A file lock lets concurrent processes
share one build; the library is written to a temporary name and renamed into place,
so a half-written file is never loaded. The library links ``libgomp.so.1``, which
resolves to the OpenMP runtime torch itself loaded, so both share one thread pool.

Switches: ``NEUROVEC_NATIVE=0`` (environment, read at import) or :func:`set_enabled`
turn the kernels off; then, and wherever the build fails (no compiler, a compile
error: logged once as a warning), every caller uses its pure-torch equivalent.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

__all__ = ["library", "available", "enabled", "set_enabled", "disabled", "build_info", "cache_dir", "SOURCE"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_kernels.cpp")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")

_enabled = os.environ.get("NEUROVEC_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
_lib: ctypes.CDLL | None = None
_tried = False
_load_lock = threading.Lock()
#: What the last load did: ``path``, ``built`` (compiled in this process), ``seconds``, ``error``.
build_info: dict = {}


def enabled() -> bool:
    """Whether native kernels may be used (the switch, not whether they built)."""
    return _enabled


def set_enabled(value: bool) -> None:
    """Turn the native kernels on or off for this process (callers fall back to torch)."""
    global _enabled
    _enabled = bool(value)


@contextlib.contextmanager
def disabled():
    """``with native.disabled(): ...`` runs the pure-torch kernels."""
    previous = _enabled
    set_enabled(False)
    try:
        yield
    finally:
        set_enabled(previous)


def available() -> bool:
    """Native kernels are switched on and built (building them now if needed)."""
    return _enabled and library() is not None


def cache_dir() -> Path:
    root = os.environ.get("NEUROVEC_CACHE_DIR")
    if root:
        return Path(root) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "neurovec" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """The instruction set ``-march=native`` targets: a cache built on another CPU is not reused."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(compiler: str) -> str:
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes().decode(), " ".join(FLAGS), version, _cpu_signature(), torch.__version__,
                 platform.machine()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, built on first use; None if disabled or it cannot be built."""
    global _lib, _tried
    if not _enabled:
        return None
    if _tried:
        return _lib
    with _load_lock:
        if not _tried:
            try:
                _lib = _load()
            except Exception as error:  # noqa: BLE001 - any failure: fall back to torch, say why once
                build_info["error"] = f"{type(error).__name__}: {error}"
                log.warning("neurovec: native CPU kernels unavailable, using torch kernels (%s)", build_info["error"])
                _lib = None
            _tried = True
    return _lib


def _load() -> ctypes.CDLL:
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found ($CXX, g++ or c++)")
    folder = cache_dir() / _key(compiler)
    path = folder / "libneurovec_kernels.so"
    build_info.update(path=str(path), built=False, seconds=0.0)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
            try:
                if not path.exists():
                    _build(compiler, folder, path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    lib = ctypes.CDLL(str(path))
    _declare(lib)
    return lib


def _build(compiler: str, folder: Path, path: Path) -> None:
    start = time.perf_counter()
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                                timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    build_info.update(built=True, seconds=time.perf_counter() - start)
    log.info("neurovec: built native kernels in %.1f s (%s)", build_info["seconds"], path)


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_SIGNATURES = {
    "gather_sum": (_I64, _P, _P, _P, _P, _I64, _P, _INT),
    "segment_sum": (_I64, _P, _P, _P, _I64, _P, _P, _INT),
    "segment_broadcast": (_I64, _P, _P, _P, _I64, _P, _P, _INT),
    "segment_max": (_I64, _P, _P, _I64, _P, _INT),
    "segment_min": (_I64, _P, _P, _I64, _P, _INT),
    "segment_extremum_backward": (_I64, _P, _P, _P, _P, _I64, _P, _P, _INT),
}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _declare(lib: ctypes.CDLL) -> None:
    for name, args in _SIGNATURES.items():
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"nv_{name}_{suffix}")
            fn.argtypes, fn.restype = args, None


_functions: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}


def function(name: str, dtype: torch.dtype):
    """The C function ``nv_<name>_<f32|f64>`` (the library must be loaded). Its index
    arguments are int32 for ``gather_sum``, int64 for the others."""
    fn = _functions.get((name, dtype))
    if fn is None:
        fn = _functions[(name, dtype)] = getattr(_lib, f"nv_{name}_{_SUFFIX[dtype]}")
    return fn
