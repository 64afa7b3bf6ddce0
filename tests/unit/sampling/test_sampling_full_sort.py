"""At the real vocabulary (151,936), BF16 logits in, every truncating configuration draws exactly the
token of a brute-force reference that sorts the whole row: the prefilters, the in-place BF16 reads
and the nucleus search change the cost, never the token.

The reference follows the definitions in `row.py` step by step with a full `lexsort` of the row; the
only shared piece is the normaliser of a top-p over the whole row (the row's mass summed by block of
1,024, the sampler's stated definition), recomputed here from the float32 probabilities.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams
from calculet.daemon.sampling.rng import uniform

from .factories import llm_like_logits, logits

VOCAB = 151_936
BLOCK = 1024

CONFIGS = {
    "greedy": SamplingParams(temperature=0.0),
    "top_k=40+top_p=0.95": SamplingParams(temperature=0.8, top_k=40, top_p=0.95),
    "top_p=0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "top_p=0.5 at T=1.3": SamplingParams(temperature=1.3, top_p=0.5),
    "top_k=50": SamplingParams(temperature=1.0, top_k=50),
    "min_p=0.05": SamplingParams(temperature=0.7, min_p=0.05),
    "top_k+top_p+min_p": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
}


def full_sort(x: np.ndarray) -> np.ndarray:
    """The row's ids ranked by value descending, then id ascending: a `lexsort` of the whole row."""
    return np.lexsort((np.arange(x.shape[0]), -x.astype(np.float32)))


def reference_token(x: np.ndarray, params: SamplingParams, u: float, order: np.ndarray) -> int:
    """The token by the definitions, given the row's `full_sort`."""
    x = x.astype(np.float32)
    if params.greedy:
        return int(order[0])
    m = x[order[0]]
    probs = np.exp((x - m) * np.float32(1.0 / params.temperature))
    keep = order
    if 0 < params.top_k < x.shape[0]:
        keep = keep[: params.top_k]
    if params.top_p < 1.0:
        cum = np.cumsum(probs[keep], dtype=np.float64)
        if keep is order:  # over the whole row: the row's mass summed by block
            padded = np.zeros(-(-x.shape[0] // BLOCK) * BLOCK, dtype=np.float32)
            padded[: x.shape[0]] = probs
            total = float(np.cumsum(padded.reshape(-1, BLOCK).sum(axis=1), dtype=np.float64)[-1])
        else:
            total = float(cum[-1])
        cut = min(int(np.searchsorted(cum, params.top_p * total, side="left")) + 1, keep.shape[0])
        keep = keep[:cut]
    if params.min_p > 0.0:
        floor = np.float32(float(m) + params.temperature * math.log(params.min_p))
        keep = keep[x[keep] >= floor]
    survivors = np.sort(keep)
    cum = np.cumsum(probs[survivors], dtype=np.float64)
    return int(survivors[int(np.searchsorted(cum, u * float(cum[-1]), side="right"))])


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    peaked = llm_like_logits(3, VOCAB, seed=11)
    flat = logits(2, VOCAB, seed=12, scale=1.0)  # a nucleus of most of the vocabulary
    return np.concatenate((peaked, flat))


@pytest.fixture(scope="module")
def orders(rows: np.ndarray) -> list[np.ndarray]:
    """Each row's full sort: the rows never change, so each is sorted once for every configuration."""
    return [full_sort(row) for row in rows]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_configuration_draws_the_full_sort_token(name: str, rows: np.ndarray, orders: list[np.ndarray]) -> None:
    sampler = Sampler(VOCAB, rows.shape[0])
    for step in range(3):
        batch = [RowSampling(replace(CONFIGS[name], seed=r), step) for r in range(5)]
        got = [result.token for result in sampler.sample(rows, batch)]
        want = [reference_token(rows[r], batch[r].params, uniform(r, step), orders[r]) for r in range(5)]
        assert got == want
