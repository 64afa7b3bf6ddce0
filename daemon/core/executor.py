"""Submitting planned jobs to the device and tracking them until they finish (DESIGN.md section 3).

The executor owns the in-flight set and the engine banks. `launch` turns a `JobPlan` whose lanes
are already assigned into a device job: acquire a JobContext from the generation's pool, reserve
every row's KV (reserve -> submit -> commit | rollback), write tokens and positions into the
context's own buffers, and submit to a free bank. If anything fails before the device accepts the
job, every reservation is rolled back and the context returned: nothing leaks. After submit the
`InFlight` record owns the context and reservations until the engine's completion path ends them.

The in-flight limit starts at the device's declared capability (or the policy's lower limit) and
drops to 1 by itself when `note_anomaly` is called (CCU exception, NaN logits, counter mismatch).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from calculet.daemon.core.jobs import JobContext
from calculet.daemon.core.kv import Reservation
from calculet.daemon.core.scheduler import JobPlan
from calculet.daemon.device.api import Submission, VirtualDevice
from calculet.daemon.device.types import EngineSlot, TaskType

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """One submitted job. Owns `ctx` (its buffers) and `reservations` until completion."""

    job_id: int
    plan: JobPlan
    ctx: JobContext
    reservations: list[Reservation]
    submission: Submission
    engine_slot: EngineSlot
    generation: int
    t_submit: float = field(default_factory=time.monotonic)
    quarantine: bool = False  # set after a wait timeout: the device may have held the buffers
    kv_lost: bool = False  # a configuration reset cleared its lanes, even if it reports DONE


class Executor:
    """In-flight jobs of one device.

    Args:
        device: the opened board.
        max_inflight: the policy's limit; the effective limit is also capped by the device.
    """

    def __init__(self, device: VirtualDevice, max_inflight: int) -> None:
        caps = device.info().capabilities
        self.device = device
        self.capability = caps.max_inflight
        self.limit = max(1, min(max_inflight, caps.max_inflight))
        self.engine_slots: tuple[EngineSlot, ...] = (
            (EngineSlot.PING, EngineSlot.PONG) if caps.ping_pong else (EngineSlot.AUTO,)
        )
        self.inflight: deque[InFlight] = deque()
        self.anomalies = 0
        self.degraded_reason = ""
        self._next_job = 1

    def has_slot(self) -> bool:
        return len(self.inflight) < self.limit and self._free_bank() is not None

    def note_anomaly(self, reason: str) -> None:
        """Count an anomaly; the in-flight limit drops to 1 (seed 000 section 5.2)."""
        self.anomalies += 1
        if self.limit > 1:
            log.warning("in-flight limit drops to 1: %s", reason)
            self.limit = 1
            self.degraded_reason = reason

    def new_job_id(self) -> int:
        job_id, self._next_job = self._next_job, self._next_job + 1
        return job_id

    def launch(self, plan: JobPlan, targets: list[tuple[int, int]]) -> InFlight | None:
        """Reserve, fill and submit one job.

        Args:
            plan: the job; every sequence already owns an ACTIVE lane.
            targets: per sequence, (lane, target KV length after the job).

        Returns:
            The in-flight record, or None when no context is free for the bank (capacity; nothing
            changed).

        Raises:
            DeviceError / CalculetError: the device refused the job; reservations were rolled back
                and the context returned.
        """
        bank = self._free_bank()
        rt = plan.runtime
        assert bank is not None and rt.pool is not None and rt.kv is not None and rt.model is not None
        job_id = self.new_job_id()
        ctx = rt.pool.acquire(rt.pool.key(plan.submodel.name, bank), job_id)
        if ctx is None:
            return None
        reservations: list[Reservation] = []
        try:
            for seq, (lane, target) in zip(plan.seqs, targets, strict=True):
                reservations.append(rt.kv.reserve(lane, seq.job_id, target, job_id))
            # The spec checks every row fits the submodel (InvalidArgument) before anything is written.
            spec = ctx.job_spec([r.row() for r in reservations], tag=f"gen{rt.generation}/job{job_id}")
            _fill_inputs(ctx, plan, reservations)
            submission = self.device.submit(rt.model, spec, bank)
        except BaseException:
            for r in reservations:
                rt.kv.rollback(r)
            rt.pool.release(ctx)
            raise
        ctx.mark_submitted()
        job = InFlight(job_id, plan, ctx, reservations, submission, bank, rt.generation)
        self.inflight.append(job)
        return job

    def retire(self, job: InFlight) -> None:
        """Forget a finished job (the completion path has ended its context and reservations)."""
        self.inflight.remove(job)

    def _free_bank(self) -> EngineSlot | None:
        busy = {j.engine_slot for j in self.inflight}
        return next((b for b in self.engine_slots if b not in busy), None)


def _fill_inputs(ctx: JobContext, plan: JobPlan, reservations: list[Reservation]) -> None:
    """Write each row's tokens and positions into the context's own input buffers."""
    tokens, positions = ctx.tokens, ctx.positions
    if plan.task is TaskType.PREFILL:
        seq, r = plan.seqs[0], reservations[0]
        ids = seq.prefill_tokens
        tokens[0, : len(ids)] = ids
        positions[0, : len(ids)] = np.arange(r.past_len, r.target_len, dtype=np.int32)
        return
    for row, (seq, r) in enumerate(zip(plan.seqs, reservations, strict=True)):
        tokens[row, 0] = seq.generated[-1]
        positions[row, 0] = r.past_len
