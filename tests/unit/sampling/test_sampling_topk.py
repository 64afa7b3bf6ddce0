"""Sampling from a top-k device output (`topk.py`) gives exactly the full-logits path's tokens and
logprobs, for every kind of request, and reads a row's full logits only when its top K cannot decide:
never for greedy or top-k <= K, always for logprobs and penalties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, TokenHistory
from calculet.daemon.sampling.topk import NeedFullRow, TopkRow, device_topk
from tests.unit.sampling.factories import BF16, llm_like_logits, logits, row_strategy

VOCAB = 1024
K = 256  # above the rejection sampler's head of 128: temperature draws mostly finish from the top K


def full_and_topk(x: np.ndarray, rows: list[RowSampling], k: int = K) -> tuple[list, list, object, list[int]]:  # type: ignore[type-arg]
    """The full path's results, the top-k path's, its tally, and which rows it read."""
    expected = Sampler(x.shape[1], len(rows)).sample(x, rows)
    read: list[int] = []

    def read_full(r: int) -> np.ndarray:
        read.append(r)
        return x[r]

    got, tally = Sampler(x.shape[1], len(rows)).sample_topk(device_topk(x, k), rows, read_full)
    return expected, got, tally, read


def row(seed: int = 7, step: int = 0, **params: object) -> RowSampling:
    return RowSampling(SamplingParams(seed=seed, **params), step)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31), ties=st.booleans(), k=st.sampled_from([1, 8, 130, K, VOCAB]))
def test_any_request_samples_the_full_paths_token_and_logprobs(
    data: st.DataObject, seed: int, ties: bool, k: int
) -> None:
    rows = [data.draw(row_strategy(VOCAB)) for _ in range(3)]
    x = logits(len(rows), VOCAB, seed, ties=ties)
    expected, got, tally, read = full_and_topk(x, rows, k)
    assert got == expected
    assert tally.from_topk + tally.full_reads == len(rows) and tally.full_reads == len(read)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.0},
        {"temperature": 0.8, "top_k": 40},
        {"temperature": 1.0, "top_k": 100},
        {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
        {"temperature": 1.0, "top_k": 50, "min_p": 0.05},
    ],
    ids=["greedy", "top-k", "top-k-100", "top-k+top-p", "top-k+min-p"],
)
def test_greedy_and_top_k_within_k_never_read_the_full_row(params: dict[str, object]) -> None:
    """(A top-k of exactly K may: BF16 logits often tie the K-th value with the tail.)"""
    x = llm_like_logits(8, VOCAB, 3)
    rows = [row(seed=s, step=s, **params) for s in range(8)]
    expected, got, tally, read = full_and_topk(x, rows)
    assert got == expected and read == [] and tally.from_topk == 8  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.0, "logprobs": 0},
        {"temperature": 1.0, "top_k": 5, "logprobs": 3},
        {"temperature": 1.0, "presence_penalty": 0.5},
        {"temperature": 0.9, "top_p": 0.9},
        {"temperature": 1.0, "top_k": K + 1},
    ],
    ids=["logprobs", "top-logprobs", "penalties", "top-p-alone", "top-k-beyond-K"],
)
def test_what_needs_the_whole_row_reads_it_and_still_matches(params: dict[str, object]) -> None:
    x = llm_like_logits(4, VOCAB, 5)
    history = TokenHistory(VOCAB, [1, 2, 3], [4])
    rows = [dataclasses.replace(row(seed=s, step=s, **params), history=history) for s in range(4)]
    expected, got, tally, read = full_and_topk(x, rows)
    assert got == expected and read == [0, 1, 2, 3] and tally.full_reads == 4  # type: ignore[attr-defined]


def test_a_temperature_draw_reads_the_row_only_when_a_proposal_lands_in_the_tail() -> None:
    """Language-model-like rows at T = 1 draw from the head almost always: few reads, same tokens.
    A flat row (every logit equal) ties its top K with its tail: every draw reads the row."""
    peaked = llm_like_logits(64, VOCAB, 11)
    rows = [row(seed=s, step=3 * s, temperature=1.0) for s in range(64)]
    expected, got, tally, _ = full_and_topk(peaked, rows)
    assert got == expected and tally.full_reads < 8  # type: ignore[attr-defined]
    flat = np.zeros((16, VOCAB), dtype=BF16)
    expected, got, tally, _ = full_and_topk(flat, rows[:16])
    assert got == expected and tally.full_reads > 8  # type: ignore[attr-defined]


def test_a_tail_proposal_the_tail_maximum_rejects_reads_nothing() -> None:
    """Rows whose envelope puts most of its mass on the tail (ranks 129..256 close below the head,
    the rest far below): at T = 1 nearly every draw proposes tail tokens. Outside the top K the tail
    maximum's probability is below the acceptance bar almost always, so the proposal is rejected
    without the row; the tokens are the full path's. Without the bound every such proposal reads."""
    rng = np.random.default_rng(4)
    x = np.full((32, VOCAB), -12.0, dtype=np.float32) - rng.random((32, VOCAB), dtype=np.float32)
    for r in range(32):
        ranked = rng.permutation(VOCAB)[:K]
        x[r, ranked] = np.linspace(0.0, -1.5, K, dtype=np.float32)  # the top K, within 1.5 of the max
    rows = [row(seed=s, step=s, temperature=1.0) for s in range(32)]
    expected, got, tally, _ = full_and_topk(x, rows)
    assert got == expected and tally.full_reads <= 2  # type: ignore[attr-defined]

    class Unbounded(TopkRow):  # the same source without the bound
        def value_bound(self, i: int) -> np.float32:
            return self.value(i)

    sampler = Sampler(VOCAB, len(rows))
    sampler._topk = Unbounded(VOCAB)  # type: ignore[attr-defined]
    unbounded, tally_unbounded = sampler.sample_topk(device_topk(x, K), rows, lambda r: x[r])
    assert unbounded == expected and tally_unbounded.full_reads >= 16  # 26 of 32 here


def test_a_row_with_nan_or_inf_is_an_anomaly_without_a_read() -> None:
    x = llm_like_logits(2, VOCAB, 1)
    x[1, 17] = np.nan
    expected, got, _, read = full_and_topk(x, [row(temperature=0.0), row(temperature=0.0)])
    assert got == expected and got[1].anomaly and read == []


def test_the_topk_source_refuses_what_its_top_k_cannot_answer() -> None:
    x = np.arange(VOCAB, dtype=np.float32)[None, :] / 10  # distinct: tail max is the (K+1)-th value
    src = TopkRow(VOCAB).load(device_topk(x, K), 0)
    assert float(src.value(VOCAB - 1)) == pytest.approx((VOCAB - 1) / 10)
    ids, _ = src.upper_set(K)
    assert ids.tolist() == list(range(VOCAB - K, VOCAB))
    with pytest.raises(NeedFullRow):
        src.value(0)
    assert src.value_bound(0) == np.float32((VOCAB - K - 1) / 10)  # the tail maximum bounds it
    assert src.value_bound(VOCAB - 1) == src.value(VOCAB - 1)
    with pytest.raises(NeedFullRow):
        src.upper_set(K + 1)
    with pytest.raises(NeedFullRow):
        src.at_least(np.float32(0.0))
    with pytest.raises(NeedFullRow):
        src.dense()
    ties = np.zeros((1, VOCAB), dtype=np.float32)  # every logit equal: the tail ties the top K
    with pytest.raises(NeedFullRow):
        TopkRow(VOCAB).load(device_topk(ties, K), 0).upper_set(1)


def test_device_topk_ranks_by_value_then_id_and_reports_the_tail() -> None:
    x = np.asarray([[1.0, 5.0, 5.0, 3.0, 5.0, 0.0]], dtype=np.float32)
    top = device_topk(x, 2)
    assert top.ids.tolist() == [[1, 2]] and top.values.tolist() == [[5.0, 5.0]]
    assert float(top.tail_max[0]) == 5.0 and bool(top.finite[0])
    with pytest.raises(ValueError):
        device_topk(x, 7)


def test_a_top_k_output_that_does_not_match_the_rows_is_refused() -> None:
    x = llm_like_logits(2, VOCAB, 1)
    with pytest.raises(InvalidArgument, match="top-k output"):
        Sampler(VOCAB, 4).sample_topk(device_topk(x, K), [row()], lambda r: x[r])


@pytest.mark.parametrize("ties", [False, True])
def test_the_bf16_reading_of_device_topk_equals_the_plain_one(ties: bool) -> None:
    x = logits(6, VOCAB, 21, ties=ties)
    x[5, 3] = np.inf  # a non-finite row
    fast, plain = device_topk(x, 40), device_topk(x.astype(np.float32), 40)
    assert fast.finite.tolist() == plain.finite.tolist() == [True] * 5 + [False]
    assert fast.ids[:5].tolist() == plain.ids[:5].tolist()
    assert fast.values[:5].tolist() == plain.values[:5].tolist()
    assert fast.tail_max[:5].tolist() == plain.tail_max[:5].tolist()
