"""The fault cycle: a tenth of the run (at least the minimum), every kind once per cycle at evenly
spread offsets, boards rotating, the same mix in any span of one cycle."""

from __future__ import annotations

from collections import Counter

import pytest

from calculet.ops.soak.fault_plan import (
    CYCLE,
    DISRUPTIVE,
    MIN_CYCLE_S,
    RESETS_PER_CYCLE,
    SoakFault,
    cycle_length,
    plan_faults,
    reset_budget,
)


def test_the_cycle_is_a_tenth_of_the_run_and_never_below_the_minimum() -> None:
    assert cycle_length(7200) == 720
    assert cycle_length(180) == MIN_CYCLE_S


def test_every_kind_once_per_cycle_at_evenly_spread_offsets() -> None:
    plan = plan_faults(3600, 2)
    cycle = 360.0
    assert len(plan) == 10 * len(CYCLE)
    for number in range(10):
        mine = [f for f in plan if f.cycle == number]
        assert [f.kind for f in mine] == list(CYCLE)
        assert [f.at_s - number * cycle for f in mine] == pytest.approx([(k + 0.5) * 36.0 for k in range(10)])


def test_the_first_and_last_tenth_see_the_same_mix() -> None:
    plan = plan_faults(7200, 2)
    first = Counter(f.kind for f in plan if f.at_s < 720)
    last = Counter(f.kind for f in plan if f.at_s >= 6480)
    assert first == last == Counter(CYCLE)


def test_a_short_run_gets_the_part_of_a_cycle_that_fits() -> None:
    plan = plan_faults(150, 2)
    assert [f.kind for f in plan] == [*CYCLE, CYCLE[0], CYCLE[1]]
    assert all(f.at_s < 150 for f in plan)


def test_boards_rotate_and_a_rollout_is_fleet_wide() -> None:
    plan = plan_faults(2400, 2)
    assert all(f.board is None for f in plan if f.kind is SoakFault.ROLLOUT)
    assert {f.board for f in plan if f.kind is SoakFault.HANG} == {0, 1}
    assert {f.board for f in plan_faults(2400, 3) if f.kind is SoakFault.HANG} == {0, 1, 2}


@pytest.mark.parametrize("boards", [1, 2, 3])
def test_the_last_board_survives_the_run_when_there_are_two_or_more(boards: int) -> None:
    """Faults that end a process spare the last board, so one daemon's growth over the run is judged."""
    plan = plan_faults(2400, boards)
    for kind in (SoakFault.SIGKILL, SoakFault.DEVICE_LOST):
        hit = {f.board for f in plan if f.kind is kind}
        assert hit == ({0} if boards == 1 else set(range(boards - 1))), (kind, hit)


def test_the_cycle_starts_gently_and_plays_six_faults_that_take_a_board_out() -> None:
    flags = [k in DISRUPTIVE for k in CYCLE]
    # every kind but the model switch, which only a `--models A,B` fleet plays (test_board_day.py)
    assert sum(flags) == 6 and not flags[0] and set(CYCLE) == set(SoakFault) - {SoakFault.MODEL_SWITCH}


def test_the_reset_budget_covers_a_cycle_twice() -> None:
    limit, window = reset_budget(360.0)
    assert window == 360.0 and limit == 2 * RESETS_PER_CYCLE + 2


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError):
        plan_faults(0, 2)
    with pytest.raises(ValueError):
        plan_faults(100, 0)
