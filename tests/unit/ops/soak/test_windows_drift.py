"""Windows (counts, percentiles, throughput) and drift (the level and trend of the per-window p99,
and the reported p99 of the requests), from points."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from calculet.ops.soak.classify import RequestClass
from calculet.ops.soak.drift import DRIFT_BOUND, MIN_WINDOW_VALUES, DriftFigure, drift, spans
from calculet.ops.soak.trend import theil_sen
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


def _run(level_at: Callable[[int], float], duration: float = 1000.0, per_window: int = 12) -> list[DriftFigure]:
    """`window_count(duration)` windows (20 of 50 s by default); window i's TTFT values are
    `level_at(i)` (TPOT a tenth of it), with one value 1 % higher so each window has a spread; the
    first window (the warm-up) carries junk."""
    count = window_count(duration)
    width = duration / count
    points = []
    for i in range(count):
        level = 99.0 if i == 0 else level_at(i)
        for k in range(per_window):
            v = level * (1.01 if k == 0 else 1.0)
            points.append(point(i * width + 1.0 + k, ttft_s=v, tpot_s=v / 10))
    windows = window_stats(points, duration, window_count(duration))
    return drift(points, windows, 60.0, duration)


def test_a_steady_run_has_not_drifted() -> None:
    figures = _run(lambda i: 1.0 + DRIFT_BOUND / 2 * (i % 2))
    assert all(f.judged and not f.drifted for f in figures)
    assert figures[0].span_windows == (2, 2)


def test_a_late_step_moves_the_level() -> None:
    ttft, tpot = _run(lambda i: 1.5 if i >= 18 else 1.0)
    assert ttft.drifted and tpot.drifted
    assert ttft.level.change == pytest.approx(0.5, rel=0.02)


def test_a_slow_rise_moves_the_trend() -> None:
    (ttft, _) = _run(lambda i: 1.0 + 0.02 * i)
    assert ttft.drifted
    assert ttft.trend.change is not None and ttft.trend.change > DRIFT_BOUND


def test_fault_windows_move_the_requests_p99_but_not_the_level_or_trend() -> None:
    """A 4,000 s run of 66 windows: two windows of the last span hit by a fault (ten times slower)
    and a milder one in the first: the p99 of the last span's requests jumps, the median of the
    per-window p99s and the Theil-Sen line do not."""
    (ttft, _) = _run(lambda i: {3: 3.0, 62: 10.0, 64: 10.0}.get(i, 1.0), duration=4000.0)
    assert ttft.span_windows[1] >= 5
    assert ttft.requests.change is not None and ttft.requests.change > 1.0
    assert not ttft.drifted and ttft.level.change == pytest.approx(0.0, abs=0.02)
    assert ttft.trend.change == pytest.approx(0.0, abs=0.02)


def test_a_falling_series_has_not_drifted() -> None:
    (ttft, _) = _run(lambda i: 2.0 - 0.05 * i)
    assert ttft.judged and not ttft.drifted and ttft.trend.change is not None and ttft.trend.change < 0


def test_drift_is_not_judged_on_short_runs_or_thin_windows() -> None:
    short = _run(lambda i: 3.0 if i > 10 else 1.0, duration=599.0)
    assert not any(f.judged or f.drifted for f in short) and "shorter" in short[0].note
    thin = _run(lambda i: 3.0 if i > 10 else 1.0, per_window=MIN_WINDOW_VALUES - 1)
    assert not thin[0].judged and not thin[0].drifted and "windows" in thin[0].note


def test_theil_sen_fits_a_line_and_shrugs_off_outliers() -> None:
    xs = [float(x) for x in range(10)]
    exact = theil_sen(xs, [2.0 + 0.5 * x for x in xs])
    assert exact.slope == pytest.approx(0.5) and exact.at(4.0) == pytest.approx(4.0)
    ys = [1.0] * 10
    ys[2] = ys[9] = 50.0
    robust = theil_sen(xs, ys)
    assert robust.slope == pytest.approx(0.0) and robust.intercept == pytest.approx(1.0)
    with pytest.raises(ValueError):
        theil_sen([1.0], [1.0])
    with pytest.raises(ValueError):
        theil_sen([1.0, 1.0], [1.0, 2.0])
