"""Exact grouping (compiler/grouping.py): against plain Python, and with every hash colliding."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neurovec.compiler import grouping
from neurovec.compiler.grouping import (first_equal_multisets, first_equal_rows, first_rows,
                                        representatives)


def python_first(keys) -> list[int]:
    seen: dict = {}
    return [seen.setdefault(k, i) for i, k in enumerate(keys)]


@pytest.mark.parametrize("bound", [5, 1000, 2**40, None])
def test_first_rows_equals_python(bound):
    rng = np.random.default_rng(bound or 7)
    high = min(bound or 2**62, 2**62)
    for n in (0, 1, 2, 17, 5000):
        keys = rng.integers(0, high, n)
        if n > 2:
            keys[rng.integers(0, n, n // 2)] = keys[rng.integers(0, n, n // 2)]  # many repeats
        assert first_rows(keys, bound).tolist() == python_first(keys.tolist())


def test_first_rows_structured_keys_need_several_rounds():
    # Keys that agree in their low bits and differ in their high bits: the slot hash must mix.
    keys = (np.arange(3000, dtype=np.int64) % 1000) << 40
    assert first_rows(keys).tolist() == python_first(keys.tolist())


def test_first_rows_pair_keys_in_graph_order():
    # Pairs of labels a * bound_b + b as the passes make them: nearby rows, nearby keys (the first
    # round folds them into slots without hashing), many repeats, a bound far above 4n.
    rng = np.random.default_rng(5)
    n, b_bound = 20000, 4_347_101
    a = rng.integers(0, 61, n)
    b = np.arange(n) // 3 + rng.integers(0, 5, n)
    keys = a * b_bound + b
    assert first_rows(keys, 61 * b_bound).tolist() == python_first(keys.tolist())
    assert first_rows(keys * 2**20, 61 * b_bound * 2**20).tolist() == python_first(keys.tolist())


def test_representatives_first_occurrence_order():
    first = first_rows(np.array([5, 3, 5, 9, 3]))
    reps, inverse = representatives(first)
    assert reps.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1]


@pytest.mark.parametrize("bound", [7, 3000, 2**40])
def test_key_representatives_is_representatives_of_first_rows(bound):
    """From the table of first rows (small bounds) or through first_rows (large ones): the same
    arrays, values and types, as representatives(first_rows(keys))."""
    from neurovec.compiler.grouping import key_representatives
    rng = np.random.default_rng(bound)
    for n in (0, 1, 5, 1000):
        keys = rng.integers(0, min(bound, 50), n) * (bound // 50 or 1)
        keys = keys[keys < bound]
        for expected, got in zip(representatives(first_rows(keys, bound)), key_representatives(keys, bound)):
            assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_first_equal_rows_is_bitwise():
    values = np.array([[1.0, 0.0], [1.0, -0.0], [1.0, 0.0], [np.nan, 1.0], [np.nan, 1.0],
                       [1.0, 2.0**-60], [0.0, 1.0]])
    assert first_equal_rows(values).tolist() == [0, 1, 0, 3, 3, 5, 6]
    assert first_equal_rows(np.zeros((3, 0))).tolist() == [0, 0, 0]
    assert first_equal_rows(np.array([1.5, -0.0, 1.5, 0.0])).tolist() == [0, 1, 0, 3]


def test_first_equal_multisets_equals_python():
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 4, size=400)
    labels = rng.integers(0, 3, size=counts.sum())
    segments = np.split(labels, np.cumsum(counts)[:-1])
    expected = python_first([tuple(sorted(s)) for s in segments])
    assert first_equal_multisets(labels, counts).tolist() == expected
    assert first_equal_multisets(labels, counts, bound=2**61).tolist() == expected  # the lexsort path


def test_colliding_hashes_never_merge(monkeypatch):
    # Every row hashes alike: only the exact comparison with the group's first row decides.
    monkeypatch.setattr(grouping, "_multiset_hashes", lambda labels, counts, rows=None: np.zeros(counts.size, np.uint64))
    monkeypatch.setattr(grouping, "_word_hashes", lambda words: np.zeros(len(words), np.uint64))
    counts = np.array([2, 2, 2, 1])
    labels = np.array([0, 1, 1, 0, 0, 2, 0])
    assert first_equal_multisets(labels, counts).tolist() == [0, 0, 2, 3]
    assert first_equal_rows(np.array([[1.0], [-0.0], [1.0], [0.0]])).tolist() == [0, 1, 0, 3]
    rows = np.array([[1.0, 2.0, 3.0], [4.0, 2.0, 3.0], [1.0, 2.0, -0.0], [1.0, 2.0, 3.0], [5.0, 0.0, 0.0]])
    assert first_equal_rows(rows).tolist() == [0, 1, 2, 0, 4]  # rows sharing a first word: by bytes


@pytest.mark.parametrize("shared", [0, 3, 40, 5000])
def test_first_equal_rows_hashes_only_rows_that_share_a_first_word(monkeypatch, shared):
    """Rows whose first 8 bytes are their own are distinct without hashing them; the rows that
    share their first word with another (``shared`` of 5000, some equal, some differing only in
    a later column, -0.0 against 0.0 among them) are compared whole."""
    rng = np.random.default_rng(shared)
    values = rng.standard_normal((5000, 4))
    pick = rng.choice(5000, shared, replace=False)
    values[pick, 0] = 1.5
    values[pick[::3], 1:] = 0.0
    values[pick[1::6], 3] = -0.0
    expected = python_first([row.tobytes() for row in values])
    hashed = []
    words = grouping._word_hashes
    monkeypatch.setattr(grouping, "_word_hashes", lambda w: hashed.append(len(w)) or words(w))
    assert first_equal_rows(values).tolist() == expected
    assert hashed == ([] if shared == 0 else [shared] if shared < 2500 else [5000])


def test_multisets_up_to_scale():
    # {0, 0, 1, 1} ~ {1, 0} ~ {0, 1, 0, 1}; {0, 0, 1} differs; {2, 2, 2} ~ {2}; an empty segment.
    counts = np.array([4, 2, 4, 3, 3, 1, 0, 0])
    labels = np.array([0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 2, 2, 2, 2])
    assert first_equal_multisets(labels, counts, up_to_scale=True).tolist() == [0, 0, 0, 3, 4, 4, 6, 6]
    assert first_equal_multisets(labels, counts).tolist() == [0, 1, 0, 3, 4, 5, 6, 6]
    rng = np.random.default_rng(3)
    counts = rng.integers(1, 6, size=300)
    labels = rng.integers(0, 2, size=counts.sum())
    segments = np.split(labels, np.cumsum(counts)[:-1])

    def canonical(s):
        c = np.bincount(s, minlength=2)
        return tuple(c // np.gcd.reduce(c))
    assert first_equal_multisets(labels, counts, up_to_scale=True).tolist() == python_first(
        [canonical(s) for s in segments])


def test_run_block_against_gcd_of_run_starts():
    from math import gcd
    from neurovec.compiler.grouping import run_block
    cases = [[], [4], [1, 1, 1, 1], [1, 1, 2, 2, 3, 3], [1, 1, 2, 2, 2, 2], [1, 2, 2, 2], [5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7],
             [1, 1, 1, 1, 2, 2, 3, 3], [0, 1, 2, 3]]
    for seq in cases:
        seq = np.array(seq)
        n = seq.size
        expected = n or 1
        for start in np.flatnonzero(np.diff(seq)) + 1:
            expected = gcd(expected, int(start))
        assert run_block(seq[1:] != seq[:-1], n) == max(expected, 1), seq


def test_run_block_reads_the_changes_in_chunks(monkeypatch):
    """run_block reads the changes a chunk at a time: run starts on either side of every chunk
    boundary count (a small chunk, against the gcd of all run starts)."""
    from math import gcd
    from neurovec.compiler import grouping
    monkeypatch.setattr(grouping, "_RUN_CHUNK", 3)
    rng = np.random.default_rng(0)
    for _ in range(300):
        runs = rng.integers(1, 4, size=int(rng.integers(1, 6))) * int(rng.integers(1, 4))
        seq = np.repeat(np.arange(runs.size), runs)
        if rng.random() < 0.5:
            seq = np.tile(seq, int(rng.integers(1, 4)))
        expected = seq.size
        for start in np.flatnonzero(np.diff(seq)) + 1:
            expected = gcd(expected, int(start))
        assert grouping.run_block(seq[1:] != seq[:-1], seq.size) == expected, seq


def test_mix64_is_splitmix64s_finalizer():
    def reference(x: int) -> int:  # in plain Python, modulo 2**64
        mask = 2**64 - 1
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)
    values = np.array([0, 1, 2**63 + 5, 2**64 - 1, 123456789], dtype=np.uint64)
    kept = values.copy()
    assert grouping.mix64(values).tolist() == [reference(int(v)) for v in kept]
    assert np.array_equal(values, kept)  # the argument is left alone


@pytest.mark.parametrize("bound", [1, 7, 2**16, 2**16 + 1, 10**6, 2**40])
def test_stable_order_is_a_stable_argsort(bound):
    # One 16-bit digit, or several (least significant first): both give the stable order.
    rng = np.random.default_rng(bound)
    for n in (0, 1, 5000):
        keys = rng.integers(0, bound, n)
        keys[rng.integers(0, max(n, 1), n // 2)] = keys[rng.integers(0, max(n, 1), n // 2)] if n else keys[:0]
        assert np.array_equal(grouping.stable_order(keys, bound), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunks_change_nothing(monkeypatch, chunk):
    """first_rows (both tables, every round) and the multiset hashes work a chunk of rows at a time
    (NOTE: [chunks]): with chunks of a few rows, the same first rows as plain Python and the same
    hashes as one chunk of everything; segments longer than a chunk, and empty ones, included."""
    rng = np.random.default_rng(chunk)
    counts = rng.integers(0, 2 * chunk + 3, size=300)
    labels = rng.integers(0, 40, size=counts.sum())
    whole = grouping._multiset_hashes(labels, counts)
    keys = rng.integers(0, 50, size=700)
    structured = (np.arange(700, dtype=np.int64) % 90) << 40  # several hashed rounds
    monkeypatch.setattr(grouping, "CHUNK", chunk)
    assert np.array_equal(grouping._multiset_hashes(labels, counts), whole)
    for k, bound in ((keys, 50), (keys * 2**33, None), (structured, None)):
        assert first_rows(k, bound).tolist() == python_first(k.tolist())
    segments = np.split(labels, np.cumsum(counts)[:-1])
    assert first_equal_multisets(labels, counts).tolist() == python_first([tuple(sorted(s)) for s in segments])


@pytest.mark.parametrize("chunk", [3, 1 << 18])
def test_multisets_of_gathered_labels_equal_the_gathered_multisets(monkeypatch, chunk):
    """first_equal_multisets(labels, counts, rows=rows) reads the segments' labels as labels[rows]
    (each label mixed once, the mixed values gathered): the same hashes and first rows as with
    labels[rows] made whole, for sums and for means (up to scale), with every hash colliding too."""
    monkeypatch.setattr(grouping, "CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    labels = rng.integers(0, 6, size=30)  # few distinct labels: many equal multisets
    counts = rng.integers(0, 5, size=200)
    rows = rng.integers(0, labels.size, size=counts.sum())
    gathered = labels[rows]
    assert np.array_equal(grouping._multiset_hashes(labels, counts, rows), grouping._multiset_hashes(gathered, counts))
    segments = np.split(gathered, np.cumsum(counts)[:-1])
    expected = python_first([tuple(sorted(s)) for s in segments])
    for up_to_scale in (False, True):
        assert (first_equal_multisets(labels, counts, 6, up_to_scale, rows).tolist()
                == first_equal_multisets(gathered, counts, 6, up_to_scale).tolist())
    assert first_equal_multisets(labels, counts, rows=rows).tolist() == expected
    # Every hash colliding: the exact check alone decides, reading labels[rows] (a collision keeps equal rows
    # apart, never merges different ones: the same first rows either way, none of them wrong).
    monkeypatch.setattr(grouping, "_multiset_hashes", lambda labels, counts, rows=None: np.zeros(counts.size, np.uint64))
    collided = first_equal_multisets(labels, counts, rows=rows)
    assert collided.tolist() == first_equal_multisets(gathered, counts).tolist()
    assert all(expected[i] == expected[int(f)] for i, f in enumerate(collided))


@settings(max_examples=200, deadline=None)
@given(a=st.lists(st.integers(0, 3), max_size=20), b=st.lists(st.integers(0, 3), max_size=20),
       chunk=st.sampled_from([1, 3, 1 << 18]))
def test_equal_arrays_is_array_equal_a_chunk_at_a_time(a, b, chunk):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grouping, "CHUNK", chunk)
        for x, y in ((a, b), (a, a), (a, a[:-1] + [4]), (a, [4] + a[1:])):
            assert grouping.equal_arrays(np.array(x), np.array(y)) == np.array_equal(x, y)


@settings(max_examples=200, deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 5)), max_size=30))
def test_expand_segments_concatenates_the_ranges(ranges):
    """Empty ranges anywhere (first, last, in a row) and starts that go down or repeat."""
    starts = np.array([s for s, _ in ranges], dtype=np.int64)
    lengths = np.array([n for _, n in ranges], dtype=np.int32)
    got = grouping.expand_segments(starts, lengths)
    assert got.dtype == np.int64
    assert got.tolist() == [s + i for s, n in ranges for i in range(n)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 18])
def test_first_rows_in_segments_is_first_rows(monkeypatch, chunk):
    """Keys equal only within a segment ((segment, label) pairs, as a mean's multisets make them)
    grouped a run of whole segments at a time: the first-row form of all of them at once, with
    runs of one segment, of a few, or of everything (empty segments among them)."""
    from neurovec.compiler.grouping import first_rows_in_segments
    rng = np.random.default_rng(chunk)
    counts = rng.integers(0, 30, 400)
    counts[-3:] = 0
    segment = np.repeat(np.arange(counts.size), counts)
    keys = segment * 25 + rng.integers(0, 25, segment.size)
    expected = python_first(keys.tolist())
    monkeypatch.setattr(grouping, "CHUNK", chunk)
    assert first_rows_in_segments(keys, counts, counts.size * 25).tolist() == expected
