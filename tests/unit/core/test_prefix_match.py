"""Prefix reuse without a device: the matcher's order (continuation, FREE, partial match, LRU
eviction), the KV manager's PARKED lanes, the block-hash advertisement and the chunk size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import FailedPrecondition, IllegalTransition, InvalidArgument
from calculet.common.prefix import BLOCK_TOKENS, block_hash, block_hashes, cached_blocks
from calculet.daemon.core.chunking import CHUNK_AUTO, CHUNK_OFF, auto_chunk_tokens, chunk_tokens, parse_chunk_setting
from calculet.daemon.core.kv import KVManager, LaneState
from calculet.daemon.core.prefix_advert import advertise, tips
from calculet.daemon.core.prefix_match import (
    CONTINUATION_LOSS_TOKENS,
    LaneChoice,
    LaneSource,
    ParkedView,
    choose_lane,
    common_prefix,
)
from calculet.ops.sim_packages.timing import sim_timing


def arr(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int32)


def seq(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


# ---- the matcher ---------------------------------------------------------------------------


def test_common_prefix_counts_equal_leading_tokens() -> None:
    assert common_prefix(arr(1, 2, 3), arr(1, 2, 4)) == 2
    assert common_prefix(arr(1, 2), arr(1, 2, 3)) == 2
    assert common_prefix(arr(5), arr(1)) == 0
    assert common_prefix(arr(), arr(1)) == 0


def test_a_continuation_takes_the_parked_lane_and_keeps_its_whole_history() -> None:
    history = seq(100)
    prompt = seq(130)  # the next turn: the history plus new tokens
    choice = choose_lane(prompt, [ParkedView(2, history, 1, 80)], {0, 1}, 16)  # 80 prompt tokens, a reply
    assert choice == LaneChoice(2, LaneSource.HIT, 100), "FREE lanes do not beat a continuation"


def test_the_match_is_capped_so_one_token_is_prefilled() -> None:
    history = seq(100)
    assert choose_lane(seq(100), [ParkedView(0, history, 1, 90)], set(), 16) == LaneChoice(0, LaneSource.HIT, 99)


def test_the_longest_continuation_wins() -> None:
    parked = [ParkedView(0, seq(40), 1, 30), ParkedView(1, seq(90), 2, 80), ParkedView(2, seq(60), 3, 50)]
    assert choose_lane(seq(200), parked, set(), 16) == LaneChoice(1, LaneSource.HIT, 90)


def test_a_stranger_sharing_only_a_system_prompt_takes_a_free_lane_not_a_warm_conversation() -> None:
    system = seq(1000)
    conversation = np.concatenate([system, seq(200, start=5000)])  # another user's private turns
    stranger = np.concatenate([system, seq(50, start=9000)])
    parked = [ParkedView(3, conversation, 1, 1100)]  # its prompt: the system prompt and a user's turn
    assert choose_lane(stranger, parked, {0}, 16) == LaneChoice(0, LaneSource.FREE)
    # With no FREE lane the least recently used parked lane goes, keeping what it shares.
    assert choose_lane(stranger, parked, set(), 16) == LaneChoice(3, LaneSource.EVICTED, 1000)


def test_a_stranger_never_truncates_a_conversation_whose_own_part_is_short_while_a_lane_is_free() -> None:
    """Issue 30, defect 6: past a 40-token system prompt the conversation holds 61 tokens of its own
    (a 10-token turn, a 52-token reply but its unsampled last token), under the continuation loss
    tolerance; a stranger with the same system prompt takes a FREE lane, and the conversation's
    next turn keeps all 101 tokens."""
    system = seq(40)
    prompt = np.concatenate([system, seq(10, start=5000)])
    history = np.concatenate([prompt, seq(51, start=6000)])
    assert len(history) - len(system) < CONTINUATION_LOSS_TOKENS
    conversation = ParkedView(3, history, 1, len(prompt))
    stranger = np.concatenate([system, seq(10, start=9000)])
    assert choose_lane(stranger, [conversation], {0, 1, 2}, 16) == LaneChoice(0, LaneSource.FREE)
    next_turn = np.concatenate([history, arr(6051), seq(8, start=7000)])
    assert choose_lane(next_turn, [conversation], {0, 1, 2}, 16) == LaneChoice(3, LaneSource.HIT, 101)
    # No lane free: the least recently used one goes (here the only one), keeping the system prompt.
    assert choose_lane(stranger, [conversation], set(), 16) == LaneChoice(3, LaneSource.EVICTED, 40)


@given(
    system=st.integers(16, 300), own=st.integers(1, 200), reply=st.integers(0, 200), tail=st.integers(0, 100),
    free=st.sets(st.integers(0, 2), min_size=1),
)  # fmt: skip
def test_a_sequence_diverging_inside_a_parked_lanes_prompt_takes_a_free_lane_whatever_the_lengths(
    system: int, own: int, reply: int, tail: int, free: set[int]
) -> None:
    """Rule 2 of `prefix_match.py`: whatever the length of the conversation's own turn and reply, a
    sequence that shares only its system prompt takes a FREE lane while one exists."""
    prompt = np.concatenate([seq(system), seq(own, start=10_000)])
    parked = ParkedView(3, np.concatenate([prompt, seq(reply, start=20_000)]), 1, len(prompt))
    stranger = np.concatenate([seq(system), seq(tail, start=30_000)])
    assert choose_lane(stranger, [parked], free, 16) == LaneChoice(min(free), LaneSource.FREE)


def test_with_no_free_lane_the_least_recently_used_lane_goes_not_the_one_sharing_most() -> None:
    system = seq(1000)
    recent = ParkedView(1, np.concatenate([system, seq(200, start=5000)]), 9, 1100)  # a live conversation
    stale = ParkedView(2, seq(300, start=20_000), 4, 250)  # idle longest, shares nothing
    stranger = np.concatenate([system, seq(50, start=9000)])
    assert choose_lane(stranger, [recent, stale], set(), 16) == LaneChoice(2, LaneSource.EVICTED)


def test_a_loss_below_the_continuation_tolerance_is_a_continuation() -> None:
    history = np.concatenate([seq(500), seq(CONTINUATION_LOSS_TOKENS - 1, start=7000)])  # re-rendered reply
    prompt = np.concatenate([seq(500), seq(80, start=8000)])
    assert choose_lane(prompt, [ParkedView(1, history, 1, 500)], {0}, 16) == LaneChoice(1, LaneSource.HIT, 500)
    longer = np.concatenate([seq(500), seq(CONTINUATION_LOSS_TOKENS, start=7000)])
    assert choose_lane(prompt, [ParkedView(1, longer, 1, 500)], {0}, 16) == LaneChoice(0, LaneSource.FREE)


def test_a_match_shorter_than_min_tokens_does_not_count() -> None:
    parked = [ParkedView(0, seq(10), 1, 6), ParkedView(1, seq(3, start=50), 2, 2)]
    assert choose_lane(seq(40), parked, {5}, 16) == LaneChoice(5, LaneSource.FREE)
    assert choose_lane(seq(40), parked, set(), 16) == LaneChoice(0, LaneSource.EVICTED), "LRU, no hit"
    assert choose_lane(seq(40), parked, set(), 8) == LaneChoice(0, LaneSource.HIT, 10)


def test_without_tokens_or_a_hit_the_least_recently_used_parked_lane_is_evicted() -> None:
    parked = [ParkedView(0, seq(40), 7, 30), ParkedView(1, seq(40, start=100), 3, 30), ParkedView(2, seq(9), 5, 5)]
    assert choose_lane(None, parked, set(), 16) == LaneChoice(1, LaneSource.EVICTED)
    assert choose_lane(None, parked, {4, 2}, 16) == LaneChoice(2, LaneSource.FREE), "lowest FREE lane first"
    assert choose_lane(None, [], set(), 16) is None


# ---- parked lanes in the KV manager -----------------------------------------------------------


def parked_manager(history: np.ndarray, lanes: int = 2) -> KVManager:
    kv = KVManager(lanes, 4096, generation=1)
    handle = kv.assign("a")
    assert handle is not None
    kv.opened(handle.lane, "a")
    kv.commit(kv.reserve(handle.lane, "a", len(history), 1))
    kv.park(handle.lane, "a", history, tuple(block_hashes(history.tolist())), now=10.0, prompt_len=len(history) - 20)
    return kv


def test_a_parked_lane_is_owned_by_no_one_counts_as_free_and_is_matched() -> None:
    history = seq(200)
    kv = parked_manager(history)
    snap = kv.lane(0)
    assert (snap.state, snap.owner, snap.length, snap.parked_at) == (LaneState.PARKED, None, 200, 10.0)
    assert kv.free_count() == 2 and kv.parked_count() == 1 and kv.all_idle() and kv.lane_of("a") is None
    handle = kv.take("b", seq(260), 16)
    assert handle is not None and (handle.lane, handle.source, handle.kept) == (0, LaneSource.HIT, 200)
    assert handle.kept_hashes == tuple(block_hashes(history.tolist()))[: 200 // BLOCK_TOKENS]
    assert kv.lane(0).length == 200 and not kv.needs_open(0), "the KV stays on the device"
    res = kv.reserve(0, "b", 260, 2)
    assert res.row().past_kv_len == 200, "only the rest is prefilled"


def test_a_partial_hit_truncates_the_tail() -> None:
    kv = parked_manager(seq(200), lanes=1)
    prompt = np.concatenate([seq(120), arr(9999, 9998)])
    handle = kv.take("b", prompt, 16)
    assert handle is not None and handle.kept == 120 and kv.lane(0).length == 120


def test_an_evicted_or_dropped_lane_is_closed_on_the_device_before_reuse() -> None:
    kv = parked_manager(seq(200), lanes=1)
    handle = kv.take("b", arr(5, 6, 7), 16)
    assert handle is not None and handle.source is LaneSource.EVICTED and kv.lane(0).length == 0
    assert kv.needs_open(0) and kv.take_device_closes() == [0] and kv.take_device_closes() == []
    kv2 = parked_manager(seq(200))
    assert kv2.drop_parked() == [0] and kv2.lane(0).state is LaneState.FREE and kv2.parked_count() == 0
    assert kv2.take_device_closes() == [0]
    kv2.forget_device_lanes()
    assert kv2.take_device_closes() == []


def test_only_a_trusted_active_lane_can_be_parked() -> None:
    kv = KVManager(2, 64, generation=1)
    handle = kv.assign("a")
    assert handle is not None
    with pytest.raises(FailedPrecondition):
        kv.park(0, "a", arr(), (), 0.0, prompt_len=0)  # empty, and never opened
    kv.opened(0, "a")
    kv.commit(kv.reserve(0, "a", 3, 1))
    with pytest.raises(InvalidArgument):
        kv.park(0, "a", arr(1, 2), (), 0.0, prompt_len=1)  # not what the KV holds
    with pytest.raises(InvalidArgument):
        kv.park(0, "a", arr(1, 2, 3), (), 0.0, prompt_len=4)  # more prompt than KV
    res = kv.reserve(0, "a", 4, 2)
    with pytest.raises(IllegalTransition):
        kv.park(0, "a", arr(1, 2, 3), (), 0.0, prompt_len=2)  # RESERVED: the device may write it
    kv.rollback(res)
    kv.mark_unknown(0)
    with pytest.raises(IllegalTransition):
        kv.park(0, "a", arr(), (), 0.0, prompt_len=0)  # UNKNOWN: untrusted
    assert kv.lane(0).owner == "a"


# ---- the advertisement --------------------------------------------------------------------


def test_block_hashes_chain_so_a_hash_names_the_whole_prefix() -> None:
    a = list(range(3 * BLOCK_TOKENS + 5))
    b = [*a[:BLOCK_TOKENS], 999_999, *a[BLOCK_TOKENS + 1 :]]  # differs inside block 1 only
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 3, "only full blocks"
    assert ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2], "a difference changes every later block"
    assert ha[1] == block_hash(ha[0], a[BLOCK_TOKENS : 2 * BLOCK_TOKENS])
    assert block_hashes(a, start=1, prev=ha[0]) == ha[1:]
    assert cached_blocks(hb, set(ha)) == 1 and cached_blocks(ha, set(ha)) == 3 and cached_blocks(ha, set()) == 0


def test_each_lane_advertises_its_tip() -> None:
    assert tips([[1, 2, 3], [1, 2], [], [1, 2]]) == (3, 2)


def test_the_advertisement_is_bounded_breadth_first_so_every_chain_stays_a_prefix() -> None:
    chains = [[1, 2, 3, 4], [1, 2, 5], [6]]
    assert advertise(chains) == ((1, 6, 2, 3, 5, 4), False)
    hashes, truncated = advertise(chains, limit=4)
    assert truncated and hashes == (1, 6, 2, 3)
    for chain in chains:  # what is advertised of each chain is a prefix of it
        depth = cached_blocks(chain, set(hashes))
        assert all(h not in hashes for h in chain[depth:]) or depth == len(chain)


# ---- the chunk size ------------------------------------------------------------------------


def test_the_auto_chunk_costs_a_few_decode_steps_in_whole_blocks() -> None:
    timing = sim_timing()
    chunk = auto_chunk_tokens(timing, decode_batch=16)
    step_ms = timing.decode_curve[0].ms_per_token * (1 + timing.batch_alpha * 15)
    cost = timing.prefill_fixed_ms + chunk * timing.prefill_ms_per_token
    assert chunk % BLOCK_TOKENS == 0 and cost >= 4 * step_ms
    smaller = chunk - BLOCK_TOKENS
    assert smaller == 0 or timing.prefill_fixed_ms + smaller * timing.prefill_ms_per_token < 4 * step_ms
    assert chunk_tokens(CHUNK_AUTO, timing, prefill_bucket=32, decode_batch=16) == 32, "capped by the bucket"
    assert chunk_tokens(CHUNK_OFF, timing, prefill_bucket=40960, decode_batch=16) == 40960
    assert chunk_tokens(100, timing, prefill_bucket=40960, decode_batch=16) == 100


@pytest.mark.parametrize(("text", "value"), [("auto", CHUNK_AUTO), ("OFF", CHUNK_OFF), ("128", 128)])
def test_the_chunk_setting_parses(text: str, value: int) -> None:
    assert parse_chunk_setting(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "big", ""])
def test_a_bad_chunk_setting_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="prefill_chunk_tokens"):
        parse_chunk_setting(text)
