"""Compiling and grounding reuse freed memory instead of asking the kernel for fresh pages (glibc only).

The passes work on whole edge-sized arrays: at 100x PROTEINS (54M edges) each one makes and drops
a few hundred-megabyte temporaries. glibc's malloc serves every block above its mmap threshold
(at most 32 MB) with a fresh ``mmap`` and returns it with ``munmap`` when freed, so every
temporary is new memory whose every page faults on first touch. Measured on the 2-core VM of
the committed runs: writing a fresh 512 MB array took 0.3-1.5 s, writing it again 0.04 s; the
100x compile spent 21 s of its 45 s in the kernel (1.2M page faults).

:func:`reusing_freed_memory` tells malloc, for the duration of a compile, to take large blocks
from its heap and keep what is freed there (``mallopt(M_MMAP_MAX, 0)``, and
``M_TRIM_THRESHOLD`` -1: never trim), so the next temporary of a pass reuses the pages of the
last one; at the end it hands the free memory back (``malloc_trim``) when there is more of it than the
process keeps afterwards anyway (the trim threshold below): trimming a small heap gives little back and
costs the next compile or grounding a page fault on every page it touches again (a MUTAG grounding,
6 ms, spent about a millisecond in the trim and the faults after it). The 100x compile's time in
the kernel fell from 21.6 s to 8.4 s (peak RSS 5.6 -> 5.9 GB). Elsewhere (macOS, musl, Windows)
it does nothing.

Setting any of these options ends glibc's *dynamic* mmap threshold for the rest of the process,
so glibc's defaults must not simply be put back: a process with a 128 KB mmap threshold and a
128 KB trim threshold maps (or trims) and page-faults every tensor of a few megabytes it
allocates, step after step (measured: an elementwise op on a 43k x 16 tensor took 2.4 ms instead
of 0.16 ms after such a restore). At the end the thresholds are set where glibc's dynamic mode
takes them once a process has freed a large block, as any process that compiled or trained on a
real graph has: blocks up to 32 MB from the heap (``M_MMAP_THRESHOLD``), the heap's free top
trimmed above 64 MB (``M_TRIM_THRESHOLD``). A process that set ``MALLOC_MMAP_MAX_``,
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` gets those values back after a compile:
``MALLOC_MMAP_MAX_=0`` keeps even blocks over 32 MB in the heap, so a training step whose
intermediates are that large reuses their pages instead of faulting them in every step (RGCN
with 100 relation types, 1M edges: 330 -> 152 ms a step, 81k -> 3k page faults), at the price of
the process keeping its peak memory.

Within, numpy also stops advising the kernel to back its large arrays with transparent huge pages
(``madvise(MADV_HUGEPAGE)``, which numpy does on Linux for arrays of 4 MB and more). The heap a
compile grows into is new memory whatever the page size, and on the virtual machines measured
(the 2-core VM of the committed runs) a fresh huge page cost more than the 512 small pages it
replaces: the 100x PROTEINS compile faults in about 1.7 GB, and with the advice spent 1.7 s in the
kernel, without it 0.9 s (compile 8.25 -> 7.67 s, medians of 4 interleaved pairs; at 10x no
difference). Arrays made outside a compile keep numpy's setting, and a process that set
``NUMPY_MADVISE_HUGEPAGE`` keeps its choice throughout. The exception is a large table that a kernel
reads by rows at random, such as the fold's fact table: :func:`table_on_huge_pages` makes it on huge
pages, where each read no longer misses the TLB.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
import threading

import numpy as np

__all__ = ["reusing_freed_memory", "table_on_huge_pages"]

# mallopt's parameters (malloc.h, mallopt(3)); after a compile: glibc's default M_MMAP_MAX, and the
# thresholds its dynamic mode reaches (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, trim at twice that).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4


def _chosen(variable: str, default: int) -> int:
    """The value the process chose for glibc in ``variable`` (read by malloc when it starts), else ``default``."""
    try:
        return int(os.environ[variable])
    except (KeyError, ValueError):
        return default


_AFTER_MMAP_MAX = _chosen("MALLOC_MMAP_MAX_", 65536)
_AFTER_MMAP_THRESHOLD = _chosen("MALLOC_MMAP_THRESHOLD_", 32 * 1024 * 1024)
_AFTER_TRIM_THRESHOLD = _chosen("MALLOC_TRIM_THRESHOLD_", 64 * 1024 * 1024)
_KEEP = -1  # as M_TRIM_THRESHOLD: never give the heap's free top back (mallopt(3))

_lock = threading.Lock()
_depth = 0  # compiles in progress (threads may compile at once: the outermost restores)


class _MallInfo2(ctypes.Structure):  # malloc.h, glibc >= 2.33
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _glibc():
    """The C library if it is glibc (it has mallopt and malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        libc.gnu_get_libc_version  # only glibc has it
        if hasattr(libc, "mallinfo2"):
            libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


def _numpy_huge_page_switch():
    """numpy's switch for its huge-page advice, ``_set_madvise_hugepage(on) -> was on`` (not
    public numpy API, so None where it is missing, or where the process chose with the variable)."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return None
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:
        try:
            from numpy.core import multiarray
        except ImportError:
            return None
    return getattr(multiarray, "_set_madvise_hugepage", None)


_HUGE_PAGES = _numpy_huge_page_switch() if _LIBC is not None else None
_huge_pages_before = None  # numpy's setting when the outermost compile began


def _worth_trimming(libc) -> bool:
    """More free memory in malloc's heap than the process keeps after a compile (always, without mallinfo2)."""
    if not hasattr(libc, "mallinfo2"):
        return True
    return libc.mallinfo2().fordblks > _AFTER_TRIM_THRESHOLD


@contextlib.contextmanager
def reusing_freed_memory():
    """Within: large blocks come from malloc's heap, and freed ones stay there to be reused."""
    global _depth, _huge_pages_before
    libc = _LIBC
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, _KEEP)
            if _HUGE_PAGES is not None:
                _huge_pages_before = _HUGE_PAGES(False)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _worth_trimming(libc):
                    libc.malloc_trim(0)
                libc.mallopt(_M_MMAP_MAX, _AFTER_MMAP_MAX)
                libc.mallopt(_M_MMAP_THRESHOLD, _AFTER_MMAP_THRESHOLD)
                libc.mallopt(_M_TRIM_THRESHOLD, _AFTER_TRIM_THRESHOLD)
                if _HUGE_PAGES is not None:
                    _HUGE_PAGES(_huge_pages_before)


_HUGE_PAGE = 2 << 20
_SMALL_TABLE = 32 << 20  # the TLB's small pages cover a few MB; 32 MB is far past them
_MADV_DONTNEED, _MADV_HUGEPAGE = 4, 14  # madvise(2), Linux


def table_on_huge_pages(shape, dtype) -> np.ndarray:
    """An empty C-ordered array for a large table that a kernel reads by rows at random, backed by
    2 MB transparent huge pages where Linux gives them on advice (its ``madvise`` mode).

    Each random row read from a table on 4 KB pages is a TLB miss, and on a virtual machine a miss
    walks two page tables. The fold of products-like's first GCN layer reads 62M rows of a 980 MB
    float32 table: 16.4-16.7 s from small pages, 10.6-12.1 s from huge ones (1 thread, the same
    inputs; filling the table took 0.6-1.2 s either way).

    Inside a compile the table comes from malloc's heap (:func:`reusing_freed_memory`), often from
    pages a freed temporary faulted in small. So the whole huge pages within the array are given
    back first (``MADV_DONTNEED``: the next write faults them in again, zeroed) and advised huge.
    Once the table is freed they stay in the heap, huge, for the temporaries after it. (The step
    kernels' large outputs get the same advice in C++: ``engines/native_ops.cpp``'s ``empty_output``.)"""
    table = np.empty(shape, dtype)
    libc = _LIBC
    if libc is None or table.nbytes < _SMALL_TABLE:
        return table
    start = table.ctypes.data + -table.ctypes.data % _HUGE_PAGE
    length = (table.ctypes.data + table.nbytes - start) // _HUGE_PAGE * _HUGE_PAGE
    if length > 0:  # only memory the array owns: malloc's bookkeeping lies outside it
        libc.madvise(start, length, _MADV_DONTNEED)
        libc.madvise(start, length, _MADV_HUGEPAGE)  # fails harmlessly without THP
    return table
