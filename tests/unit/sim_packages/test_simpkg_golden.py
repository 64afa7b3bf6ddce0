"""Golden outputs: the procedure (on a fake kernel) and each built package against a kernel re-run."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from calculet.daemon.calsim.kernel import DecodeRow, Kernel, make_kernel
from calculet.daemon.package.manifest import PackageManifest, load_manifest
from calculet.ops.sim_packages.golden import (
    GOLDEN_DECODE_STEPS,
    GOLDEN_TOP_K,
    bf16_round,
    bf16_ulp,
    compute_golden,
    logit_atol,
    top_logits,
)


class FakeKernel(Kernel):
    """Logits that depend on the last token and its position; records every call."""

    def __init__(self, vocab: int, lanes: int, lane_context: int) -> None:
        self.vocab_size, self.lanes, self.lane_context = vocab, lanes, lane_context
        self.calls: list[tuple[str, object]] = []

    def _row(self, token: int, position: int) -> np.ndarray:
        out = np.linspace(-1.0, 1.0, self.vocab_size, dtype=np.float32)
        out[(token * 7 + position * 3 + 1) % self.vocab_size] = 5.0 + 1e-4  # bf16 rounds this to 5.0
        return out

    def prefill(self, lane: int, past_kv_len: int, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        self.calls.append(("prefill", (lane, past_kv_len, tokens.tolist(), positions.tolist())))
        return self._row(int(tokens[-1]), int(positions[-1]))

    def decode(self, rows: Sequence[DecodeRow]) -> np.ndarray:
        self.calls.append(("decode", list(rows)))
        return np.stack([self._row(r.token, r.position) for r in rows])

    def clear_lane(self, lane: int) -> None:
        raise NotImplementedError

    def corrupt_lane(self, lane: int, rng: np.random.Generator) -> None:
        raise NotImplementedError

    @property
    def kv_bytes(self) -> int:
        return 0


def test_procedure_on_a_fake_kernel(qwen_pkg: Path) -> None:
    manifest = load_manifest(qwen_pkg)
    made: list[FakeKernel] = []

    def factory(m: PackageManifest, d: Path, lanes: int, ctx: int) -> Kernel:
        made.append(FakeKernel(97, lanes, ctx))
        return made[0]

    prompt = [3, 1, 4, 1, 5]
    g = compute_golden(manifest, qwen_pkg, prompt, factory)
    k = made[0]
    assert k.lanes == 1 and k.lane_context >= len(prompt) + GOLDEN_DECODE_STEPS
    assert k.calls[0] == ("prefill", (0, 0, prompt, [0, 1, 2, 3, 4]))
    # Each decode step feeds the previous greedy token at the next position of lane 0.
    expected = [(5 * 7 + 4 * 3 + 1) % 97]
    for step in range(GOLDEN_DECODE_STEPS):
        kind, rows = k.calls[1 + step]
        assert kind == "decode"
        assert rows == [DecodeRow(lane=0, past_kv_len=5 + step, token=expected[-1], position=5 + step)]
        expected.append((expected[-1] * 7 + (5 + step) * 3 + 1) % 97)
    assert list(g.decode_tokens) == expected
    assert g.prompt_tokens == tuple(prompt)
    assert g.prefill_top[0] == (expected[0], 5.0)  # bf16-rounded, not 5.0001
    assert len(g.prefill_top) == GOLDEN_TOP_K


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, st.integers(1, 64), elements=st.floats(-8, 8, width=32)))
def test_top_logits_are_the_k_largest_descending_low_id_first(x: np.ndarray) -> None:
    top = top_logits(x, GOLDEN_TOP_K)
    k = min(GOLDEN_TOP_K, x.size)
    assert len(top) == k
    assert [v for _, v in top] == sorted(x.tolist(), reverse=True)[:k]
    for (t1, v1), (t2, v2) in itertools.pairwise(top):
        assert v1 > v2 or (v1 == v2 and t1 < t2)
    assert all(x[t] == v for t, v in top)


@settings(max_examples=100, deadline=None)
@given(st.floats(1e-3, 1e4))
def test_atol_covers_one_bf16_rounding_flip(v: float) -> None:
    b = float(bf16_round(np.float32([v]))[0])
    atol = logit_atol([(0, b)])  # golden logits are recorded after bf16 rounding
    # The bf16 neighbour a nudged float32 value could round to is within the tolerance.
    neighbour = float(np.float32(b).astype(ml_dtypes.bfloat16) + ml_dtypes.bfloat16(bf16_ulp(b)))
    assert abs(neighbour - b) <= atol
    assert atol >= 1e-2


def test_bf16_round_matches_ml_dtypes() -> None:
    x = np.float32([1.0 + 2**-9, 3.14159, -2.5e-3])
    assert bf16_round(x).tolist() == x.astype(ml_dtypes.bfloat16).astype(np.float32).tolist()
    assert bf16_round(x)[0] == 1.0  # below half an ulp rounds down


def test_golden_matches_a_rerun_of_the_kernel(any_pkg: Path) -> None:
    m = load_manifest(any_pkg)
    g = m.golden
    n = len(g.prompt_tokens)
    assert n > 0 and len(g.decode_tokens) == GOLDEN_DECODE_STEPS + 1
    kernel = make_kernel(m, any_pkg, 2, m.kv.lane_context)  # different lanes/context: must not matter
    logits = kernel.prefill(1, 0, np.asarray(g.prompt_tokens, np.int32), np.arange(n, dtype=np.int32))
    logits = logits.astype(ml_dtypes.bfloat16).astype(np.float32)
    for token, value in g.prefill_top:
        assert abs(float(logits[token]) - value) <= g.logit_atol
    assert int(np.argmax(logits)) == g.decode_tokens[0]
    assert float(logits.max()) == pytest.approx(g.prefill_top[0][1], abs=g.logit_atol)
    for step, token in enumerate(g.decode_tokens[:-1]):
        row = DecodeRow(lane=1, past_kv_len=n + step, token=token, position=n + step)
        out = kernel.decode([row])[0].astype(ml_dtypes.bfloat16).astype(np.float32)
        assert int(np.argmax(out)) == g.decode_tokens[step + 1]


def test_golden_prompt_is_a_chat_prompt(any_pkg: Path) -> None:
    from tokenizers import Tokenizer

    m = load_manifest(any_pkg)
    tok = Tokenizer.from_file(str(any_pkg / m.tokenizer.path))
    text = tok.decode(list(m.golden.prompt_tokens), skip_special_tokens=False)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    assert len(m.golden.prompt_tokens) <= m.submodel("prefill").max_tokens
