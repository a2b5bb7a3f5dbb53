"""neurovec's C++ CPU kernels (``native_ops.cpp``): built on first use, cached, loaded as torch operators.

The kernels reduce sorted, static CSR segments -- a fused gather -> per-edge
coefficient -> sum (and its transpose for the backward), plain segment sums and
means, segment max / min and their tie-splitting backward -- without ever
materialising per-edge rows, on as many threads as ``torch.get_num_threads()``
(NOTE: [threads on a busy machine]). They are torch operators,
``torch.ops.neurovec_cpu.*``: four kernels without autograd, which programs call
under ``torch.compile`` (their fake kernels are registered here), and three with
their autograd in C++, which programs call eagerly (see ``native_ops.cpp`` and
``engines/ops.py``). Three more (``native_fold.cpp``) are the compile's: :func:`fold_sums`, the folded
sums of ``fold_constants``, bit for bit those of its numpy path (built with floating-point contraction
off); :func:`csr_transpose`, the modules' A^T; and :func:`gathered_wrapping_sums`, the multiset
hashes of dedup's labelling.

Build: :func:`operators` (or :func:`available`) builds the sources (:data:`SOURCES`) on first use with
``torch.utils.cpp_extension`` (the system C++ compiler, ``$CXX`` else ``c++``, and ninja;
``-O3 -march=native -fopenmp``; about a minute, said in a warning before it starts) into
``$NEUROVEC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/neurovec`` or ``~/.cache/neurovec``)
``/native/<key>/``, where ``key`` hashes the sources, the flags, the compiler's version,
the CPU's instruction set, and the torch and Python versions; later processes load it from
there. A file lock lets concurrent processes share one build. ``python -m
neurovec.engines.native_build`` builds ahead of time.

Switches: ``NEUROVEC_NATIVE=0`` (environment, read at import) or :func:`set_enabled`
turn the kernels off; then, and wherever the build fails (no compiler, a compile
error: logged once as a warning), every caller uses its pure-torch equivalent.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import torch

__all__ = ["operators", "available", "enabled", "set_enabled", "disabled", "build_info", "cache_dir", "SOURCE", "SOURCES",
           "fold_sums", "gathered_wrapping_sums"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_ops.cpp")
#: Every file of the library: the kernels, and the compile-time fold kernel (``native_fold.cpp``: built with
#: floating-point contraction off, see :func:`fold_sums`).
SOURCES = (SOURCE, Path(__file__).with_name("native_fold.cpp"))
NAME = "neurovec_ops"
FLAGS = ("-O3", "-march=native", "-fopenmp")

_enabled = os.environ.get("NEUROVEC_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
_load_lock = threading.Lock()
#: What the first load gave: the operators, or None where they could not be built (tried once).
_loaded: dict[str, object] = {}
#: What the load did: ``path``, ``built`` (compiled in this process), ``seconds``, ``error``.
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
    return operators() is not None


def operators():
    """``torch.ops.neurovec_cpu``, built and loaded on first use; None if the kernels are
    switched off or cannot be built (said once, in a warning)."""
    if not _enabled:
        return None
    if "operators" in _loaded:
        return _loaded["operators"]
    with _load_lock:
        if "operators" not in _loaded:
            try:
                _loaded["operators"] = _load()
            except Exception as error:  # noqa: BLE001 - any failure: the callers fall back, say why once
                build_info["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
                log.warning("neurovec: C++ kernels unavailable, using torch kernels (%s)", build_info["error"])
                _loaded["operators"] = None
    return _loaded["operators"]


def fold_sums(facts, index, coef, counts):
    """``value[j] = (((0.0 + p[s]) + p[s + 1]) + ...) + p[s + counts[j] - 1]`` (float64 numpy, one row
    per segment), where ``s`` is segment ``j``'s first entry and ``p[e] = coef[e] * facts[index[e]]``
    (each product rounded on its own) or ``facts[index[e]]`` without ``coef``: the sums of
    ``fold_constants.sequential_sums``, bit for bit, in C++ (``native_fold.cpp``: one pass over the
    gathered rows, split over torch's threads by segments; read as float32 where every fact is one,
    which widens back exactly). None where the kernels are switched off or
    not built: the caller computes them itself."""
    ops = operators()
    if ops is None:
        return None
    import numpy as np  # noqa: PLC0415 - only the compiler's folds call this

    from ..memory import table_on_huge_pages  # noqa: PLC0415

    facts = np.ascontiguousarray(facts, dtype=np.float64)
    x = facts.reshape(facts.shape[0], int(np.prod(facts.shape[1:], dtype=np.int64)))
    # Every fact a float32 (real features often are): the kernel reads half the bytes. Compared a block
    # of rows at a time (no table-sized mask; a table that is not stops at its first block that differs).
    narrow = table_on_huge_pages(x.shape, np.float32)  # read by rows at random (see its docstring)
    np.copyto(narrow, x, casting="same_kind")
    step = max(1, (1 << 20) // max(x.shape[1], 1))
    if all(np.array_equal(narrow[lo:lo + step], x[lo:lo + step]) for lo in range(0, x.shape[0], step)):
        x = narrow
    del narrow
    counts = np.asarray(counts, dtype=np.int64)
    ptr = _segment_bounds(counts)
    index = np.asarray(index)
    if index.dtype not in (np.int32, np.int64):
        index = index.astype(np.int64)
    index = np.ascontiguousarray(index).reshape(-1)
    if counts.size and counts.min() < 0 or ptr[-1] != index.size:
        raise ValueError(f"fold_sums: the segment counts add up to {int(ptr[-1])}, not to the {index.size} entries")
    if index.size and (index.min() < 0 or index.max() >= x.shape[0]):
        raise ValueError(f"fold_sums: an index is outside the {x.shape[0]} fact rows")
    if coef is not None:
        coef = np.ascontiguousarray(coef, dtype=np.float64).reshape(-1)
        if coef.size != index.size:
            raise ValueError(f"fold_sums: {coef.size} coefficients for {index.size} entries")
    x, index, coef, ptr = _tensors(x, index, coef, ptr)
    return ops.fold_sums(x, index, coef, ptr).numpy()


def csr_transpose(index, ptr, n_sources: int, values=None, index_dtype=torch.int64, perm: bool = True):
    """The transpose of a CSR matrix by a counting sort (``native_fold.cpp``): ``index`` (E,) int32 or int64
    tensor, the column of each entry; ``ptr`` (S + 1,) int64 tensor, segment ``j`` owning the entries
    ``ptr[j]:ptr[j + 1]``; ``values`` (E,) tensor of any dtype, or None. Returns ``(t_ptr, t_col, t_perm,
    t_values)``: ``t_perm`` (int64) the entries grouped by column, each column's in their CSR order -- the
    permutation of a stable sort of ``index`` --, ``t_ptr`` (N + 1,) each column's bounds, ``t_col`` the segment of
    each, both ``index_dtype``, and ``t_values = values[t_perm]`` (None without ``values``); with
    ``perm=False``, ``t_perm`` is None (not made: at products-like, 500 MB written twice). None where the
    kernels are switched off or not built: the caller sorts itself. Raises ``ValueError`` for an index outside
    ``[0, n_sources)`` or a ``ptr`` that does not run from 0 to E, sorted."""
    ops = operators()
    if ops is None:
        return None
    with _refusals_as_value_errors("csr_transpose"):
        t_ptr, t_col, t_perm, t_values = ops.csr_transpose(index, ptr, int(n_sources), values, index_dtype, perm)
    return t_ptr, t_col, (t_perm if perm else None), (t_values if values is not None else None)


def gathered_wrapping_sums(words, index, counts):
    """Per segment ``j`` (``counts[j]`` consecutive entries): the sum modulo 2**64 of ``words[index[e]]``
    over its entries (uint64 numpy; ``words`` uint64, ``index`` int32 or int64), in C++
    (``native_fold.cpp``), split over torch's threads by segments: the multiset hashes of
    ``compiler/grouping.py``. None where the kernels are switched off or not built: the caller adds
    them up itself. Raises ``ValueError`` for an index outside ``words``."""
    ops = operators()
    if ops is None:
        return None
    import numpy as np  # noqa: PLC0415 - only the compiler's labelling calls this

    ptr = _segment_bounds(counts)
    index = np.ascontiguousarray(index)
    if index.dtype not in (np.int32, np.int64) or ptr[-1] != index.size:
        raise ValueError(f"gathered_wrapping_sums: {index.size} entries of {index.dtype}, for counts adding up to {int(ptr[-1])}")
    words = np.ascontiguousarray(words, dtype=np.uint64).view(np.int64)
    with _refusals_as_value_errors("gathered_wrapping_sums"):
        return ops.gathered_wrapping_sums(*_tensors(words, index, ptr)).numpy().view(np.uint64)


def _segment_bounds(counts):
    """``ptr`` (int64 numpy) of segments of ``counts`` entries each: segment ``j`` owns ``ptr[j]:ptr[j + 1]``."""
    import numpy as np  # noqa: PLC0415 - only the compile's kernels call this

    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def _tensors(*arrays):
    """Tensors sharing the numpy arrays' memory (None stays None). Read-only arrays (a program's constants)
    make torch warn that tensors could write them; the kernels only read them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return [None if a is None else torch.from_numpy(a) for a in arrays]


@contextlib.contextmanager
def _refusals_as_value_errors(op: str):
    """A kernel's refusal of its input (a ``TORCH_CHECK`` whose message starts with ``op:``) as a ``ValueError``
    with that first line; any other error as it is."""
    try:
        yield
    except RuntimeError as error:
        if f"{op}:" in str(error):
            raise ValueError(str(error).splitlines()[0]) from None
        raise


def cache_dir() -> Path:
    root = os.environ.get("NEUROVEC_CACHE_DIR")
    if root:
        return Path(root) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "neurovec" / "native"


def _compiler() -> str | None:
    """The compiler torch.utils.cpp_extension will run: ``$CXX``, else ``c++``."""
    return shutil.which(os.environ.get("CXX") or "c++")


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
    for part in (*(source.read_text() for source in SOURCES), " ".join(FLAGS), version, _cpu_signature(), torch.__version__, sys.version,
                 platform.machine()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def _load():
    if hasattr(torch.ops.neurovec_cpu, "csr_sum"):  # loaded already, e.g. by a second import of neurovec
        return torch.ops.neurovec_cpu
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found ($CXX, else c++)")
    folder = cache_dir() / _key(compiler)
    path = folder / f"{NAME}.so"
    build_info.update(path=str(path), built=False, seconds=0.0)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key: wait for it
        try:
            if not path.exists():
                _build(folder)
            torch.ops.load_library(str(path))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _register_fakes()
    _warn_if_spinning_on_a_busy_machine()  # once: the operators load once
    return torch.ops.neurovec_cpu


def _build(folder: Path) -> None:
    """Compile ``native_ops.cpp`` into ``folder``, saying so first (a warning: visible by default) and
    showing the build as a step of its own while it runs (neurovec.progress)."""
    from torch.utils import cpp_extension  # noqa: PLC0415 - only for a build

    from ..progress import Progress  # noqa: PLC0415

    log.warning("neurovec: building its C++ kernels, once for this machine and torch version (about a minute; "
                "`python -m neurovec.engines.native_build` builds them ahead of time), into %s", folder)
    start, failure = time.perf_counter(), []

    def build() -> None:
        try:
            cpp_extension.load(NAME, [str(source) for source in SOURCES], extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"],
                               build_directory=str(folder), is_python_module=False, verbose=False)
        except BaseException as error:  # noqa: BLE001 - raised again below, in the caller's thread
            failure.append(error)

    worker = threading.Thread(target=build, name="neurovec-build", daemon=True)
    worker.start()
    with Progress("neurovec: building C++ kernels", _BUILD_S, "s", delay_s=2.0) as bar:
        while worker.is_alive():
            worker.join(1.0)
            bar.update(min(time.perf_counter() - start, _BUILD_S), "g++ " + ", ".join(s.name for s in SOURCES))
    if failure:
        raise failure[0]
    build_info.update(built=True, seconds=time.perf_counter() - start)
    log.info("neurovec: built %s in %.1f s", folder / f"{NAME}.so", build_info["seconds"])


#: What a build takes, for its progress bar: measured ~60 s on a quiet 2-CPU machine.
_BUILD_S = 60.0


def _register_fakes() -> None:
    """Fake (meta) kernels of the operators programs call under torch.compile: output shapes only."""
    def rows(x, n):
        return x.new_empty((n,) + tuple(x.shape[1:]))

    fakes = {
        "csr_sum": lambda x, ptr, col, values, divide, bias: rows(x, ptr.shape[0] - 1),
        "csr_sum_out": lambda x, ptr, col, values, divide, bias, out, add=False: None,
        "broadcast": lambda g, ptr, values, divide, n_entries: rows(g, n_entries),
        "extremum": lambda x, ptr, max: rows(x, ptr.shape[0] - 1),
        "extremum_backward": lambda grad, x, y, ptr: torch.empty_like(x),
        "prod": lambda x, ptr: rows(x, ptr.shape[0] - 1),
        "prod_backward": lambda grad, x, ptr: torch.empty_like(x),
        "pair_prod": lambda x, strided: rows(x, x.shape[0] // 2),
        "pair_prod_backward": lambda grad, x, strided: torch.empty_like(x),
        "rows": lambda x, index: rows(x, index.shape[0]),
        "fold_sums": lambda x, index, coef, ptr: rows(x, ptr.shape[0] - 1).to(torch.float64),
    }
    for name, fake in fakes.items():
        try:
            torch.library.register_fake(f"neurovec_cpu::{name}")(fake)
        except RuntimeError:  # registered by a second import of neurovec (pytest imports the checkout twice)
            pass


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


def main() -> None:
    """``python -m neurovec.engines.native_build``: build (or find) the C++ kernels now, and say where."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not available():
        sys.exit(f"neurovec: the C++ kernels are not available: "
                 f"{build_info.get('error') or 'switched off (NEUROVEC_NATIVE=0)'}")
    built = f"built in {build_info['seconds']:.0f} s" if build_info.get("built") else "already built"
    print(f"neurovec: C++ kernels {built}: {build_info.get('path')}")
