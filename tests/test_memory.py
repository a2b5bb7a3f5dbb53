"""neurovec/memory.py: while compiling or grounding, freed large blocks stay in malloc's heap (glibc)."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from neurovec import memory
from neurovec.memory import reusing_freed_memory

from .test_native import THP_AVAILABLE, vm_flags

glibc_only = pytest.mark.skipif(memory._LIBC is None, reason="needs glibc's mallopt")


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


# Where a large block comes from depends on the heap's past: a process that freed a 70 MB block
# into its heap (any earlier test's compile) serves the next 64 MB from there, mapping or not. So
# these checks run in a fresh interpreter, whose heap holds no large free block.
_MAPPED_BYTES = """
import numpy as np
from neurovec import memory
from neurovec.memory import reusing_freed_memory

def mapped_bytes():  # bytes malloc holds in blocks of their own mapping (mallinfo2().hblkhd)
    return memory._LIBC.mallinfo2().hblkhd
"""


def _in_a_fresh_process(body: str, **environment: str) -> None:
    result = subprocess.run([sys.executable, "-c", _MAPPED_BYTES + textwrap.dedent(body)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **environment})
    assert result.returncode == 0, result.stderr


needs_mallinfo2 = pytest.mark.skipif(memory._LIBC is None or not hasattr(memory._LIBC, "mallinfo2"),
                                     reason="needs glibc >= 2.33 (mallinfo2)")


@needs_mallinfo2
def test_large_blocks_come_from_the_heap_inside():
    # 64 MB is above every mmap threshold of glibc: outside, a mapping of its own (fresh pages
    # each time); inside, a block of the heap, where a freed one is reused.
    _in_a_fresh_process("""
        before = mapped_bytes()
        outside = np.ones(2**23)
        assert mapped_bytes() >= before + outside.nbytes
        del outside
        with reusing_freed_memory():
            before = mapped_bytes()
            inside = np.ones(2**23)
            assert mapped_bytes() < before + inside.nbytes
            del inside
        assert memory._depth == 0
    """)


@needs_mallinfo2
def test_after_a_compile_blocks_of_a_few_megabytes_still_come_from_the_heap():
    # Setting mallopt options ends glibc's dynamic mmap threshold: with the defaults put back,
    # every tensor of a few MB a training step allocates would be a fresh mapping, every step.
    _in_a_fresh_process("""
        with reusing_freed_memory():
            np.ones(2**20)
        before = mapped_bytes()
        block = np.ones(2**19)  # 4 MB: above glibc's default threshold, below 32 MB
        assert mapped_bytes() < before + block.nbytes
        del block
        before = mapped_bytes()
        big = np.ones(2**23)  # 64 MB: still a mapping of its own
        assert mapped_bytes() >= before + big.nbytes
    """)


@needs_mallinfo2
def test_a_process_that_chose_mallocs_options_keeps_them_after_a_compile():
    # MALLOC_MMAP_MAX_=0 (glibc reads it at start): no block is ever a mapping of its own, and a
    # compile must not undo that when it ends (the test above shows what it sets otherwise).
    _in_a_fresh_process("""
        assert memory._AFTER_MMAP_MAX == 0
        with reusing_freed_memory():
            np.ones(2**20)
        before = mapped_bytes()
        big = np.ones(2**23)  # 64 MB: a mapping of its own, but for the process's choice
        assert mapped_bytes() < before + big.nbytes
    """, MALLOC_MMAP_MAX_="0")


def test_nested_and_failing_blocks_end_the_reuse_once(monkeypatch):
    calls = []

    class FakeLibc:
        def mallopt(self, option, value):
            calls.append((option, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))
            return 1

    monkeypatch.setattr(memory, "_LIBC", FakeLibc())
    with pytest.raises(RuntimeError):
        with reusing_freed_memory():
            with reusing_freed_memory():  # a second compile at once (another thread)
                pass
            assert calls == [(memory._M_MMAP_MAX, 0), (memory._M_TRIM_THRESHOLD, memory._KEEP)]
            raise RuntimeError("a pass failed")
    assert calls[2:] == [("trim", 0), (memory._M_MMAP_MAX, memory._AFTER_MMAP_MAX),
                         (memory._M_MMAP_THRESHOLD, memory._AFTER_MMAP_THRESHOLD),
                         (memory._M_TRIM_THRESHOLD, memory._AFTER_TRIM_THRESHOLD)]
    assert memory._depth == 0


def test_without_glibc_nothing_happens(monkeypatch):
    monkeypatch.setattr(memory, "_LIBC", None)
    with reusing_freed_memory():
        assert memory._depth == 0


@glibc_only
def test_compile_builds_the_module_while_reusing_freed_memory(monkeypatch, tu_dir):
    # The module's tensors are as large as the program's constants: they too reuse freed pages.
    from neurovec import compiling, datasets

    depths = []

    class Recording(compiling.CompiledModule):
        def __init__(self, *args, **kwargs):
            depths.append(memory._depth)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(compiling, "CompiledModule", Recording)
    graph = datasets.gcn(datasets.load_tu("MUTAG", tu_dir, download=False), samples=[0, 1])
    compiling.compile(graph)
    assert depths == [1]


@pytest.mark.parametrize("free_bytes, trimmed", [(1 << 20, False), (memory._AFTER_TRIM_THRESHOLD + 1, True)])
def test_the_heap_is_trimmed_only_when_it_holds_more_than_the_process_keeps(monkeypatch, free_bytes, trimmed):
    # Trimming a small heap gives little back, and the next grounding faults in every page again.
    calls = []

    class FakeLibc:
        def mallopt(self, option, value):
            return 1

        def malloc_trim(self, pad):
            calls.append("trim")
            return 1

        def mallinfo2(self):
            return _MallInfo2(fordblks=free_bytes)

    monkeypatch.setattr(memory, "_LIBC", FakeLibc())
    with reusing_freed_memory():
        pass
    assert calls == (["trim"] if trimmed else [])


@pytest.mark.skipif(memory._HUGE_PAGES is None, reason="needs glibc and numpy's huge-page switch")
def test_numpy_advises_no_huge_pages_inside_and_its_setting_comes_back():
    switch = memory._HUGE_PAGES
    for setting in (True, False):  # whatever numpy did before, it does again after
        before = switch(setting)
        try:
            with reusing_freed_memory():
                with reusing_freed_memory():
                    assert switch(False) is False  # (reading it sets it: set it back as it was)
                assert switch(False) is False
            assert switch(setting) is setting
        finally:
            switch(before)


def test_a_process_that_chose_numpys_huge_pages_keeps_its_choice(monkeypatch):
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    assert memory._numpy_huge_page_switch() is None
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE")
    from numpy._core import multiarray
    assert memory._numpy_huge_page_switch() is getattr(multiarray, "_set_madvise_hugepage", None)



@pytest.mark.skipif(memory._LIBC is None or not THP_AVAILABLE,
                    reason="needs glibc and Linux's transparent huge pages")
def test_a_large_table_is_advised_huge_pages_and_keeps_what_is_written():
    import numpy as np
    with reusing_freed_memory():
        garbage = np.full(2**23, 7.0)  # heap pages faulted in (small) with values in them
        del garbage
        table = memory.table_on_huge_pages((2**22, 2), np.float64)  # 64 MB
        assert table.shape == (2**22, 2) and table.dtype == np.float64 and table.flags.c_contiguous
        inner = table.ctypes.data + -table.ctypes.data % (2 << 20)
        assert "hg" in vm_flags(inner)
        table[:] = np.arange(table.size, dtype=np.float64).reshape(table.shape)
        assert np.array_equal(table.reshape(-1), np.arange(table.size, dtype=np.float64))


def test_the_advice_covers_only_whole_huge_pages_within_the_table(monkeypatch):
    import numpy as np

    calls = []

    class Libc:  # records madvise; malloc's own functions are not needed here
        def madvise(self, address, length, advice):
            calls.append((address, length, advice))
            return 0

    monkeypatch.setattr(memory, "_LIBC", Libc())
    assert memory.table_on_huge_pages((1000,), np.float64).shape == (1000,)  # small: no advice
    assert calls == []
    for rows in (2**22 + 3, 2**22):
        calls.clear()
        table = memory.table_on_huge_pages((rows, 1), np.float64)
        start, end = table.ctypes.data, table.ctypes.data + table.nbytes
        assert [advice for _, _, advice in calls] == [memory._MADV_DONTNEED, memory._MADV_HUGEPAGE]
        for address, length, _ in calls:
            assert address % (2 << 20) == 0 and length % (2 << 20) == 0 and length > 0
            assert start <= address and address + length <= end
            assert address - start < 2 << 20 and end - (address + length) < 2 << 20  # every whole page in it
    monkeypatch.setattr(memory, "_LIBC", None)  # elsewhere than glibc: np.empty, no advice
    calls.clear()
    assert memory.table_on_huge_pages((2**23,), np.float64).size == 2**23 and calls == []
