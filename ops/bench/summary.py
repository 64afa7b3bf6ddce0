"""The run's figures from its records: counts, latency distributions, throughput and goodput.

- Distributions (TTFT, TPOT, ITL, E2E) over the successful requests: mean and the 50th, 90th, 95th
  and 99th percentiles (docs/sources.md 001 §12.1 asks for P50, P95 and P99), numpy's linear
  interpolation between closest ranks (`numpy.percentile`, its default method). ITL pools every
  request's values; TPOT leaves out requests of one token.
- The measured window runs from `window_start` (just before the first measured request is sent) to
  the last measured request's end (success or failure).
- Request throughput = completed / window; output token throughput = output tokens of completed
  requests / window; total token throughput adds their prompt tokens. Goodput = requests meeting
  every SLO (slo module) / window, and their output tokens / window; None without `--slo`.
- `errors` keeps the first `MAX_ERRORS` failures' messages, in request order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calculet.ops.bench.latency import RequestLatency, request_latency
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.slo import Slo

PERCENTILES = (50, 90, 95, 99)
MAX_ERRORS = 5


@dataclass(frozen=True)
class LatencyStats:
    """A latency distribution in seconds; every figure None when there are no values."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    p95: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats:
        if not values:
            return cls(0, None, None, None, None)
        p50, p90, p95, p99 = (float(v) for v in np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES))
        return cls(len(values), float(np.mean(values)), p50, p90, p99, p95)


@dataclass(frozen=True)
class BenchSummary:
    """What a run measured (see the module docstring for each figure)."""

    requests: int
    completed: int
    failed: int
    errors: tuple[str, ...]
    prompt_tokens: int
    output_tokens: int
    requested_output_tokens: int
    duration_s: float
    request_throughput: float | None
    output_throughput: float | None
    total_token_throughput: float | None
    good_requests: int | None
    goodput: float | None
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    itl_by_chunk_requests: int
    good_output_tokens: int | None = None
    goodput_tokens: float | None = None


def _rate(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def summarize(records: Sequence[RequestRecord], window_start: float, slo: Slo) -> BenchSummary:
    """The figures of the measured `records` (finished, in request order)."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    latencies: list[RequestLatency] = [request_latency(r) for r in done]
    ends = [r.end if r.end is not None else r.start for r in records]
    duration = max(ends) - window_start if ends else 0.0
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_tokens or 0 for r in done)
    met = [r for r, lat in zip(done, latencies, strict=True) if slo.met(lat)] if slo.given else None
    good = None if met is None else len(met)
    good_tokens = None if met is None else sum(r.output_tokens for r in met)
    return BenchSummary(
        requests=len(records),
        completed=len(done),
        failed=len(failed),
        errors=tuple(f"request {r.index}: {r.error}" for r in failed[:MAX_ERRORS]),
        prompt_tokens=prompt,
        output_tokens=output,
        requested_output_tokens=sum(r.max_tokens for r in records),
        duration_s=duration,
        request_throughput=_rate(len(done), duration),
        output_throughput=_rate(output, duration),
        total_token_throughput=_rate(output + prompt, duration),
        good_requests=good,
        goodput=None if good is None else _rate(good, duration),
        ttft=LatencyStats.of([lat.ttft for lat in latencies]),
        tpot=LatencyStats.of([lat.tpot for lat in latencies if lat.tpot is not None]),
        itl=LatencyStats.of([v for lat in latencies for v in lat.itls]),
        e2e=LatencyStats.of([lat.e2e for lat in latencies]),
        itl_by_chunk_requests=sum(1 for lat in latencies if lat.itl_by_chunk),
        good_output_tokens=good_tokens,
        goodput_tokens=None if good_tokens is None else _rate(good_tokens, duration),
    )
