"""TokenHistory bookkeeping and the three penalties' semantics (HF/vLLM repetition, OpenAI presence/frequency)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling import SamplingParams, TokenHistory
from calculet.daemon.sampling.penalties import apply_penalties

V = 50
IDS = st.lists(st.integers(0, V - 1), max_size=40)


@given(IDS, IDS)
def test_history_matches_a_recount_of_the_raw_tokens(prompt: list[int], generated: list[int]) -> None:
    h = TokenHistory(V, np.asarray(prompt, dtype=np.int32))
    for tok in generated:
        h.append(tok)
    counts = Counter(generated)
    assert sorted(h.seen_ids.tolist()) == sorted(set(prompt) | set(generated))
    assert dict(zip(h.generated_ids.tolist(), h.generated_counts.tolist(), strict=True)) == dict(counts)
    assert h.generated_len == len(generated)
    built_at_once = TokenHistory(V, prompt, generated)
    assert sorted(built_at_once.seen_ids.tolist()) == sorted(h.seen_ids.tolist())


def test_history_grows_past_its_initial_capacity() -> None:
    h = TokenHistory(1000, [])
    for tok in range(300):
        h.append(tok)
        h.append(tok)
    assert h.generated_ids.tolist() == list(range(300))
    assert set(h.generated_counts.tolist()) == {2}


def test_history_views_are_read_only() -> None:
    h = TokenHistory(V, [1, 2], [3])
    with pytest.raises(ValueError):
        h.seen_ids[0] = 7


@pytest.mark.parametrize(
    ("prompt", "generated", "match"),
    [
        ([0, V], (), r"^prompt: "),
        ([-1], (), r"^prompt: "),
        (np.array([1.0, 2.0]), (), r"^prompt: .*integers"),
        ([1], [V], r"^token: "),
        ([1], [-3], r"^token: "),
        ([1], [True], r"^token: "),
        ([1], [2.0], r"^token: "),
    ],
)
def test_history_refuses_ids_outside_the_vocabulary(prompt: object, generated: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        TokenHistory(V, prompt, generated)  # type: ignore[arg-type]


def _reference(x: np.ndarray, params: SamplingParams, prompt: list[int], generated: list[int]) -> np.ndarray:
    """Token-by-token penalties as HF (repetition) and OpenAI (presence/frequency) describe them."""
    out = x.astype(np.float64)
    for tok in set(prompt) | set(generated):
        v = out[tok]
        out[tok] = v / params.repetition_penalty if v > 0 else v * params.repetition_penalty
    for tok, count in Counter(generated).items():
        out[tok] -= params.frequency_penalty * count + params.presence_penalty
    return out


@given(
    st.integers(0, 2**32 - 1),
    IDS,
    IDS,
    st.floats(0.5, 2.0),
    st.floats(-2.0, 2.0),
    st.floats(-2.0, 2.0),
)
def test_penalties_match_the_token_by_token_definition(
    seed: int, prompt: list[int], generated: list[int], rep: float, pres: float, freq: float
) -> None:
    x = (np.random.default_rng(seed).standard_normal(V) * 4).astype(np.float32)
    params = SamplingParams(repetition_penalty=rep, presence_penalty=pres, frequency_penalty=freq)
    row = x.copy()
    apply_penalties(row, params, TokenHistory(V, prompt, generated))
    np.testing.assert_allclose(row, _reference(x, params, prompt, generated), rtol=1e-6, atol=1e-6)
    untouched = np.setdiff1d(np.arange(V), np.asarray(prompt + generated, dtype=np.intp))
    assert np.array_equal(row[untouched], x[untouched])


@pytest.mark.parametrize(("penalty", "logit", "limit"), [(1e-30, 3.0e38, 1), (1e30, -3.0e38, -1)])
def test_an_extreme_repetition_penalty_saturates_instead_of_overflowing(
    penalty: float, logit: float, limit: int
) -> None:
    row = np.array([logit, 1.0], dtype=np.float32)
    apply_penalties(row, SamplingParams(repetition_penalty=penalty), TokenHistory(2, [0]))
    assert row[0] == limit * np.finfo(np.float32).max
    assert row[1] == 1.0
