"""Submitting planned jobs to the device and tracking them until they finish (DESIGN.md section 3).

The executor owns the in-flight set and the engine banks. `launch` turns a `JobPlan` whose lanes
are already assigned into a device job: acquire a JobContext from the generation's pool, reserve
every row's KV (reserve -> submit -> commit | rollback), write tokens and positions into the
context's own buffers, and submit to a free bank. If anything fails before the device accepts the
job, every reservation is rolled back and the context returned: nothing leaks. After submit the
`InFlight` record owns the context and reservations until the engine's completion path ends them.

The in-flight limit (`InflightLimit`) starts at the device's declared capability (or the policy's
lower limit), drops to 1 by itself when `note_anomaly` is called (a CCU exception the device raised
on its own, a hang, NaN logits, a counter mismatch; never a reset's deliberate CCU exceptions) and
comes back after `restore_after` consecutive clean completions or a successful operator reset.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np

from calculet.daemon.core.jobs import JobContext
from calculet.daemon.core.kv import Reservation
from calculet.daemon.core.scheduler import JobPlan
from calculet.daemon.device.api import Submission, VirtualDevice
from calculet.daemon.device.types import EngineSlot, TaskType
from calculet.daemon.errors import InvalidArgument
from calculet.daemon.lifecycle import Lifecycle, table

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
    reset_hit: bool = False  # a reset ended it: its CCU exception is the reset's, not a device anomaly


class LimitState(Enum):
    FULL = auto()  # the device's (or the policy's) limit: ping/pong where the device has it
    DEGRADED = auto()  # 1 job at a time after an anomaly


LIMIT_TRANSITIONS = table([(LimitState.FULL, [LimitState.DEGRADED]), (LimitState.DEGRADED, [LimitState.FULL])])
RESTORE_AFTER_CLEAN_JOBS = 256  # consecutive clean completions before a degraded limit comes back


class InflightLimit:
    """How many jobs may be in flight, and why (seed 000 section 5.2). Owned by the executor;
    callers hold the engine lock.

    Args:
        full: the limit when healthy (>= 1).
        restore_after: consecutive clean completions that end a degradation (0 = only an operator
            reset does).

    Raises (on construction):
        InvalidArgument: full < 1 or restore_after < 0.
    """

    def __init__(self, full: int, restore_after: int = RESTORE_AFTER_CLEAN_JOBS) -> None:
        if full < 1 or restore_after < 0:
            raise InvalidArgument(f"in-flight limit: full >= 1 and restore_after >= 0, got {full}/{restore_after}")
        self.full = full
        self.restore_after = restore_after
        self._life: Lifecycle[LimitState] = Lifecycle("in-flight limit", LimitState.FULL, LIMIT_TRANSITIONS)
        self.anomalies = 0
        self.clean = 0  # consecutive clean completions while DEGRADED
        self.reason = ""  # why it is DEGRADED ("" when FULL)

    @property
    def state(self) -> LimitState:
        return self._life.state

    @property
    def value(self) -> int:
        return self.full if self.state is LimitState.FULL else 1

    def anomaly(self, reason: str) -> bool:
        """Count an anomaly and degrade. Returns True if the limit dropped now."""
        self.anomalies += 1
        self.clean = 0
        if self.state is LimitState.DEGRADED or self.full == 1:
            return False  # nothing to drop: one job at a time already
        self._life.move(LimitState.DEGRADED)
        self.reason = reason
        return True

    def clean_completion(self) -> bool:
        """A job completed with no anomaly. Returns True if this ended the degradation."""
        if self.state is not LimitState.DEGRADED:
            return False
        self.clean += 1
        return self.restore_after > 0 and self.clean >= self.restore_after and self.restore()

    def restore(self) -> bool:
        """Back to the full limit (a clean period, or a successful operator reset). Returns True
        if it was degraded."""
        if self.state is not LimitState.DEGRADED:
            return False
        self._life.move(LimitState.FULL)
        self.clean, self.reason = 0, ""
        return True


class Executor:
    """In-flight jobs of one device.

    Args:
        device: the opened board.
        max_inflight: the policy's limit; the effective limit is also capped by the device.
    """

    def __init__(self, device: VirtualDevice, max_inflight: int, restore_after: int = RESTORE_AFTER_CLEAN_JOBS) -> None:
        caps = device.info().capabilities
        self.device = device
        self.capability = caps.max_inflight
        self.limiter = InflightLimit(max(1, min(max_inflight, caps.max_inflight)), restore_after)
        self.engine_slots: tuple[EngineSlot, ...] = (
            (EngineSlot.PING, EngineSlot.PONG) if caps.ping_pong else (EngineSlot.AUTO,)
        )
        self.inflight: deque[InFlight] = deque()
        self._next_job = 1

    @property
    def limit(self) -> int:
        return self.limiter.value

    @property
    def anomalies(self) -> int:
        return self.limiter.anomalies

    @property
    def degraded_reason(self) -> str:
        return self.limiter.reason

    def has_slot(self) -> bool:
        return len(self.inflight) < self.limit and self._free_bank() is not None

    def note_anomaly(self, reason: str) -> None:
        """Count a device anomaly; the in-flight limit drops to 1 (seed 000 section 5.2)."""
        if self.limiter.anomaly(reason):
            log.warning("in-flight limit drops to 1: %s", reason)

    def note_clean(self) -> None:
        """A job completed with no anomaly; enough in a row restore the full in-flight limit."""
        if self.limiter.clean_completion():
            log.info("in-flight limit back to %d after %d clean jobs", self.limit, self.limiter.restore_after)

    def restore_limit(self, why: str) -> None:
        """Restore the full in-flight limit (a successful operator reset)."""
        if self.limiter.restore():
            log.info("in-flight limit back to %d: %s", self.limit, why)

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
