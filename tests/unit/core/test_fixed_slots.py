"""Fixed slots in the daemon (`lane_selection=false`): the compaction decision (pure), and through the
real engine on the `tiny` package: the smallest batch that covers the highest slot, and a sequence
left alone in a high slot moved down by re-prefill without changing a token (docs/daemon.md,
"Fixed slots")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calculet.daemon.core.compaction import (
    Occupant,
    SlotMove,
    SlotStats,
    batch_for,
    compaction_plan,
    reprefill_ms,
    step_ms,
)
from calculet.daemon.core.observe.status import SlotView
from calculet.daemon.core.prefix_match import LaneChoice, LaneSource, ParkedView, choose_lane
from calculet.daemon.package.manifest import DecodePoint, TimingDecl
from calculet.ops.sim_packages.build import build_sim_package

from .engine_factories import assert_clean, finish, request, running_core

# The qwen preset's figures (docs/sources.md 001 §10): 17.167 ms a token up to 512 tokens,
# prefill 17.167 ms + 4.791 ms a token, batch_alpha 0.1.
TIMING = TimingDecl(
    decode_curve=(DecodePoint(512, 17.167), DecodePoint(2048, 23.81)),
    prefill_fixed_ms=17.167,
    prefill_ms_per_token=4.791,
    batch_alpha=0.1,
    h2d_gbps=1.0,
    d2h_gbps=1.0,
)
BATCHES = (1, 4, 8, 16)


def test_the_batch_covers_the_highest_slot() -> None:
    assert [batch_for(BATCHES, n) for n in (1, 2, 4, 5, 9, 16, 17)] == [1, 4, 4, 8, 16, 16, 16]


def occupants(*slots: int, kv: int = 100, steps: int = 1000) -> list[Occupant]:
    return [Occupant(slot, kv, steps) for slot in slots]


def test_a_move_pays_when_the_saved_padding_exceeds_the_re_prefill() -> None:
    # Slots 0 and 9 hold sequences (batch 16); slot 1 is free: moving 9 -> 1 runs batch 4.
    saving = step_ms(TIMING, 16, 100) - step_ms(TIMING, 4, 100)  # 20.6 ms a step
    cost = reprefill_ms(TIMING, 100)  # 496 ms
    steps = int(cost / saving)
    assert compaction_plan(TIMING, BATCHES, occupants(0, 9, steps=steps), [1, 2]) == []
    assert compaction_plan(TIMING, BATCHES, occupants(0, 9, steps=steps + 1), [1, 2]) == [SlotMove(9, 1, 100)]


def test_every_sequence_above_the_smaller_batch_moves_together() -> None:
    # 7 sequences fit batch 8; the four in slots 9..14 move into 0, 1, 3, 4 (one move alone would
    # leave slot 13 and batch 16), and the cost is all four re-prefills.
    held = occupants(2, 6, 7, 9, 11, 13, 14)
    free = [0, 1, 3, 4, 5, 8, 10, 12, 15]
    moves = compaction_plan(TIMING, BATCHES, held, free)
    assert moves == [SlotMove(14, 0, 100), SlotMove(13, 1, 100), SlotMove(11, 3, 100), SlotMove(9, 4, 100)]
    saving = step_ms(TIMING, 16, 100) - step_ms(TIMING, 8, 100)
    steps = int(4 * reprefill_ms(TIMING, 100) / saving)
    assert compaction_plan(TIMING, BATCHES, occupants(2, 6, 7, 9, 11, 13, 14, steps=steps), free) == []


@pytest.mark.parametrize(
    ("held", "free", "why"),
    [
        ([0, 2, 3], [1], "the batch does not shrink: 3 sequences need batch 4 anyway"),
        ([0, 1], [2, 3], "already below the smallest batch that holds them"),
        ([], [0], "nothing runs"),
    ],
)
def test_no_move_when_it_cannot_shrink_the_batch(held: list[int], free: list[int], why: str) -> None:
    assert compaction_plan(TIMING, BATCHES, occupants(*held), free) == [], why


def test_a_long_sequence_costs_more_to_move_than_a_short_one() -> None:
    short, long = (compaction_plan(TIMING, BATCHES, occupants(12, kv=kv, steps=300), [0]) for kv in (50, 1500))
    assert short == [SlotMove(12, 0, 50)] and long == []


def test_with_fixed_slots_a_cold_lane_is_the_lowest_free_or_parked_slot() -> None:
    tokens = np.arange(40, dtype=np.int32)
    old = ParkedView(1, np.arange(100, 140, dtype=np.int32), last_used=1, prompt_len=40)  # least recently used
    low = ParkedView(0, np.arange(200, 240, dtype=np.int32), last_used=2, prompt_len=40)
    assert choose_lane(tokens, [old, low], {3}, 16) == LaneChoice(3, LaneSource.FREE)
    assert choose_lane(tokens, [old, low], {3}, 16, lowest_slot=True) == LaneChoice(0, LaneSource.EVICTED)
    assert choose_lane(tokens, [old], {0, 3}, 16, lowest_slot=True) == LaneChoice(0, LaneSource.FREE)
    mine = ParkedView(2, tokens[:30], last_used=3, prompt_len=30)  # a continuation still comes first
    assert choose_lane(tokens, [old, low, mine], {3}, 16, lowest_slot=True) == LaneChoice(2, LaneSource.HIT, 30)


def test_the_fill_is_active_rows_over_compiled_rows() -> None:
    stats = SlotStats(active_rows=3, compiled_rows=8)
    assert stats.fill == 0.375 and SlotStats().fill == 1.0
    assert SlotView(True, "all", 3, 8, 0, 0).fill == 0.375


# ---------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fixed-slots")
    build_sim_package("tiny", root / "tiny")  # decode batches 1 and 4, 4 lanes
    return root


FIXED = {"lane_selection": False, "inactive_rows": "only_valid"}
SHORT = request(tuple(range(3, 13)), 2, seed=1)
LONG = request(tuple(range(20, 30)), 200, seed=2, temperature=0.9, top_p=0.95)


def test_one_sequence_in_slot_0_runs_batch_1(models: Path) -> None:
    with running_core(models, device_options=FIXED, prefix_reuse=False) as core:
        finish(core, core.submit(request(tuple(range(5, 15)), 30, seed=3)).job_id)
        slots = core.status().models[0].slots
    assert slots is not None and slots.fixed and slots.inactive_rows == "only_valid"
    assert slots.active_rows == slots.compiled_rows > 0  # the warm-up's and its own steps: all batch 1


@pytest.mark.parametrize("reuse", [False, True], ids=["slot-0-free", "slot-0-parked"])
def test_a_sequence_left_in_a_high_slot_moves_down_and_keeps_its_tokens(models: Path, reuse: bool) -> None:
    with running_core(models, prefix_reuse=False) as core:  # the reference: lanes selected freely
        want, _ = finish(core, core.submit(LONG).job_id)
    # SHORT takes slot 0 and LONG slot 1 (batch 4); once SHORT ends, slot 0 is FREE (or PARKED, and
    # evicted by the move), and LONG, with ~198 steps left, pays its 13-token re-prefill back in
    # batch-1 steps.
    with running_core(models, device_options=FIXED, prefix_reuse=reuse) as core:
        ids = [core.submit(SHORT).job_id, core.submit(LONG).job_id]
        got, _ = finish(core, ids[1])
        finish(core, ids[0])
        status = core.status()
        counters = core.snapshot().counters
        assert_clean(core)
    slots = status.models[0].slots
    assert slots is not None and slots.compactions == 1, slots
    assert slots.compacted_tokens > len(LONG.prompt_tokens)  # its prompt and what it had generated
    assert counters.recoveries == 0  # a move is not a recovery: no fault, no budget spent
    assert got == want
