"""The observers' records of what the engine does (`observer.py` events), built from its sequences
and device jobs. Pure: each function reads the objects it is given (under the engine lock, where the
engine calls them) and returns a frozen event for `ObserverHub.emit`; nothing here changes state.
"""

from __future__ import annotations

import time

from calculet.daemon.core.client_job import ClientJob
from calculet.daemon.core.completion import Settlement
from calculet.daemon.core.events import FinalEvent
from calculet.daemon.core.executor import DeviceJob
from calculet.daemon.core.observe.observer import (
    FAULT_CCU_EXCEPTION,
    FAULT_COUNTER_MISMATCH,
    FAULT_NON_FINITE,
    DeviceJobDone,
    DeviceJobStarted,
    RequestFinished,
    RequestQueued,
    RowDone,
)
from calculet.daemon.device.types import JobStatus, JobTimestamps


def queued(seq: ClientJob) -> RequestQueued:
    req = seq.request
    return RequestQueued(
        seq.job_id, req.model, seq.generation, len(req.prompt_tokens), len(req.resume_tokens),
        req.client_request_id, seq.internal, seq.t_submit, req.trace,
    )  # fmt: skip


def finished(seq: ClientJob) -> RequestFinished:
    """The observers' record of a request's Final: the one its log holds (the first written wins, as
    its client saw it), so the metrics carry exactly the usage and timings the client got."""
    final = seq.log.read(seq.log.produced() - 1)[-1]
    assert isinstance(final, FinalEvent)
    return RequestFinished(
        seq.job_id, seq.request.model, seq.generation, final.reason, final.error_kind, final.usage, final.timings,
        seq.internal, time.monotonic(),
    )  # fmt: skip


def started(job: DeviceJob) -> DeviceJobStarted:
    plan = job.plan
    job_ids = tuple(s.job_id for s in plan.seqs)
    return DeviceJobStarted(
        job.device_job_id, plan.task, job.engine_slot, plan.runtime.alias, job.generation, job_ids, job.t_submit
    )


def job_done(
    job: DeviceJob, status: JobStatus, settlement: Settlement, stamps: JobTimestamps | None, host: tuple[float, float]
) -> DeviceJobDone:
    """The observers' record of a decided device job (before it is applied: `first` reads `t_first`).

    Args:
        host: (sampling seconds, postprocess seconds) on the host.
    """
    rows = tuple(
        RowDone(r.seq.job_id, r.token is not None, r.token is not None and r.seq.t_first is None, r.seq.internal)
        for r in settlement.rows
    )
    plan = job.plan
    return DeviceJobDone(
        job.device_job_id, plan.task, job.engine_slot, plan.runtime.alias, job.generation, status, rows,
        plan.submodel.batch, stamps, host[0], host[1], job.t_submit, time.monotonic(),
        tuple(fault_kind(status, anomaly) for anomaly in settlement.anomalies),
    )  # fmt: skip


def fault_kind(status: JobStatus, anomaly: str) -> str:
    """The FAULT_* kind of one of a settlement's anomalies (`completion.settle` names them)."""
    if status is JobStatus.CCU_EXCEPTION:
        return FAULT_CCU_EXCEPTION
    if anomaly.startswith("non-finite"):
        return FAULT_NON_FINITE
    return FAULT_COUNTER_MISMATCH
