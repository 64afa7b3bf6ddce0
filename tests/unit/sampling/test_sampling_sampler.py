"""The Sampler's contract: no fresh full-vocabulary allocation per token, and typed errors for bad input."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from calculet.common.errors import ErrorKind, InvalidArgument
from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams, SamplingPolicy, TokenHistory

from .factories import BF16, llm_like_logits, logits

QWEN_VOCAB = 151_936
ROW_F32_BYTES = QWEN_VOCAB * 4

CONFIGS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(seed=1, temperature=0.8),
    "top_k": SamplingParams(seed=2, top_k=50),
    "top_p": SamplingParams(seed=3, top_p=0.9),
    "top_k_top_p_min_p": SamplingParams(seed=4, top_k=40, top_p=0.95, min_p=0.05),
    "penalties_logprobs": SamplingParams(
        seed=5, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5, logprobs=20
    ),
}


@pytest.fixture(scope="module")
def qwen_logits() -> np.ndarray:
    # Temporaries scale with the candidate set (a top-p nucleus over flat logits can hold thousands of
    # tokens); with a language model's peaked logits they are small.
    return llm_like_logits(1, QWEN_VOCAB, seed=17)


def _peak_bytes(sampler: Sampler, x: np.ndarray, row: RowSampling) -> int:
    sampler.sample(x, [row])  # warm-up
    tracemalloc.start()
    try:
        sampler.sample(x, [row])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_no_fresh_full_vocabulary_allocation_per_token(name: str, qwen_logits: np.ndarray) -> None:
    history = TokenHistory(QWEN_VOCAB, list(range(0, 4000, 3)), list(range(100, 300)))
    row = RowSampling(CONFIGS[name], 3, history)
    sampler = Sampler(QWEN_VOCAB, 4)
    workspace = sampler.workspace
    assert _peak_bytes(sampler, qwen_logits, row) < ROW_F32_BYTES // 4
    assert sampler.workspace is workspace


def test_the_serial_policy_does_allocate_a_full_copy(qwen_logits: np.ndarray) -> None:
    # The measurement above can see a full-row allocation: today's path makes one per token.
    serial = Sampler(QWEN_VOCAB, 1, policy=SamplingPolicy.SERIAL)
    assert _peak_bytes(serial, qwen_logits, RowSampling(SamplingParams(temperature=0.0), 0)) >= ROW_F32_BYTES


V = 64
ROW = RowSampling(SamplingParams(), 0)


@pytest.mark.parametrize(
    ("x", "rows", "match"),
    [
        (np.zeros(V, dtype=BF16), [ROW], r"^logits: must be a 2-D"),
        ([[0.0] * V], [ROW], r"^logits: must be a 2-D"),
        (np.zeros((1, V), dtype=np.float16), [ROW], r"^logits: dtype"),
        (np.zeros((1, V), dtype=np.int32), [ROW], r"^logits: dtype"),
        (np.zeros((1, V + 1), dtype=BF16), [ROW], r"^logits: shape"),
        (np.zeros((2, V), dtype=BF16), [ROW], r"^logits: shape"),
        (np.zeros((5, V), dtype=BF16), [ROW] * 5, r"^rows: 5 exceeds"),
        (np.zeros((1, V), dtype=BF16), [RowSampling(SamplingParams(top_k=V + 1), 0)], r"^rows\[0\]\.params\.top_k"),
        (
            np.zeros((2, V), dtype=BF16),
            [ROW, RowSampling(SamplingParams(presence_penalty=0.5), 0)],
            r"^rows\[1\]\.history: penalties",
        ),
        (
            np.zeros((1, V), dtype=BF16),
            [RowSampling(SamplingParams(repetition_penalty=1.2), 0, TokenHistory(V + 1, [1]))],
            r"^rows\[0\]\.history: built for vocab 65",
        ),
    ],
)
@pytest.mark.parametrize("policy", list(SamplingPolicy))
def test_bad_input_is_refused_with_invalid_argument(
    x: object, rows: list[RowSampling], match: str, policy: SamplingPolicy
) -> None:
    sampler = Sampler(V, 4, policy=policy)
    with pytest.raises(InvalidArgument, match=match) as err:
        sampler.sample(x, rows)  # type: ignore[arg-type]
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


def test_sampler_sizes_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match=r"^vocab_size"):
        Sampler(0, 1)
    with pytest.raises(InvalidArgument, match=r"^max_rows"):
        Sampler(8, 0)
    with pytest.raises(InvalidArgument, match=r"^stride"):
        Sampler(8, 1, stride=0)


@pytest.mark.parametrize("step", [-1, 2**64, True, 1.5, "3"])
def test_row_step_must_be_a_64_bit_counter(step: object) -> None:
    with pytest.raises(InvalidArgument, match=r"^step: "):
        RowSampling(SamplingParams(), step)  # type: ignore[arg-type]


def test_float32_logits_are_accepted_and_an_empty_batch_is_a_no_op() -> None:
    sampler = Sampler(V, 2)
    x = logits(1, V, seed=2)
    assert sampler.sample(x.astype(np.float32), [ROW]) == sampler.sample(x, [ROW])
    assert sampler.sample(np.zeros((0, V), dtype=BF16), []) == []
