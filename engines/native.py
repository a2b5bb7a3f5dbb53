"""neurovec's C++ CPU kernels (``native_kernels.h``): built on first use, cached, loaded.

The kernels reduce sorted, static CSR segments -- a fused gather -> per-edge
coefficient -> sum (and its transpose for the backward), plain segment sums and
means, segment max / min and their tie-splitting backward -- without ever
materialising per-edge rows, on as many threads as ``torch.get_num_threads()`` (NOTE:
[threads on a busy machine]). They are built twice, into two libraries:

* :func:`library`: ``native_kernels.cpp``, plain C functions without torch headers
  (a few seconds to build), called through ctypes from ``engines/ops.py``'s Python
  autograd Functions;
* :func:`operators`: ``native_ops.cpp``, the same kernels as torch operators
  ``torch.ops.neurovec_cpu.*`` whose autograd is C++ too (compiled against torch's
  headers and libraries: ~15-40 s, once). A call costs a third of the Python
  Function's (NOTE: [Operators in C++] in ``engines/ops.py``); where this library
  cannot be built, the ops use the ctypes kernels.

Build: the first call of either compiles its source with the system C++
compiler (``$CXX``, else ``g++``/``c++``; ``-O3 -march=native -fopenmp``) into
``$NEUROVEC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/neurovec`` or ``~/.cache/neurovec``)
``/native/<key>/``, where ``key`` hashes the sources, the flags, the compiler's version,
the CPU's instruction set and the torch version. A file lock lets concurrent processes
share one build; a library is written to a temporary name and renamed into place,
so a half-written file is never loaded. The libraries link ``libgomp.so.1``, which
resolves to the OpenMP runtime torch itself loaded, so both share one thread pool.

Switches: ``NEUROVEC_NATIVE=0`` (environment, read at import) or :func:`set_enabled`
turn the kernels off; then, and wherever a build fails (no compiler, a compile
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

__all__ = ["library", "operators", "available", "enabled", "set_enabled", "disabled", "without_operators",
           "build_info", "ops_build_info", "cache_dir", "SOURCE", "OPS_SOURCE"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_kernels.cpp")
OPS_SOURCE = Path(__file__).with_name("native_ops.cpp")
HEADER = Path(__file__).with_name("native_kernels.h")  # included by both
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")

_enabled = os.environ.get("NEUROVEC_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
_load_lock = threading.Lock()
#: What each library's first load gave: the library, or None where it could not be built (tried once).
_loaded: dict[str, object] = {}
#: What the last load did: ``path``, ``built`` (compiled in this process), ``seconds``, ``error``.
build_info: dict = {}
_operators_on = True  # see without_operators()
#: The same for :func:`operators`.
ops_build_info: dict = {}


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


@contextlib.contextmanager
def without_operators():
    """``with native.without_operators(): ...`` runs the ctypes kernels from Python autograd
    Functions instead of the :func:`operators` (to compare the two, or test the fallback)."""
    global _operators_on
    previous = _operators_on
    _operators_on = False
    try:
        yield
    finally:
        _operators_on = previous


def available() -> bool:
    """Native kernels are switched on and built (building them now if needed, the
    :func:`operators` too: no later first call waits for their build)."""
    if not (_enabled and library() is not None):
        return False
    operators()  # the ctypes kernels do without them
    return True


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


def _key(compiler: str, source: Path, flags: tuple[str, ...]) -> str:
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    digest = hashlib.sha256()
    for part in (source.read_bytes().decode(), HEADER.read_bytes().decode(), " ".join(flags), version,
                 _cpu_signature(), torch.__version__, platform.machine()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, built on first use; None if disabled or it cannot be built."""
    if not _enabled:
        return None
    return _once("kernels", _load, build_info, "native CPU kernels unavailable, using torch kernels")


def _once(key: str, load, info: dict, unavailable: str):
    """``load()``'s result, loaded on the first call (under the lock) and kept; a failure is
    kept as None and said once, in a warning, so that callers fall back for good."""
    if key in _loaded:
        return _loaded[key]
    with _load_lock:
        if key not in _loaded:
            try:
                _loaded[key] = load()
            except Exception as error:  # noqa: BLE001 - any failure: the caller falls back, say why once
                info["error"] = f"{type(error).__name__}: {error}"
                log.warning("neurovec: %s (%s)", unavailable, info["error"])
                _loaded[key] = None
    return _loaded[key]


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_cached_build(SOURCE, FLAGS, (), "libneurovec_kernels.so", build_info)))
    _declare(lib)
    return lib


def operators():
    """``torch.ops.neurovec_cpu`` (see ``native_ops.cpp``), built and loaded on first use;
    None if the kernels are switched off or this library cannot be built."""
    if not (_enabled and _operators_on):
        return None
    return _once("operators", _load_operators, ops_build_info,
                 "C++ torch operators unavailable, using the ctypes kernels")


# NOTE: [threads on a busy machine] The operators split their segments among torch's own
# intra-op threads (at::parallel_for): the threads torch's ops use, as many as
# torch.get_num_threads(), never a second pool beside them. In torch's CPU wheels those are an
# OpenMP team, and unless OMP_WAIT_POLICY=passive is set before torch starts, a thread waiting
# for the next parallel region or at its end barrier spins for a while before it sleeps. With other
# processes on the CPUs that is ruinous: a thread spins on a CPU that the thread it waits for needs,
# and every parallel op of a step -- torch's matmuls, elementwise ops and fused Adam as much as these
# kernels (torch.profiler, PROTEINS GCN at 2 threads on a loaded 2-CPU machine: mm 7.6 ms a call,
# threshold_backward 31 ms, the gather_sum backward 23 ms, for a step of 1 ms at 1 thread) -- waits
# for scheduler time slices. No scheme inside these kernels changes how torch's ops wait, so
# neurovec says so once (_warn_if_spinning_on_a_busy_machine) and benchmarks/kernels_loaded.py
# measures a step idle and beside a competing process under both wait policies.

def _spinning_on_a_busy_machine() -> str | None:
    """Why torch's threads will spin against other processes here (see NOTE: [threads on a busy
    machine]), or None: more than one thread, OpenMP's default (active) waiting, and a 1-minute load
    average of at least the number of CPUs this process may use."""
    threads = torch.get_num_threads()
    if threads <= 1 or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return None
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load < cpus:
        return None
    return (f"the CPUs are busy (load average {load:.1f} on {cpus} CPUs) and torch's {threads} OpenMP threads "
            "wait actively (OMP_WAIT_POLICY unset): each parallel operation may wait for a thread that another "
            "process keeps off its CPU, and training steps can run 10-100x slower. Set OMP_WAIT_POLICY=passive "
            "in the environment before Python starts, or call torch.set_num_threads(1)")


def _warn_if_spinning_on_a_busy_machine() -> None:
    reason = _spinning_on_a_busy_machine()
    if reason:
        log.warning("neurovec: %s", reason)


def _torch_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Compile flags (torch's headers, its C++ standard and ABI) and link flags (its libraries)."""
    root = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_flags = (*FLAGS[:-1], "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{root / 'include'}",
                     f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}")
    lib = root / "lib"
    return compile_flags, (f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch", "-ltorch_cpu", "-lc10")


def _load_operators():
    compile_flags, link_flags = _torch_flags()
    path = _cached_build(OPS_SOURCE, compile_flags, link_flags, "libneurovec_ops.so", ops_build_info)
    if not hasattr(torch.ops.neurovec_cpu, "gather_sum"):  # loaded already, e.g. by a second import of neurovec
        torch.ops.load_library(str(path))
    _warn_if_spinning_on_a_busy_machine()  # once: operators() loads once
    return torch.ops.neurovec_cpu


def _cached_build(source: Path, flags: tuple[str, ...], link_flags: tuple[str, ...], name: str,
                  info: dict) -> Path:
    """The library built from ``source`` in the cache (building it now if it is not there)."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found ($CXX, g++ or c++)")
    folder = cache_dir() / _key(compiler, source, flags + link_flags)
    path = folder / name
    info.update(path=str(path), built=False, seconds=0.0)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
            try:
                if not path.exists():
                    _build(compiler, [*flags, str(source), *link_flags], folder, path, info)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return path


def _build(compiler: str, arguments: list[str], folder: Path, path: Path, info: dict) -> None:
    start = time.perf_counter()
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *arguments, "-o", tmp], capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    info.update(built=True, seconds=time.perf_counter() - start)
    log.info("neurovec: built %s in %.1f s (%s)", path.name, info["seconds"], path)


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
        fn = _functions[(name, dtype)] = getattr(_loaded["kernels"], f"nv_{name}_{_SUFFIX[dtype]}")
    return fn
