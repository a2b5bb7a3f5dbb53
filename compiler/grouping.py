"""Exact grouping of equal rows in expected linear time: the primitive behind every merge.

The passes that merge rows (``dedup_facts``, ``iso_compression``, ``dedup_linear``,
``dedup_aggregations``) all ask one question of ``n`` rows: which of them are equal? The answer
here is the *first-row form*: ``first[i]`` is the smallest row equal to row ``i``, so the distinct
rows are exactly those with ``first[i] == i``; :func:`representatives` turns it into the
``(reps, inverse)`` pair that the passes rewrite with.

Equality is always decided exactly, never assumed from a hash or a tolerance:

* integer keys (a row label, a pair of labels ``a * bound_b + b``) are equal iff the integers
  are (:func:`first_rows`);
* fact rows are equal iff their bytes are (:func:`first_equal_rows`): ``-0.0`` differs from
  ``0.0``, and two values that differ in the last bit differ;
* segments of labels (the inputs of an aggregation) are equal iff they are the same multiset
  (:func:`first_equal_multisets`).

For the last two, a 64-bit hash of each row proposes the groups, and every proposed member is then
compared with its group's first row: bytes for facts, the sorted label sequences for multisets
(only the segments that a hash groups with another are sorted). A hash collision can keep two equal
rows apart, never merge different ones.

Nothing sorts all ``n`` keys. Keys are spread over a table of 2n to 4n slots (the key itself
when keys are small, else first its low bits xor its high bits, which keeps nearby keys in nearby
slots, and in later rounds the top bits after a multiplicative hash), each slot's smallest row is
found with ``np.minimum.at``, and the rows whose key differs from their slot's first row try again
among themselves with other hash bits (about a fifth of the rows, then a fifth of those, ...).
On 5M keys one round costs a fraction of one sort.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..sources.relational import joins
from . import backend

__all__ = ["row_dtype", "equal_arrays", "first_rows", "first_rows_in_segments", "first_equal_rows",
           "first_equal_multisets", "representatives", "key_representatives",
           "mix64", "expand_segments", "dense_ranks", "stable_order", "is_identity", "run_block"]

# Odd 64-bit multipliers (from splitmix64 and the golden ratio) for the rounds of slot hashing.
_MULTIPLIERS = tuple(np.uint64(m) for m in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB,
                                            0xD6E8FEB86659FD93, 0xA0761D6478BD642F, 0xE7037ED1A0B428DB))
_SMALL_KEYS = 1 << 10  # keys below max(4n, this) index a table directly
_RUN_CHUNK = 1 << 20  # run_block reads the changes this many at a time
CHUNK = 1 << 18  # rows (or labels) per chunk of edge-sized work (NOTE: [chunks])

# NOTE: [chunks] At 100x PROTEINS a pass groups 20M labels. Every edge-sized temporary is 160 MB
# of memory that the compile must take from the kernel unless an earlier temporary left it free,
# and on the 2-core VM of the committed runs a fresh gigabyte costs 2-3 s (pages zeroed and
# faulted in); the passes' compute is about linear in the edges, their fresh memory is not (the
# 100x pipeline took 8.9 s with its heap grown beforehand, 16-18 s without, loaded machine). So
# the grouping primitives make their per-row temporaries (slots, hashes, comparisons) a chunk
# of rows at a time, in buffers that stay in the caches and are reused, and hold only their
# results at full length. Chunks change nothing but the order in which rows are visited:
# minima, sums and comparisons per row are the same.


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every input bit over the output."""
    return _mix_in_place(np.array(x, dtype=np.uint64))


def _mix_in_place(x: np.ndarray) -> np.ndarray:
    """``mix64`` of a uint64 array the caller no longer needs, written over it: one scratch array
    instead of a fresh one per operation (at 50M rows each is 400 MB of new pages)."""
    scratch = np.empty_like(x)
    with np.errstate(over="ignore"):
        for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
            np.right_shift(x, np.uint64(shift), out=scratch)
            x ^= scratch
            if multiplier is not None:
                x *= np.uint64(multiplier)
    return x


def row_dtype(n: int):
    """The integer type of row numbers below ``n`` (and of first-row forms of ``n`` rows): int32
    where they fit, half the memory of int64."""
    return np.int32 if n < 2**31 else np.int64


def _first_in_table(keys: np.ndarray, bound: int) -> np.ndarray:
    """``first_rows`` of small keys (all below ``bound``): a table with a slot per key, filled
    and read a chunk of rows at a time (NOTE: [chunks])."""
    return _first_row_table(keys, bound)[keys]


def _first_row_table(keys: np.ndarray, bound: int) -> np.ndarray:
    """Per key below ``bound``: the first row with that key (``keys.size`` where none has it),
    filled a chunk of rows at a time (NOTE: [chunks])."""
    n = keys.size
    dtype = row_dtype(n)
    table = np.full(bound, n, dtype=dtype)
    for lo in range(0, n, CHUNK):
        np.minimum.at(table, keys[lo:lo + CHUNK], np.arange(lo, min(lo + CHUNK, n), dtype=dtype))
    return table


def first_rows(keys: np.ndarray, bound: int | None = None) -> np.ndarray:
    """First-row form of integer ``keys``: ``first[i]`` = the smallest row with key ``keys[i]``.

    ``bound``: every key lies in ``[0, bound)`` (small bounds index a table directly).

    Edge-sized work goes a chunk of rows at a time (NOTE: [chunks]): a round computes each chunk's
    slots twice (once to fill the table, once to read it) rather than keeping an array of all of
    them, and compares each chunk's keys with their slot's first key in place.
    """
    keys = np.asarray(keys)
    n = keys.size
    if n == 0:
        return np.zeros(0, row_dtype(0))
    if bound is not None and bound <= max(4 * n, _SMALL_KEYS):
        return _first_in_table(keys, int(bound))
    # Equal keys, equal words: an integer's bytes as the unsigned type of its width (no copy).
    words = keys.view(f"u{keys.itemsize}") if keys.dtype.kind in "iu" and keys.itemsize in (4, 8) \
        else keys.astype(np.uint64)
    first = np.arange(n, dtype=row_dtype(n))
    rows = None  # the rows still to place (None: all of them)
    table = None  # the slot table: made in the first round, reused by the (smaller) later ones
    for round_ in itertools.count():
        m = words.size
        bits = max((2 * m - 1).bit_length(), 1)  # at least 2m slots: about a fifth of the rows go again
        dtype = row_dtype(m)
        if table is None or table.dtype != dtype:
            table = np.empty(1 << bits, dtype=dtype)
        slot_first = table[:1 << bits]
        slot_first.fill(m)
        for lo in range(0, m, CHUNK):
            hi = min(lo + CHUNK, m)
            np.minimum.at(slot_first, _slots(words[lo:hi], bits, round_), np.arange(lo, hi, dtype=dtype))
        again = []  # per chunk: rows of another key than their slot's first row
        for lo in range(0, m, CHUNK):
            hi = min(lo + CHUNK, m)
            chunk = words[lo:hi]
            local = slot_first[_slots(chunk, bits, round_)]
            same = words[local] == chunk
            if rows is None:
                first[lo:hi][same] = local[same]
            else:
                first[rows[lo:hi][same]] = rows[local[same]]
            again.append(np.flatnonzero(np.logical_not(same, out=same)) + lo)
        # Every row of such a key is among them: they try again among themselves.
        again = np.concatenate(again)
        if not again.size:
            return first
        rows = again if rows is None else rows[again]
        words = words[again]


def first_rows_in_segments(keys: np.ndarray, counts: np.ndarray, bound: int | None = None) -> np.ndarray:
    """``first_rows(keys, bound)`` where equal keys lie in the same segment (``counts[j]``
    consecutive keys each): the keys are grouped a run of whole segments (about ``CHUNK`` keys)
    at a time, each run in a slot table of its own size that stays in the caches, instead of
    one table of all of them (at products-like x 1/8, SAGE's 7.8M (segment, label) pairs of a
    mean: a 64 MB table)."""
    keys = np.asarray(keys)
    n = keys.size
    first = np.empty(n, dtype=row_dtype(n))
    if n == 0:
        return first
    ends = np.cumsum(counts, dtype=np.int64)
    starts = ends - counts
    cuts = np.unique(starts[np.searchsorted(starts, np.arange(0, n, CHUNK)).clip(max=counts.size - 1)])
    cuts = np.append(cuts[cuts < n], n).tolist()
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        first[lo:hi] = first_rows(keys[lo:hi], bound)
        first[lo:hi] += lo
    return first


def _slots(words: np.ndarray, bits: int, round_: int) -> np.ndarray:
    """Slots of a round: folded in the first (``_folded_slots``), hashed in the later ones."""
    if round_ == 0:
        return _folded_slots(words, bits).view(np.int64)
    slots = np.multiply(words, _MULTIPLIERS[round_ % len(_MULTIPLIERS)])  # wraps (unsigned)
    slots >>= np.uint64(64 - bits)
    return slots.view(np.int64)


def _folded_slots(words: np.ndarray, bits: int) -> np.ndarray:
    """The first round's slots: the key's low ``bits`` bits, xor its higher bits shifted down.

    Keys in a program are row labels and pairs of them (``a * bound_b + b``), which follow the
    graph's order: neighbouring rows have nearby keys. Unlike a multiplicative hash, folding keeps
    nearby keys in nearby slots, so the table is read and written almost in order instead of at
    random (at 100x PROTEINS, 19M keys into a 256 MB table: 0.27 s instead of 0.53 s); and such
    keys collide less than hashed ones (2% against a fifth go again). Keys that fold badly
    (multiples of the table size, say) only pass to the hashed rounds."""
    slots = words >> np.uint64(bits)
    slots ^= words
    slots &= np.uint64((1 << bits) - 1)
    return slots


def representatives(first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(reps, inverse)`` of a first-row form: the distinct rows, ascending, and for every row
    the position of its representative among them (``first == reps[inverse]``)."""
    is_rep = first == _rows_like(first)
    rank = np.cumsum(is_rep, dtype=row_dtype(first.size))  # the narrow type: readers' indices are composed with it
    rank -= 1
    return np.flatnonzero(is_rep).astype(row_dtype(first.size), copy=False), rank[first]


def key_representatives(keys: np.ndarray, bound: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``representatives(first_rows(keys, bound))``. Small keys (those that index ``first_rows``'
    table) go from the table of each key's first row straight to ``(reps, inverse)``: the distinct
    rows are the table's entries, and a row's position among them is its key's, read from a table
    of one entry per key -- no first-row form of every row, no running count over every row, and
    no gather from an array of every row (at products-like x 1/8, a GCN layer's 8M edge products
    into 306k source rows)."""
    keys = np.asarray(keys)
    n = keys.size
    if n == 0 or bound is None or bound > max(4 * n, _SMALL_KEYS):
        return representatives(first_rows(keys, bound))
    table = _first_row_table(keys, int(bound))
    occurring = np.flatnonzero(table < n)  # keys that some row has
    firsts = table[occurring]
    order = np.argsort(firsts)  # distinct rows: no ties
    dtype = row_dtype(n)
    position = np.empty(int(bound), dtype=dtype)  # key -> its first row's place among the distinct rows
    position[occurring[order]] = np.arange(order.size, dtype=dtype)
    return firsts[order], position[keys]


def _rows_like(first: np.ndarray) -> np.ndarray:
    """``arange(first.size)`` in ``first``'s type when that is int32 (compared with it: half of an
    int64 arange's 150 MB at 20M rows)."""
    return np.arange(first.size, dtype=first.dtype if first.dtype == np.int32 else np.int64)


def equal_arrays(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal(a, b)`` for 1-d arrays, a chunk at a time: it stops at the first chunk that
    differs (most candidate periods of an edge-sized index differ early), and makes no array of
    the length of both (NOTE: [chunks])."""
    if a.shape != b.shape:
        return False
    for lo in range(0, a.size, CHUNK):
        if not np.array_equal(a[lo:lo + CHUNK], b[lo:lo + CHUNK]):
            return False
    return True


def is_identity(index: np.ndarray, count: int) -> bool:
    """Whether ``index`` is ``arange(count)`` (the ends are checked first: usually enough)."""
    return index.size == count and (count == 0 or (index[0] == 0 and index[-1] == count - 1
                                                     and np.array_equal(index, np.arange(count))))


def run_block(changed: np.ndarray, n: int) -> int:
    """The largest ``b`` dividing ``n`` such that every run of equal values in a sequence of length
    ``n`` starts at a multiple of ``b``; ``changed[e]``: the value at ``e + 1`` differs from ``e``.

    The first change usually settles it (``gcd(first, n) == 1``): no list of all changes then."""
    if n <= 1 or not changed.size:
        return max(n, 1)
    first = int(np.argmax(changed))
    if not changed[first]:
        return n  # a single run
    block = math.gcd(first + 1, n)
    # gcd(block, every run start), a chunk of changes at a time: no array of all the starts, and
    # done as soon as the gcd is 1.
    for lo in range(first + 1, changed.size, _RUN_CHUNK):
        if block == 1:
            break
        starts = np.flatnonzero(changed[lo:lo + _RUN_CHUNK]) + (lo + 1)
        if starts.size:
            block = math.gcd(block, int(np.gcd.reduce(starts % block)))
    return block


def dense_ranks(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, rank, counts)`` of small non-negative integer keys (all below ``bound``): the
    distinct keys ascending, each key's position among them, and how often each occurs --
    ``np.unique(keys, return_inverse=True, return_counts=True)`` by counting instead of sorting."""
    occurrences = np.bincount(keys, minlength=bound)
    values = np.flatnonzero(occurrences)
    position = np.cumsum(occurrences > 0, dtype=row_dtype(values.size))
    position -= 1
    return values.astype(row_dtype(bound), copy=False), position[keys], occurrences[values]


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for non-negative integer keys below ``bound``, as an LSD
    radix sort on 16-bit digits (``sources/relational/joins.stable_order``), in the rows' dtype."""
    keys = np.asarray(keys)
    return joins.stable_order(keys, bound, row_dtype(keys.size))


# -- rows of bytes ------------------------------------------------------------------------------------

def _words(values: np.ndarray) -> np.ndarray:
    """The bytes of every row as ``(n, w)`` uint64 words (zero-padded)."""
    n = values.shape[0] if values.ndim else 1
    flat = np.ascontiguousarray(values).reshape(n, -1)
    raw = flat.view(np.uint8).reshape(n, -1)
    pad = -raw.shape[1] % 8
    if pad:
        raw = np.concatenate([raw, np.zeros((n, pad), np.uint8)], axis=1)
    return raw.view(np.uint64).reshape(n, -1)


def _word_hashes(words: np.ndarray) -> np.ndarray:
    salts = mix64(np.arange(1, words.shape[1] + 1, dtype=np.uint64))
    hashes = np.zeros(words.shape[0], np.uint64)
    with np.errstate(over="ignore"):
        for column in range(words.shape[1]):  # value width, not rows
            hashes += _mix_in_place(words[:, column] ^ salts[column])
    return hashes


def first_equal_rows(values: np.ndarray) -> np.ndarray:
    """First-row form of the rows of ``values`` (axis 0) under bitwise equality.

    A row whose first 8 bytes no other row has equals no other row: only the rows that share their
    first word with another are hashed whole (node features of real numbers: hardly any)."""
    values = np.asarray(values)
    n = values.shape[0] if values.ndim else 1
    words = _words(values)
    if n and words.shape[1] > 1:
        by_first_word = first_rows(np.ascontiguousarray(words[:, 0]))
        shared = by_first_word != _rows_like(by_first_word)
        shared[by_first_word[shared]] = True  # and the first row of each such word
        rows = np.flatnonzero(shared)
        if rows.size < n // 2:
            first = np.arange(n, dtype=row_dtype(n))
            if rows.size:
                first[rows] = rows[_first_equal_words(words[rows])]
            return first
    return _first_equal_words(words)


def _first_equal_words(words: np.ndarray) -> np.ndarray:
    """``first_equal_rows`` of rows given as ``(n, w)`` uint64 words (``_words``)."""
    first = first_rows(_word_hashes(words))
    candidates = np.flatnonzero(first != _rows_like(first))
    if candidates.size:
        same = np.all(words[candidates] == words[first[candidates]], axis=1)
        wrong = candidates[~same]
        first[wrong] = wrong
    return first


# -- multisets ------------------------------------------------------------------------------------------

def expand_segments(starts: np.ndarray, lengths: np.ndarray, dtype=np.int64) -> np.ndarray:
    """Concatenated ranges ``[starts[k], starts[k] + lengths[k])``, of ``dtype`` (int32 is for
    ranges that end below ``2**31``: then every running sum below is one of their values).

    Built as a running sum in one output array: steps of 1, and at the head of each range the
    jump from the previous range's last value. ``repeat(...) + arange(total)`` made three arrays
    of the output's size (at 100x PROTEINS about 50M rows, 400 MB each)."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype)
    if not np.all(lengths):  # an empty range has no head to put its jump at
        starts, lengths = starts[lengths > 0], lengths[lengths > 0]
    starts = starts.astype(np.int64)
    out = np.ones(total, dtype)
    out[0] = starts[0]
    out[(np.cumsum(lengths) - lengths)[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(out, out=out)


def _multiset_hashes(labels: np.ndarray, counts: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Per segment: the count and the wrapping sum of the mixed labels (order-independent).

    With ``rows``, the segments' labels are ``labels[rows]``: each label is mixed once and the mixed
    values are gathered (at products-like, 2.45M labels read by 62M edges: the edges' labels are
    never made, nor mixed one by one), by the engine's kernel where it has one
    (``Backend.gathered_wrapping_sums``: the torch engine's C++, one pass; a products-like layer in
    the compile 0.7 s against numpy's 1.3 s). The sums are the same either way: integer sums wrap
    alike in any order."""
    mixed_labels = None if rows is None else _mix_in_place(labels.astype(np.uint64))
    kernel = backend.optional("gathered_wrapping_sums") if rows is not None else None
    sums = kernel(mixed_labels, rows, counts) if kernel else None
    if sums is None:
        sums = _wrapping_sums(labels, counts, rows, mixed_labels)
    with np.errstate(over="ignore"):
        sums ^= _mix_in_place(counts.astype(np.uint64) + np.uint64(0x51ED))
        return _mix_in_place(sums)


def _wrapping_sums(labels: np.ndarray, counts: np.ndarray, rows: np.ndarray | None,
                   mixed_labels: np.ndarray | None) -> np.ndarray:
    """``_multiset_hashes``' sums in numpy: the labels mixed (or the mixed labels gathered) and
    summed a run of whole segments at a time (about ``CHUNK`` labels; NOTE: [chunks]): no mixed
    copy of all of them."""
    n = counts.size
    sums = np.zeros(n, np.uint64)
    size = (labels if rows is None else rows).size
    if size:
        ends = np.cumsum(counts)
        starts = ends - counts
        # Chunks of whole segments: a chunk starts at the first segment starting at or after a
        # multiple of CHUNK labels.
        cuts = np.unique(np.searchsorted(starts, np.arange(0, size, CHUNK)))
        cuts = np.append(cuts[cuts < n], n)
        for s0, s1 in zip(cuts[:-1], cuts[1:]):
            lo, hi = starts[s0], ends[s1 - 1]
            nonempty = np.flatnonzero(counts[s0:s1] > 0)
            if nonempty.size:
                mixed = (_mix_in_place(labels[lo:hi].astype(np.uint64)) if rows is None
                         else mixed_labels[rows[lo:hi]])
                with np.errstate(over="ignore"):
                    sums[s0 + nonempty] = np.add.reduceat(mixed, starts[s0 + nonempty] - lo)
    return sums


def _sorted_segments(labels: np.ndarray, starts: np.ndarray, counts: np.ndarray, rows: np.ndarray,
                     bound: int, label_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The labels of segments ``rows``, each segment sorted, concatenated; and each one's offset.
    With ``label_rows``, the segments' labels are ``labels[label_rows]``."""
    lengths = counts[rows]
    positions = expand_segments(starts[rows], lengths)
    values = labels[positions if label_rows is None else label_rows[positions]].astype(np.int64)
    segment = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)
    if rows.size * max(bound, 1) < 2**62:
        keys = segment * bound + values  # segment-major keys: one plain sort sorts every segment
        keys.sort()
        values = keys - segment * bound
    else:
        values = values[np.lexsort((values, segment))]
    return values, np.cumsum(lengths) - lengths


def first_equal_multisets(labels: np.ndarray, counts: np.ndarray, bound: int | None = None,
                          up_to_scale: bool = False, rows: np.ndarray | None = None) -> np.ndarray:
    """First-row form of consecutive segments (``counts[j]`` labels each) under multiset equality.

    ``labels`` are exact integer labels (``0 <= label < bound``) of the segments' elements. With
    ``up_to_scale``, multisets are also equal when one's multiplicities are a common multiple of
    the other's: ``{a, a, b, b}`` equals ``{a, b}`` (a mean does not tell them apart).

    With ``rows``, the segments' labels are ``labels[rows]``, read where needed (``_multiset_hashes``)
    instead of made whole.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n = counts.size
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        labels = labels.astype(np.int64)
    if bound is None:
        bound = int(labels.max(initial=0)) + 1
    if up_to_scale and rows is not None:
        labels, rows = labels[rows], None
    if up_to_scale and labels.size:
        labels, counts = _scale_free(labels, counts, bound)
    first = first_rows(_multiset_hashes(labels, counts, rows))
    candidates = np.flatnonzero(first != _rows_like(first))
    if candidates.size == 0:
        return first
    reps = first[candidates]
    # Exact check: each candidate against its representative, as sorted label sequences.
    involved = np.zeros(n, bool)
    involved[candidates] = True
    involved[reps] = True
    involved_rows = np.flatnonzero(involved)
    position = np.cumsum(involved) - 1
    starts = np.cumsum(counts) - counts
    values, offsets = _sorted_segments(labels, starts, counts, involved_rows, bound, rows)
    same_count = counts[candidates] == counts[reps]
    checked, against = candidates[same_count], reps[same_count]
    lengths = counts[checked]
    differ = (values[expand_segments(offsets[position[checked]], lengths)]
              != values[expand_segments(offsets[position[against]], lengths)])
    mismatch = np.zeros(checked.size, bool)
    mismatch[np.repeat(np.arange(checked.size), lengths)[differ]] = True
    wrong = np.concatenate([candidates[~same_count], checked[mismatch]])
    first[wrong] = wrong
    return first


def _scale_free(labels: np.ndarray, counts: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's multiset with its multiplicities divided by their gcd (canonical up to scale):
    ``(labels, counts)`` of the reduced segments, each distinct label's copies in a row."""
    segment = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    if counts.size * bound >= 2**62:
        labels, bound = first_rows(labels, bound), labels.size
    # Distinct (segment, label) pairs, in element order -- so grouped by segment -- and their counts.
    reps, inverse = representatives(first_rows_in_segments(segment * bound + labels, counts, counts.size * bound))
    multiplicity = np.bincount(inverse, minlength=reps.size)
    pair_segment = segment[reps]
    starts = np.flatnonzero(np.diff(pair_segment, prepend=-1))
    divisor = np.gcd.reduceat(multiplicity, starts)
    reduced = multiplicity // np.repeat(divisor, np.diff(np.append(starts, reps.size)))
    new_counts = np.zeros(counts.size, np.int64)
    new_counts[pair_segment[starts]] = np.add.reduceat(reduced, starts)
    return np.repeat(labels[reps], reduced), new_counts
