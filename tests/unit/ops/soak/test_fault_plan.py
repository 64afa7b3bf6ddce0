"""The fault cycle: a tenth of the run (at least the minimum, stretched to divide the run), every
kind once per cycle at evenly spread offsets, boards rotating, the same mix in any span of one
cycle, and the same faults on the same boards in the first and last spans."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from calculet.ops.soak.drift import spans
from calculet.ops.soak.fault_plan import (
    CYCLE,
    DISRUPTIVE,
    MIN_CYCLE_S,
    RESETS_PER_CYCLE,
    SWITCH_CYCLE,
    SoakFault,
    cycle_length,
    plan_faults,
    reset_budget,
    whole_cycle,
)
from calculet.ops.soak.settings import SoakSettings, cycle_floor_for


def test_the_cycle_is_a_tenth_of_the_run_and_never_below_the_minimum() -> None:
    assert cycle_length(7200) == 720
    assert cycle_length(250) == 125.0  # the minimum, stretched to divide the run
    assert cycle_length(180) == 180.0 > MIN_CYCLE_S


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
    plan = plan_faults(150, 2, cycle_s=MIN_CYCLE_S)  # a cycle given, not stretched
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


def test_a_raised_cycle_is_stretched_to_divide_the_run() -> None:
    assert whole_cycle(6912.0, 712.0) == pytest.approx(768.0)  # 9 cycles, not 9.7
    assert whole_cycle(7200.0, 720.0) == pytest.approx(720.0)  # a tenth already divides the run
    assert whole_cycle(150.0, 120.0) == pytest.approx(150.0)  # at least one cycle, never shortened
    assert cycle_length(1300.0) == pytest.approx(130.0) and cycle_length(180.0) == pytest.approx(180.0)
    with pytest.raises(ValueError):
        whole_cycle(0.0, 1.0)


@pytest.mark.parametrize("boards", [2, 3])
def test_the_first_and_last_spans_see_the_same_faults_on_the_same_boards(boards: int) -> None:
    """The board-day run: 24 board-hours at time scale 0.08, a cycle floor of four 178 s job
    timeouts, the switch cycle. The drift spans are the first and the last cycle's length; each
    holds every kind once, on the same board, at the same offset into its span."""
    settings = SoakSettings(86400.0, Path("out"), "qwen3-30b-a3b-b1", time_scale=0.08, boards=boards,
                            cycle_floor_s=cycle_floor_for(178.0))  # fmt: skip
    cycle = settings.cycle_s
    plan = plan_faults(settings.phase_s, boards, cycle, SWITCH_CYCLE)
    first, last = spans(settings.warmup, settings.phase_s, cycle)

    def seen(span: tuple[float, float], start: float) -> list[tuple[SoakFault, int | None, float]]:
        return [(f.kind, f.board, round(f.at_s - start, 6)) for f in plan if span[0] <= f.at_s < span[1]]

    assert seen(first, 0.0) == seen(last, last[0]) and len(seen(first, 0.0)) == len(SWITCH_CYCLE)
    middle = [f for f in plan if f.cycle == 1]
    assert [f.board for f in middle] != [f.board for f in plan if f.cycle == 0], "the cycles between rotate"
