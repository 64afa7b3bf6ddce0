"""Exact selection (prefiltered top-k, top-p nucleus) against a full sort, and the inverse-CDF draws."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.sampling.draw import FullMass, draw_candidates, draw_full
from calculet.daemon.sampling.select import nucleus_full, nucleus_of, subsample_kth_bound, top_k

from .factories import rank_ids

ROWS = st.tuples(st.integers(1, 400), st.integers(0, 2**32 - 1), st.booleans())


def _row(shape: tuple[int, int, bool]) -> np.ndarray:
    n, seed, ties = shape
    rng = np.random.default_rng(seed)
    if ties:
        return rng.integers(-3, 4, size=n).astype(np.float32)
    return (rng.standard_normal(n) * 3).astype(np.float32)


def _probs(vals: np.ndarray, m: np.float32) -> np.ndarray:
    return np.exp(vals - m)


@given(ROWS, st.data(), st.integers(1, 9))
def test_top_k_keeps_exactly_the_k_best_ranked(shape: tuple[int, int, bool], data: st.DataObject, stride: int) -> None:
    x = _row(shape)
    k = data.draw(st.integers(1, x.shape[0] + 2))
    ids, vals = top_k(x, k, stride, np.empty(x.shape[0], dtype=bool))
    expected = np.sort(rank_ids(x)[:k])
    assert np.array_equal(ids, expected)
    assert np.array_equal(vals, x[expected])


@given(ROWS, st.integers(1, 50), st.integers(1, 9))
def test_subsample_bound_never_exceeds_the_true_kth_largest(shape: tuple[int, int, bool], k: int, stride: int) -> None:
    x = _row(shape)
    bound = subsample_kth_bound(x, k, stride)
    if bound is None:
        assert k > x[::stride].shape[0]
    else:
        assert bound <= np.sort(x)[::-1][k - 1]


def _reference_nucleus(x: np.ndarray, top_p: float, m: np.float32) -> np.ndarray:
    order = rank_ids(x)
    cum = np.cumsum(_probs(x[order], m), dtype=np.float64)
    cut = int(np.searchsorted(cum, top_p * cum[-1], side="left")) + 1
    return order[: min(cut, x.shape[0])]


@given(ROWS, st.floats(0.001, 0.999), st.integers(1, 9))
def test_nucleus_over_the_full_row_equals_a_full_sort(shape: tuple[int, int, bool], top_p: float, stride: int) -> None:
    x = _row(shape)
    m = x.max()
    expected = _reference_nucleus(x, top_p, m)
    # The normaliser is the same sum in the same (rank) order, so the boundary is bit-identical.
    total = float(np.cumsum(_probs(x[rank_ids(x)], m), dtype=np.float64)[-1])
    ids, vals = nucleus_full(x, top_p, total, lambda v: _probs(v, m), stride, np.empty(x.shape[0], dtype=bool))
    assert np.array_equal(ids, expected)
    assert np.array_equal(vals, x[expected])


@given(ROWS, st.floats(0.001, 0.999))
def test_nucleus_of_a_pool_renormalises_over_the_pool(shape: tuple[int, int, bool], top_p: float) -> None:
    x = _row(shape)
    m = x.max()
    pool = np.sort(rank_ids(x)[: max(1, x.shape[0] // 3)])
    ids, _ = nucleus_of(pool, x[pool], top_p, lambda v: _probs(v, m))
    sub = x[pool]
    assert np.array_equal(ids, pool[_reference_nucleus(sub, top_p, m)])


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
