"""Before a fleet starts: each run's modelled device time and limit, and the fleet's time scale.

`estimate(run, model, seed)` applies the timing-model limit (limit.py) to the very requests the run
will send (`prompts.plan_lines`, measured part), at the rows its concurrency fills on each board: the
modelled seconds the run needs at least, its longest request, and the fleet's output tokens per
modelled second at that load.

`auto_time_scale` (`--time-scale auto`, the default) picks the calsim time scale of a fleet so that
host CPU is not the limit: at time scale `s` the fleet streams at most `L / s` tokens per wall second
(`L` the largest at-load limit of its runs), and each costs the host about `host_s_per_token` of CPU
(daemon + gateway + client; docs/performance.md measured ~0.64 ms in the daemon and ~0.22 ms in the
client per token), so `s >= host_s_per_token * L / (CPU_SHARE * cpus)` keeps the harness under
`CPU_SHARE` of the host's cores; never below `AUTO_FLOOR` (1 = the emulated board's own speed, where
a decode step is long enough that the host's ~1 ms per step barely shows; a fleet may set a lower
floor, `FleetSpec.scale_floor`), rounded up to `STEP` (above the floor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.limit import RequestShape, Serving, WorkloadLimit, request_floor, rows_at_load, workload_limit
from calculet.ops.bench.suite.matrix import SuiteRun
from calculet.ops.bench.suite.prompts import plan_lines

AUTO_FLOOR = 1.0
CPU_SHARE = 0.5
STEP = 0.05


@dataclass(frozen=True)
class RunEstimate:
    """A run's modelled figures (seconds on the device clock).

    Attributes:
        limit: the at-load limit of its measured requests on one board.
        modelled_s: device seconds the run needs at least (its requests spread over the boards).
        longest_request_s: the longest request alone (its modelled E2E at the run's rows).
        fleet_tokens_per_s: the fleet's output tokens per modelled second at that limit.
    """

    run: SuiteRun
    limit: WorkloadLimit
    modelled_s: float
    longest_request_s: float
    fleet_tokens_per_s: float


def serving_of(run: SuiteRun) -> Serving:
    return Serving(run.fleet.policy, run.fleet.max_inflight)


def estimate(run: SuiteRun, model: DeviceModel, seed: int) -> RunEstimate:
    """The run's estimate (module docstring)."""
    lines = plan_lines(run, seed)[run.warmup :]
    shapes = [RequestShape(line.prompt, line.output) for line in lines]
    serving = serving_of(run)
    rows = rows_at_load(model, serving, run.concurrency, run.fleet.boards)
    limit = workload_limit(model, shapes, serving, rows)
    longest = max(request_floor(model, s, rows).e2e for s in shapes)
    boards = run.fleet.boards
    return RunEstimate(run, limit, limit.device_s / boards, longest, boards * limit.output_tokens_per_s)


def auto_time_scale(
    estimates: Sequence[RunEstimate], host_s_per_token: float, cpus: int, floor: float | None = None
) -> float:
    """The time scale of a fleet running `estimates` (module docstring); `floor` replaces `AUTO_FLOOR`
    (the length grid's fleet, `FleetSpec.scale_floor`)."""
    peak = max((e.fleet_tokens_per_s for e in estimates), default=0.0)
    return time_scale_for_peak(peak, host_s_per_token, cpus, floor)


def time_scale_for_peak(peak: float, host_s_per_token: float, cpus: int, floor: float | None = None) -> float:
    """The rule of `auto_time_scale` for a fleet whose peak is `peak` output tokens per modelled second."""
    needed = host_s_per_token * peak / (CPU_SHARE * max(1, cpus))
    lowest = AUTO_FLOOR if floor is None else floor
    return lowest if needed <= lowest else math.ceil(needed / STEP - 1e-9) * STEP
