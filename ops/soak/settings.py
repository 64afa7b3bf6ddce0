"""`SoakSettings`: what one `calctl soak` run is asked to do, and the figures derived from it
(warm-up, fault cycle, reset budget, job timeout). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.limit import request_floor
from calculet.ops.soak.durations import format_duration
from calculet.ops.soak.fault_plan import cycle_length
from calculet.ops.soak.fleets import MIN_JOB_TIMEOUT_S
from calculet.ops.soak.mix import RequestSpec, request_shapes

WARMUP_SHARE = 0.05
MIN_WARMUP_S = 10.0
MAX_WARMUP_S = 300.0
JOB_TIMEOUT_FACTOR = 2.0  # the longest modelled job, twice, plus a second


@dataclass(frozen=True)
class SoakSettings:
    """The run's settings (the command's flags).

    Attributes:
        duration_s: the soak phase's length.
        out: the output directory.
        preset: the calsim package preset.
        time_scale: the soak fleet's calsim time scale.
        boards: boards in the soak fleet.
        load: the arrival rate as a fraction of capacity.
        seed: the pool, arrivals and choices of requests.
        faults: play the fault cycle.
        pool_size: requests in the pool.
        sample_interval_s: process usage sampling period.
        lost_timeout_s: a request without a complete answer by then is lost.
        models_root: where the packages are (default `<out>/models`).
        warmup_s: excluded from drift and growth (default `warmup_for(duration_s)`).
        calibration_s: the closed loop at time scale 0 (default `capacity.calibration_seconds`).
    """

    duration_s: float
    out: Path
    preset: str
    time_scale: float = 1.0
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

    @property
    def models(self) -> Path:
        return self.models_root if self.models_root is not None else self.out / "models"

    @property
    def warmup(self) -> float:
        return warmup_for(self.duration_s) if self.warmup_s is None else self.warmup_s

    @property
    def cycle_s(self) -> float:
        return cycle_length(self.duration_s)

    def describe(self) -> dict[str, Any]:
        return {
            "duration_s": self.duration_s,
            "duration": format_duration(self.duration_s),
            "out": str(self.out),
            "preset": self.preset,
            "time_scale": self.time_scale,
            "boards": self.boards,
            "load": self.load,
            "seed": self.seed,
            "faults": self.faults,
            "pool_size": self.pool_size,
            "sample_interval_s": self.sample_interval_s,
            "lost_timeout_s": self.lost_timeout_s,
            "models_root": str(self.models),
            "warmup_s": self.warmup,
            "cycle_s": self.cycle_s,
        }


def warmup_for(duration_s: float) -> float:
    """5 % of the run, within 10 s .. 300 s."""
    return min(MAX_WARMUP_S, max(MIN_WARMUP_S, WARMUP_SHARE * duration_s))


def job_timeout_for(model: DeviceModel, pool: Sequence[RequestSpec], time_scale: float) -> float:
    """The daemons' `--job-timeout`: twice the longest job the pool can make (a whole prefill of its
    longest prompt, an upper bound: prefills are chunked) at the time scale, plus a second; at
    least `MIN_JOB_TIMEOUT_S` (a hang costs this long before the CCU reset)."""
    if time_scale <= 0:
        return MIN_JOB_TIMEOUT_S
    longest = max((s for spec in pool for s in request_shapes(spec)), key=lambda s: s.prompt)
    floor = request_floor(model, longest, 1)
    return max(MIN_JOB_TIMEOUT_S, math.ceil(JOB_TIMEOUT_FACTOR * floor.ttft * time_scale + 1.0))
