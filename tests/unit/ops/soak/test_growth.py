"""Process usage: least-squares slopes, growth between the first and last spans, and which
processes are judged."""

from __future__ import annotations

import pytest

from calculet.ops.soak.growth import MIB, GrowthBounds, ProcessSeries, UsageSample, series_growth, slope_per_hour


def series(values: list[tuple[float, int, int, int]], ended: bool = False, name: str = "gateway") -> ProcessSeries:
    s = ProcessSeries(name, "gateway" if name == "gateway" else "daemon", 42, ended=ended)
    s.samples = [UsageSample(t, rss, fds, threads) for t, rss, fds, threads in values]
    return s


def test_slope_per_hour_is_least_squares() -> None:
    assert slope_per_hour([(0.0, 1.0), (1800.0, 2.0), (3600.0, 3.0)]) == pytest.approx(2.0)
    assert slope_per_hour([(0.0, 5.0), (3600.0, 4.0), (7200.0, 6.0)]) == pytest.approx(0.5)
    assert slope_per_hour([(1.0, 1.0)]) is None
    assert slope_per_hour([(1.0, 1.0), (1.0, 2.0)]) is None


def flat_then(late_fds: int, late_rss: int, duration: float = 1200.0) -> ProcessSeries:
    early = [(float(t), 100 * MIB, 30, 10) for t in range(0, 300, 10)]
    late = [(float(t), late_rss, late_fds, 10) for t in range(300, int(duration) + 1, 10)]
    return series(early + late)


def test_growth_within_bounds_passes_and_beyond_fails() -> None:
    ok = series_growth(flat_then(46, 150 * MIB), 60.0, 1200.0, GrowthBounds())
    assert ok["fds"].growth == 16 and ok["fds"].judged and not ok["fds"].over
    assert not ok["rss_bytes"].over  # +50 MiB: under the 64 MiB floor
    bad = series_growth(flat_then(47, 170 * MIB), 60.0, 1200.0, GrowthBounds())
    assert bad["fds"].over and bad["rss_bytes"].over
    assert bad["fds"].slope_per_hour is not None and bad["fds"].slope_per_hour > 0


def test_rss_bound_is_ten_percent_of_a_large_process() -> None:
    assert GrowthBounds().limit("rss_bytes", 2000 * MIB) == pytest.approx(200 * MIB)
    assert GrowthBounds().limit("rss_bytes", 100 * MIB) == 64 * MIB


def test_growth_is_reported_but_not_judged_on_short_runs_or_replaced_processes() -> None:
    short = series_growth(flat_then(99, 100 * MIB, duration=500.0), 30.0, 500.0, GrowthBounds())
    assert short["fds"].growth == 69 and not short["fds"].judged and not short["fds"].over
    gone = flat_then(99, 100 * MIB)
    gone.ended = True
    assert not series_growth(gone, 60.0, 1200.0, GrowthBounds())["fds"].judged
    late = series([(float(t), MIB, 99, 1) for t in range(100, 1201, 10)], name="board0")
    assert not series_growth(late, 60.0, 1200.0, GrowthBounds())["fds"].judged  # started after the warm-up
