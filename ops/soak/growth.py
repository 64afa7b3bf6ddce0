"""Process usage over the run: per process (per pid: a restarted board starts a new series), its
RSS, open file descriptors and threads, their least-squares slope per hour after the warm-up (a
process started during the run: after a warm-up of its own), and their growth, judged against
`GrowthBounds`.

Growth is the median of the samples in the last 10 % of the run minus the median of those in the
first 10 % after the warm-up (the spans of `drift.spans`; medians, so one sample taken mid-burst
does not decide it). Growth is judged only for processes that lived through the run (sampled
before the warm-up ended and still alive at its end: the gateway, and a board that was never
restarted) and only for runs of at least `JUDGE_MIN_S` (10 minutes); the figures are always
reported.

| metric | bound on growth |
| --- | --- |
| open fds, less the inbound client connections (`UsageSample`) | +16 |
| threads | +8 |
| RSS | +10 % of the first median or +64 MiB, whichever is larger |
| RSS slope after the first board-hour | at most 1 MB (10^6 bytes) per board-hour |

The late slope: the least-squares slope of the samples after the process's first board-hour, per
board-hour (`hour_s`: the wall seconds of a board-hour, `SoakSettings.wall(3600)`), judged for the
processes that lived through the run when those samples span at least a board-hour (runs of two
board-hours or more). It sees a slow leak that the first 20 minutes' allocations (the 2-hour run's
board RSS rose 16 MB, then held: docs/reliability.md) would hide in the whole run's slope.

Pure functions; `sampler` takes the samples.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from calculet.ops.soak.drift import JUDGE_MIN_S, spans

METRICS = ("rss_bytes", "fds", "threads")
MIB = 1024 * 1024


@dataclass(frozen=True)
class GrowthBounds:
    """The largest growth after the warm-up that passes (module docstring)."""

    fds: int = 16
    threads: int = 8
    rss_fraction: float = 0.10
    rss_bytes: int = 64 * MIB
    rss_late_slope_per_hour: int = 1_000_000

    def limit(self, metric: str, baseline: float) -> float:
        if metric == "fds":
            return float(self.fds)
        if metric == "threads":
            return float(self.threads)
        return max(self.rss_fraction * baseline, float(self.rss_bytes))

    def describe(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, slots=True)
class UsageSample:
    """One sample of one process, `t_s` seconds into the soak phase.

    `inbound`: its established TCP connections on a port it listens on (the clients' HTTP
    connections to the gateway). The judged `fds` leaves them out: a backlog holds one per request
    in flight, which is load, not a leak. A socket the process fails to close still counts once its
    peer has gone (it is no longer ESTABLISHED), and so does every other fd.
    """

    t_s: float
    rss_bytes: int
    fds: int
    threads: int
    inbound: int = 0

    def value(self, metric: str) -> float:
        if metric == "fds":
            return float(self.fds - self.inbound)
        return float(getattr(self, metric))


@dataclass
class ProcessSeries:
    """The samples of one process (one pid)."""

    name: str  # "gateway", "board0", ...
    role: str  # "gateway" or "daemon"
    pid: int
    samples: list[UsageSample] = field(default_factory=list)
    ended: bool = False  # the process exited (or was replaced) before the run ended


@dataclass(frozen=True)
class MetricGrowth:
    """One metric of one process (module docstring)."""

    metric: str
    first: float | None
    last: float | None
    growth: float | None
    slope_per_hour: float | None
    limit: float | None
    judged: bool
    over: bool
    late_slope_per_hour: float | None = None
    late_limit: float | None = None
    late_judged: bool = False
    late_over: bool = False

    def to_json(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "first": r(self.first),
            "last": r(self.last),
            "growth": r(self.growth),
            "slope_per_hour": r(self.slope_per_hour),
            "limit": r(self.limit),
            "judged": self.judged,
            "over": self.over,
            "late_slope_per_hour": r(self.late_slope_per_hour),
            "late_limit": r(self.late_limit),
            "late_judged": self.late_judged,
            "late_over": self.late_over,
        }


def slope_per_hour(points: Sequence[tuple[float, float]], hour_s: float = 3600.0) -> float | None:
    """Least-squares slope of `(seconds, value)` points, per hour of `hour_s` seconds; None with
    fewer than 2 distinct times."""
    if len(points) < 2:
        return None
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * hour_s


def lived_through(series: ProcessSeries, warmup_s: float) -> bool:
    """Sampled before the warm-up ended, and alive at the run's end."""
    return bool(series.samples) and series.samples[0].t_s <= warmup_s and not series.ended


def series_growth(
    series: ProcessSeries,
    warmup_s: float,
    duration_s: float,
    bounds: GrowthBounds,
    min_width_s: float = 0.0,
    hour_s: float = 3600.0,
    judge_min_s: float = JUDGE_MIN_S,
) -> dict[str, MetricGrowth]:
    """Each metric's growth, slopes and judgement (module docstring); the spans as `drift.spans`;
    `hour_s` wall seconds make a board-hour (the slopes' unit) and runs shorter than `judge_min_s`
    wall seconds are not judged."""
    first_span, last_span = spans(warmup_s, duration_s, min_width_s)
    # A process started during the run (a restarted board) has a warm-up of its own.
    born = max(0.0, series.samples[0].t_s) if series.samples else 0.0
    after = [s for s in series.samples if s.t_s >= warmup_s + born]
    early = [s for s in after if s.t_s < first_span[1]]
    late = [s for s in after if s.t_s >= last_span[0]]
    judge = duration_s >= judge_min_s and lived_through(series, warmup_s)
    later = [s for s in series.samples if s.t_s >= born + hour_s]
    late_span = later[-1].t_s - later[0].t_s if later else 0.0
    judge_late = lived_through(series, warmup_s) and late_span >= hour_s
    out = {}
    for metric in METRICS:
        first = statistics.median(s.value(metric) for s in early) if early else None
        last = statistics.median(s.value(metric) for s in late) if late else None
        growth = last - first if first is not None and last is not None else None
        slope = slope_per_hour([(s.t_s, s.value(metric)) for s in after], hour_s)
        limit = bounds.limit(metric, first) if first is not None else None
        judged = judge and growth is not None
        over = judged and growth is not None and limit is not None and growth > limit
        late_slope = slope_per_hour([(s.t_s, s.value(metric)) for s in later], hour_s)
        late_limit = float(bounds.rss_late_slope_per_hour) if metric == "rss_bytes" else None
        late_judged = judge_late and late_slope is not None and late_limit is not None
        late_over = late_judged and late_slope is not None and late_limit is not None and late_slope > late_limit
        out[metric] = MetricGrowth(
            metric, first, last, growth, slope, limit, judged, over, late_slope, late_limit, late_judged, late_over
        )
    return out
