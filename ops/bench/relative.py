"""A run's figures relative to the timing model, so they do not depend on calsim's `--time-scale`.

At time scale `s` a modelled second takes `s` wall seconds, so a wall figure `x` of a request whose
modelled floor is `f` (limit.py: what a perfect host gives it at the run's batch) is compared as
`x / (s * f)`: 1.0 is the device's own speed, above it the host's and the queue's share. Per
successful request `i` (prompt and output tokens from its record), at `rows` decode rows per step:

- TTFT_i / (s * ttft floor_i), TPOT_i / (s * mean modelled decode step_i), each ITL value of
  request i / (s * step_i), E2E_i / (s * e2e floor_i); their mean and p50/p90/p99 (ITL pooled);
- TPOT excess: TPOT_i - s * step_i in milliseconds (the host's and the queue's wall time per token
  beyond the device's, whatever `s`);
- throughput: measured output tokens/s over the limit at the run's load, `boards *
  limit.output_tokens_per_s / s` (limit.py), for the same completed requests;
- busy of wall: the boards' compute-busy device seconds times `s` over `boards read * window`: the
  share of the wall time the compute units were busy.

`rows` comes from the load: a closed loop's concurrency, else the mean requests in flight over the
window (Little's law: the sum of the E2E over the window), spread evenly over the boards. With `s = 0`
the device takes no wall time: every ratio is null (TPOT excess is then the whole TPOT).

Data flow: `bench._bench` -> `timing_json(context, result, concurrency)` -> the report's
`timing_model` section (docs/benchmarking.md). No clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.latency import request_latency
from calculet.ops.bench.limit import (
    RequestFloor,
    RequestShape,
    Serving,
    WorkloadLimit,
    limits_by_batch,
    request_floor,
    rows_at_load,
    workload_limit,
)
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.runner import BenchResult
from calculet.ops.bench.summary import LatencyStats


@dataclass(frozen=True)
class TimingContext:
    """What relating a run to the timing model needs.

    Attributes:
        package: the package directory the timing table was read from (for the report).
        model: the package as the timing model sees it.
        serving: the daemons' policy and in-flight limit.
        time_scale: the daemons' calsim time scale (wall seconds per modelled second).
        boards: boards serving the run.
    """

    package: str
    model: DeviceModel
    serving: Serving
    time_scale: float
    boards: int


def stats_json(values: Sequence[float]) -> dict[str, Any]:
    """count, mean, p50, p90, p95, p99 of unitless values (null without values)."""
    s = LatencyStats.of(values)
    return {"count": s.count, "mean": s.mean, "p50": s.p50, "p90": s.p90, "p95": s.p95, "p99": s.p99}


def mean_in_flight(records: Sequence[RequestRecord], window_s: float) -> float:
    """Requests in flight on average over the window: the sum of their E2E over the window."""
    total = sum(r.end - r.start for r in records if r.end is not None)
    return total / window_s if window_s > 0 else 1.0


def _ratio(value: float, floor: float, scale: float) -> float | None:
    return value / (scale * floor) if scale > 0 and floor > 0 else None


def _relative(
    records: Sequence[RequestRecord], floors: Sequence[RequestFloor], scale: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The per-request ratios (module docstring) and the TPOT excess in ms."""
    ttft: list[float | None] = []
    tpot: list[float | None] = []
    itl: list[float | None] = []
    e2e: list[float | None] = []
    excess: list[float] = []
    for record, floor in zip(records, floors, strict=True):
        lat = request_latency(record)
        ttft.append(_ratio(lat.ttft, floor.ttft, scale))
        e2e.append(_ratio(lat.e2e, floor.e2e, scale))
        step = floor.step
        if lat.tpot is not None and step is not None:
            tpot.append(_ratio(lat.tpot, step, scale))
            excess.append((lat.tpot - scale * step) * 1000.0)
            itl += [_ratio(v, step, scale) for v in lat.itls]
    return {
        "ttft": stats_json([v for v in ttft if v is not None]),
        "tpot": stats_json([v for v in tpot if v is not None]),
        "itl": stats_json([v for v in itl if v is not None]),
        "e2e": stats_json([v for v in e2e if v is not None]),
    }, stats_json(excess)


def limit_json(limit: WorkloadLimit, boards: int) -> dict[str, Any]:
    """A limit's figures; throughput for `boards` boards sharing the requests evenly."""
    return {
        "rows": limit.rows,
        "decode_batch": limit.batch,
        "device_s": limit.device_s,
        "serial_s": limit.serial_s,
        "compute_s": limit.compute_s,
        "chain_s": limit.chain_s,
        "overlap_s": limit.overlap_s,
        "overlap_ratio": limit.overlap_s / limit.serial_s,
        "s_per_request": limit.s_per_request,
        "s_per_output_token": limit.s_per_output_token,
        "output_tokens_per_s": boards * limit.output_tokens_per_s,
    }


def _busy_of_wall(result: BenchResult, scale: float) -> float | None:
    read = [b for b in result.boards if b.error is None and b.busy_s is not None]
    window = result.summary.duration_s
    if not read or window <= 0 or scale <= 0:
        return None
    return sum(b.busy_s or 0.0 for b in read) * scale / (len(read) * window)


def timing_json(ctx: TimingContext, result: BenchResult, concurrency: int | None) -> dict[str, Any]:
    """The report's `timing_model` section for `result` (docs/benchmarking.md, "bench suite").

    Args:
        ctx: the package's model, the policy, the time scale and the boards.
        result: the finished run.
        concurrency: the closed loop's concurrency; None for an open loop (the mean in flight is used).
    """
    ok = [r for r in result.records if r.ok]
    head: dict[str, Any] = {
        "package": ctx.package,
        "time_scale": ctx.time_scale,
        "policy": ctx.serving.policy.value,
        "max_inflight": ctx.serving.inflight,
        "boards": ctx.boards,
        "decode_batches": list(ctx.model.decode_batches),
        "lanes": ctx.model.lanes,
    }
    if not ok:
        return head | {"load": None, "limit": None, "limit_by_batch": [], "floors_ms": None, "relative": None}
    shapes = [RequestShape(max(1, r.prompt_tokens or 1), r.output_tokens) for r in ok]
    load = float(concurrency) if concurrency is not None else mean_in_flight(ok, result.summary.duration_s)
    rows = rows_at_load(ctx.model, ctx.serving, load, ctx.boards)
    limit = workload_limit(ctx.model, shapes, ctx.serving, rows)
    floors = [request_floor(ctx.model, s, rows) for s in shapes]
    relative, excess = _relative(ok, floors, ctx.time_scale)
    steps = [f.step for f in floors if f.step is not None]
    measured = result.summary.output_throughput
    fleet_limit = ctx.boards * limit.output_tokens_per_s
    scale = ctx.time_scale
    return head | {
        "load": {"in_flight": load, "rows": rows, "decode_batch": limit.batch},
        "limit": limit_json(limit, ctx.boards),
        "limit_by_batch": [limit_json(b, ctx.boards) for b in limits_by_batch(ctx.model, shapes, ctx.serving)],
        "floors_ms": {
            "ttft": 1000.0 * sum(f.ttft for f in floors) / len(floors),
            "decode_step": 1000.0 * sum(steps) / len(steps) if steps else None,
            "e2e": 1000.0 * sum(f.e2e for f in floors) / len(floors),
        },
        "relative": relative
        | {
            "throughput": measured * scale / fleet_limit if measured is not None and scale > 0 else None,
            "busy_of_wall": _busy_of_wall(result, scale),
        },
        "tpot_excess_ms": excess,
    }
