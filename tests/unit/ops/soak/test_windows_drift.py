"""Windows (counts, percentiles, throughput) and drift (last 10 % against the first 10 % after the
warm-up), from points."""

from __future__ import annotations

import pytest

from calculet.ops.soak.classify import RequestClass
from calculet.ops.soak.drift import DRIFT_BOUND, drift, spans
from calculet.ops.soak.windows import window_count, window_stats
from tests.unit.ops.soak.factories import point


def test_window_count_is_20_or_one_a_minute() -> None:
    assert window_count(120) == 20
    assert window_count(1800) == 30
    assert window_count(7200) == 120


def test_windows_split_by_end_time_with_late_ends_in_the_last() -> None:
    points = [point(1.0), point(2.0, RequestClass.FAILED), point(9.5), point(12.0)]  # 12 s: after the traffic
    stats = window_stats(points, 10.0, 2)
    assert [w.counts["ok"] for w in stats] == [1, 2]
    assert stats[0].counts["failed"] == 1
    assert stats[1].ok_per_s == pytest.approx(2 / 5)
    assert stats[1].output_tokens_per_s == pytest.approx(20 / 5)


def test_window_percentiles_interpolate_like_numpy() -> None:
    points = [point(1.0, ttft_s=v) for v in (0.1, 0.2, 0.3, 0.4, 0.5)]
    (w,) = window_stats(points, 10.0, 1)
    assert w.ttft.p50 == pytest.approx(0.3)
    assert w.ttft.p99 == pytest.approx(0.496)
    assert w.tpot.count == 5


def test_an_empty_window_has_no_percentiles() -> None:
    (w, _) = window_stats([point(9.0)], 10.0, 2)
    assert w.ttft.count == 0 and w.ttft.p99 is None and w.ok_per_s == 0


def test_spans_skip_the_warm_up_and_widen_to_a_cycle() -> None:
    assert spans(60.0, 1000.0) == ((60.0, 160.0), (900.0, 1000.0))
    assert spans(30.0, 600.0, 120.0) == ((30.0, 150.0), (480.0, 600.0))


def _run(early: float, late: float, duration: float = 1000.0) -> list:  # type: ignore[type-arg]
    points = [point(100.0 + i * 0.1, ttft_s=early, tpot_s=early / 10) for i in range(30)]
    points += [point(950.0 + i * 0.1, ttft_s=late, tpot_s=late / 10) for i in range(30)]
    points += [point(20.0, ttft_s=99.0, tpot_s=9.9) for _ in range(30)]  # the warm-up: ignored
    return drift(points, 60.0, duration)


def test_drift_within_the_bound_passes_and_above_it_fails() -> None:
    fine = _run(1.0, 1.0 + DRIFT_BOUND - 0.01)
    assert all(f.judged and not f.drifted for f in fine)
    worse = _run(1.0, 1.5)
    assert all(f.drifted for f in worse) and worse[0].change == pytest.approx(0.5)


def test_drift_is_not_judged_on_short_runs_or_few_samples() -> None:
    short = _run(1.0, 3.0, duration=599.0)
    assert not any(f.judged or f.drifted for f in short) and "shorter" in short[0].note
    few = drift([point(100.0), point(990.0)], 60.0, 1000.0)
    assert not few[0].judged and "fewer" in few[0].note
