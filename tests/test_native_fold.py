"""The C++ fold kernel (engines/native_fold.cpp, ``native.fold_sums``) gives ``sequential_sums``' values bit
for bit: each product rounded on its own (no fused multiply-add), added per segment in entry order from 0.0."""
import numpy as np
import pytest
import torch

from neurovec.compiler import backend
from neurovec.compiler.passes import fold_constants as fc
from neurovec.engines import native

pytestmark = pytest.mark.skipif(not native.available(), reason="neurovec's C++ kernels are switched off or not built here")

WIDTH = 19  # wider than a vector register: the kernel's vector loop and its remainder both run


def _bits(a):
    return np.ascontiguousarray(a).view(np.int64)


def _tricky():
    """Segments whose sums come out otherwise under a fused multiply-add or another order of addition.

    * segment 0: p0 = -(1 + 2^-29), p1 = (1 + 2^-30)^2 = 1 + 2^-29 + 2^-60, rounded 1 + 2^-29: the sum is
      0.0, where fma(c, x, acc) keeps 2^-60;
    * segment 1: 1e16, 1, -1e16, 1: in entry order 1.0, pairwise or in reverse order 0.0;
    * segment 2: one product -0.0: 0.0 (the sum starts from +0.0);
    * segment 3: empty: 0.0."""
    a = 1.0 + 2.0 ** -30
    rows = np.array([-(1.0 + 2.0 ** -29), a, 1e16, 1.0, -1e16, -0.0])
    facts = np.repeat(rows[:, None], WIDTH, axis=1)
    index = np.array([0, 1, 2, 3, 4, 3, 5])
    coef = np.array([1.0, a, 1.0, 1.0, 1.0, 1.0, 1.0])
    counts = np.array([2, 4, 1, 0])
    expected = np.repeat(np.array([0.0, 1.0, 0.0, 0.0])[:, None], WIDTH, axis=1)
    return facts, index, coef, counts, expected


def test_rounding_and_order_are_sequential_sums():
    facts, index, coef, counts, expected = _tricky()
    fused = (1.0 + 2.0 ** -30) ** 2 - (1.0 + 2.0 ** -29)  # what a contracted multiply-add would keep
    assert fused == 0.0 and np.float64(2.0 ** -60) != 0.0  # the data tells the two apart (see _tricky)
    for index_dtype in (np.int64, np.int32):
        value = native.fold_sums(facts, index.astype(index_dtype), coef, counts)
        assert np.array_equal(_bits(value), _bits(expected))
        assert np.array_equal(_bits(value), _bits(fc.sequential_sums(facts, index, coef, counts)))
    assert not np.signbit(native.fold_sums(facts, index, coef, counts)[2]).any()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weighted", [True, False])
def test_random_segments_bitwise(threads, weighted):
    rng = np.random.default_rng(3)
    facts = rng.standard_normal((300, WIDTH)) * np.exp(rng.uniform(-30, 30, (300, WIDTH)))
    facts[rng.random(facts.shape) < 0.05] = -0.0
    counts = rng.integers(0, 60, 2000)
    counts[:5] = [0, 500, 1, 0, 3]
    index = rng.integers(0, facts.shape[0], int(counts.sum()))
    coef = rng.standard_normal(index.size) / 3 if weighted else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        value = native.fold_sums(facts, index, coef, counts)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(_bits(value), _bits(fc.sequential_sums(facts, index, coef, counts, chunk_values=4096)))


@pytest.mark.parametrize("weighted", [True, False])
def test_float_facts_are_read_as_float32_with_the_same_bits(monkeypatch, weighted):
    """Facts that are all float32 values go to the kernel as float32 (half the bytes read at random) and
    give the float64 sums bit for bit; one fact that is not a float32 keeps the whole table float64."""
    rng = np.random.default_rng(5)
    facts = (rng.standard_normal((200, WIDTH)) * np.exp(rng.uniform(-20, 20, (200, WIDTH)))).astype(np.float32).astype(np.float64)
    facts[rng.random(facts.shape) < 0.05] = -0.0
    counts = rng.integers(0, 40, 900)
    index = rng.integers(0, facts.shape[0], int(counts.sum()))
    coef = rng.standard_normal(index.size) / 3 if weighted else None
    seen = []
    ops = native.operators()

    class Spy:
        def fold_sums(self, x, *args):
            seen.append(x.dtype)
            return ops.fold_sums(x, *args)

    monkeypatch.setattr(native, "operators", lambda: Spy())
    value = native.fold_sums(facts, index, coef, counts)
    assert seen == [torch.float32]
    assert np.array_equal(_bits(value), _bits(fc.sequential_sums(facts, index, coef, counts)))
    wide = facts.copy()
    wide[7, 3] = 1.0 + 2.0 ** -40  # not a float32
    value = native.fold_sums(wide, index, coef, counts)
    assert seen == [torch.float32, torch.float64]
    assert np.array_equal(_bits(value), _bits(fc.sequential_sums(wide, index, coef, counts)))


def test_bad_input_is_refused():
    facts, index, coef, counts, _ = _tricky()
    with pytest.raises(ValueError, match="outside the 6 fact rows"):
        native.fold_sums(facts, index + 1, coef, counts)
    with pytest.raises(ValueError, match="add up to 6, not to the 7 entries"):
        native.fold_sums(facts, index, coef, counts[:-2])


def test_fold_constants_takes_the_engine_sums_where_offered(monkeypatch):
    """The pass asks the engine (``Backend.sequential_sums``) first and computes them itself where it gives None."""
    facts, index, coef, counts, expected = _tricky()
    calls = []

    class Offering:
        def sequential_sums(self, *args):
            calls.append(args)
            return native.fold_sums(*args)

    monkeypatch.setattr(backend, "_registered", [Offering()])
    assert np.array_equal(_bits(fc._engine_sums(facts, index, coef, counts)), _bits(expected)) and len(calls) == 1
    monkeypatch.setattr(backend, "_registered", [object()])
    assert fc._engine_sums(facts, index, coef, counts) is None


def test_rows_of_several_axes_and_empty_inputs():
    rng = np.random.default_rng(1)
    facts, index, counts = rng.standard_normal((5, 2, 3)), np.array([0, 4, 4, 1]), np.array([1, 0, 3])
    coef = rng.standard_normal(4)
    value = native.fold_sums(facts, index, coef, counts)
    assert value.shape == (3, 6)
    assert np.array_equal(_bits(value), _bits(fc.sequential_sums(facts, index, coef, counts)))
    empty = native.fold_sums(np.zeros((0, 3)), np.zeros(0, np.int64), None, np.zeros(4, np.int64))
    assert empty.shape == (4, 3) and not empty.any() and not np.signbit(empty).any()


# --------------------------------------------------------------------------- csr_transpose

def _sorted_transpose(index, counts, n_sources):
    """A^T's bounds, segments and permutation by a stable sort by source (numpy's, not torch's)."""
    perm = np.argsort(index, kind="stable")
    t_ptr = np.zeros(n_sources + 1, np.int64)
    np.cumsum(np.bincount(index, minlength=n_sources), out=t_ptr[1:])
    seg_id = np.repeat(np.arange(counts.size), counts)
    return t_ptr, seg_id[perm], perm


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("values_dtype", [None, torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_sources", [70, 5000])
def test_csr_transpose_is_a_stable_sort_by_column(index_dtype, values_dtype, n_sources):
    """The counting sort places every entry where a stable sort by column puts it (each column's entries in
    their CSR order), its segment beside it, and its value bit for bit; unread columns and empty segments too.
    With 5000 columns, several to a bucket of the first pass (1024 buckets at most), the second pass sorts them."""
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 9, 3000)
    counts[:3] = [0, 40, 0]
    index = rng.integers(0, n_sources - 5, int(counts.sum()))  # the last 5 columns are never read
    index[:40] = 7  # one column many times over, from one segment
    index[100:300:3] = n_sources - 6  # and the last read one, from many segments
    ptr = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    values = None if values_dtype is None else torch.randn(index.size, dtype=torch.float64).to(values_dtype)
    for index_in, perm in ((np.int32, True), (np.int64, True), (np.int32, False)):
        t_ptr, t_col, t_perm, t_values = native.csr_transpose(torch.from_numpy(index.astype(index_in)), torch.from_numpy(ptr),
                                                              n_sources, values, index_dtype, perm=perm)
        expected = _sorted_transpose(index, counts, n_sources)
        assert t_ptr.dtype == t_col.dtype == index_dtype
        assert np.array_equal(t_ptr.numpy(), expected[0]) and np.array_equal(t_col.numpy(), expected[1])
        if perm:
            assert t_perm.dtype == torch.int64 and np.array_equal(t_perm.numpy(), expected[2])
        else:
            assert t_perm is None
        if values is None:
            assert t_values is None
        else:
            assert t_values.dtype == values_dtype
            assert torch.equal(t_values.view(-1).view(torch.uint8), values[torch.from_numpy(expected[2])].view(-1).view(torch.uint8))


def test_csr_transpose_refuses_bad_input():
    index, ptr = torch.tensor([0, 2, 1]), torch.tensor([0, 2, 3])
    with pytest.raises(ValueError, match="index 2 is outside the 2 columns"):
        native.csr_transpose(index, ptr, 2)
    with pytest.raises(ValueError, match="ptr must run from 0 to the number of entries"):
        native.csr_transpose(index, torch.tensor([0, 2]), 3)
    with pytest.raises(ValueError, match="ptr must be sorted"):
        native.csr_transpose(index, torch.tensor([0, 3, 1, 3]), 3)
    with pytest.raises(ValueError, match="as long as index"):
        native.csr_transpose(index, ptr, 3, torch.ones(2))


def test_gather_sum_is_the_same_with_and_without_the_kernel():
    """GatherSum.from_index's transpose by the counting sort is the one by torch's stable sort, tensor for tensor."""
    from neurovec.engines import kernels

    rng = np.random.default_rng(2)
    counts = rng.integers(1, 6, 500)
    index = rng.integers(0, 90, int(counts.sum()))
    values = rng.standard_normal(index.size)
    for coef, mean, dtype in ((None, False, torch.float32), (values, False, torch.float32), (values, True, torch.float64)):
        made = kernels.GatherSum.from_index(index.astype(np.int32), counts, 100, coef, mean=mean, dtype=dtype).buffers()
        with native.disabled():
            sorted_ = kernels.GatherSum.from_index(index.astype(np.int32), counts, 100, coef, mean=mean, dtype=dtype).buffers()
        for name, tensor in made.items():
            other = sorted_[name]
            assert (tensor is None) == (other is None), name
            if tensor is not None:
                assert tensor.dtype == other.dtype and torch.equal(tensor, other), name


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_csr_transpose_is_the_same_on_any_number_of_threads(threads):
    """Above 65,536 entries the counting sort splits its passes over torch's threads (the segments in
    shares, then the buckets): each share's entries go after the shares before them in every bucket, so
    the result is the stable sort by column however many threads there are."""
    rng = np.random.default_rng(11)
    counts = rng.integers(0, 40, 9000)
    n_sources = 20_000
    index = rng.integers(0, n_sources, int(counts.sum()))
    index[:5000] = 3  # a column read from the first share and from others
    ptr = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    values = torch.randn(index.size, dtype=torch.float64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t_ptr, t_col, t_perm, t_values = native.csr_transpose(torch.from_numpy(index), torch.from_numpy(ptr),
                                                              n_sources, values, torch.int32)
        without_perm = native.csr_transpose(torch.from_numpy(index), torch.from_numpy(ptr), n_sources, values,
                                            torch.int32, perm=False)
    finally:
        torch.set_num_threads(before)
    expected = _sorted_transpose(index, counts, n_sources)
    assert index.size > 65_536
    assert np.array_equal(t_ptr.numpy(), expected[0]) and np.array_equal(t_col.numpy(), expected[1])
    assert np.array_equal(t_perm.numpy(), expected[2])
    assert torch.equal(t_values, values[torch.from_numpy(expected[2])])
    assert without_perm[2] is None
    for made, other in zip((t_ptr, t_col, t_values), without_perm[:2] + without_perm[3:]):
        assert torch.equal(made, other)


def test_a_table_large_enough_for_huge_pages_gives_the_same_sums():
    # 48 MB of float32 facts (native.fold_sums copies them to huge pages: neurovec.memory)
    rng = np.random.default_rng(5)
    facts = rng.integers(-1000, 1000, (2**17, 96)).astype(np.float64) / 8
    counts = rng.integers(0, 4, 2**14)
    index = rng.integers(0, facts.shape[0], int(counts.sum()))
    coef = rng.standard_normal(index.size)
    assert np.array_equal(_bits(native.fold_sums(facts, index, coef, counts)),
                          _bits(fc.sequential_sums(facts, index, coef, counts)))


def _numpy_wrapping_sums(words, index, counts):
    from neurovec.compiler import grouping

    return grouping._wrapping_sums(None, counts, index, words)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gathered_wrapping_sums_are_numpys_on_any_number_of_threads(threads, index_dtype):
    """dedup's multiset hashes add up words[index[e]] per segment modulo 2**64: the C++ kernel gives numpy's
    sums bit for bit, with empty segments, sums that wrap, and above 65,536 entries split over threads."""
    rng = np.random.default_rng(threads)
    counts = rng.integers(0, 30, 9000)
    counts[:7] = 0
    words = rng.integers(0, 2**64, 5000, dtype=np.uint64)  # most sums of two or more wrap
    index = rng.integers(0, words.size, int(counts.sum())).astype(index_dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sums = native.gathered_wrapping_sums(words, index, counts)
    finally:
        torch.set_num_threads(before)
    assert index.size > 65_536 and sums.dtype == np.uint64
    assert np.array_equal(sums, _numpy_wrapping_sums(words, index, counts))
    assert sums[:7].tolist() == [0] * 7


def test_gathered_wrapping_sums_refuse_bad_input():
    words = np.arange(4, dtype=np.uint64)
    with pytest.raises(ValueError, match="an index is outside the 4 labels"):
        native.gathered_wrapping_sums(words, np.array([0, 4], np.int32), np.array([2]))
    with pytest.raises(ValueError, match="an index is outside the 4 labels"):
        native.gathered_wrapping_sums(words, np.array([-1, 0]), np.array([1, 1]))
    with pytest.raises(ValueError, match="counts adding up to 3"):
        native.gathered_wrapping_sums(words, np.array([0, 1]), np.array([1, 2]))


def test_multiset_hashes_take_the_engine_sums_where_offered(monkeypatch):
    """grouping._multiset_hashes of gathered labels asks the engine (Backend.gathered_wrapping_sums) and hashes
    what it returns; without it (None) numpy adds them up: the same hashes."""
    from neurovec.compiler import grouping

    calls = []

    def kernel(words, index, counts):
        calls.append(index.size)
        return native.gathered_wrapping_sums(words, index, counts)

    rng = np.random.default_rng(5)
    labels, counts = rng.integers(0, 50, 300), rng.integers(0, 6, 1000)
    rows = rng.integers(0, labels.size, int(counts.sum()))
    monkeypatch.setattr(backend, "optional", lambda name: kernel if name == "gathered_wrapping_sums" else None)
    offered = grouping._multiset_hashes(labels, counts, rows)
    assert calls == [rows.size]
    monkeypatch.setattr(backend, "optional", lambda name: None)
    assert np.array_equal(offered, grouping._multiset_hashes(labels, counts, rows))
    assert np.array_equal(offered, grouping._multiset_hashes(labels[rows], counts))
