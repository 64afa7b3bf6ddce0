"""Drift: p99 TTFT and p99 TPOT of the run's last 10 % against its first 10 % after the warm-up.

The first span is `[warmup, warmup + w)`, the last `[duration - w, duration]` with `w` = 10 % of
the run, or one fault cycle when that is longer (runs under 20 minutes: each span then still sees
every kind of fault once), by request end (requests ending after the traffic stopped count in the
last span).
`change` = last / first - 1; above `bound` (20 %) the metric has drifted. It is judged only for
runs of at least `JUDGE_MIN_S` (10 minutes) with at least `MIN_SAMPLES` values in each span;
otherwise reported as not judged, with the reason. Faults recur on a cycle one tenth of the run
long (`fault_plan`), so both spans see the same mix of faults.

Pure functions of `RequestPoint`s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calculet.ops.bench.summary import LatencyStats
from calculet.ops.soak.points import RequestPoint
from calculet.ops.soak.windows import ms

SPAN_SHARE = 0.10
DRIFT_BOUND = 0.20
JUDGE_MIN_S = 600.0
MIN_SAMPLES = 20


@dataclass(frozen=True)
class DriftFigure:
    """One metric's drift (module docstring); seconds, `change` a ratio (None when not computable)."""

    metric: str
    first_p99: float | None
    last_p99: float | None
    first_count: int
    last_count: int
    change: float | None
    judged: bool
    drifted: bool
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "first_p99_ms": ms(self.first_p99),
            "last_p99_ms": ms(self.last_p99),
            "first_count": self.first_count,
            "last_count": self.last_count,
            "change": None if self.change is None else round(self.change, 4),
            "bound": DRIFT_BOUND,
            "judged": self.judged,
            "drifted": self.drifted,
            "note": self.note,
        }


Span = tuple[float, float]


def spans(warmup_s: float, duration_s: float, min_width_s: float = 0.0) -> tuple[Span, Span]:
    """The first and last spans, `(start, end)` seconds (module docstring)."""
    width = max(SPAN_SHARE * duration_s, min_width_s)
    first = (warmup_s, min(duration_s, warmup_s + width))
    last = (max(first[1], duration_s - width), duration_s)
    return first, last


def drift(
    points: Sequence[RequestPoint], warmup_s: float, duration_s: float, min_width_s: float = 0.0
) -> list[DriftFigure]:
    """TTFT and TPOT drift (module docstring); `min_width_s` is the fault cycle."""
    first, last = spans(warmup_s, duration_s, min_width_s)
    metrics: tuple[tuple[str, Callable[[RequestPoint], float | None]], ...] = (
        ("ttft", lambda p: p.ttft_s),
        ("tpot", lambda p: p.tpot_s),
    )
    out = []
    for name, value in metrics:
        early = [v for p in points if first[0] <= p.end_s < first[1] and (v := value(p)) is not None]
        late = [v for p in points if p.end_s >= last[0] and (v := value(p)) is not None]
        out.append(_figure(name, LatencyStats.of(early), LatencyStats.of(late), duration_s))
    return out


def _figure(metric: str, early: LatencyStats, late: LatencyStats, duration_s: float) -> DriftFigure:
    change = None
    if early.p99 is not None and late.p99 is not None and early.p99 > 0:
        change = late.p99 / early.p99 - 1.0
    if duration_s < JUDGE_MIN_S:
        judged, note = False, f"not judged: the run is shorter than {JUDGE_MIN_S / 60:g} minutes"
    elif change is None or min(early.count, late.count) < MIN_SAMPLES:
        judged, note = False, f"not judged: fewer than {MIN_SAMPLES} values in a span"
    else:
        judged, note = True, ""
    drifted = judged and change is not None and change > DRIFT_BOUND
    return DriftFigure(metric, early.p99, late.p99, early.count, late.count, change, judged, drifted, note)
