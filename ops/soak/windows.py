"""The run in time windows: per window, requests by class, TTFT and TPOT p50/p99, throughput.

A request belongs to the window its end falls in (the last window also takes the requests that
ended after the traffic stopped, while the harness waited for them). Percentiles are numpy's
linear interpolation (`ops/bench/summary.LatencyStats`). Throughput counts the `ok` requests and
their output tokens per second of the window.

`window_count(duration)`: 20 windows, or one a minute for runs longer than 20 minutes; the soak
passes its board time (`conclude`), so a board-day at time scale 0.1 has 1,440 windows of 6 s.
Pure functions of `RequestPoint`s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calculet.ops.bench.summary import LatencyStats
from calculet.ops.soak.classify import RequestClass
from calculet.ops.soak.points import RequestPoint

MIN_WINDOWS = 20
WINDOW_S_LONG = 60.0


def window_count(duration_s: float) -> int:
    """20 windows, or one per minute when that gives more."""
    return max(MIN_WINDOWS, int(duration_s // WINDOW_S_LONG))


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


@dataclass(frozen=True)
class WindowStats:
    """One window's figures (module docstring); latencies in seconds."""

    index: int
    start_s: float
    end_s: float
    counts: dict[str, int]
    ttft: LatencyStats
    tpot: LatencyStats
    ok_per_s: float
    output_tokens_per_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start_s": round(self.start_s, 3),
            "end_s": round(self.end_s, 3),
            "counts": self.counts,
            "ttft_ms": {"count": self.ttft.count, "p50": ms(self.ttft.p50), "p99": ms(self.ttft.p99)},
            "tpot_ms": {"count": self.tpot.count, "p50": ms(self.tpot.p50), "p99": ms(self.tpot.p99)},
            "ok_per_s": round(self.ok_per_s, 4),
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
        }


def window_stats(points: Sequence[RequestPoint], duration_s: float, count: int) -> list[WindowStats]:
    """`count` equal windows over `[0, duration_s]` (module docstring).

    Raises:
        ValueError: `duration_s` not > 0 or `count` < 1.
    """
    if not duration_s > 0 or count < 1:
        raise ValueError(f"windows: need a duration > 0 and at least one window, got {duration_s}, {count}")
    width = duration_s / count
    buckets: list[list[RequestPoint]] = [[] for _ in range(count)]
    for p in points:
        buckets[min(count - 1, max(0, int(p.end_s // width)))].append(p)
    out = []
    for i, bucket in enumerate(buckets):
        classes = Counter(p.cls.value for p in bucket)
        ok = [p for p in bucket if p.cls is RequestClass.OK]
        out.append(
            WindowStats(
                index=i,
                start_s=i * width,
                end_s=(i + 1) * width,
                counts={c.value: classes.get(c.value, 0) for c in RequestClass},
                ttft=LatencyStats.of([p.ttft_s for p in bucket if p.ttft_s is not None]),
                tpot=LatencyStats.of([p.tpot_s for p in bucket if p.tpot_s is not None]),
                ok_per_s=len(ok) / width,
                output_tokens_per_s=sum(p.output_tokens for p in ok) / width,
            )
        )
    return out
