"""Drift: has p99 TTFT or p99 TPOT risen over the run? Three figures per metric, two of them judged.

The series is the per-window p99 (`windows.py`, one window a minute on long runs) of the windows
after the warm-up that hold at least `MIN_WINDOW_VALUES` values, at each window's midpoint.

- **level** (judged): the median of the series' windows inside the first 10 % after the warm-up
  against the median of those inside the last 10 % (`spans`: each span at least one fault cycle
  long, so both see every kind of fault). A step late in the run moves it.
- **trend** (judged): a Theil-Sen line through the whole series (`trend.py`), its value at the
  end against its value at the end of the warm-up. A slow rise moves it.
- **requests** (reported, not judged): the p99 of all requests that ended in each span. With a
  fault every few minutes it is set by the span's handful of worst requests, every one of them
  hit by a fault (a job timeout, a restart, a failover), so it says where the faults happened to
  land more than how the fleet ages: on the 2-hour run it read +21.6 % while the per-window
  series had no upward trend (docs/reliability.md).

`change` = later / earlier - 1. The metric has drifted when the level or the trend change is
above `DRIFT_BOUND` (20 %). Judged only for runs of at least `JUDGE_MIN_S` (10 board minutes) with at
least `MIN_SPAN_WINDOWS` usable windows in each span; otherwise reported as not judged, with the
reason.

Pure functions of `RequestPoint`s and `WindowStats`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calculet.ops.bench.summary import LatencyStats
from calculet.ops.soak.points import RequestPoint
from calculet.ops.soak.trend import theil_sen
from calculet.ops.soak.windows import WindowStats, ms

SPAN_SHARE = 0.10
DRIFT_BOUND = 0.20
JUDGE_MIN_S = 600.0
MIN_WINDOW_VALUES = 10
MIN_SPAN_WINDOWS = 2

Span = tuple[float, float]
Sample = tuple[float, float]  # (window midpoint s, p99 s)


@dataclass(frozen=True)
class Comparison:
    """An earlier and a later value (seconds) and `change` = later / earlier - 1 (None when either
    is missing or earlier is 0)."""

    earlier: float | None
    later: float | None

    @property
    def change(self) -> float | None:
        if self.earlier is None or self.later is None or self.earlier <= 0:
            return None
        return self.later / self.earlier - 1.0

    def to_json(self) -> dict[str, Any]:
        change = self.change
        return {
            "earlier_ms": ms(self.earlier),
            "later_ms": ms(self.later),
            "change": None if change is None else round(change, 4),
        }


@dataclass(frozen=True)
class DriftFigure:
    """One metric's drift (module docstring)."""

    metric: str
    level: Comparison
    trend: Comparison
    requests: Comparison
    span_windows: tuple[int, int]
    span_requests: tuple[int, int]
    judged: bool
    note: str

    @property
    def drifted(self) -> bool:
        return self.judged and any(c is not None and c > DRIFT_BOUND for c in self.judged_changes())

    def judged_changes(self) -> tuple[float | None, float | None]:
        return self.level.change, self.trend.change

    def worst_change(self) -> float | None:
        known = [c for c in self.judged_changes() if c is not None]
        return max(known) if known else None

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "level": self.level.to_json(),
            "trend": self.trend.to_json(),
            "requests": self.requests.to_json(),
            "span_windows": list(self.span_windows),
            "span_requests": list(self.span_requests),
            "bound": DRIFT_BOUND,
            "judged": self.judged,
            "drifted": self.drifted,
            "note": self.note,
        }


def spans(warmup_s: float, duration_s: float, min_width_s: float = 0.0) -> tuple[Span, Span]:
    """The first and last spans, `(start, end)` seconds (module docstring)."""
    width = max(SPAN_SHARE * duration_s, min_width_s)
    first = (warmup_s, min(duration_s, warmup_s + width))
    last = (max(first[1], duration_s - width), duration_s)
    return first, last


_METRICS: tuple[tuple[str, Callable[[RequestPoint], float | None], Callable[[WindowStats], LatencyStats]], ...] = (
    ("ttft", lambda p: p.ttft_s, lambda w: w.ttft),
    ("tpot", lambda p: p.tpot_s, lambda w: w.tpot),
)


def drift(
    points: Sequence[RequestPoint],
    windows: Sequence[WindowStats],
    warmup_s: float,
    duration_s: float,
    min_width_s: float = 0.0,
    judge_min_s: float = JUDGE_MIN_S,
) -> list[DriftFigure]:
    """TTFT and TPOT drift (module docstring); `min_width_s` is the fault cycle; runs shorter than
    `judge_min_s` (`JUDGE_MIN_S` of board time, in wall seconds) are not judged."""
    first, last = spans(warmup_s, duration_s, min_width_s)
    out = []
    for name, of_point, of_window in _METRICS:
        early = [v for p in points if first[0] <= p.end_s < first[1] and (v := of_point(p)) is not None]
        late = [v for p in points if p.end_s >= last[0] and (v := of_point(p)) is not None]
        series = _series(windows, of_window, warmup_s)
        out.append(_figure(name, series, early, late, (first, last), (warmup_s, duration_s), judge_min_s))
    return out


def _series(
    windows: Sequence[WindowStats], stats: Callable[[WindowStats], LatencyStats], warmup_s: float
) -> list[Sample]:
    out = []
    for w in windows:
        mid, s = (w.start_s + w.end_s) / 2.0, stats(w)
        if mid >= warmup_s and s.count >= MIN_WINDOW_VALUES and s.p99 is not None:
            out.append((mid, s.p99))
    return out


def _figure(
    metric: str,
    series: list[Sample],
    early: list[float],
    late: list[float],
    span_pair: tuple[Span, Span],
    run: tuple[float, float],
    judge_min_s: float,
) -> DriftFigure:
    first, last = span_pair
    in_first = [v for t, v in series if first[0] <= t < first[1]]
    in_last = [v for t, v in series if last[0] <= t <= last[1]]
    level = Comparison(_median(in_first), _median(in_last))
    trend = Comparison(None, None)
    if len(series) >= 2 * MIN_SPAN_WINDOWS and len({t for t, _ in series}) > 1:
        line = theil_sen([t for t, _ in series], [v for _, v in series])
        trend = Comparison(line.at(run[0]), line.at(run[1]))
    requests = Comparison(LatencyStats.of(early).p99, LatencyStats.of(late).p99)
    if run[1] < judge_min_s:
        judged, note = False, f"not judged: the run is shorter than {JUDGE_MIN_S / 60:g} minutes"
    elif min(len(in_first), len(in_last)) < MIN_SPAN_WINDOWS:
        judged, note = (
            False,
            f"not judged: fewer than {MIN_SPAN_WINDOWS} windows of {MIN_WINDOW_VALUES}+ values in a span",
        )
    else:
        judged, note = True, ""
    return DriftFigure(
        metric, level, trend, requests, (len(in_first), len(in_last)), (len(early), len(late)), judged, note
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
