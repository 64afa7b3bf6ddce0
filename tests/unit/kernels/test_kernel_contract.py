"""The `Kernel` contract, checked on both kernels (numeric and synthetic) over the tiny geometry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind
from calculet.daemon.calsim.kernel import DecodeRow, Kernel
from calculet.daemon.calsim.kernels.errors import KernelInputError

from .kernel_factories import KernelMaker, arange32, clearly_different, same_logits

VOCAB = 512
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
token_lists = st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=24)


def run_sequence(kernel: Kernel, lane: int, tokens: list[int], prefill_len: int) -> list[np.ndarray]:
    """Prefill the first `prefill_len` tokens, decode the rest one by one; logits after each step."""
    out = [kernel.prefill(lane, 0, np.asarray(tokens[:prefill_len], np.int32), arange32(0, prefill_len))]
    for p in range(prefill_len, len(tokens)):
        out.append(kernel.decode([DecodeRow(lane, p, tokens[p], p)])[0])
    return out


@SETTINGS
@given(tokens=token_lists, data=st.data())
def test_prefill_then_decodes_equals_one_longer_prefill(
    kernel_maker: KernelMaker, tokens: list[int], data: st.DataObject
) -> None:
    split = data.draw(st.integers(1, len(tokens) - 1))
    stepped = run_sequence(kernel_maker(), 0, tokens, split)[-1]
    whole = kernel_maker().prefill(0, 0, np.asarray(tokens, np.int32), arange32(0, len(tokens)))
    assert same_logits(kernel_maker(), stepped, whole)


@SETTINGS
@given(tokens=token_lists, data=st.data())
def test_prefill_in_chunks_equals_one_prefill(
    kernel_maker: KernelMaker, tokens: list[int], data: st.DataObject
) -> None:
    split = data.draw(st.integers(1, len(tokens) - 1))
    k = kernel_maker()
    k.prefill(1, 0, np.asarray(tokens[:split], np.int32), arange32(0, split))
    chunked = k.prefill(1, split, np.asarray(tokens[split:], np.int32), arange32(split, len(tokens)))
    whole = kernel_maker().prefill(2, 0, np.asarray(tokens, np.int32), arange32(0, len(tokens)))
    assert same_logits(k, chunked, whole)


@SETTINGS
@given(tokens=token_lists, data=st.data())
def test_changing_an_earlier_token_changes_later_logits(
    kernel_maker: KernelMaker, tokens: list[int], data: st.DataObject
) -> None:
    j = data.draw(st.integers(0, len(tokens) - 2))
    other = list(tokens)
    other[j] = data.draw(st.integers(0, VOCAB - 1).filter(lambda t: t != tokens[j]))
    k = kernel_maker()
    n = len(tokens)
    a = k.prefill(0, 0, np.asarray(tokens, np.int32), arange32(0, n))
    b = k.prefill(1, 0, np.asarray(other, np.int32), arange32(0, n))
    assert clearly_different(a, b)
    # And the change is still visible one decode step later, through the KV cache only.
    step = k.decode([DecodeRow(0, n, 7, n), DecodeRow(1, n, 7, n)])
    assert clearly_different(step[0], step[1])


def test_interleaved_lanes_equal_each_lane_alone(kernel_maker: KernelMaker) -> None:
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, VOCAB, 12).tolist(), rng.integers(0, VOCAB, 9).tolist()]
    alone = [run_sequence(kernel_maker(), lane, seq, 4) for lane, seq in zip((0, 3), seqs, strict=True)]
    k = kernel_maker()
    together: list[list[np.ndarray]] = [[], []]
    for lane_idx, lane in enumerate((0, 3)):
        together[lane_idx].append(k.prefill(lane, 0, np.asarray(seqs[lane_idx][:4], np.int32), arange32(0, 4)))
    for p in range(4, 12):
        rows = [DecodeRow(0, p, seqs[0][p], p)]
        if p < 9:
            rows.append(DecodeRow(3, p, seqs[1][p], p))
        out = k.decode(rows)
        for i in range(len(rows)):
            together[i].append(out[i])
    for want, got in zip(alone, together, strict=True):
        assert len(want) == len(got)
        assert all(same_logits(k, a, b) for a, b in zip(want, got, strict=True))


def test_batched_decode_rows_at_different_lengths_equal_each_row_alone(kernel_maker: KernelMaker) -> None:
    rng = np.random.default_rng(4)
    prompts = {0: rng.integers(0, VOCAB, 5), 1: rng.integers(0, VOCAB, 11), 2: rng.integers(0, VOCAB, 2)}
    rows = [DecodeRow(lane, len(p), 100 + lane, len(p)) for lane, p in prompts.items()]
    batched = kernel_maker()
    for lane, p in prompts.items():
        batched.prefill(lane, 0, p.astype(np.int32), arange32(0, len(p)))
    out = batched.decode(rows)
    assert out.shape == (3, VOCAB) and out.dtype == np.float32
    for i, row in enumerate(rows):
        single = kernel_maker()
        p = prompts[row.lane]
        single.prefill(row.lane, 0, p.astype(np.int32), arange32(0, len(p)))
        assert same_logits(single, out[i], single.decode([row])[0])


def test_same_package_gives_same_logits_in_a_fresh_kernel(kernel_maker: KernelMaker) -> None:
    tokens = np.array([5, 9, 200, 3], np.int32)
    a = kernel_maker().prefill(0, 0, tokens, arange32(0, 4))
    b = kernel_maker().prefill(0, 0, tokens, arange32(0, 4))
    assert np.array_equal(a, b)
    assert a.shape == (VOCAB,) and a.dtype == np.float32 and np.isfinite(a).all()


def test_prefill_returns_an_array_the_caller_may_keep(kernel_maker: KernelMaker) -> None:
    k = kernel_maker()
    first = k.prefill(0, 0, np.array([1, 2, 3], np.int32), arange32(0, 3))
    kept = first.copy()
    k.prefill(1, 0, np.array([4, 5], np.int32), arange32(0, 2))
    k.decode([DecodeRow(0, 3, 9, 3), DecodeRow(1, 2, 9, 2)])
    assert np.array_equal(first, kept)


def test_positions_are_part_of_the_computation(kernel_maker: KernelMaker) -> None:
    k = kernel_maker()
    tokens = np.array([10, 20, 30], np.int32)
    a = k.prefill(0, 0, tokens, arange32(0, 3))
    # Spacing changes relative distances (a uniform shift would not change RoPE attention).
    b = k.prefill(1, 0, tokens, np.array([0, 4, 9], np.int32))
    assert clearly_different(a, b)


def _history(k: Kernel, lane: int) -> np.ndarray:
    return k.prefill(lane, 0, np.array([11, 12, 13, 14, 15], np.int32), arange32(0, 5))


def test_clear_lane_forgets_the_lane_and_only_that_lane(kernel_maker: KernelMaker) -> None:
    k, ref = kernel_maker(), kernel_maker()
    for kernel in (k, ref):
        _history(kernel, 0)
        _history(kernel, 1)
    k.clear_lane(0)
    after = k.decode([DecodeRow(0, 5, 16, 5), DecodeRow(1, 5, 16, 5)])
    before = ref.decode([DecodeRow(0, 5, 16, 5), DecodeRow(1, 5, 16, 5)])
    assert clearly_different(after[0], before[0])
    assert same_logits(k, after[1], before[1])
    # A cleared lane is as good as new for a fresh sequence.
    assert same_logits(k, _history(k, 0), _history(kernel_maker(), 0))


def test_corrupt_lane_changes_that_lane_only(kernel_maker: KernelMaker) -> None:
    k, ref = kernel_maker(), kernel_maker()
    for kernel in (k, ref):
        _history(kernel, 2)
        _history(kernel, 3)
    k.corrupt_lane(2, np.random.default_rng(0))
    after = k.decode([DecodeRow(2, 5, 16, 5), DecodeRow(3, 5, 16, 5)])
    before = ref.decode([DecodeRow(2, 5, 16, 5), DecodeRow(3, 5, 16, 5)])
    assert clearly_different(after[0], before[0])
    assert same_logits(k, after[1], before[1])


def test_kv_bytes_grow_with_lanes_and_context(kernel_maker: KernelMaker) -> None:
    base = kernel_maker(lanes=2, lane_context=32).kv_bytes
    assert base >= 2 * 32  # at least one byte per lane-slot
    assert kernel_maker(lanes=4, lane_context=32).kv_bytes == 2 * base
    assert kernel_maker(lanes=2, lane_context=64).kv_bytes == 2 * base


# ------------------------------------------------------------------ bad inputs

TOK3 = np.array([1, 2, 3], np.int32)
POS3 = arange32(0, 3)
BAD_PREFILLS = [
    ((4, 0, TOK3, POS3), r"prefill: lane 4 out of range \(kernel has lanes 0..3\)"),
    ((-1, 0, TOK3, POS3), r"prefill: lane -1 out of range"),
    ((0, 0, np.array([], np.int32), arange32(0, 0)), r"prefill: tokens is empty"),
    ((0, 62, TOK3, POS3), r"prefill: past_kv_len 62 \+ 3 new tokens exceeds lane_context 64"),
    ((0, -1, TOK3, POS3), r"prefill: past_kv_len -1 is negative"),
    ((0, 0, TOK3, arange32(0, 2)), r"prefill: 2 positions for 3 tokens"),
    (
        (0, 0, np.array([1, VOCAB, 3], np.int32), POS3),
        rf"prefill: token id {VOCAB} out of range \[0, {VOCAB}\)",
    ),
    ((0, 0, np.array([1, -5], np.int32), arange32(0, 2)), r"prefill: token id -5 out of range"),
    ((0, 0, TOK3.reshape(1, 3), POS3), r"prefill: tokens must be 1-D, got shape \(1, 3\)"),
    ((0, 0, TOK3.astype(np.float32), POS3), r"prefill: tokens must be integers, got dtype float32"),
    ((0, 0, TOK3, np.array([0, -1, 2], np.int32)), r"prefill: position -1 is negative"),
]


def _assert_input_error(exc: pytest.ExceptionInfo[KernelInputError]) -> None:
    assert isinstance(exc.value, ValueError)  # the Kernel ABC promises ValueError
    assert exc.value.kind is ErrorKind.INVALID_ARGUMENT


@pytest.mark.parametrize(("args", "message"), BAD_PREFILLS)
def test_bad_prefill_raises_and_writes_nothing(kernel_maker: KernelMaker, args: tuple, message: str) -> None:
    k, ref = kernel_maker(), kernel_maker()
    for kernel in (k, ref):
        _history(kernel, 0)
    with pytest.raises(KernelInputError, match=message) as exc:
        k.prefill(*args)
    _assert_input_error(exc)
    row = [DecodeRow(0, 5, 16, 5)]
    assert same_logits(k, k.decode(row), ref.decode(row))


BAD_DECODES = [
    ([], r"decode: no rows"),
    ([DecodeRow(0, 5, 16, 5), DecodeRow(4, 0, 1, 0)], r"decode row 1: lane 4 out of range"),
    ([DecodeRow(0, 5, 16, 5), DecodeRow(0, 6, 1, 6)], r"decode row 1: lane 0 repeated"),
    ([DecodeRow(1, 64, 1, 64)], r"decode row 0: past_kv_len 64 \+ 1 new tokens exceeds lane_context 64"),
    ([DecodeRow(1, -2, 1, 0)], r"decode row 0: past_kv_len -2 is negative"),
    ([DecodeRow(1, 0, VOCAB + 3, 0)], rf"decode row 0: token id {VOCAB + 3} out of range"),
    ([DecodeRow(1, 0, 1, -4)], r"decode row 0: position -4 is negative"),
]


@pytest.mark.parametrize(("rows", "message"), BAD_DECODES)
def test_bad_decode_raises_and_writes_nothing(kernel_maker: KernelMaker, rows: list, message: str) -> None:
    k, ref = kernel_maker(), kernel_maker()
    for kernel in (k, ref):
        _history(kernel, 0)
    with pytest.raises(KernelInputError, match=message) as exc:
        k.decode(rows)
    _assert_input_error(exc)
    # Row 0 of some bad calls is valid (lane 0 at slot 5): it must not have been written.
    later = [DecodeRow(0, 6, 17, 6)]
    ref_later = ref.decode(later)
    assert same_logits(k, k.decode(later), ref_later)


@pytest.mark.parametrize("lane", [-1, 4, 100])
def test_clear_and_corrupt_reject_a_bad_lane(kernel_maker: KernelMaker, lane: int) -> None:
    k = kernel_maker()
    with pytest.raises(KernelInputError, match=rf"clear_lane: lane {lane} out of range"):
        k.clear_lane(lane)
    with pytest.raises(KernelInputError, match=rf"corrupt_lane: lane {lane} out of range"):
        k.corrupt_lane(lane, np.random.default_rng(0))


@SETTINGS
@given(past=st.integers(0, 80), n=st.integers(1, 80))
def test_span_beyond_the_lane_is_refused_exactly_when_it_overflows(
    kernel_maker: KernelMaker, past: int, n: int
) -> None:
    k = kernel_maker(lanes=1, lane_context=64)
    tokens = np.ones(n, np.int32)
    if past + n > 64:
        with pytest.raises(KernelInputError, match="exceeds lane_context 64"):
            k.prefill(0, past, tokens, arange32(past, past + n))
    else:
        assert k.prefill(0, past, tokens, arange32(past, past + n)).shape == (VOCAB,)
