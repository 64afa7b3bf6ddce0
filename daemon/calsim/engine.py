"""calsim engine: two engine banks (ping, pong), one compute unit, the modelled clock, the worker.

Data flow: `CalsimDevice.submit` validates a job, then `pick_bank` / `check_free` / `accept`
queue it here: the clock places its phases on the device timeline and the job occupies its bank,
buffers and lanes. `accept` poisons the job's output rows (every byte 0xFF: NaN for bf16/float,
-1 for integers) and claims its output buffers. The worker thread performs each job's steps in
device-time order, waiting on the condition until each step is due under `time_scale`: at H2D it
copies the active input rows out of the host buffers (a refill before H2D changes the result, as
on hardware), at COMPUTE it runs the kernel (and a top-k job's top-k, within the compute), at
FINISH (D2H end) it keeps the bf16 logits rows (or the top-k outputs) as the job's `outputs`, ends
the job DONE or CCU_EXCEPTION, frees bank, buffers and lanes, and sets the job's event. The
outputs reach the host buffers only in `deliver`, which `CalsimSubmission.wait` calls when it
returns DONE, and only into buffers the job still claims (a later job that named the buffer took it
over). So a caller that reads outputs before `wait` returned DONE (after polling `status`, or for a
CCU_EXCEPTION job) reads poison, not plausible logits.

Checks (`checks`, the `checks` driver option): with them on, `pick_bank` refuses a busy bank
(EngineBusy), `check_free` a buffer or lane held by an in-flight job (BufferInUse, LaneBusy) and
`buffer_holder` names the job that makes `unregister_buffer` refuse. A real runtime (CalRT 0.7.6)
makes none of these refusals; with `checks` off calsim accepts such jobs too (a bank, buffer or
lane is simply shared; the data effects follow from the H2D / compute / D2H order) so tests can
show that `calculet.daemon.device.guard.GuardedDevice` alone catches the daemon bug.

Locking: ONE lock + condition, owned by the device and shared here. Every method is called with
it held, except `start` and `join`. The worker releases it only around the kernel call, during
which it holds the *kernel token* (`_kernel_user`); anyone else who touches kernel lanes (resets,
close) first waits on the condition until the token is free. No polling anywhere: the worker
sleeps on the condition until notified (submit, reset, close, loss) or a step falls due.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import numpy as np

from calculet.daemon.calsim.clock import DeviceClock, Pacer
from calculet.daemon.calsim.compute import ComputeFailed, compute_logits, topk_outputs
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.calsim.job import Job, Step
from calculet.daemon.calsim.job_check import ResolvedJob
from calculet.daemon.calsim.kernel import Kernel
from calculet.daemon.calsim.lane_kv import LaneKV
from calculet.daemon.calsim.timing import JobDurations, copy_s
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.errors import BufferInUse, DeviceLost, EngineBusy, InvalidJob, LaneBusy
from calculet.daemon.device.types import EngineSlot, JobCounters, JobSpec, JobStatus
from calculet.daemon.os_threads import named

logger = logging.getLogger(__name__)

BANKS = (EngineSlot.PING, EngineSlot.PONG)
POISON_BYTE = 0xFF  # what an output row holds until `wait` returns DONE: NaN as bf16/float, -1 as int


def poison_rows(array: np.ndarray, rows: int) -> None:
    """Fill rows 0..rows-1 of a C-contiguous host array with `POISON_BYTE` in every byte."""
    array[:rows].view(np.uint8)[...] = POISON_BYTE


class ComputeEngine:
    """Banks, in-flight jobs, holds, modelled clock and worker of one calsim board.

    Args:
        cond: the device's condition (its lock is the one lock of the device).
        time_scale: wall seconds per modelled second; 0 never waits.
        seed: seeds the garbage written into corrupted lanes.
        name: worker thread name.
        checks: refuse a busy bank, a held buffer or a busy lane (see the module docstring).
    """

    def __init__(
        self, cond: threading.Condition, time_scale: float, seed: int, name: str, *, checks: bool = True
    ) -> None:
        self._cond = cond
        self.clock = DeviceClock()
        self.pacer = Pacer(time_scale)
        self._seed = seed
        self.checks = checks
        self._banks: dict[EngineSlot, list[Job]] = {b: [] for b in BANKS}  # more than one only without checks
        self._claims: dict[int, Job] = {}  # output buffer id -> the job whose outputs it awaits
        self._kept: dict[int, Job] = {}  # output buffer id -> the top-k job whose full rows it keeps
        self.row_reads = 0  # full rows read on demand (`read_logits_row`)
        self._submitted = 0
        self._finished = 0
        self._kernel_user: Job | None = None
        self._stopping = False
        self.gone: str | None = None  # why every call now raises DeviceLost (lost or closed)
        self._thread = threading.Thread(target=named("calsim-worker", self._run), name=name, daemon=True)

    # ------------------------------------------------------------------ worker thread control

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait for the worker to exit (call without the lock, after `shutdown` or `lose`)."""
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    # ------------------------------------------------------------------ queries

    @property
    def cond(self) -> threading.Condition:
        """The device's one lock + condition."""
        return self._cond

    def ensure_alive(self) -> None:
        """Raises:
        DeviceLost: the device was lost or closed."""
        if self.gone is not None:
            raise DeviceLost(self.gone)

    def inflight(self) -> list[Job]:
        """Jobs holding a bank (not finished), oldest first."""
        return sorted((j for jobs in self._banks.values() for j in jobs), key=lambda j: j.job_id)

    def holds_model(self, config_id: int) -> list[Job]:
        return [j for j in self.inflight() if j.model.config_id == config_id]

    def buffer_holder(self, buffer_id: int) -> Job | None:
        """The oldest in-flight job holding the buffer, for which `unregister_buffer` refuses it;
        None when none does, and always None with checks off."""
        if not self.checks:
            return None
        return next((j for j in self.inflight() if buffer_id in j.resolved.buffer_ids), None)

    def counters(self) -> JobCounters:
        states = [j.status.state for j in self.inflight()]
        return JobCounters(
            submitted=self._submitted,
            pending=states.count(JobStatus.PENDING),
            running=states.count(JobStatus.RUNNING),
            finished=self._finished,
            left=self._submitted - self._finished,
        )

    # ------------------------------------------------------------------ submit

    def pick_bank(self, requested: EngineSlot) -> EngineSlot:
        """The bank a new job goes to. AUTO takes the free bank that has been free longest on the
        device clock (ping on a tie), so the choice does not depend on thread timing.

        With checks off a busy bank is never refused: an explicit bank is taken as asked, and AUTO
        with both banks busy takes the one with the fewest jobs (ping on a tie). Such a job shares
        the bank; its times are placed as if the bank were its own (the copy path and the compute
        unit still serve jobs one at a time). What a real runtime does then is not modelled.

        Raises:
            EngineBusy: the requested bank, or for AUTO both banks, hold a job in flight (checks on).
        """
        if requested is EngineSlot.AUTO:
            free = [b for b in BANKS if not self._banks[b]]
            if free:
                return min(free, key=lambda b: (self.clock.bank_free[b], BANKS.index(b)))
            if self.checks:
                raise EngineBusy("both engine banks (ping, pong) have a job in flight")
            return min(BANKS, key=lambda b: (len(self._banks[b]), BANKS.index(b)))
        holders = self._banks[requested]
        if holders and self.checks:
            raise EngineBusy(f"engine bank {requested.value} has job {holders[0].job_id} in flight")
        return requested

    def check_free(self, config_id: int, resolved: ResolvedJob) -> None:
        """Nothing with checks off.

        Raises:
            BufferInUse: a buffer of the job is held by an in-flight job.
            LaneBusy: a lane of the job is being advanced by an in-flight job.
        """
        if not self.checks:
            return
        inflight = self.inflight()
        for buffer_id in resolved.buffer_ids:
            holder = next((j for j in inflight if buffer_id in j.resolved.buffer_ids), None)
            if holder is not None:
                raise BufferInUse(f"buffer {buffer_id} is held by in-flight job {holder.job_id}")
        for lane in resolved.lanes:
            holder = next((j for j in inflight if j.model.config_id == config_id and lane in j.resolved.lanes), None)
            if holder is not None:
                raise LaneBusy(f"lane {lane} is being advanced by in-flight job {holder.job_id}")

    def accept(
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
    ) -> Job:
        """Queue a validated job on `bank` (already checked free); it now holds bank, buffers, lanes.
        Its output rows hold poison from now until `deliver` writes its outputs."""
        if fault is not None and fault.kind is FaultKind.CCU_EXCEPTION:
            durations = dataclasses.replace(durations, d2h=0.0)  # nothing is copied back
        delay = fault.delay_ms / 1000.0 if fault is not None and fault.kind is FaultKind.SLOW_JOB else 0.0
        hang = fault is not None and fault.kind is FaultKind.HANG
        idle = not self.inflight()
        schedule = self.clock.place(bank, durations, delay, hang)
        if idle:
            self.pacer.anchor(schedule.queued)
        job = Job(job_id, model, kernel, lane_kv, spec, resolved, bank, fault, durations, schedule)
        self._banks[bank].append(job)
        for buf in resolved.outputs.values():
            poison_rows(buf.array, len(resolved.rows))
            self._claims[buf.buffer_id] = job
            earlier = self._kept.pop(buf.buffer_id, None)
            if earlier is not None:  # its output buffer is reused: its full rows are gone
                earlier.kept_logits = None
        self._submitted += 1
        self._cond.notify_all()
        return job

    def observe_finished(self, job: Job) -> None:
        """The host waited `job` to completion: it has seen the device reach its D2H end."""
        self.clock.observe(job.schedule.d2h_end)

    def deliver(self, job: Job) -> None:
        """`wait` returns DONE for `job`: write its outputs' active rows into each output buffer it
        still claims (a buffer a later job named keeps that job's poison). Once only: a second
        wait writes nothing again. A CCU_EXCEPTION job has no outputs: its rows keep the poison."""
        outputs, job.outputs = job.outputs, {}
        for name, rows in outputs.items():
            buf = job.resolved.outputs[name]
            if self._claims.get(buf.buffer_id) is job:
                del self._claims[buf.buffer_id]
                buf.array[: len(rows)] = rows
                if job.kept_logits is not None:
                    self._kept[buf.buffer_id] = job

    # ------------------------------------------------------------------ resets, loss, close

    def wait_kernel_idle(self) -> None:
        """Block (on the condition) until the worker is not inside a kernel call.

        Raises:
            DeviceLost: the device was lost or closed meanwhile.
        """
        self._cond.wait_for(lambda: self._kernel_user is None or self.gone is not None)
        self.ensure_alive()

    def reset_ccu(self) -> None:
        """Every in-flight job ends CCU_EXCEPTION; every lane it named is corrupted.

        Raises:
            DeviceLost: the device was lost or closed while waiting for the kernel.
        """
        self.wait_kernel_idle()
        aborted = self.inflight()
        self.clock.settle_reset(aborted, [], self.clock.reset_time(aborted))
        for job in aborted:
            self._corrupt(job)
            self._end(job, JobStatus.CCU_EXCEPTION)

    def reset_model(self, config_id: int, kernel: Kernel, lane_kv: LaneKV) -> None:
        """The model's in-flight jobs end CCU_EXCEPTION and all its lanes are cleared; other
        models' jobs continue (re-planned if they waited behind one of its hung jobs).

        Raises:
            DeviceLost: the device was lost or closed while waiting for the kernel.
        """
        self.wait_kernel_idle()
        aborted = self.holds_model(config_id)
        survivors = [j for j in self.inflight() if j not in aborted]
        self.clock.settle_reset(aborted, survivors, self.clock.reset_time(aborted))
        for job in aborted:
            self._end(job, JobStatus.CCU_EXCEPTION)
        for lane in range(kernel.lanes):
            kernel.clear_lane(lane)
        lane_kv.clear()
        self._cond.notify_all()

    def lose(self, reason: str) -> None:
        """The device stops answering: waiters wake and every later call raises DeviceLost."""
        if self.gone is None:
            self.gone = reason
        for job in self.inflight():
            job.done.set()
        self._cond.notify_all()

    def shutdown(self, reason: str) -> None:
        """Close: in-flight jobs end CCU_EXCEPTION (after any running kernel call returns), the
        worker is told to exit, and later calls raise DeviceLost(`reason`). Call `join` after
        releasing the lock."""
        self._cond.wait_for(lambda: self._kernel_user is None)
        aborted = self.inflight()
        self.clock.settle_reset(aborted, [], self.clock.reset_time(aborted))
        for job in aborted:
            self._end(job, JobStatus.CCU_EXCEPTION)
        self._stopping = True
        self.lose(reason)

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:
            # A bug in calsim or a kernel: surface it as a lost device rather than hang waiters.
            logger.exception("calsim worker failed; the device is lost")
            with self._cond:
                self._kernel_user = None  # the failed call is over
                self.lose(f"calsim worker failed: {exc!r}")

    def _loop(self) -> None:
        while True:
            with self._cond:
                job = self._next_due()
                if job is None:
                    return
                needs_kernel = self._perform(job)
            if needs_kernel:
                logits, topk, failure = self._compute(job)
                with self._cond:
                    self._kernel_done(job, logits, topk, failure)

    def _next_due(self) -> Job | None:
        """Block until some job's next step is due; None when the worker must exit."""
        while True:
            if self._stopping or self.gone is not None:
                return None
            due = [(ev, j) for j in self.inflight() if (ev := j.next_event()) is not None]
            if not due:
                self._cond.wait()
                continue
            event, job = min(due, key=lambda pair: pair[0])
            delay = self.pacer.delay(event[0])
            if delay > 0:
                self._cond.wait(delay)  # woken early by submit/reset/close; re-evaluate then
                continue
            return job

    def _perform(self, job: Job) -> bool:
        """Do `job`'s due step under the lock; True if the kernel must run next (token taken)."""
        step = job.step.state
        if step is Step.H2D:
            n = len(job.resolved.rows)
            job.staged = {name: np.array(b.array[:n], copy=True) for name, b in job.resolved.inputs.items()}
            job.step.move(Step.COMPUTE)
            return False
        if step is Step.COMPUTE:
            job.status.move(JobStatus.RUNNING)
            job.step.move(Step.FINISH)
            if job.hangs:
                return False  # FINISH is at d2h_end = inf: only a reset ends this job
            if job.has_fault(FaultKind.CCU_EXCEPTION):
                job.failure = "injected ccu_exception"
                return False
            self._kernel_user = job
            return True
        self._finish(job)
        return False

    def _compute(self, job: Job) -> tuple[np.ndarray | None, dict[str, np.ndarray] | None, str | None]:
        """Outside the lock, holding the kernel token: the logits, and a top-k job's outputs."""
        try:
            sub = job.resolved.submodel
            logits = compute_logits(job.kernel, sub.task_type, job.resolved.rows, job.staged)
        except ComputeFailed as exc:
            return None, None, str(exc)
        ids = job.resolved.outputs.get("topk_ids")
        return logits, None if ids is None else topk_outputs(logits, ids.array.shape[1]), None

    def _kernel_done(
        self, job: Job, logits: np.ndarray | None, topk: dict[str, np.ndarray] | None, failure: str | None
    ) -> None:
        self._kernel_user = None
        self._cond.notify_all()
        if not job.finished:
            job.logits = logits
            job.topk = topk
            job.failure = failure
            if failure is None:
                job.lane_kv.written(job.resolved.active)  # the kernel wrote the rows' KV

    def _finish(self, job: Job) -> None:
        if job.failure is not None or job.logits is None:
            self._corrupt(job)
            self._end(job, JobStatus.CCU_EXCEPTION)
            return
        logits = job.logits
        if job.has_fault(FaultKind.NAN_LOGITS):
            logits = np.full_like(logits, np.nan)
        ids = job.resolved.outputs.get("topk_ids")
        if ids is None:
            job.outputs = {"logits": logits}  # reaches the host buffer when `wait` returns DONE
        else:
            # Computed at COMPUTE, unless a NaN fault replaced the logits since.
            ready = job.topk if logits is job.logits else None
            job.outputs = ready if ready is not None else topk_outputs(logits, ids.array.shape[1])
            job.kept_logits = logits
        self._end(job, JobStatus.DONE)

    def forget_buffer(self, buffer_id: int) -> None:
        """The buffer was unregistered: the full rows a top-k job kept for it go too (the device's
        memory of that output is released). Under the device lock."""
        earlier = self._kept.pop(buffer_id, None)
        if earlier is not None:
            earlier.kept_logits = None
            for other in [b for b, j in self._kept.items() if j is earlier]:
                del self._kept[other]

    def kept_rows(self) -> int:
        """Top-k jobs whose full rows the device keeps now (bounded by the registered buffers)."""
        return len({id(j) for j in self._kept.values()})

    def read_logits_row(self, job: Job, row: int, out: np.ndarray, d2h_gbps: float) -> float:
        """Copy row `row` of a finished top-k job's full logits into `out`: a D2H of its bytes on
        the modelled clock, from when the host asks. Under the device lock.

        Returns:
            Wall seconds the caller sleeps (outside the lock) so the copy takes its modelled time.
        Raises:
            InvalidJob: not a finished top-k job, the row is not one of its active rows, or its
                output buffer was reused since (the full rows are gone).
        """
        kept = job.kept_logits
        if kept is None:
            raise InvalidJob(
                f"job {job.job_id}: no full logits on the device (not top-k, or its output buffer was reused)"
            )
        if not 0 <= row < kept.shape[0] or out.shape != kept.shape[1:] or out.dtype != kept.dtype:
            raise InvalidJob(
                f"job {job.job_id}: row {row} into {out.dtype} {out.shape} does not fit {kept.dtype} {kept.shape}"
            )
        out[...] = kept[row]
        end = self.clock.host_now + copy_s(out.nbytes, d2h_gbps)
        self.clock.observe(end)
        self.row_reads += 1
        return self.pacer.delay(end)

    def _corrupt(self, job: Job) -> None:
        """What a CCU exception mid-write leaves: garbage in every lane the job named."""
        for lane in job.resolved.lanes:
            job.kernel.corrupt_lane(lane, np.random.default_rng([self._seed, job.job_id, lane]))
        job.lane_kv.lost(job.resolved.lanes)

    def _end(self, job: Job, status: JobStatus) -> None:
        job.status.move(status)
        job.step.move(Step.ENDED)
        bank = self._banks[job.bank]
        bank.remove(job)
        if not bank:
            self.clock.release_bank(job.bank, job.schedule.d2h_end)
        if status is not JobStatus.DONE:
            job.outputs = {}
            for buf in job.resolved.outputs.values():  # nothing to deliver: the poison stays
                if self._claims.get(buf.buffer_id) is job:
                    del self._claims[buf.buffer_id]
        self._finished += 1
        job.staged = {}
        job.logits = None
        job.done.set()
        self._cond.notify_all()
