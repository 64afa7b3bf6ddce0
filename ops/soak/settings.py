"""`SoakSettings`: what one `calctl soak` run is asked to do, and the figures derived from it
(warm-up, fault cycle, reset budget, job timeout). Pure.

Board time and wall time. calsim paces the device at `time_scale` wall seconds per modelled second,
so at 0.1 a board lives ten board-seconds in each wall second (docs/reliability.md, "Board time").
The run's own clock (`Timeline`) stays the host's: restarts, drains and HTTP timeouts take host
time whatever the scale. What is a length of the board's life is given in board seconds and turned
into wall seconds here (`wall`): the soak phase (`--duration`), the warm-up, the fault cycle, the
sampling period and the calibration; windows are one per board minute and slopes are per board
hour (`conclude`). Time scale 0 has no modelled time: board time is then wall time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.limit import request_floor
from calculet.ops.soak.capacity import MIN_CALIBRATION_S, calibration_seconds
from calculet.ops.soak.durations import format_duration
from calculet.ops.soak.fault_plan import MIN_CYCLE_S, whole_cycle
from calculet.ops.soak.fleets import MIN_JOB_TIMEOUT_S
from calculet.ops.soak.mix import RequestSpec, request_shapes

WARMUP_SHARE = 0.05
MIN_WARMUP_S = 10.0
MAX_WARMUP_S = 300.0
JOB_TIMEOUT_FACTOR = 2.0  # the longest modelled job, twice, plus a second
# psutil reads of a handful of processes cost about a millisecond; below this wall period a fast
# time scale would spend the host's CPU on sampling rather than on the fleet.
MIN_SAMPLE_WALL_S = 0.5
# A hang holds one board for the job timeout; at most a quarter of a cycle, so the other faults of
# the cycle still meet a whole fleet most of the time.
HANG_CYCLE_FACTOR = 4.0
POLICIES = ("continuous", "serial")


@dataclass(frozen=True)
class SoakSettings:
    """The run's settings (the command's flags). Lengths are board seconds (module docstring) except
    `lost_timeout_s`, an HTTP client's timeout, in wall seconds.

    Attributes:
        duration_s: the soak phase's length.
        out: the output directory.
        preset: the calsim package preset the boards serve.
        time_scale: the soak fleet's calsim time scale.
        policy: the daemons' scheduling policy (`POLICIES`).
        switch_model: a second preset in the gateway's catalog, which the `model_switch` fault
            switches a board to (`calctl soak --models A,B`); None: no such fault.
        boards: boards in the soak fleet.
        load: the arrival rate as a fraction of capacity.
        seed: the pool, arrivals and choices of requests.
        faults: play the fault cycle.
        pool_size: requests in the pool.
        sample_interval_s: process usage sampling period.
        lost_timeout_s: a request without a complete answer by then is lost.
        models_root: where the packages are (default `<out>/models`).
        warmup_s: excluded from drift and growth (default `warmup_for(duration_s)`).
        cycle_floor_s: the shortest fault cycle, wall seconds (`cycle_floor_for` the job timeout).
        calibration_s: the closed loop at time scale 0 (default `capacity.calibration_seconds`).
    """

    duration_s: float
    out: Path
    preset: str
    time_scale: float = 1.0
    policy: str = "continuous"
    switch_model: str | None = None
    boards: int = 2
    load: float = 0.7
    seed: int = 0
    faults: bool = True
    pool_size: int = 200
    sample_interval_s: float = 5.0
    lost_timeout_s: float = 300.0
    models_root: Path | None = None
    warmup_s: float | None = None
    calibration_s: float | None = None
    cycle_floor_s: float = MIN_CYCLE_S

    @property
    def models(self) -> Path:
        return self.models_root if self.models_root is not None else self.out / "models"

    @property
    def wall_per_board(self) -> float:
        """Wall seconds per board second: the time scale, or 1 at time scale 0 (module docstring)."""
        return self.time_scale if self.time_scale > 0 else 1.0

    def wall(self, board_s: float) -> float:
        """Wall seconds of `board_s` board seconds."""
        return board_s * self.wall_per_board

    @property
    def phase_s(self) -> float:
        """The soak phase in wall seconds."""
        return self.wall(self.duration_s)

    @property
    def warmup(self) -> float:
        """The warm-up in wall seconds (5 % of the run, 10-300 board seconds, unless given)."""
        return self.wall(warmup_for(self.duration_s) if self.warmup_s is None else self.warmup_s)

    @property
    def cycle_s(self) -> float:
        """The fault cycle in wall seconds: a tenth of the run, at least `cycle_floor_s` of wall time
        (its board outages take host seconds each whatever the scale, and a hang the job timeout),
        stretched so that the run holds a whole number of cycles (`fault_plan.whole_cycle`)."""
        return whole_cycle(self.phase_s, max(self.wall(self.duration_s / 10.0), self.cycle_floor_s))

    @property
    def sample_wall_s(self) -> float:
        """The sampling period in wall seconds, at least `MIN_SAMPLE_WALL_S`."""
        return max(self.wall(self.sample_interval_s), MIN_SAMPLE_WALL_S)

    @property
    def calibration_wall_s(self) -> float:
        """The calibration's closed loop in wall seconds: given, or 5 % of the run in board time
        (15-120 board seconds), at least `MIN_CALIBRATION_S` of wall time (enough host requests)."""
        if self.calibration_s is not None:
            return self.calibration_s
        return max(MIN_CALIBRATION_S, self.wall(calibration_seconds(self.duration_s)))

    @property
    def presets(self) -> tuple[str, ...]:
        """Every preset the soak fleet's gateway knows: the served one first."""
        return (self.preset,) if self.switch_model is None else (self.preset, self.switch_model)

    def describe(self) -> dict[str, Any]:
        return {
            "duration_s": self.duration_s,
            "duration": format_duration(self.duration_s),
            "out": str(self.out),
            "preset": self.preset,
            "time_scale": self.time_scale,
            "wall_per_board_s": self.wall_per_board,
            "phase_wall_s": self.phase_s,
            "policy": self.policy,
            "switch_model": self.switch_model,
            "boards": self.boards,
            "load": self.load,
            "seed": self.seed,
            "faults": self.faults,
            "pool_size": self.pool_size,
            "sample_interval_s": self.sample_interval_s,
            "sample_wall_s": self.sample_wall_s,
            "lost_timeout_s": self.lost_timeout_s,
            "models_root": str(self.models),
            "warmup_wall_s": self.warmup,
            "cycle_wall_s": self.cycle_s,
        }


def warmup_for(duration_s: float) -> float:
    """5 % of the run, within 10 s .. 300 s (board seconds)."""
    return min(MAX_WARMUP_S, max(MIN_WARMUP_S, WARMUP_SHARE * duration_s))


def cycle_floor_for(job_timeout_s: float) -> float:
    """The shortest fault cycle for this job timeout: `MIN_CYCLE_S`, or `HANG_CYCLE_FACTOR` job
    timeouts, since a hang holds its board that long (a serial board's 30,000-token prefill is one
    job of 1,032 board-seconds, so the timeout is 230 s at time scale 0.1)."""
    return max(MIN_CYCLE_S, HANG_CYCLE_FACTOR * job_timeout_s)


def lost_timeout_for(
    model: DeviceModel, pool: Sequence[RequestSpec], time_scale: float, flag_s: float, job_timeout_s: float
) -> float:
    """The lost timeout the traffic uses: `--lost-timeout`, or more where the pool's slowest request
    (by the timing model, alone on a board, at the time scale) could not finish within it: twice
    that (its own run, and its run again on another board after a fault cut it), plus the daemons'
    job timeout (a hang holds the request that long before its board is reset), plus the flag (queues
    and the gateway's failover waits). A `long_context` request's TTFT alone is minutes of board
    time; docs/reliability.md ("Board-day run") has the requests a bound without the hang gave up."""
    if time_scale <= 0:
        return flag_s
    slowest = max(sum(request_floor(model, shape, 1).e2e for shape in request_shapes(spec)) for spec in pool)
    return max(flag_s, math.ceil(JOB_TIMEOUT_FACTOR * slowest * time_scale + job_timeout_s + flag_s))


def job_timeout_for(model: DeviceModel, pool: Sequence[RequestSpec], time_scale: float) -> float:
    """The daemons' `--job-timeout`: twice the longest job the pool can make (a whole prefill of its
    longest prompt, an upper bound: prefills are chunked) at the time scale, plus a second; at
    least `MIN_JOB_TIMEOUT_S` (a hang costs this long before the CCU reset)."""
    if time_scale <= 0:
        return MIN_JOB_TIMEOUT_S
    longest = max((s for spec in pool for s in request_shapes(spec)), key=lambda s: s.prompt)
    floor = request_floor(model, longest, 1)
    return max(MIN_JOB_TIMEOUT_S, math.ceil(JOB_TIMEOUT_FACTOR * floor.ttft * time_scale + 1.0))
