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
