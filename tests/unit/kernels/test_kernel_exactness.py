"""Bit-exactness of both kernels (issue 9, item 7), compared on the raw bits, never with a tolerance.

What the daemon's exactness promise rests on: (a) a row's logits and the KV it writes do not
depend on the other rows of a decode call (how many, which lanes, at which lengths, in which
order); (b) a prefill of n tokens writes the KV that n single-token decode steps write, in one
call or in chunks; (c) after the KV is lost, re-prefilling prompt + generated returns the logits
that continuing the decode would, and decoding on from there stays identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.daemon.calsim.kernel import DecodeRow, Kernel, make_kernel

from .kernel_factories import KernelMaker, arange32, lane_kv, make_manifest, same_bits

VOCAB = 512
LANES = 16
CONTEXT = 160
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
Package = tuple[Path, dict[str, np.ndarray]]


@pytest.fixture(scope="module", params=["numeric-fp32", "numeric-bf16", "synthetic"])
def kernel_maker(request: pytest.FixtureRequest, tiny_package: Package) -> KernelMaker:
    """Fresh kernels of one kind; the numeric kernel with both KV dtypes (packages use bf16)."""
    kind, _, kv_dtype = request.param.partition("-")

    def make(lanes: int = 4, lane_context: int = 64) -> Kernel:
        manifest = make_manifest(kernel=kind, lanes=lanes, lane_context=lane_context, kv_dtype=kv_dtype or "fp32")
        return make_kernel(manifest, tiny_package[0], lanes, lane_context)

    return make


def fill_lanes(kernel: Kernel, rng: np.random.Generator, lengths: list[int]) -> None:
    """Prefill lane i with `lengths[i]` random tokens."""
    for lane, n in enumerate(lengths):
        kernel.prefill(lane, 0, rng.integers(0, VOCAB, n).astype(np.int32), arange32(0, n))


def same_kv(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("batch", [4, 8, 16])
def test_a_rows_logits_and_kv_do_not_depend_on_the_rows_beside_it(kernel_maker: KernelMaker, batch: int) -> None:
    rng = np.random.default_rng(batch)
    k = kernel_maker(lanes=LANES, lane_context=CONTEXT)
    lengths = [int(n) for n in rng.integers(1, CONTEXT - 8, LANES)]
    fill_lanes(k, rng, lengths)
    rows = [DecodeRow(lane, lengths[lane], int(rng.integers(VOCAB)), lengths[lane]) for lane in range(LANES)]
    solo = {}
    for row in rows:  # each row alone; its KV slot is rewritten by every later call
        solo[row.lane] = (k.decode([row])[0], lane_kv(k, row.lane, row.past_kv_len + 1))
    for trial in range(3):  # the same rows among different neighbours, in different orders
        picked = rng.permutation(LANES)[:batch]
        out = k.decode([rows[lane] for lane in picked])
        for i, lane in enumerate(picked):
            logits, kv = solo[lane]
            assert same_bits(out[i], logits), f"lane {lane}, trial {trial}: logits differ in a batch of {batch}"
            assert same_kv(lane_kv(k, lane, rows[lane].past_kv_len + 1), kv), f"lane {lane}: KV differs"


def test_a_row_in_a_batch_at_its_own_length_equals_the_row_alone_over_many_lengths(kernel_maker: KernelMaker) -> None:
    """One lane walks 40 decode steps alone; a twin lane walks them among neighbours whose lengths
    keep changing (shorter and longer than it), so every padding case of the batch is crossed."""
    rng = np.random.default_rng(7)
    k = kernel_maker(lanes=8, lane_context=CONTEXT)
    prompt = rng.integers(0, VOCAB, 5).astype(np.int32)
    fill_lanes(k, rng, [1, 60, 3, 20, 90, 7, 1, 1])
    k.prefill(0, 0, prompt, arange32(0, 5))
    k.prefill(7, 0, prompt, arange32(0, 5))
    past = {lane: n for lane, n in zip(range(1, 7), [60, 3, 20, 90, 7, 1], strict=True)}
    for p in range(5, 45):
        token = int(rng.integers(VOCAB))
        alone = k.decode([DecodeRow(0, p, token, p)])[0]
        others = [lane for lane in past if rng.random() < 0.7]
        rows = [DecodeRow(lane, past[lane], int(rng.integers(VOCAB)), past[lane]) for lane in others]
        at = int(rng.integers(len(rows) + 1))
        rows.insert(at, DecodeRow(7, p, token, p))
        out = k.decode(rows)
        for lane in others:
            past[lane] += 1
        assert same_bits(out[at], alone), f"step {p}"
    assert same_kv(lane_kv(k, 0, 45), lane_kv(k, 7, 45))


@pytest.mark.parametrize("n", [1, 2, 7, 32, 33, 100])
def test_prefill_writes_the_kv_and_returns_the_logits_of_one_by_one_decode(kernel_maker: KernelMaker, n: int) -> None:
    tokens = np.random.default_rng(n).integers(0, VOCAB, n).astype(np.int32)
    k = kernel_maker(lanes=2, lane_context=CONTEXT)
    prefilled = k.prefill(0, 0, tokens, arange32(0, n))
    stepped = [k.decode([DecodeRow(1, p, int(tokens[p]), p)])[0] for p in range(n)]
    assert same_bits(prefilled, stepped[-1])
    assert same_kv(lane_kv(k, 0, n), lane_kv(k, 1, n))


def test_one_token_prefill_equals_a_decode_step(kernel_maker: KernelMaker) -> None:
    k = kernel_maker(lanes=2, lane_context=CONTEXT)
    tokens = np.array([5, 9, 200, 3, 77], np.int32)
    k.prefill(0, 0, tokens[:4], arange32(0, 4))
    k.prefill(1, 0, tokens[:4], arange32(0, 4))
    a = k.prefill(0, 4, tokens[4:], arange32(4, 5))
    b = k.decode([DecodeRow(1, 4, 77, 4)])[0]
    assert same_bits(a, b)
    assert same_kv(lane_kv(k, 0, 5), lane_kv(k, 1, 5))


@SETTINGS
@given(n=st.integers(2, 140), data=st.data())
def test_prefill_in_any_chunks_writes_the_kv_of_one_prefill(
    kernel_maker: KernelMaker, n: int, data: st.DataObject
) -> None:
    tokens = np.random.default_rng(n).integers(0, VOCAB, n).astype(np.int32)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=4))))
    k = kernel_maker(lanes=2, lane_context=CONTEXT)
    whole = k.prefill(0, 0, tokens, arange32(0, n))
    last = None
    for start, end in zip([0, *cuts], [*cuts, n], strict=True):
        last = k.prefill(1, start, tokens[start:end], arange32(start, end))
    assert last is not None
    assert same_bits(whole, last)
    assert same_kv(lane_kv(k, 0, n), lane_kv(k, 1, n))


@pytest.mark.parametrize("generated", [1, 17, 80])
def test_re_prefill_after_lost_kv_continues_exactly_where_decode_was(kernel_maker: KernelMaker, generated: int) -> None:
    """What recovery does after a CCU exception: the lane holds garbage, the daemon re-prefills
    prompt + generated; the logits and every later step must be those of the undisturbed run."""
    rng = np.random.default_rng(generated)
    prompt = rng.integers(0, VOCAB, 23).astype(np.int32)
    k = kernel_maker(lanes=3, lane_context=CONTEXT)
    fill_lanes(k, rng, [1, 40, 9])  # neighbours share every decode call below
    k.prefill(0, 0, prompt, arange32(0, 23))
    seq = [int(t) for t in prompt]
    rows_of = {1: 40, 2: 9}

    def step(lane: int, token: int, p: int) -> np.ndarray:
        rows = [DecodeRow(lane, p, token, p)] + [DecodeRow(o, rows_of[o], 3, rows_of[o]) for o in rows_of]
        out = k.decode(rows)
        for o in rows_of:
            rows_of[o] += 1
        return out[0]

    for _ in range(generated):  # the undisturbed run, sampled tokens fed back
        seq.append(int(rng.integers(VOCAB)))
        logits = step(0, seq[-1], len(seq) - 1)
    undisturbed = [logits]
    after = [int(t) for t in rng.integers(0, VOCAB, 5)]
    for token in after:
        undisturbed.append(step(0, token, len(seq) + len(undisturbed) - 1))
    k.corrupt_lane(0, np.random.default_rng(0))
    recovered = [k.prefill(0, 0, np.asarray(seq, np.int32), arange32(0, len(seq)))]
    for token in after:
        recovered.append(step(0, token, len(seq) + len(recovered) - 1))
    for i, (a, b) in enumerate(zip(undisturbed, recovered, strict=True)):
        assert same_bits(a, b), f"step {i} after the re-prefill differs"
