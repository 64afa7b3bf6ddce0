"""Exact selection against a full sort: the group-maximum prefilter, top-k and thresholds on FP32 rows
and on BF16 rows read in place, the top-p nucleus over a whole row, and the inverse-CDF draws."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.sampling.bf16 import BF16, Bf16Row, ceil_bits
from calculet.daemon.sampling.draw import FullMass, draw_candidates, draw_full
from calculet.daemon.sampling.groups import GroupMax
from calculet.daemon.sampling.nucleus import nucleus
from calculet.daemon.sampling.rowmath import RowMath, RowScratch
from calculet.daemon.sampling.select import nucleus_of
from calculet.daemon.sampling.source import F32Row

from .factories import rank_ids

# (length, seed, kind): kind 0 normal, 1 small integers (many ties), 2 all negative, 3 mixed signs
# with zeros and negative zeros, 4 one positive peak over a negative bulk.
ROWS = st.tuples(st.integers(1, 400), st.integers(0, 2**32 - 1), st.integers(0, 4))
GROUPS = st.integers(1, 70)


def _row(shape: tuple[int, int, int]) -> np.ndarray:
    """A float32 row whose values are exactly representable in BF16 (so both sources see one row)."""
    n, seed, kind = shape
    rng = np.random.default_rng(seed)
    if kind == 1:
        x = rng.integers(-3, 4, size=n).astype(np.float64)
    elif kind == 2:
        x = -np.abs(rng.standard_normal(n) * 3) - 0.01
    elif kind == 3:
        x = rng.choice([-2.5, -0.0, 0.0, 0.0078125, 1.5], size=n)
    elif kind == 4:
        x = -np.abs(rng.standard_normal(n) * 3) - 0.01
        x[rng.integers(0, n)] = 4.0
    else:
        x = rng.standard_normal(n) * 3
    return x.astype(BF16).astype(np.float32)


def _sources(x: np.ndarray, group: int) -> tuple[F32Row, Bf16Row]:
    n = x.shape[0]
    f32 = F32Row(n, group, np.empty(n, dtype=bool)).load(x)
    bf16 = Bf16Row(n, group, np.empty(n, dtype=np.float32), np.empty(n, dtype=bool)).load(x.astype(BF16))
    return f32, bf16


def _probs(vals: np.ndarray, m: np.float32) -> np.ndarray:
    return np.exp(vals - m)


@given(ROWS, st.integers(1, 50), GROUPS)
def test_the_group_maximum_bound_never_exceeds_the_true_kth_largest(
    shape: tuple[int, int, int], k: int, group: int
) -> None:
    x = _row(shape)
    groups = GroupMax(x, group, np.empty(x.shape[0], dtype=bool))
    bound = groups.kth_bound(k)
    if bound is None:
        assert k > groups.cols
    else:
        assert bound <= np.sort(x)[::-1][k - 1]
        assert np.array_equal(groups.at_least(bound), np.flatnonzero(x >= bound))


@given(ROWS, st.data(), GROUPS)
def test_top_k_keeps_exactly_the_k_best_ranked_on_both_sources(
    shape: tuple[int, int, int], data: st.DataObject, group: int
) -> None:
    x = _row(shape)
    k = data.draw(st.integers(1, x.shape[0] + 2))
    expected = np.sort(rank_ids(x)[:k])
    for src in _sources(x, group):
        ids, vals = src.top_k(k)
        assert np.array_equal(ids, expected), type(src).__name__
        assert vals.dtype == np.float32 and np.array_equal(vals, x[expected]), type(src).__name__


@given(ROWS, st.floats(-4.0, 5.0, width=32), GROUPS)
def test_thresholds_keep_exactly_the_elements_at_or_above_on_both_sources(
    shape: tuple[int, int, int], threshold: float, group: int
) -> None:
    x = _row(shape)
    expected = np.flatnonzero(x >= np.float32(threshold))
    for src in _sources(x, group):
        ids, vals = src.at_least(np.float32(threshold))
        assert np.array_equal(ids, expected), type(src).__name__
        assert np.array_equal(vals, x[expected]), type(src).__name__


@given(ROWS, GROUPS)
def test_the_bf16_argmax_is_the_float_argmax_with_ties_to_the_lowest_id(
    shape: tuple[int, int, int], group: int
) -> None:
    x = _row(shape)
    _, bf16 = _sources(x, group)
    assert bf16.finite_argmax() == int(np.argmax(x))


@given(ROWS, st.sampled_from([np.nan, np.inf, -np.inf, -np.nan]), st.data())
def test_a_bf16_row_with_a_nan_or_infinity_anywhere_has_no_argmax(
    shape: tuple[int, int, int], bad: float, data: st.DataObject
) -> None:
    x = _row(shape).astype(BF16)
    x[data.draw(st.integers(0, x.shape[0] - 1))] = bad
    _, bf16 = _sources(x.astype(np.float32), 64)
    bf16.load(x)
    assert bf16.finite_argmax() is None


@given(st.floats(2.0**-100, 2.0**127, width=32))
def test_ceil_bits_is_the_least_bf16_value_at_or_above(threshold: float) -> None:
    bits = ceil_bits(threshold)
    value = float(np.array([bits], dtype=np.int16).view(BF16)[0])
    assert value >= threshold
    below = float(np.array([bits - 1], dtype=np.int16).view(BF16)[0])
    assert below < threshold


def test_ceil_bits_of_a_threshold_above_the_largest_bf16_is_infinity() -> None:
    largest = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert ceil_bits(np.nextafter(np.float32(largest), np.float32(np.inf))) == 0x7F80


def _reference_nucleus(x: np.ndarray, top_p: float, probs: np.ndarray, total: float) -> np.ndarray:
    """Full sort by rank; the shortest prefix whose float64 cumulative mass reaches top_p * total."""
    order = rank_ids(x)
    cum = np.cumsum(probs[order], dtype=np.float64)
    cut = int(np.searchsorted(cum, top_p * total, side="left")) + 1
    return order[: min(cut, x.shape[0])]


@given(ROWS, st.floats(0.001, 0.999), GROUPS, st.floats(0.25, 2.0))
def test_the_nucleus_over_the_whole_row_equals_a_full_sort_on_both_sources(
    shape: tuple[int, int, int], top_p: float, group: int, temperature: float
) -> None:
    x = _row(shape)
    for src in _sources(x, group):
        scratch = RowScratch(x.shape[0], block=16)
        rm = RowMath(src, int(np.argmax(x)), temperature, scratch)
        total = rm.mass().total  # the normaliser the sampler uses; the reference takes it as given
        expected = _reference_nucleus(x, top_p, rm.probs(x), total)
        ids, vals = nucleus(src, top_p, rm)
        assert np.array_equal(ids, expected), type(src).__name__
        assert np.array_equal(vals, x[expected]), type(src).__name__


@given(ROWS, st.floats(0.001, 0.999))
def test_nucleus_of_a_pool_renormalises_over_the_pool(shape: tuple[int, int, int], top_p: float) -> None:
    x = _row(shape)
    m = x.max()
    pool = np.sort(rank_ids(x)[: max(1, x.shape[0] // 3)])
    ids, _ = nucleus_of(pool, x[pool], top_p, lambda v: _probs(v, m))
    sub = x[pool]
    probs = _probs(sub, m)
    total = float(np.cumsum(probs[rank_ids(sub)], dtype=np.float64)[-1])
    assert np.array_equal(ids, pool[_reference_nucleus(sub, top_p, probs, total)])


def test_draw_candidates_never_returns_a_zero_probability_token() -> None:
    ids = np.arange(6)
    probs = np.array([0.0, 0.5, 0.0, 0.25, 0.25, 0.0], dtype=np.float32)
    drawn = {draw_candidates(ids, probs, u) for u in np.linspace(0.0, 1.0 - 2**-53, 1001)}
    assert drawn == {1, 3, 4}
    assert draw_candidates(ids, probs, 1.0 - 2**-53) == 4


def test_draw_candidates_partitions_the_unit_interval_in_id_order() -> None:
    ids = np.array([3, 10, 11])
    probs = np.array([1.0, 2.0, 1.0], dtype=np.float32)
    assert [draw_candidates(ids, probs, u) for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.999)] == [3, 3, 10, 10, 11, 11]


def test_blocked_full_draw_equals_a_plain_inverse_cdf() -> None:
    rng = np.random.default_rng(5)
    block = 128
    for vocab in (1, 127, 128, 1000, 5003):
        padded = np.zeros(-(-vocab // block) * block, dtype=np.float32)
        padded[:vocab] = np.exp(rng.standard_normal(vocab) * 3 - 9).astype(np.float32)
        padded[rng.integers(0, vocab, size=vocab // 4)] = 0.0  # zero-probability tokens too
        padded[rng.integers(0, vocab)] = 1.0
        mass = FullMass.of(padded, block)
        cum = np.cumsum(padded[:vocab], dtype=np.float64)
        for u in rng.random(300):
            token = draw_full(padded, mass, block, float(u))
            assert token == int(np.searchsorted(cum, u * cum[-1], side="right"))
            assert padded[token] > 0.0
