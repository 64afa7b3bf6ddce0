"""What each knob does: greedy, top-k, top-p, min-p, penalties, the drawn distribution and logprobs,
checked against float64 references computed from the logits, never against the sampler's own output."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, TokenHistory

from .factories import BF16, logits, rank_ids, softmax64

V = 300
SAMPLER = Sampler(V, 8)
SEEDS = st.integers(0, 2**64 - 1)


def _one(x: np.ndarray, params: SamplingParams, step: int = 0, history: TokenHistory | None = None) -> int:
    result = SAMPLER.sample(x.reshape(1, -1), [RowSampling(params, step, history)])[0]
    assert result.token is not None
    return result.token


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), SEEDS)
def test_temperature_zero_is_argmax_with_ties_to_the_lowest_id(logit_seed: int, seed: int) -> None:
    x = logits(1, V, logit_seed, ties=True)[0]
    lowest_max = int(np.flatnonzero(x == x.max())[0])
    assert _one(x, SamplingParams(seed=seed, temperature=0.0), step=seed % 1000) == lowest_max


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), SEEDS, st.floats(0.1, 3.0), st.booleans())
def test_top_k_one_and_a_tiny_top_p_are_greedy(logit_seed: int, seed: int, temperature: float, ties: bool) -> None:
    x = logits(1, V, logit_seed, ties=ties)[0]
    greedy = _one(x, SamplingParams(temperature=0.0))
    assert _one(x, SamplingParams(seed=seed, temperature=temperature, top_k=1)) == greedy
    assert _one(x, SamplingParams(seed=seed, temperature=temperature, top_p=1e-7)) == greedy


def _draws(x: np.ndarray, params: SamplingParams, n: int, sampler: Sampler = SAMPLER) -> np.ndarray:
    """Token counts over seeds 0..n-1 (step fixed), batched."""
    vocab = x.shape[0]
    counts = np.zeros(vocab, dtype=np.int64)
    batch = sampler.max_rows
    block = np.broadcast_to(x, (batch, vocab))
    for start in range(0, n, batch):
        rows = [RowSampling(replace(params, seed=s), 5) for s in range(start, min(n, start + batch))]
        for result in sampler.sample(np.ascontiguousarray(block[: len(rows)]), rows):
            assert result.token is not None
            counts[result.token] += 1
    return counts


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token outside the allowed set"
    expected = probs[support] * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum())


SMALL = np.array([1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.25, -2.0], dtype=BF16)
WIDE = Sampler(SMALL.shape[0], 256)


def test_drawn_frequencies_match_the_softmax_at_the_temperature() -> None:
    counts = _draws(SMALL, SamplingParams(temperature=0.8), 12_000, WIDE)
    assert _chi2(counts, softmax64(SMALL, 0.8)) < 40.0  # df=7: p(chi2 > 40) ~ 1e-6
    # The same draws are far from the temperature-1 distribution, so the check has power.
    assert _chi2(counts, softmax64(SMALL, 1.0)) > 100.0


def test_truncated_frequencies_match_the_renormalised_reference() -> None:
    params = SamplingParams(temperature=1.2, top_k=6, top_p=0.8)
    p = softmax64(SMALL, 1.2)
    order = rank_ids(SMALL)
    kept = order[:6]
    cum = np.cumsum(p[kept] / p[kept].sum())
    kept = kept[: int(np.searchsorted(cum, 0.8)) + 1]
    ref = np.zeros_like(p)
    ref[kept] = p[kept] / p[kept].sum()
    counts = _draws(SMALL, params, 12_000, WIDE)
    assert _chi2(counts, ref) < 40.0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(min_p=0.2),
        SamplingParams(min_p=0.2, top_k=7),  # top-k keeps more; min-p decides
        SamplingParams(min_p=0.2, top_p=0.995),  # so does top-p
    ],
)
def test_min_p_keeps_exactly_the_tokens_above_the_ratio_to_the_best(params: SamplingParams) -> None:
    x = np.array([0.0, -0.5, -1.0, -2.0, -3.0, -4.0, 0.0, -8.0], dtype=BF16)  # best p at ids 0 and 6
    p = softmax64(x)
    # min_p=0.2: allowed p_i >= 0.2 p_max <=> x_i >= ln 0.2 = -1.61 -> ids 0, 1, 2, 6.
    counts = _draws(x, params, 6000, WIDE)
    ref = np.where(x.astype(np.float64) >= math.log(0.2), p, 0.0)
    assert set(np.flatnonzero(counts).tolist()) == {0, 1, 2, 6}
    assert _chi2(counts, ref / ref.sum()) < 40.0


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    x = np.full(V, -9.0, dtype=BF16)
    x[[10, 11]] = [2.0, 1.75]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.25)
    assert _one(x, SamplingParams(temperature=0.0)) == 10
    assert _one(x, greedy, history=TokenHistory(V, [10])) == 11  # 2.0 / 1.25 = 1.6 < 1.75
    assert _one(x, greedy, history=TokenHistory(V, [], [10])) == 11  # output tokens count too
    x[[10, 11]] = [-1.0, -1.125]
    assert _one(x, greedy, history=TokenHistory(V, [10])) == 11  # -1.0 * 1.25 = -1.25 < -1.125


def test_presence_and_frequency_penalties_follow_openai_over_generated_tokens_only() -> None:
    x = np.full(V, -9.0, dtype=BF16)
    x[[10, 11]] = [2.0, 1.75]
    # presence: once per distinct token, whatever the count.
    assert _one(x, SamplingParams(temperature=0.0, presence_penalty=0.5), history=TokenHistory(V, [], [10])) == 11
    assert _one(x, SamplingParams(temperature=0.0, presence_penalty=0.125), history=TokenHistory(V, [], [10] * 9)) == 10
    # frequency: proportional to the count.
    freq = SamplingParams(temperature=0.0, frequency_penalty=0.1)
    assert _one(x, freq, history=TokenHistory(V, [], [10, 10])) == 10  # 2.0 - 0.2 = 1.8 > 1.75
    assert _one(x, freq, history=TokenHistory(V, [], [10, 10, 10])) == 11  # 1.7 < 1.75
    # prompt tokens are not penalised by presence/frequency.
    both = SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=2.0)
    assert _one(x, both, history=TokenHistory(V, [10] * 5)) == 10
    # negative penalties encourage repeats.
    assert _one(x, SamplingParams(temperature=0.0, presence_penalty=-0.5), history=TokenHistory(V, [], [11])) == 11


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), SEEDS, st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.sampled_from([0, 1, 3]))
def test_logprobs_are_the_full_log_softmax_before_truncation(
    logit_seed: int, seed: int, temperature: float, top_k: int
) -> None:
    vocab = 12
    x = logits(1, vocab, logit_seed)[0]
    params = SamplingParams(seed=seed, temperature=temperature, top_k=top_k, logprobs=20)
    result = Sampler(vocab, 1).sample(x.reshape(1, -1), [RowSampling(params, 3)])[0]
    ref = np.log(softmax64(x, temperature if temperature > 0 else 1.0))
    assert result.token is not None and result.logprob is not None
    assert result.logprob == pytest.approx(ref[result.token], abs=1e-5)
    top = result.top_logprobs
    assert [tok for tok, _ in top] == rank_ids(x).tolist()  # all 12, most likely first, ties by id
    assert np.allclose([lp for _, lp in top], ref[[tok for tok, _ in top]], atol=1e-5)
    assert math.fsum(math.exp(lp) for _, lp in top) == pytest.approx(1.0, abs=1e-5)
    assert dict(top)[result.token] == result.logprob


def test_logprobs_zero_gives_the_token_logprob_only_and_none_gives_nothing() -> None:
    x = logits(1, V, 4)[0]
    only = SAMPLER.sample(x.reshape(1, -1), [RowSampling(SamplingParams(seed=1, logprobs=0), 0)])[0]
    none = SAMPLER.sample(x.reshape(1, -1), [RowSampling(SamplingParams(seed=1), 0)])[0]
    three = SAMPLER.sample(x.reshape(1, -1), [RowSampling(SamplingParams(seed=1, logprobs=3), 0)])[0]
    assert only.logprob is not None and only.top_logprobs == ()
    assert none.logprob is None and none.top_logprobs == ()
    assert len(three.top_logprobs) == 3 and only.token == none.token == three.token
    assert [t for t, _ in three.top_logprobs] == rank_ids(x)[:3].tolist()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_row_is_flagged_and_the_other_rows_are_untouched(bad: float) -> None:
    x = logits(4, V, 8)
    rows = [RowSampling(SamplingParams(seed=i, temperature=0.9, top_p=0.9, logprobs=2), i) for i in range(4)]
    clean = SAMPLER.sample(x, rows)
    x[2, 123] = bad
    dirty = SAMPLER.sample(x, rows)
    assert dirty[2].anomaly and dirty[2].token is None and dirty[2].logprob is None
    assert [dirty[i] for i in (0, 1, 3)] == [clean[i] for i in (0, 1, 3)]
    assert not any(clean[i].anomaly for i in range(4))
