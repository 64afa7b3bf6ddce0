"""One accepted calsim job: its status lifecycle, pipeline step, modelled schedule and staged data.

Data flow: `ComputeEngine.accept` builds a `Job` from a `ResolvedJob`, the clock fills its
`Schedule`, and the engine's worker moves it through its steps: H2D (inputs copied from the host
buffers into `staged`), COMPUTE (kernel -> `logits`, bf16), FINISH (the D2H copy: `outputs` kept,
status DONE or CCU_EXCEPTION, `done` set). The host output buffers get `outputs` only when
`wait` returns DONE (`ComputeEngine.deliver`); until then they hold poison. Ownership: the engine
owns the Job; the job holds its buffers, lanes and engine bank from acceptance until its status
is finished, and claims its output buffers until its outputs are delivered or a later job names them.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, fields
from enum import Enum

import numpy as np

from calculet.common.lifecycle import Lifecycle, table
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.calsim.job_check import ResolvedJob
from calculet.daemon.calsim.kernel import Kernel
from calculet.daemon.calsim.lane_kv import LaneKV
from calculet.daemon.calsim.timing import JobDurations
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec, JobStatus, JobTimestamps

STATUS_EDGES = table(
    [
        (JobStatus.PENDING, [JobStatus.RUNNING, JobStatus.CCU_EXCEPTION]),
        (JobStatus.RUNNING, [JobStatus.DONE, JobStatus.CCU_EXCEPTION]),
    ]
)


class Step(Enum):
    """The next thing the worker does for a job."""

    H2D = "h2d"  # read the host inputs at h2d_start
    COMPUTE = "compute"  # run the kernel at compute_start (status -> RUNNING)
    FINISH = "finish"  # keep the outputs and finish at d2h_end (never, for a hang)
    ENDED = "ended"  # finished or aborted


STEP_EDGES = table(
    [
        (Step.H2D, [Step.COMPUTE, Step.ENDED]),
        (Step.COMPUTE, [Step.FINISH, Step.ENDED]),
        (Step.FINISH, [Step.ENDED]),
    ]
)


@dataclass
class Schedule:
    """Modelled device times (seconds) of one job; `inf` marks phases stuck behind a hang."""

    queued: float
    h2d_start: float
    h2d_end: float
    compute_start: float
    compute_end: float
    d2h_start: float
    d2h_end: float

    def at(self, step: Step) -> float:
        """Device time at which the worker performs `step`."""
        if step is Step.H2D:
            return self.h2d_start
        if step is Step.COMPUTE:
            return self.compute_start
        if step is Step.FINISH:
            return self.d2h_end
        return math.inf

    def clamp(self, limit: float) -> None:
        """Cut every time at `limit` (an abort at device time `limit`); keeps the order."""
        for f in fields(self):
            setattr(self, f.name, min(getattr(self, f.name), limit))

    def frozen(self, d2d_seconds: float = 0.0, d2d_bytes: int = 0) -> JobTimestamps:
        return JobTimestamps(
            self.queued,
            self.h2d_start,
            self.h2d_end,
            self.compute_start,
            self.compute_end,
            self.d2h_start,
            self.d2h_end,
            d2d_seconds,
            d2d_bytes,
        )


class Job:
    """An accepted job.

    Args:
        job_id: the submit attempt index that created it (unique, increasing).
        model / kernel: the configured model and its kernel (which owns the lanes' KV).
        lane_kv: the model's valid KV length per lane (`lane_kv.py`), updated when the job writes.
        spec / resolved: what was submitted and its looked-up buffers and rows.
        bank: the engine bank it occupies.
        fault: the injected fault it carries, if any.
        durations / schedule: modelled phase durations and times (see `clock.py`).
    """

    def __init__(
        self,
        job_id: int,
        model: ConfiguredModel,
        kernel: Kernel,
        lane_kv: LaneKV,
        spec: JobSpec,
        resolved: ResolvedJob,
        bank: EngineSlot,
        fault: Fault | None,
        durations: JobDurations,
        schedule: Schedule,
    ) -> None:
        self.job_id = job_id
        self.model = model
        self.kernel = kernel
        self.lane_kv = lane_kv
        self.spec = spec
        self.resolved = resolved
        self.bank = bank
        self.fault = fault
        self.durations = durations
        self.schedule = schedule
        self.history: list[JobStatus] = [JobStatus.PENDING]
        self.status: Lifecycle[JobStatus] = Lifecycle(
            f"calsim job {job_id}", JobStatus.PENDING, STATUS_EDGES, lambda _old, new: self.history.append(new)
        )
        self.step: Lifecycle[Step] = Lifecycle(f"calsim job {job_id} step", Step.H2D, STEP_EDGES)
        self.staged: dict[str, np.ndarray] = {}  # input rows read at H2D
        self.logits: np.ndarray | None = None  # bf16 [rows, vocab] produced at COMPUTE
        # The outputs a top-k job's D2H will move, computed with the logits at COMPUTE (on the device
        # the top-k runs within the compute, so it must not delay the D2H end here either).
        self.topk: dict[str, np.ndarray] | None = None
        self.outputs: dict[str, np.ndarray] = {}  # output name -> rows copied at D2H, delivered at wait
        # A top-k job's full bf16 rows, kept "on the device" for `read_logits_row` until another job
        # claims one of its output buffers (the engine drops them then).
        self.kept_logits: np.ndarray | None = None
        self.failure: str | None = None  # why the job will end as CCU_EXCEPTION
        self.done = threading.Event()  # set once finished (or when the device is lost/closed)

    def has_fault(self, kind: FaultKind) -> bool:
        return self.fault is not None and self.fault.kind is kind

    @property
    def hangs(self) -> bool:
        return self.has_fault(FaultKind.HANG)

    @property
    def finished(self) -> bool:
        return self.status.state.finished

    def timestamps(self) -> JobTimestamps:
        """Its schedule as the device reports it, with the cross-chip traffic of a compute phase that
        ran to its end (an abort before then counts none: the link time is inside the compute)."""
        s, d = self.schedule, self.durations
        if s.compute_end < s.compute_start + d.compute:
            return s.frozen()
        return s.frozen(d.d2d, d.d2d_bytes)

    def next_event(self) -> tuple[float, int, int] | None:
        """(device time, job id, step order) of the next step, or None if none is due ever."""
        step = self.step.state
        when = self.schedule.at(step)
        if math.isinf(when):
            return None
        return when, self.job_id, list(Step).index(step)

    def __repr__(self) -> str:
        return f"Job({self.job_id}, {self.spec.submodel}, {self.bank.value}, {self.status.state.name})"
