"""The untruncated draw by rejection (`rejection.py`): it proposes every tail token, follows the row's
distribution at vocabularies where the head is a small part of the row, and is a pure function of
(row, seed, step)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams
from calculet.daemon.sampling.rejection import HEAD_RANK, tail_token

VOCAB = 16_384  # 256 groups of 64: the head (HEAD_RANK) is a small upper set, the tail the rest
DRAWS = 6_000


@given(st.sets(st.integers(0, 199), max_size=60))
def test_tail_tokens_enumerate_every_token_outside_the_head_once_in_order(head: set[int]) -> None:
    ids = np.array(sorted(head), dtype=np.intp)
    below = ids - np.arange(ids.shape[0])
    tail = [tail_token(below, j) for j in range(200 - len(head))]
    assert tail == [t for t in range(200) if t not in head]


def _row(seed: int) -> np.ndarray:
    """A few peaks over a N(0, 1.5) bulk: about a quarter of the mass in the tail."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(VOCAB) * 1.5
    x[rng.choice(VOCAB, size=4, replace=False)] = [11.0, 10.5, 10.0, 9.0]
    return x.astype(ml_dtypes.bfloat16)


def _draw_counts(row: np.ndarray, temperature: float) -> np.ndarray:
    sampler = Sampler(VOCAB, 1)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for seed in range(DRAWS):
        params = SamplingParams(seed=seed, temperature=temperature)
        counts[sampler.sample(row[None, :], [RowSampling(params, 7)])[0].token] += 1
    return counts


def _reference(row: np.ndarray, temperature: float) -> np.ndarray:
    z = row.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


def test_the_draw_follows_the_rows_distribution_head_and_tail() -> None:
    row = _row(3)
    p = _reference(row, 1.0)
    counts = _draw_counts(row, 1.0)
    order = np.argsort(-p, kind="stable")
    head, tail = order[:HEAD_RANK], order[HEAD_RANK:]
    assert 0.05 < p[tail].sum() < 0.6  # the tail carries real mass: the rejection path runs
    # Pool the cells: the 8 most likely tokens, the rest of the head, and the tail in 4 id ranges.
    cells = [[int(t)] for t in order[:8]] + [list(head[8:])] + [list(q) for q in np.array_split(np.sort(tail), 4)]
    observed = np.array([counts[c].sum() for c in cells], dtype=np.float64)
    expected = np.array([p[c].sum() for c in cells]) * DRAWS
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 45.0, (observed, expected)  # df = 12: p(chi2 > 45) ~ 1e-5
    assert counts.sum() == DRAWS and (counts[tail] > 0).sum() > 100  # many distinct tail tokens drawn


def test_the_draw_distinguishes_temperatures() -> None:
    row = _row(4)
    counts = _draw_counts(row, 0.7)
    top = int(np.argmax(_reference(row, 0.7)))
    at_07, at_10 = _reference(row, 0.7)[top] * DRAWS, _reference(row, 1.0)[top] * DRAWS
    # The most likely token's count matches T = 0.7 within 5 sigma and is far from T = 1.0's.
    assert abs(counts[top] - at_07) < 5 * np.sqrt(at_07)
    assert abs(counts[top] - at_10) > 5 * np.sqrt(at_10)


def test_the_token_is_a_function_of_row_seed_and_step_only() -> None:
    row = _row(5)
    params = SamplingParams(seed=11, temperature=1.0)
    alone = Sampler(VOCAB, 1).sample(row[None, :], [RowSampling(params, 9)])[0].token
    batch = np.stack([_row(6), row, _row(7)])
    others = [RowSampling(SamplingParams(seed=s, temperature=1.0), 9) for s in (1, 2)]
    rows = [others[0], RowSampling(params, 9), others[1]]
    assert Sampler(VOCAB, 3).sample(batch, rows)[1].token == alone
    with_logprobs = SamplingParams(seed=11, temperature=1.0, logprobs=2)
    assert Sampler(VOCAB, 1).sample(row[None, :], [RowSampling(with_logprobs, 9)])[0].token == alone
