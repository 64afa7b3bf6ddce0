"""Determinism: a row's result depends only on its logits, params, step and history, never on the batch,
the policy, the prefilter stride or what the workspace held before."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, SamplingPolicy, TokenHistory

from .factories import logits, row_strategy

V = 600
MAX_ROWS = 8
SAMPLER = Sampler(V, MAX_ROWS)  # shared on purpose: stale workspace contents must never leak
SERIAL = Sampler(V, MAX_ROWS, policy=SamplingPolicy.SERIAL)
BATCH = st.lists(row_strategy(V), min_size=1, max_size=MAX_ROWS)


@settings(max_examples=60, deadline=None)
@given(BATCH, st.integers(0, 2**32 - 1), st.booleans(), st.data())
def test_a_row_alone_equals_that_row_at_any_position_in_any_batch(
    batch: list[RowSampling], seed: int, ties: bool, data: st.DataObject
) -> None:
    x = logits(len(batch), V, seed, ties=ties)
    together = SAMPLER.sample(x, batch)
    for pos in data.draw(st.lists(st.integers(0, len(batch) - 1), min_size=1, max_size=3, unique=True)):
        alone = SAMPLER.sample(x[pos : pos + 1], [batch[pos]])
        assert alone == [together[pos]]
    order = data.draw(st.permutations(range(len(batch))))
    shuffled = SAMPLER.sample(x[order], [batch[i] for i in order])
    assert shuffled == [together[i] for i in order]


@settings(max_examples=40, deadline=None)
@given(BATCH, st.integers(0, 2**32 - 1), st.booleans())
def test_serial_policy_draws_the_same_tokens_as_the_default_one(
    batch: list[RowSampling], seed: int, ties: bool
) -> None:
    x = logits(len(batch), V, seed, ties=ties)
    assert SERIAL.sample(x, batch) == SAMPLER.sample(x, batch)


@settings(max_examples=30, deadline=None)
@given(BATCH, st.integers(0, 2**32 - 1), st.booleans(), st.integers(1, 40))
def test_the_prefilter_stride_changes_nothing_but_speed(
    batch: list[RowSampling], seed: int, ties: bool, stride: int
) -> None:
    x = logits(len(batch), V, seed, ties=ties)
    assert Sampler(V, MAX_ROWS, stride=stride).sample(x, batch) == SAMPLER.sample(x, batch)


def test_sampling_does_not_modify_the_callers_logits() -> None:
    x = logits(3, V, seed=3)
    before = x.copy()
    rows = [
        RowSampling(SamplingParams(seed=i, repetition_penalty=1.5, frequency_penalty=1.0), 2, h)
        for i, h in enumerate(_histories(3))
    ]
    for sampler in (SAMPLER, SERIAL):
        sampler.sample(x, rows)
        assert np.array_equal(x.view(np.uint16), before.view(np.uint16))


def _histories(n: int) -> list[TokenHistory]:
    return [TokenHistory(V, list(range(i, i + 20)), [i, i, 5]) for i in range(n)]


def test_same_seed_and_step_give_the_same_token_in_a_fresh_sampler() -> None:
    x = logits(1, V, seed=11, scale=0.5)
    rows = [RowSampling(SamplingParams(seed=99, temperature=1.3, top_p=0.95), step) for step in range(30)]
    first = [SAMPLER.sample(x, [r])[0].token for r in rows]
    again = [Sampler(V, 1).sample(x, [r])[0].token for r in rows]
    assert first == again
    assert len(set(first)) > 10  # a flat distribution: the steps really draw different tokens


def test_different_seeds_give_different_token_sequences() -> None:
    x = logits(1, V, seed=12, scale=0.5)
    sequences = {
        tuple(SAMPLER.sample(x, [RowSampling(SamplingParams(seed=seed), step)])[0].token for step in range(16))
        for seed in range(40)
    }
    assert len(sequences) == 40


def test_real_vocabulary_rows_are_batch_and_policy_independent() -> None:
    vocab = 151_936
    sampler = Sampler(vocab, 4)
    serial = Sampler(vocab, 4, policy=SamplingPolicy.SERIAL)
    x = logits(4, vocab, seed=21)
    rows = [
        RowSampling(SamplingParams(seed=1, temperature=0.0, logprobs=5), 0),
        RowSampling(SamplingParams(seed=2, top_k=40, top_p=0.9, logprobs=0), 7),
        RowSampling(SamplingParams(seed=3, top_p=0.8, min_p=0.05), 9),
        RowSampling(SamplingParams(seed=4, temperature=0.7), 13),
    ]
    together = sampler.sample(x, rows)
    assert serial.sample(x, rows) == together
    for pos in (3, 0, 2, 1):
        assert sampler.sample(x[pos : pos + 1], [rows[pos]]) == [together[pos]]
