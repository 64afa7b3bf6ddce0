"""Small factories and independent float64 references for the sampler tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from calculet.daemon.sampling import RowSampling, SamplingParams, TokenHistory

BF16 = ml_dtypes.bfloat16


def logits(rows: int, vocab: int, seed: int, scale: float = 3.0, ties: bool = False) -> np.ndarray:
    """bfloat16 [rows, vocab]; `ties` draws small integers so equal logits are common."""
    rng = np.random.default_rng(seed)
    if ties:
        return rng.integers(-4, 5, size=(rows, vocab)).astype(BF16)
    return (rng.standard_normal((rows, vocab)) * scale).astype(BF16)


def llm_like_logits(rows: int, vocab: int, seed: int) -> np.ndarray:
    """bfloat16 [rows, vocab] shaped like a language model's: a N(0, 2) bulk and a few peaks 12-16
    above it, so the most likely token has p ~ 0.5-0.9 and the 0.9-nucleus is a handful of tokens."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, vocab)) * 2.0
    for r in range(rows):
        x[r, rng.choice(vocab, size=5, replace=False)] = [16.0, 15.0, 14.0, 13.0, 12.0]
    return x.astype(BF16)


def softmax64(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Reference probabilities in float64 from float32/bf16 logits."""
    z = x.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def rank_ids(x: np.ndarray) -> np.ndarray:
    """All ids by (logit desc, id asc), via a full sort (the brute-force reference)."""
    return np.lexsort((np.arange(x.shape[0]), -x.astype(np.float64)))


def params_strategy(vocab: int) -> st.SearchStrategy[SamplingParams]:
    """Valid sampling parameters, biased towards the interesting corners."""
    return st.builds(
        SamplingParams,
        seed=st.integers(0, 2**64 - 1),
        temperature=st.sampled_from([0.0, 0.3, 1.0, 1.8]) | st.floats(0.05, 3.0),
        top_k=st.sampled_from([0, 0, 1, 5]) | st.integers(0, vocab),
        top_p=st.sampled_from([1.0, 1.0, 0.9, 0.5, 1e-6]) | st.floats(0.01, 1.0),
        min_p=st.sampled_from([0.0, 0.0, 0.05, 0.5]),
        repetition_penalty=st.sampled_from([1.0, 1.0, 1.3, 0.8]),
        presence_penalty=st.sampled_from([0.0, 0.0, 0.5, -1.0]),
        frequency_penalty=st.sampled_from([0.0, 0.0, 0.3, -0.2]),
        logprobs=st.sampled_from([None, None, 0, 3, 20]),
    )


def row_strategy(vocab: int) -> st.SearchStrategy[RowSampling]:
    """A row with valid params, a step, and a small history."""

    @st.composite
    def build(draw: st.DrawFn) -> RowSampling:
        params = draw(params_strategy(vocab))
        prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12))
        generated = draw(st.lists(st.integers(0, vocab - 1), max_size=12))
        step = draw(st.integers(0, 2**20))
        return RowSampling(params, step, TokenHistory(vocab, prompt, generated))

    return build()
