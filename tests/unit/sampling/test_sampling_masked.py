"""Constrained rows (`masked.py`): the sampler draws exactly what a straightforward implementation of
the definition draws on the masked logits with the same uniforms, on the FP32, BF16 and top-k paths
alike, never a forbidden token; and a top-k package reads a constrained row's full logits only when
its top K cannot decide."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, SamplingPolicy
from calculet.daemon.sampling.draw import FullMass
from calculet.daemon.sampling.penalties import apply_penalties
from calculet.daemon.sampling.rejection import HEAD_RANK, MAX_TRIALS
from calculet.daemon.sampling.rng import uniform, uniform_at
from calculet.daemon.sampling.rowmath import DEFAULT_BLOCK
from calculet.daemon.sampling.topk import device_topk
from tests.unit.sampling.factories import llm_like_logits, logits, row_strategy

VOCAB = 1024
K = 256


def masks(vocab: int, seed: int, sizes: tuple[int, ...]) -> list[np.ndarray]:
    """Bool masks allowing `n` random tokens each."""
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        m = np.zeros(vocab, dtype=bool)
        m[rng.choice(vocab, size=n, replace=False)] = True
        out.append(m)
    return out


# ---- the reference: the definition, written out on a dense masked float32 row -------------------


def _pick(cum: np.ndarray, target: float) -> int:
    i = int(np.searchsorted(cum, target, side="right"))
    if i >= cum.shape[0]:
        i = int(np.searchsorted(cum, cum[-1], side="left"))
    return i


def _rank(ids: np.ndarray, vals: np.ndarray) -> np.ndarray:
    return np.lexsort((ids, -vals))


def reference(x_row: np.ndarray, row: RowSampling) -> tuple[int, float | None]:
    """The token (and logprob) of the masked row by the definition (docs/daemon.md): penalties,
    mask to -inf, temperature, top-k, top-p, min-p, then an inverse CDF in id order; with no
    truncation, the head/tail rejection draw of `masked.py`, written out densely."""
    p = row.params
    assert row.allowed is not None
    x = x_row.astype(np.float32).copy()
    if p.has_penalties:
        assert row.history is not None
        apply_penalties(x, p, row.history)
    xm = np.where(row.allowed, x, np.float32(-np.inf)).astype(np.float32)
    ids_all = np.arange(x.shape[0])
    order = _rank(ids_all, xm)
    best = int(order[0])
    m = xm[best]
    t = 1.0 if p.greedy else p.temperature
    inv_t = np.float32(1.0 / t)

    def probs(v: np.ndarray) -> np.ndarray:
        z = np.subtract(v.astype(np.float32), m)
        if inv_t != 1.0:
            z = np.multiply(z, inv_t)
        return np.exp(z)

    padded = np.zeros(-(-x.shape[0] // DEFAULT_BLOCK) * DEFAULT_BLOCK, dtype=np.float32)
    padded[: x.shape[0]] = probs(xm)
    total = FullMass.of(padded, DEFAULT_BLOCK).total
    token = best if p.greedy else _reference_draw(x, xm, row, m, probs, padded, total)
    lp = None
    if p.logprobs is not None:
        z = np.float32(xm[token] - m)
        lp = float(z * inv_t if inv_t != 1.0 else z) - math.log(total)
    return token, lp


def _reference_draw(x, xm, row, m, probs, padded, total):  # type: ignore[no-untyped-def]
    p = row.params
    vocab = x.shape[0]
    ids = np.arange(vocab)
    k = p.top_k if 0 < p.top_k < vocab else 0
    floor = float(m) + p.temperature * math.log(p.min_p) if p.min_p > 0 else None
    if k or p.top_p < 1.0 or floor is not None:
        order = _rank(ids, xm)
        cand = order[:k] if k else order
        if p.top_p < 1.0:
            cum = np.cumsum(probs(xm[cand]), dtype=np.float64)
            target = p.top_p * (float(cum[-1]) if k else total)
            cut = min(int(np.searchsorted(cum, target, side="left")) + 1, cum.shape[0])
            cand = cand[:cut]
        if floor is not None:
            cand = cand[xm[cand] >= np.float32(floor)]
        cand = np.sort(cand)
        cum = np.cumsum(probs(xm[cand]), dtype=np.float64)
        return int(cand[_pick(cum, uniform(p.seed, row.step) * float(cum[-1]))])
    # No truncation: the head is the allowed part of the unmasked row's top HEAD_RANK.
    top = _rank(ids, x)[:HEAD_RANK]
    head = np.sort(top[row.allowed[top]])
    tail = np.setdiff1d(np.flatnonzero(row.allowed), head)
    if tail.size == 0:
        cum = np.cumsum(probs(xm[head]), dtype=np.float64)
        return int(head[_pick(cum, uniform_at(p.seed, row.step, 0) * float(cum[-1]))])
    bound = min(np.float32(x[top].min()), m)
    p_t = float(probs(np.asarray([bound]))[0])
    head_cum = np.cumsum(probs(xm[head]), dtype=np.float64)
    head_mass = float(head_cum[-1]) if head.size else 0.0
    span = head_mass + tail.size * p_t
    for trial in range(MAX_TRIALS):
        point = uniform_at(p.seed, row.step, 2 * trial) * span
        if point < head_mass:
            return int(head[min(int(np.searchsorted(head_cum, point, side="right")), head.size - 1)])
        if p_t <= 0.0:
            continue
        token = int(tail[min(int((point - head_mass) / p_t), tail.size - 1)])
        if uniform_at(p.seed, row.step, 2 * trial + 1) * p_t < float(probs(np.asarray([xm[token]]))[0]):
            return token
    block_cum = np.cumsum(padded.reshape(-1, DEFAULT_BLOCK).sum(axis=1), dtype=np.float64)
    target = uniform_at(p.seed, row.step, 2 * MAX_TRIALS) * total
    b = _pick(block_cum, target)
    before = float(block_cum[b - 1]) if b else 0.0
    cum = np.cumsum(padded[b * DEFAULT_BLOCK : (b + 1) * DEFAULT_BLOCK], dtype=np.float64)
    return b * DEFAULT_BLOCK + _pick(cum, target - before)


def constrained(rows: list[RowSampling], allowed: list[np.ndarray]) -> list[RowSampling]:
    return [dataclasses.replace(r, allowed=a) for r, a in zip(rows, allowed, strict=True)]


def full_and_topk(x: np.ndarray, rows: list[RowSampling], k: int = K) -> tuple[list, list, list[int]]:  # type: ignore[type-arg]
    expected = Sampler(x.shape[1], len(rows)).sample(x, rows)
    read: list[int] = []

    def read_full(r: int) -> np.ndarray:
        read.append(r)
        return x[r]

    got, tally = Sampler(x.shape[1], len(rows)).sample_topk(device_topk(x, k), rows, read_full)
    assert tally.full_reads == len(read)
    return expected, got, read


# ---- tests ----------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    seed=st.integers(0, 2**31),
    sizes=st.tuples(*[st.sampled_from([1, 2, 5, 40, 127, 129, 600, VOCAB - 1, VOCAB])] * 3),
    llm=st.booleans(),
)
def test_the_sampler_draws_the_reference_token_of_the_masked_row(
    data: st.DataObject, seed: int, sizes: tuple[int, ...], llm: bool
) -> None:
    x = llm_like_logits(3, VOCAB, seed) if llm else logits(3, VOCAB, seed)
    rows = constrained([data.draw(row_strategy(VOCAB)) for _ in range(3)], masks(VOCAB, seed, sizes))
    serial = Sampler(VOCAB, 3, policy=SamplingPolicy.SERIAL).sample(x, rows)
    for path in (x, x.astype(np.float32)):
        results = Sampler(VOCAB, 3).sample(path, rows)
        assert results == serial
        for r, (res, row) in enumerate(zip(results, rows, strict=True)):
            token, lp = reference(x[r], row)
            assert res.token == token
            assert row.allowed is not None and row.allowed[token]
            if lp is not None:
                assert res.logprob is not None and res.logprob == pytest.approx(lp, rel=1e-6, abs=1e-6)
                assert all(row.allowed[t] for t, _ in res.top_logprobs)
                assert all(math.isfinite(v) for _, v in res.top_logprobs)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    seed=st.integers(0, 2**31),
    sizes=st.tuples(*[st.sampled_from([1, 3, 40, 200, 600, VOCAB])] * 3),
    k=st.sampled_from([1, 8, 130, K, VOCAB]),
)
def test_full_and_topk_packages_give_equal_tokens_under_a_mask(
    data: st.DataObject, seed: int, sizes: tuple[int, ...], k: int
) -> None:
    x = llm_like_logits(3, VOCAB, seed)
    rows = constrained([data.draw(row_strategy(VOCAB)) for _ in range(3)], masks(VOCAB, seed, sizes))
    expected, got, _ = full_and_topk(x, rows, k)
    assert got == expected


def test_a_topk_row_is_read_only_when_no_allowed_token_is_in_its_top_k() -> None:
    x = llm_like_logits(2, VOCAB, 3)
    top = device_topk(x, K)
    inside, outside = np.zeros(VOCAB, dtype=bool), np.zeros(VOCAB, dtype=bool)
    inside[top.ids[0, :3]] = True  # three of row 0's top K
    tail = np.setdiff1d(np.arange(VOCAB), top.ids[1])
    outside[tail[:3]] = True  # three tokens outside row 1's top K
    greedy = SamplingParams(seed=1, temperature=0.0)
    rows = [RowSampling(greedy, 0, allowed=inside), RowSampling(greedy, 0, allowed=outside)]
    expected, got, read = full_and_topk(x, rows)
    assert got == expected and read == [1]
    assert got[0].token == int(top.ids[0, 0])


def test_a_sampled_topk_row_with_its_allowed_tokens_on_top_reads_nothing() -> None:
    """The llm-like rows put most mass on 5 peaks: allowing them and the bulk, a temperature draw
    lands in the head or is rejected by the tail maximum's bound, over many seeds (>= 95 % unread)."""
    x = llm_like_logits(16, VOCAB, 11)
    rows = [
        RowSampling(SamplingParams(seed=s, temperature=0.7), s, allowed=(np.arange(VOCAB) % 3 != 0) | (x[s] > 10))
        for s in range(16)
    ]
    expected, got, read = full_and_topk(x, rows)
    assert got == expected
    assert len(read) <= 1


def test_a_forbidden_token_is_never_drawn_even_when_it_holds_all_the_mass() -> None:
    x = np.full((1, VOCAB), -5.0, dtype=np.float32)
    x[0, 7] = 50.0  # the unmasked argmax
    allowed = np.zeros(VOCAB, dtype=bool)
    allowed[[3, 900]] = True
    for seed in range(50):
        for params in (SamplingParams(seed=seed), SamplingParams(seed=seed, temperature=0.0, logprobs=5)):
            res = Sampler(VOCAB, 1).sample(x, [RowSampling(params, seed, allowed=allowed)])[0]
            assert res.token in (3, 900)
            assert {t for t, _ in res.top_logprobs} <= {3, 900}


def test_the_masked_draw_follows_the_masked_distribution() -> None:
    """Frequencies over many seeds match the renormalised masked softmax (fixed seeds: no flakiness)."""
    vocab = 300
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, vocab)) * 2.0).astype(np.float32)
    allowed = np.zeros(vocab, dtype=bool)
    allowed[rng.choice(vocab, size=60, replace=False)] = True
    sampler = Sampler(vocab, 1)
    n = 6000
    counts = np.zeros(vocab)
    for seed in range(n):
        res = sampler.sample(x, [RowSampling(SamplingParams(seed=seed), 0, allowed=allowed)])[0]
        assert res.token is not None
        counts[res.token] += 1
    p = np.where(allowed, np.exp(x[0].astype(np.float64) - x[0].max()), 0.0)
    p /= p.sum()
    assert counts[~allowed].sum() == 0
    big = p > 0.02
    # 5 standard deviations on each sizeable token's count
    assert np.all(np.abs(counts[big] - n * p[big]) <= 5 * np.sqrt(n * p[big] * (1 - p[big])) + 1)


def test_a_mask_of_the_wrong_shape_or_allowing_nothing_is_refused() -> None:
    x = logits(1, VOCAB, 0)
    for bad in (np.zeros(VOCAB, dtype=bool), np.ones(VOCAB - 1, dtype=bool), np.ones(VOCAB, dtype=np.int8)):
        with pytest.raises(InvalidArgument, match="allowed"):
            Sampler(VOCAB, 1).sample(x, [RowSampling(SamplingParams(), 0, allowed=bad)])


def _whole_row_cases() -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows and masks that take each branch of the whole-row draw: every allowed token in the head,
    a head and a tail, no head at all, and a tail so improbable that the trials run out (fallback)."""
    x = logits(1, VOCAB, 21, scale=1.0)[0].astype(np.float32)
    order = np.lexsort((np.arange(VOCAB), -x))
    in_head = np.zeros(VOCAB, dtype=bool)
    in_head[order[[0, 5, 60, 127]]] = True
    mixed = np.zeros(VOCAB, dtype=bool)
    mixed[order[[1, 2, 300, 700, 900]]] = True
    no_head = np.zeros(VOCAB, dtype=bool)
    no_head[order[200:260]] = True
    flat = np.full(VOCAB, 5.0, dtype=np.float32)
    flat[:200] = 10.0
    starved = np.zeros(VOCAB, dtype=bool)
    starved[300:900] = True
    flat[301:900] = -26.0
    flat[[300, 600]] = 4.0  # the masked maxima; 598 allowed tokens 30 below them: the trials run out
    return [(x, in_head), (x, mixed), (x, no_head), (flat, starved)]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_every_branch_of_the_masked_whole_row_draw_matches_the_reference(case: int, temperature: float) -> None:
    x, allowed = _whole_row_cases()[case]
    rows = [RowSampling(SamplingParams(seed=s, temperature=temperature), s, allowed=allowed) for s in range(40)]
    for row in rows:
        for path in (x.astype(np.float32), x.astype(llm_like_logits(1, 8, 0).dtype)):
            res = Sampler(VOCAB, 1).sample(path[None, :], [row])[0]
            assert res.token == reference(path.astype(np.float32), row)[0]
    expected, got, _ = full_and_topk(x[None, :].repeat(1, axis=0), rows[:1])
    assert got == expected
