"""One benchmark run: warm-up, device sample, the measured requests, device sample, figures.

Order (all on the caller's asyncio loop):
1. warm-up: the `plan.warmup` requests in a closed loop at the run's concurrency (or all at once
   for an open loop, capped at `WARMUP_OPEN_CONCURRENCY`); their records are dropped, only the
   failures are counted;
2. each board's utilisation sample (`device_stats.sample_boards`);
3. the window starts; `schedule.run(plan.measured, send)`; every finished record is passed to
   `on_done` (the progress bar);
4. the samples again; `summary.summarize` and `device_stats.board_utilization`.

The clock is `time.perf_counter()`, the same the backends stamp records with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calculet.ops.bench.backend import BenchBackend
from calculet.ops.bench.device_stats import (
    BoardUtilization,
    StatusOf,
    board_utilization,
    fleet_busy_ratio,
    sample_boards,
)
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.schedule import ArrivalSchedule, ClosedLoop
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.summary import BenchSummary, summarize
from calculet.ops.bench.workload import BenchRequest

WARMUP_OPEN_CONCURRENCY = 16


@dataclass(frozen=True)
class BenchPlan:
    """What to send: warm-up requests (not counted), measured requests, the SLO, the boards whose
    device figures are read, and the warm-up's concurrency."""

    warmup: Sequence[BenchRequest]
    measured: Sequence[BenchRequest]
    slo: Slo
    board_targets: Sequence[str]
    warmup_concurrency: int


@dataclass(frozen=True)
class BenchResult:
    """A finished run: the figures, the boards' device figures and the measured records."""

    summary: BenchSummary
    boards: tuple[BoardUtilization, ...]
    busy_ratio: float | None
    records: tuple[RequestRecord, ...]
    window_start: float
    warmup_failed: int


def warmup_concurrency(schedule: ArrivalSchedule) -> int:
    """The warm-up's clients: the closed loop's own, else `WARMUP_OPEN_CONCURRENCY`."""
    return schedule.concurrency if isinstance(schedule, ClosedLoop) else WARMUP_OPEN_CONCURRENCY


async def run_bench(
    backend: BenchBackend,
    schedule: ArrivalSchedule,
    plan: BenchPlan,
    status_of: StatusOf,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> BenchResult:
    """Run `plan` through `backend` by `schedule` (see the module docstring).

    Raises:
        CalculetError: only from `backend.send` bugs; failed requests are records.
    """
    warmed = await ClosedLoop(plan.warmup_concurrency).run(plan.warmup, backend.send) if plan.warmup else []
    before = await sample_boards(plan.board_targets, status_of)

    async def send(request: BenchRequest) -> RequestRecord:
        record = await backend.send(request)
        if on_done is not None:
            on_done(record)
        return record

    window_start = time.perf_counter()
    records = await schedule.run(plan.measured, send)
    after = await sample_boards(plan.board_targets, status_of)
    boards = tuple(board_utilization(before[t], after[t]) for t in plan.board_targets)
    return BenchResult(
        summary=summarize(records, window_start, plan.slo),
        boards=boards,
        busy_ratio=fleet_busy_ratio(boards),
        records=tuple(records),
        window_start=window_start,
        warmup_failed=sum(1 for r in warmed if not r.ok),
    )
