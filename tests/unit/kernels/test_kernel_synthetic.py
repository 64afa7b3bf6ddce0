"""The synthetic kernel at the real geometry: hash chain, logit shape, EOS policy, config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind
from calculet.daemon.calsim.kernel import DecodeRow
from calculet.daemon.calsim.kernels.errors import KernelConfigError, KernelInputError
from calculet.daemon.calsim.kernels.hashing import U64, PowerTable, token_hash
from calculet.daemon.calsim.kernels.synthetic import LogitShaper, SyntheticKernel

from .kernel_factories import REAL_ARCH, arange32, make_manifest

VOCAB = REAL_ARCH.vocab_size
CONTEXT = 40960
EOS = (151643, 151645)


@pytest.fixture(scope="module")
def real() -> SyntheticKernel:
    """One kernel at the real geometry (tests use distinct lanes or rewrite what they read)."""
    return SyntheticKernel(make_manifest(REAL_ARCH, kernel="synthetic", eos=EOS), Path("."), 4, CONTEXT)


def fresh(seed: int = 7, lanes: int = 2, ctx: int = 4096) -> SyntheticKernel:
    return SyntheticKernel(make_manifest(REAL_ARCH, kernel="synthetic", eos=EOS, seed=seed), Path("."), lanes, ctx)


@settings(max_examples=25, deadline=None)
@given(
    prefix=st.lists(st.integers(0, 2**31), min_size=1, max_size=30),
    tokens=st.lists(st.integers(0, 200_000), min_size=1, max_size=30),
)
def test_chain_extend_equals_appending_one_slot_at_a_time(prefix: list[int], tokens: list[int]) -> None:
    table = PowerTable(64)
    hashes = token_hash(np.asarray(tokens), np.arange(len(tokens)), key=12345)
    prev = np.array([prefix[-1]], dtype=U64)
    stepped, value = [], prev
    for h in hashes:
        value = PowerTable.step(value, np.array([h], dtype=U64))
        stepped.append(int(value[0]))
    assert table.extend(prev, hashes).tolist() == stepped


def test_token_hash_separates_tokens_and_positions() -> None:
    tokens, positions = np.meshgrid(np.arange(300), np.arange(300))
    hashes = token_hash(tokens.ravel(), positions.ravel(), key=1)
    assert np.unique(hashes).size == hashes.size


def test_full_context_lane_works_at_the_real_geometry(real: SyntheticKernel) -> None:
    tokens = (np.arange(CONTEXT - 1) * 7919 % VOCAB).astype(np.int32)
    long = real.prefill(0, 0, tokens, arange32(0, CONTEXT - 1))
    last = real.decode([DecodeRow(0, CONTEXT - 1, 5, CONTEXT - 1)])
    assert long.shape == (VOCAB,) and last.shape == (1, VOCAB) and last.dtype == np.float32
    with pytest.raises(KernelInputError, match=r"past_kv_len 40960 \+ 1 new tokens exceeds lane_context 40960"):
        real.decode([DecodeRow(0, CONTEXT, 5, CONTEXT)])
    # The slot-0 token still matters after 40,959 more tokens.
    tokens[0] += 1
    assert not np.array_equal(real.prefill(1, 0, tokens, arange32(0, CONTEXT - 1)), long)


def test_the_seed_selects_the_model() -> None:
    tokens = np.array([1, 2, 3], np.int32)
    a, b, c = (fresh(s).prefill(0, 0, tokens, arange32(0, 3)) for s in (7, 7, 8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


class GreedyStats:
    """Per-step summaries of a greedy run on one lane (full logits rows are 600 KB each)."""

    def __init__(self, kernel: SyntheticKernel, steps: int, detail_steps: int) -> None:
        self.argmax = np.empty(steps, np.int64)
        self.eos_max = np.empty(steps, np.float32)
        self.top = np.empty((detail_steps, LogitShaper.PEAKS), np.float64)  # descending
        self.log_z = np.empty(detail_steps, np.float64)
        logits = kernel.prefill(0, 0, np.array([100, 200], np.int32), arange32(0, 2))
        for i in range(steps):
            if i:
                logits = kernel.decode([DecodeRow(0, i + 1, int(self.argmax[i - 1]), i + 1)])[0]
            self.argmax[i] = logits.argmax()
            self.eos_max[i] = logits[list(EOS)].max()
            if i < detail_steps:
                self.top[i] = -np.sort(-np.partition(logits, VOCAB - LogitShaper.PEAKS)[-LogitShaper.PEAKS :])
                self.log_z[i] = np.log(np.exp(logits.astype(np.float64)).sum())


@pytest.fixture(scope="module")
def run() -> GreedyStats:
    return GreedyStats(fresh(lanes=1, ctx=2048), 2000, 200)


def test_eos_is_rare_but_reachable(run: GreedyStats) -> None:
    eos_steps = np.isin(run.argmax, EOS)
    # About 1 step in LogitShaper.EOS_PERIOD: a generation ends, but not early every time.
    assert 1 <= eos_steps.sum() <= 4 * len(run.argmax) // LogitShaper.EOS_PERIOD
    # On every other step each EOS logit is held at or below the cap.
    assert (run.eos_max[~eos_steps] <= LogitShaper.EOS_CAP).all()


def test_greedy_and_sampled_decoding_both_vary(run: GreedyStats) -> None:
    assert (run.top[:, 0] > run.top[:, 1]).all()  # a unique greedy choice
    assert np.unique(run.argmax).size > 0.9 * len(run.argmax)
    top_prob = np.exp(run.top[:, 0] - run.log_z)
    peaks_mass = np.exp(run.top - run.log_z[:, None]).sum(axis=1)
    # Temperature-1 sampling is neither forced (top token ~always) nor a flat draw over the vocab.
    assert 0.2 < np.median(top_prob) < 0.95
    assert np.median(peaks_mass) > 0.5


def test_a_rare_eos_step_wins_over_every_peak() -> None:
    shaper = LogitShaper(64, (3, 5), seed=1)
    chains = np.arange(20_000, dtype=U64)
    out = shaper.logits(chains)
    eos_top = np.isin(out.argmax(axis=1), (3, 5))
    assert 0 < eos_top.mean() < 3 / LogitShaper.EOS_PERIOD
    assert (out[eos_top].max(axis=1) >= LogitShaper.PEAK_LOW).all()


def test_decode_cost_does_not_grow_with_history(real: SyntheticKernel) -> None:
    """The chain reads one slot: a decode at the end of a long lane equals a decode after a
    prefill that produced the same chain value (and touches nothing else)."""
    tokens = (np.arange(5000) % 1000).astype(np.int32)
    real.prefill(2, 0, tokens, arange32(0, 5000))
    a = real.decode([DecodeRow(2, 5000, 9, 5000)])[0]
    b = real.prefill(3, 0, np.append(tokens, 9).astype(np.int32), arange32(0, 5001))
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "lanes", "ctx", "message"),
    [
        ({"eos": (VOCAB,)}, 1, 8, rf"EOS ids \[{VOCAB}\] outside the vocab \[0, {VOCAB}\)"),
        ({}, 0, 8, r"lanes must be >= 1, got 0"),
        ({}, 1, 0, r"lane_context must be >= 1, got 0"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict, lanes: int, ctx: int, message: str) -> None:
    manifest = make_manifest(REAL_ARCH, kernel="synthetic", **kwargs)
    with pytest.raises(KernelConfigError, match=message) as exc:
        SyntheticKernel(manifest, Path("."), lanes, ctx)
    assert isinstance(exc.value, ValueError) and exc.value.kind is ErrorKind.FAILED_PRECONDITION


def test_tiny_vocab_and_no_eos_work() -> None:
    shaper = LogitShaper(2, (), seed=0)
    out = shaper.logits(np.arange(50, dtype=U64))
    assert out.shape == (50, 2) and np.isfinite(out).all()
