"""Device utilisation from hand-made device timestamps (`core/utilization.py`): serial jobs leave
the copies uncovered, ping/pong hides them, the banks' ratios add up to the total, overlapping
computes count once, missing or infinite timestamps are left out, and the recent window covers
the last seconds of wall clock only. Also its protobuf form in Status."""

from __future__ import annotations

import math

import pytest

from calculet.daemon.core.utilization import UtilizationTracker
from calculet.daemon.device.types import EngineSlot, JobTimestamps
from calculet.daemon.wire_views import utilization_to_pb

PING, PONG = EngineSlot.PING, EngineSlot.PONG
BANKS = (PING, PONG)


def stamps(queued: float, h2d: tuple[float, float], compute: tuple[float, float], d2h_end: float) -> JobTimestamps:
    return JobTimestamps(queued, h2d[0], h2d[1], compute[0], compute[1], compute[1], d2h_end)


def by_bank(tracker: UtilizationTracker, now: float) -> dict[EngineSlot, tuple[float, float]]:
    return {b.bank: (b.busy_seconds, b.busy_ratio) for b in tracker.view(now).banks}


def test_serial_jobs_leave_the_copies_idle() -> None:
    t = UtilizationTracker(BANKS, started=0.0)
    t.record(PING, stamps(0, (0, 1), (1, 5), 6), tokens=1, sampling_s=0.25, now=1.0)
    t.record(PING, stamps(6, (6, 7), (7, 11), 12), tokens=1, sampling_s=0.25, now=1.5)
    v = t.view(2.0)
    assert (v.device_seconds, v.busy_seconds) == (12, 8)
    assert v.busy_ratio == pytest.approx(8 / 12)
    assert (v.h2d_seconds, v.compute_seconds, v.d2h_seconds, v.sampling_seconds) == (2, 8, 2, 0.5)
    assert v.generated_tokens == 2
    assert by_bank(t, 2.0) == {PING: (8, pytest.approx(8 / 12)), PONG: (0, 0)}


def test_ping_pong_hides_the_copies_and_the_banks_add_up_to_the_total() -> None:
    t = UtilizationTracker(BANKS, started=0.0)
    t.record(PING, stamps(0, (0, 1), (1, 5), 6), tokens=1, sampling_s=0.0, now=1.0)
    t.record(PONG, stamps(0, (1, 2), (5, 9), 10), tokens=1, sampling_s=0.0, now=1.0)
    v = t.view(1.0)
    assert (v.device_seconds, v.busy_seconds, v.busy_ratio) == (10, 8, 0.8)
    banks = by_bank(t, 1.0)
    assert banks == {PING: (4, 0.4), PONG: (4, 0.4)}
    assert sum(ratio for _, ratio in banks.values()) == pytest.approx(v.busy_ratio)


def test_overlapping_computes_count_once_so_the_ratio_stays_at_most_one() -> None:
    t = UtilizationTracker(BANKS, started=0.0)
    t.record(PING, stamps(0, (0, 0), (0, 4), 4), tokens=0, sampling_s=0.0, now=1.0)
    t.record(PONG, stamps(0, (0, 0), (2, 6), 6), tokens=0, sampling_s=0.0, now=1.0)
    v = t.view(1.0)
    assert (v.busy_seconds, v.device_seconds, v.busy_ratio) == (6, 6, 1.0)
    assert v.compute_seconds == 8  # the phase sum keeps what the device reported


@pytest.mark.parametrize("bad", [None, stamps(0, (0, 1), (1, math.inf), math.inf)])
def test_jobs_without_finite_timestamps_count_only_their_tokens(bad: JobTimestamps | None) -> None:
    t = UtilizationTracker(BANKS, started=0.0)
    t.record(PING, stamps(0, (0, 1), (1, 3), 4), tokens=1, sampling_s=0.0, now=1.0)
    t.record(PONG, bad, tokens=3, sampling_s=0.5, now=1.0)
    v = t.view(1.0)
    assert (v.device_seconds, v.busy_seconds, v.generated_tokens, v.sampling_seconds) == (4, 2, 4, 0.5)


def test_nothing_recorded_reports_zeros_not_a_division_by_zero() -> None:
    v = UtilizationTracker(BANKS, started=5.0).view(5.0)
    assert (v.device_seconds, v.busy_ratio, v.tokens_per_second, v.recent_busy_ratio, v.recent_window_seconds) == (
        0,
        0,
        0,
        0,
        0,
    )
    assert [b.bank for b in v.banks] == [PING, PONG]


def test_the_recent_window_covers_the_last_seconds_of_wall_clock() -> None:
    t = UtilizationTracker(BANKS, started=100.0, window_s=10.0)
    t.record(PING, stamps(0, (0, 1), (1, 5), 6), tokens=10, sampling_s=0.0, now=100.5)
    t.record(PING, stamps(6, (6, 7), (7, 11), 12), tokens=5, sampling_s=0.0, now=105.2)
    early = t.view(106.0)  # younger than the window: it covers the 6 s since start
    assert early.recent_window_seconds == pytest.approx(6.0)
    assert early.tokens_per_second == pytest.approx(15 / 6)
    assert early.recent_busy_ratio == pytest.approx(8 / 12)
    later = t.view(112.0)  # the first second has left the window
    assert later.recent_window_seconds == pytest.approx(10.0)
    assert later.tokens_per_second == pytest.approx(5 / 10)
    assert later.recent_busy_ratio == pytest.approx(4 / 6)
    idle = t.view(200.0)
    assert (idle.tokens_per_second, idle.recent_busy_ratio) == (0, 0)
    assert idle.generated_tokens == 15 and idle.busy_ratio == pytest.approx(8 / 12)  # since start: kept


def test_status_carries_it_with_banks_as_indexes() -> None:
    t = UtilizationTracker(BANKS, started=0.0)
    t.record(PING, stamps(0, (0, 1), (1, 5), 6), tokens=2, sampling_s=0.125, now=1.0)
    t.record(PONG, stamps(0, (1, 2), (5, 9), 10), tokens=1, sampling_s=0.0, now=1.5)
    pb = utilization_to_pb(t.view(2.0))
    assert (pb.device_seconds, pb.busy_seconds, pb.busy_ratio) == (10, 8, 0.8)
    assert [(b.bank, b.busy_seconds, b.busy_ratio) for b in pb.banks] == [(0, 4, 0.4), (1, 4, 0.4)]
    assert (pb.h2d_seconds, pb.compute_seconds, pb.d2h_seconds, pb.sampling_seconds) == (2, 8, 2, 0.125)
    assert pb.generated_tokens == 3 and pb.tokens_per_second == pytest.approx(3 / 2)
    assert (pb.recent_busy_ratio, pb.recent_window_seconds) == (0.8, 2.0)


def test_d2d_traffic_is_summed_from_the_jobs_and_carried_in_status() -> None:
    t = UtilizationTracker(BANKS, started=0.0)
    linked = JobTimestamps(0, 0, 1, 1, 5, 5, 6, d2d_seconds=0.5, d2d_bytes=3_000)
    t.record(PING, linked, tokens=1, sampling_s=0.0, now=1.0)
    t.record(PONG, stamps(0, (1, 2), (5, 9), 10), tokens=1, sampling_s=0.0, now=1.0)  # a job without D2D
    t.record(PING, JobTimestamps(10, 10, 11, 11, 12, 12, 13, d2d_seconds=0.25, d2d_bytes=1_000), 1, 0.0, 1.5)
    v = t.view(2.0)
    assert (v.d2d_seconds, v.d2d_bytes) == (0.75, 4_000)
    pb = utilization_to_pb(v)
    assert (pb.d2d_seconds, pb.d2d_bytes) == (0.75, 4_000)
