"""The board-day additions to the soak: board time against wall time, the RSS slope after the first
board-hour and its verdict rule, the `long_context` request class and its own arrival stream, the
`model_switch` fault kind (its place in the cycle, its allowed-failure rule, how chaos plays it),
and the command's `--models` / `--policy` choice. Pure or with fakes: no process is started."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from calculet.ops.bench.limit import RequestShape, request_floor
from calculet.ops.commands import soak as soak_command
from calculet.ops.soak import chaos as chaos_module
from calculet.ops.soak.capacity import LONG_CONTEXT_TIME_SHARE, long_context_rate
from calculet.ops.soak.chaos import Chaos, FaultRecord, SwitchFault
from calculet.ops.soak.fault_plan import (
    CYCLE,
    DISRUPTIVE,
    SWITCH_CYCLE,
    SoakFault,
    cycle_kinds,
    plan_faults,
)
from calculet.ops.soak.growth import MIB, GrowthBounds, ProcessSeries, UsageSample, series_growth
from calculet.ops.soak.mix import (
    KIND_SHARES,
    LONG_CONTEXT_KIND,
    LONG_CONTEXT_MIN_LANE,
    build_pool,
    burst_specs,
    mix_shape,
    request_shapes,
)
from calculet.ops.soak.policy import allowed_rule
from calculet.ops.soak.settings import (
    HANG_CYCLE_FACTOR,
    MIN_SAMPLE_WALL_S,
    SoakSettings,
    cycle_floor_for,
    job_timeout_for,
    lost_timeout_for,
)
from calculet.ops.soak.timeline import Timeline
from calculet.ops.soak.verdict import VerdictInputs, judge
from tests.unit.ops.bench.timing_factories import device_model
from tests.unit.ops.soak.factories import spec
from tests.unit.ops.soak.test_verdict import tally

BOARD_HOUR = 3600.0


def words(text: str) -> int:
    return len(text.split())


# ---------------------------------------------------------------- board time


@pytest.mark.parametrize(
    ("scale", "phase", "cycle", "warmup", "sample"),
    [
        (0.1, 8640.0, 864.0, 30.0, MIN_SAMPLE_WALL_S),  # a board-day in 2.4 wall hours
        (1.0, 86400.0, 8640.0, 300.0, 5.0),
        (0.0, 86400.0, 8640.0, 300.0, 5.0),  # no modelled time: board time is wall time
    ],
)
def test_a_board_day_is_measured_in_board_time(
    scale: float, phase: float, cycle: float, warmup: float, sample: float
) -> None:
    s = SoakSettings(duration_s=86400.0, out=Path("x"), preset="tiny", time_scale=scale)
    assert (s.phase_s, s.cycle_s, s.warmup, s.sample_wall_s) == pytest.approx((phase, cycle, warmup, sample))
    assert s.describe()["phase_wall_s"] == pytest.approx(phase)


def test_a_short_fast_run_keeps_the_host_floors_of_cycle_and_calibration() -> None:
    s = SoakSettings(duration_s=3600.0, out=Path("x"), preset="tiny", time_scale=0.1)
    assert s.phase_s == pytest.approx(360.0)
    assert s.cycle_s == 120.0  # six outages of host seconds each fit in no less
    assert s.calibration_wall_s == 15.0  # 120 board seconds would be 12 wall seconds


# ---------------------------------------------------------------- RSS slope after the first board-hour


def rising(rss_per_board_hour: float, hour_s: float, hours: float = 3.0, first_hour_rise: float = 0.0) -> ProcessSeries:
    """Samples every 1/60 board-hour: `first_hour_rise` bytes over the first board-hour, then a line."""
    out = ProcessSeries("board1", "daemon", 7)
    for i in range(int(hours * 60) + 1):
        t = i * hour_s / 60
        board_hours = t / hour_s
        early = first_hour_rise * min(1.0, board_hours)
        late = rss_per_board_hour * max(0.0, board_hours - 1.0)
        out.samples.append(UsageSample(t, int(100 * MIB + early + late), 30, 10))
    return out


@pytest.mark.parametrize("hour_s", [BOARD_HOUR, 360.0])  # time scale 1 and 0.1
def test_the_late_rss_slope_is_per_board_hour_and_skips_the_first(hour_s: float) -> None:
    settled = rising(0.0, hour_s, first_hour_rise=40e6)  # the 2-hour run's early rise, then flat
    leaking = rising(2e6, hour_s)
    for series, over in ((settled, False), (leaking, True)):
        rss = series_growth(series, 0.0, 3 * hour_s, GrowthBounds(), 0.0, hour_s, 600.0 * hour_s / BOARD_HOUR)
        m = rss["rss_bytes"]
        assert m.late_judged and m.late_over is over, m
        assert m.late_slope_per_hour == pytest.approx(2e6 if over else 0.0, abs=1e4)
    # the whole run's slope of the settled process is the early rise, which the late one leaves out
    whole = series_growth(settled, 0.0, 3 * hour_s, GrowthBounds(), 0.0, hour_s)["rss_bytes"]
    assert whole.slope_per_hour is not None and whole.slope_per_hour > 1e6


def test_the_late_slope_needs_a_board_hour_after_the_first() -> None:
    m = series_growth(rising(5e6, BOARD_HOUR, hours=1.5), 0.0, 5400.0, GrowthBounds())["rss_bytes"]
    assert not m.late_judged and not m.late_over and m.late_slope_per_hour is not None


def test_the_verdict_fails_a_late_rss_slope_and_notes_when_not_judged() -> None:
    leaking = series_growth(rising(2e6, BOARD_HOUR), 0.0, 3 * BOARD_HOUR, GrowthBounds())
    verdict = judge(VerdictInputs({"soak": tally()}, [], {"board1 (pid 7)": leaking}, {"board0": True}))
    assert not verdict.passed and any("per board-hour after the first board-hour" in r for r in verdict.reasons)
    short = series_growth(rising(2e6, BOARD_HOUR, hours=1.5), 0.0, 5400.0, GrowthBounds())
    verdict = judge(VerdictInputs({"soak": tally()}, [], {"board1 (pid 7)": short}, {"board0": True}))
    assert verdict.passed and any("first board-hour not judged" in n for n in verdict.notes)


# ---------------------------------------------------------------- the long-context class


def test_long_context_requests_join_the_pool_only_where_a_lane_holds_them() -> None:
    assert mix_shape(5120).long_context is None and mix_shape(5120).shares == KIND_SHARES
    shape = mix_shape(LONG_CONTEXT_MIN_LANE)
    pool = build_pool(100, 0, shape, words)
    long = [s for s in pool if s.kind == LONG_CONTEXT_KIND]
    assert len(long) == 1 and long[0].turns == 1 and long[0].message_tokens[0] >= 30_000
    assert long[0].message_tokens[0] + long[0].max_tokens < LONG_CONTEXT_MIN_LANE
    # the other kinds are still all there, and the same seed gives the same pool
    assert {s.kind for s in pool} == {k for k, _ in KIND_SHARES} | {LONG_CONTEXT_KIND}
    assert build_pool(100, 0, shape, words) == pool


def test_the_long_context_stream_takes_its_share_of_board_time_at_any_scale() -> None:
    model = device_model(batches=(1,), lanes=1)
    long = spec(("w " * 400,), (400,), max_tokens=16)
    at_one = long_context_rate(model, [long], 2, 1.0)
    assert long_context_rate(model, [long], 2, 0.1) == pytest.approx(10 * at_one)
    assert long_context_rate(model, [], 2, 1.0) == 0.0
    # the timing model's seconds of one such request, times the rate, is the share of 2 boards
    e2e = request_floor(model, RequestShape(400 + 5, 16), 1).e2e
    assert at_one * e2e == pytest.approx(LONG_CONTEXT_TIME_SHARE * 2, rel=0.05)


def test_the_lost_timeout_grows_to_cover_the_slowest_request() -> None:
    model = device_model(batches=(1,), lanes=1)
    pool = [spec(), spec(("w " * 400,), (400,), max_tokens=16)]
    assert lost_timeout_for(model, pool, 0.0, 300.0, 3.0) == 300.0
    assert lost_timeout_for(model, pool, 1.0, 1.0, 3.0) > 1.0
    assert lost_timeout_for(model, pool, 1e-6, 300.0, 0.0) == pytest.approx(301.0, abs=1.0)


def test_the_lost_timeout_waits_out_a_hang_and_a_second_run_of_the_slowest_request() -> None:
    model = device_model(batches=(1,), lanes=1)
    long = spec(("w " * 400,), (400,), max_tokens=16)
    slowest = sum(request_floor(model, shape, 1).e2e for shape in request_shapes(long)) * 0.1
    job_timeout = job_timeout_for(model, [spec(), long], 0.1)
    lost = lost_timeout_for(model, [spec(), long], 0.1, 300.0, job_timeout)
    # its run, a hang's job timeout, its run again elsewhere, and the flag's 300 s for queues
    assert lost >= slowest + job_timeout + slowest + 300.0
    assert lost - lost_timeout_for(model, [spec(), long], 0.1, 300.0, 0.0) == pytest.approx(job_timeout, abs=1.0)


# ---------------------------------------------------------------- the model-switch fault


def test_the_model_switch_joins_the_cycle_on_a_two_model_fleet_of_two_boards() -> None:
    assert cycle_kinds(False, 2) == CYCLE and cycle_kinds(True, 1) == CYCLE
    assert cycle_kinds(True, 2) == SWITCH_CYCLE and SWITCH_CYCLE[-1] is SoakFault.MODEL_SWITCH
    assert SoakFault.MODEL_SWITCH in DISRUPTIVE and SoakFault.MODEL_SWITCH not in CYCLE
    plan = plan_faults(2400, 2, kinds=SWITCH_CYCLE)
    switches = [f for f in plan if f.kind is SoakFault.MODEL_SWITCH]
    assert len(switches) == 10 and {f.board for f in switches} == {0, 1}  # every cycle, over both boards


def test_a_request_that_outwaits_placement_is_allowed_under_its_own_rule() -> None:
    message = "model 'qwen3-4b' got no board within 120 s"
    assert allowed_rule(503, None, message) == "model-switch"
    assert allowed_rule(None, "unavailable", message) == "model-switch"
    cut = "no board could serve model 'qwen3-30b-a3b' after 3 tokens: model qwen3-30b-a3b unloaded"
    assert allowed_rule(None, "unavailable", cut) == "model-switch"  # the proving run's words
    assert allowed_rule(503, None, "board draining") == "unavailable"
    assert allowed_rule(500, None, message) is None


def test_the_burst_is_the_pools_first_short_specs() -> None:
    pool = build_pool(60, 3, mix_shape(256), words)
    burst = burst_specs(pool, 3)
    assert [s.kind for s in burst] == ["short"] * 3 and burst == [s for s in pool if s.kind == "short"][:3]


@dataclass
class _Child:
    pid: int = 11

    def alive(self) -> bool:
        return True


@dataclass
class _Board:
    name: str
    target: str


@dataclass
class _Supervisor:
    boards: list[_Board] = field(default_factory=lambda: [_Board("board0", "t0"), _Board("board1", "t1")])

    def child(self, board: int) -> _Child:
        return _Child()


@pytest.mark.parametrize("placement_returns", [True, False])
def test_chaos_switches_a_board_sends_the_burst_and_sees_it_come_back(
    monkeypatch: pytest.MonkeyPatch, placement_returns: bool
) -> None:
    switches: list[tuple[str, str, str]] = []

    def switch_board(target: str, alias: str, package: str, reason: str) -> str:
        switches.append((target, alias, package))
        return f"switched from x@1 to {alias}@2"

    def serving_alias(target: str) -> tuple[str, int] | None:
        return ("qwen", 3) if placement_returns else ("dense", 2)

    monkeypatch.setattr(chaos_module, "switch_board", switch_board)
    monkeypatch.setattr(chaos_module, "serving_alias", serving_alias)
    monkeypatch.setattr(chaos_module, "RETURN_S", 5.0 if placement_returns else 0.0)
    bursts: list[int] = []

    async def burst() -> int:
        bursts.append(1)
        return 4

    async def play() -> FaultRecord:
        chaos = Chaos(
            [], _Supervisor(), Timeline(), alias="qwen", packages=("qwen", "qwen-copy"),  # type: ignore[arg-type]
            gateway_url="http://x", log_dir=Path("x"), say=lambda _: None, switch=SwitchFault("dense", burst),
        )  # fmt: skip
        record = FaultRecord(1.0, "model_switch", "board1", 0)
        chaos._start_switch(1, record)
        assert chaos.rollout_running  # the gate and the supervisor see an operation under way
        await chaos.finish(10.0)
        return record

    record = asyncio.run(play())
    assert record.outcome == "switched" and bursts == [1] and "4 request(s) of dense" in record.note
    assert switches[0] == ("t1", "dense", "dense")
    if placement_returns:
        assert len(switches) == 1 and "placement switched it back" in record.note
    else:
        assert switches[1] == ("t1", "qwen", "qwen") and "the harness switched it back" in record.note


# ---------------------------------------------------------------- the command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak_command.add_arguments(parser)
    return parser.parse_args(["--duration", "24h", "--out", "o", *argv])


def test_the_command_takes_two_models_or_a_preset_and_a_policy() -> None:
    s = soak_command.settings_from(parse("--models", "qwen3-30b-a3b,qwen3-4b", "--policy", "serial"))
    assert (s.preset, s.switch_model, s.policy, s.presets) == (
        "qwen3-30b-a3b",
        "qwen3-4b",
        "serial",
        ("qwen3-30b-a3b", "qwen3-4b"),
    )
    s = soak_command.settings_from(parse("--preset", "tiny", "--time-scale", "0.1"))
    assert (s.preset, s.switch_model, s.policy, s.phase_s) == ("tiny", None, "continuous", pytest.approx(8640.0))
    assert soak_command.settings_from(parse()).preset == soak_command.DEFAULT_PRESET


def test_the_calibration_is_5_percent_of_the_run_unless_given() -> None:
    assert soak_command.settings_from(parse("--time-scale", "0.1")).calibration_wall_s == 15.0
    assert soak_command.settings_from(parse("--time-scale", "1")).calibration_wall_s == 120.0
    assert soak_command.settings_from(parse("--calibration", "5s")).calibration_wall_s == 5.0
    for bad in (("--calibration", "soon"), ("--calibration", "-3s")):
        with pytest.raises(SystemExit):
            parse(*bad)


def test_the_command_refuses_bad_models_and_policies() -> None:
    for bad in (("--models", "tiny"), ("--models", "tiny,tiny"), ("--policy", "fifo")):
        with pytest.raises(SystemExit):
            parse(*bad)


def test_a_long_job_timeout_stretches_the_fault_cycle() -> None:
    s = SoakSettings(duration_s=3 * BOARD_HOUR, out=Path("x"), preset="tiny", time_scale=0.1)
    assert cycle_floor_for(3.0) == 120.0 and s.cycle_s == 120.0
    slow = replace(s, cycle_floor_s=cycle_floor_for(230.0))  # a serial 30,000-token prefill at 0.1
    # Four job timeouts (920 s) fit once in the 1,080 s run: the one cycle is the whole run.
    assert HANG_CYCLE_FACTOR * 230.0 == 920.0 and slow.cycle_s == 1080.0
