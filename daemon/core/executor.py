"""Device jobs: building, submitting and tracking them until their completion is applied
(docs/daemon.md).

Vocabulary: a *job* is the client's unit (one Submit, a `ClientJob`); a *device job* is one unit of
device work the executor builds from a `JobPlan` (a prefill of one sequence or a batched decode
step) and a *submission* is the device's handle on it.

The executor owns the device jobs and the engine banks. A device job goes through three steps:

    prepare(plan)    engine lock held: a free bank, a JobContext from the generation's pool, a KV
                     reservation for every row the plan gave it (reserve -> submit -> commit | rollback)
    submit(job)      no lock: write the rows' tokens and positions into the context's own buffers and
                     call `device.submit` (the device call never runs under the engine lock)
    started(job, s)  engine lock held: the device accepted it; the completion thread may wait on it
                     (or `abort(job)`: the device refused it; every reservation rolls back and the
                     context returns to its pool, so nothing leaks)

Until `retire`, the `DeviceJob` owns its context and its reservations; the completion path ends them
through `commit_row` / `lose_row` / `end_context` (engine lock held, no device call). A rebuild of the
pool's buffers after a quarantine is returned as a `PoolUpkeep` the caller runs without the lock.
The executor never assigns or frees a lane: the scheduler does.

The in-flight limit (`InflightLimit`) starts at the device's declared capability (or the policy's
lower limit), drops to 1 by itself when `note_anomaly` is called (a CCU exception the device raised
on its own, a hang, NaN logits, a counter mismatch; never a reset's deliberate CCU exceptions) and
comes back after `restore_after` consecutive clean completions or a successful operator reset.

Lock: none of its own; the engine lock guards it. `submit` runs without it, on a job only the engine
thread touches until `started`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np

from calculet.common.errors import InvalidArgument
from calculet.common.lifecycle import Lifecycle, table
from calculet.daemon.core.ids import DeviceJobId
from calculet.daemon.core.job_buffers import BufferState, JobContext, JobPool
from calculet.daemon.core.kv import LaneState, Reservation
from calculet.daemon.core.row_masks import RowMasks
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import JobPlan
from calculet.daemon.device.api import Submission, VirtualDevice
from calculet.daemon.device.slots import slot_rows
from calculet.daemon.device.types import EngineSlot, TaskType

log = logging.getLogger(__name__)


@dataclass(eq=False)  # identity: one record per device job
class DeviceJob:
    """One device job. Owns `ctx` (its buffers) and `reservations` until it is retired.

    Attributes:
        submission: the device's handle; None while the job is being submitted.
        quarantine: set after a wait timeout or a hung job's reset: the device may have held the
            buffers, so they are never reused.
        kv_lost: a configuration reset cleared its lanes, even if it reports DONE.
        reset_hit: a reset ended (or may have ended) it: its CCU exception is the reset's doing, not a
            device anomaly.
        full_row_reads: rows of a top-k job whose full logits sampling read from the device.
        masks: its constrained rows' next-token masks, computed while the device runs it
            (`completion.prepare_masks`); None until then.
        out_rows: per sequence of the plan, the job row it occupies: its position in the plan, or
            with fixed slots its lane (row i is slot i, `device/slots.py`); set by `prepare`.
    """

    device_job_id: DeviceJobId
    plan: JobPlan
    ctx: JobContext
    reservations: list[Reservation]
    engine_slot: EngineSlot
    generation: int
    tag: str
    lanes_to_open: list[int] = field(default_factory=list)  # rows' lanes the device must open first
    lanes_opened: list[int] = field(default_factory=list)  # of those, the ones it opened so far
    submission: Submission | None = None
    t_submit: float = field(default_factory=time.monotonic)
    quarantine: bool = False
    kv_lost: bool = False
    reset_hit: bool = False
    full_row_reads: int = 0
    masks: RowMasks | None = None
    out_rows: tuple[int, ...] = ()

    @property
    def submitted(self) -> bool:
        return self.submission is not None

    @property
    def rows_in_place(self) -> bool:
        """Row i of the job is the plan's sequence i (no idle row between them)."""
        return not self.out_rows or self.out_rows == tuple(range(len(self.out_rows)))

    def row_of(self, i: int) -> int:
        """The job row of the plan's sequence i."""
        return self.out_rows[i] if self.out_rows else i


@dataclass(frozen=True)
class PoolUpkeep:
    """Device work a returned context left for its pool; `run` it without the engine lock.

    Attributes:
        rebuild: a context was quarantined: register a fresh epoch of buffers (until then its key
            has one slot fewer, and the engine waits for the rebuild rather than reuse it).
    """

    pool: JobPool
    rebuild: bool

    def run(self) -> None:
        """Raises: DeviceError: registering or unregistering buffers failed."""
        if self.rebuild:
            self.pool.rebuild()
        else:
            self.pool.sweep()


class LimitState(Enum):
    FULL = auto()  # the device's (or the policy's) limit: ping/pong where the device has it
    DEGRADED = auto()  # 1 job at a time after an anomaly


LIMIT_TRANSITIONS = table([(LimitState.FULL, [LimitState.DEGRADED]), (LimitState.DEGRADED, [LimitState.FULL])])
RESTORE_AFTER_CLEAN_JOBS = 256  # consecutive clean completions before a degraded limit comes back


class InflightLimit:
    """How many jobs may be in flight, and why (docs/sources.md 000 §5.2). Owned by the executor;
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
    """Device jobs of one board, oldest first.

    Args:
        device: the opened board.
        max_inflight: the policy's limit; the effective limit is also capped by the device.
        restore_after: clean completions that end a degraded in-flight limit.
    """

    def __init__(self, device: VirtualDevice, max_inflight: int, restore_after: int = RESTORE_AFTER_CLEAN_JOBS) -> None:
        caps = device.info().capabilities
        self._device = device
        self.capability = caps.max_inflight
        self.limiter = InflightLimit(max(1, min(max_inflight, caps.max_inflight)), restore_after)
        self.engine_slots: tuple[EngineSlot, ...] = (
            (EngineSlot.PING, EngineSlot.PONG) if caps.ping_pong else (EngineSlot.AUTO,)
        )
        self._jobs: deque[DeviceJob] = deque()
        self._next_job = 1

    # ---- queries ----------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self.limiter.value

    @property
    def anomalies(self) -> int:
        return self.limiter.anomalies

    @property
    def degraded_reason(self) -> str:
        return self.limiter.reason

    def jobs(self) -> list[DeviceJob]:
        """Every device job not yet retired (being submitted or on the device), oldest first."""
        return list(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def oldest_submitted(self) -> DeviceJob | None:
        """The job the completion thread waits on next: the oldest, once the device has it."""
        return self._jobs[0] if self._jobs and self._jobs[0].submitted else None

    def submitting(self) -> bool:
        """A job is between `prepare` and `started`/`abort`."""
        return any(not j.submitted for j in self._jobs)

    def has_slot(self) -> bool:
        return len(self._jobs) < self.limit and self._free_bank() is not None

    # ---- the in-flight limit --------------------------------------------------------------

    def note_anomaly(self, reason: str) -> None:
        """Count a device anomaly; the in-flight limit drops to 1 (docs/sources.md 000 §5.2)."""
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

    # ---- building and submitting ----------------------------------------------------------

    def prepare(self, plan: JobPlan) -> DeviceJob | None:
        """Take a bank and a context and reserve every row of `plan` (engine lock held).

        Returns:
            The job (not yet submitted), or None when no context is free for the bank (capacity;
            nothing changed).

        Raises:
            CalculetError: a row does not fit its lane or the submodel; nothing changed.
        """
        bank = self._free_bank()
        rt = plan.runtime
        assert bank is not None and rt.pool is not None and rt.kv is not None
        job_id, self._next_job = self._next_job, self._next_job + 1
        ctx = rt.pool.acquire(rt.pool.key(plan.submodel.name, bank), job_id)
        if ctx is None:
            return None
        reservations: list[Reservation] = []
        try:
            for seq, (lane, target) in zip(plan.seqs, plan.targets, strict=True):
                reservations.append(rt.kv.reserve(lane, seq.job_id, target, job_id))
        except BaseException:
            self._undo(rt, ctx, reservations)
            raise
        job = DeviceJob(job_id, plan, ctx, reservations, bank, rt.generation, f"gen{rt.generation}/job{job_id}")
        bound = rt.slot_bound(plan.submodel)
        job.out_rows = tuple(lane for lane, _ in plan.targets) if bound else tuple(range(len(plan.targets)))
        job.lanes_to_open = [lane for lane, _ in plan.targets if rt.kv.needs_open(lane)]
        self._jobs.append(job)
        return job

    def open_lanes(self, job: DeviceJob) -> list[int]:
        """Open the lanes the job's rows take for the first time (KV Apply). WITHOUT the engine lock.

        Returns:
            The lanes opened, all of `lanes_to_open` (record them with `lanes_opened`).

        Raises:
            OutOfKV / DeviceError: the device refused a lane; the ones opened before it are in
                `job.lanes_opened` all the same (record them too).
        """
        rt = job.plan.runtime
        assert rt.model is not None
        for lane in job.lanes_to_open:
            self._device.open_lane(rt.model, lane)
            job.lanes_opened.append(lane)
        return job.lanes_opened

    def lanes_opened(self, job: DeviceJob) -> None:
        """Record the lanes the device opened for the job's rows (engine lock held), so the lanes are
        closed when their sequences leave them."""
        kv = job.plan.runtime.kv
        assert kv is not None
        owners = {lane: seq.job_id for seq, (lane, _) in zip(job.plan.seqs, job.plan.targets, strict=True)}
        for lane in job.lanes_opened:
            kv.opened(lane, owners[lane])

    def submit(self, job: DeviceJob) -> Submission:
        """Fill the job's buffers and hand it to the device. Runs WITHOUT the engine lock: the job
        is not visible to the completion path until `started`.

        Raises:
            DeviceError / CalculetError: the device refused it (call `abort`).
        """
        rt = job.plan.runtime
        assert rt.model is not None
        # The spec checks every row fits the submodel (InvalidArgument) before anything is written.
        rows = [r.row() for r in job.reservations]
        bound = rt.fixed_slots is not None and rt.slot_bound(job.plan.submodel)
        if rt.fixed_slots is not None and bound:  # row i is slot i, idle slots masked by the rule
            rows = list(slot_rows({r.lane: r for r in rows}, job.plan.submodel, rt.fixed_slots))
        spec = job.ctx.job_spec(rows, tag=job.tag, fixed_slots=bound)
        _fill_inputs(job.ctx, job.plan, job.reservations, job.out_rows)
        return self._device.submit(rt.model, spec, job.engine_slot)

    def started(self, job: DeviceJob, submission: Submission) -> None:
        """The device accepted the job (engine lock held)."""
        job.ctx.mark_submitted()
        job.submission = submission
        job.t_submit = time.monotonic()
        if job.plan.task is TaskType.DECODE:  # the batch fill (`compaction.SlotStats`)
            stats = job.plan.runtime.slots
            stats.active_rows += len(job.plan.seqs)
            stats.compiled_rows += job.plan.submodel.batch

    def abort(self, job: DeviceJob) -> None:
        """The device refused the job (engine lock held): roll back its reservations, return its
        context and forget it."""
        self._undo(job.plan.runtime, job.ctx, job.reservations)
        self._jobs.remove(job)

    # ---- ending a job (the completion path, engine lock held) -------------------------------

    def commit_row(self, job: DeviceJob, row: int) -> None:
        """The row's output is trusted: its lane now holds the reserved length."""
        kv = job.plan.runtime.kv
        assert kv is not None
        kv.commit(job.reservations[row])

    def lose_row(self, job: DeviceJob, row: int) -> None:
        """The row's KV is not trusted (fault, NaN, reset): its lane becomes UNKNOWN."""
        kv = job.plan.runtime.kv
        assert kv is not None
        lane = job.reservations[row].lane
        if kv.lane(lane).state in (LaneState.ACTIVE, LaneState.RESERVED):
            kv.mark_unknown(lane)

    def end_context(self, job: DeviceJob) -> PoolUpkeep | None:
        """Give the job's buffers back (engine lock held; no device call): quarantined when the device
        may have held them, otherwise zeroed and back to the pool for reuse.

        Returns:
            The device work this left for the pool (a rebuild into a new epoch after a quarantine,
            or unregistering a context of an old epoch), which the caller runs WITHOUT the engine
            lock; None when there is none.
        """
        pool = job.plan.runtime.pool
        if pool is None or job.ctx.state is BufferState.RETIRED:
            return None  # its generation's pool is closed: the buffers went with it
        if job.quarantine:
            pool.quarantine(job.ctx)
            return PoolUpkeep(pool, rebuild=True)
        if job.ctx.state is not BufferState.COMPLETING:
            job.ctx.mark_completing()
        stale = job.ctx.epoch != pool.epoch
        pool.release(job.ctx)
        return PoolUpkeep(pool, rebuild=False) if stale else None

    def retire(self, job: DeviceJob) -> None:
        """Forget a finished job (its context and reservations are ended)."""
        self._jobs.remove(job)

    # ---- internals ------------------------------------------------------------------------

    def _undo(self, rt: ModelRuntime, ctx: JobContext, reservations: list[Reservation]) -> None:
        assert rt.kv is not None and rt.pool is not None
        for r in reservations:
            rt.kv.rollback(r)
        rt.pool.release(ctx)

    def _free_bank(self) -> EngineSlot | None:
        busy = {j.engine_slot for j in self._jobs}
        return next((b for b in self.engine_slots if b not in busy), None)


def _fill_inputs(ctx: JobContext, plan: JobPlan, reservations: list[Reservation], out_rows: tuple[int, ...]) -> None:
    """Write each row's tokens and positions into the context's own input buffers (a decode
    sequence into its job row, `out_rows`). An idle row keeps the zeros its release left: nothing
    is invented for it."""
    tokens, positions = ctx.tokens, ctx.positions
    if plan.task is TaskType.PREFILL:  # one chunk: the tokens after what the lane already holds
        seq, r = plan.seqs[0], reservations[0]
        ids = seq.prefill_slice(r.past_len, r.target_len)
        tokens[0, : len(ids)] = ids
        positions[0, : len(ids)] = np.arange(r.past_len, r.target_len, dtype=np.int32)
        return
    for row, seq, r in zip(out_rows, plan.seqs, reservations, strict=True):
        tokens[row, 0] = seq.generated[-1]
        positions[row, 0] = r.past_len
