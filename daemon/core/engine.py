"""The device loop: admission, continuous batching, submit, completion (DESIGN.md section 3).

Threads (the threading model):
- the caller's threads (gRPC handlers) call `submit` / `cancel` / `snapshot`; they only take the
  engine lock briefly and never touch the device;
- the **engine thread** sleeps on the engine condition until there is work and a free in-flight
  slot, asks the `Scheduler` for a `JobPlan`, assigns lanes and has the `Executor` submit it
  (non-blocking); with the serial policy it also waits for the job right away, like today's
  product;
- the **completion thread** blocks in `Submission.wait` on the oldest in-flight job, samples its
  logits outside the lock (so sampling overlaps the other bank's device work), then under the
  lock commits or rolls back KV, streams tokens, and returns the context to its pool.
Nothing polls: every wait is on the condition, an event log listener, or the device's wait.

Per-job state lives in `Sequence`s (`sequence.py`); completions are applied by
`completion.py`. Ownership: a READY/WAITING sequence belongs to the scheduler, a sequence in a
PREFILL/DECODE job belongs to that job's `InFlight` until its completion is applied.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from calculet.daemon.core.completion import CompletionApplier
from calculet.daemon.core.events import EventLog, FinishReason
from calculet.daemon.core.executor import Executor, InFlight
from calculet.daemon.core.request import GenerationRequest, validate_request
from calculet.daemon.core.reset_budget import ResetBudget
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import JobPlan, Scheduler, SchedulingPolicy
from calculet.daemon.core.sequence import SeqState, Sequence
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost, WaitTimeout
from calculet.daemon.device.types import JobStatus, TaskType
from calculet.daemon.errors import (
    CalculetError,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    NotFound,
    Overloaded,
    Unavailable,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        policy: scheduling knobs.
        max_inflight: jobs in flight at once (capped by the device's capability).
        synchronous: wait for each job right after submitting it (the serial policy).
        job_timeout_s: wall-clock wait for one job before the device is reset.
        max_recoveries: re-prefills a sequence may need after lost KV before it fails.
        reset_limit / reset_window_s: automatic resets allowed per window before the board stops
            serving and waits for an operator.
        orphan_timeout_s: a job with no Wait stream attached for this long is cancelled, so a client
            that submits and disappears cannot hold a lane forever (None = never).
        retention: finished jobs kept for re-attaching `Wait` calls.
    """

    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    max_inflight: int = 2
    synchronous: bool = False
    job_timeout_s: float = 30.0
    max_recoveries: int = 3
    retention: int = 4096
    reset_limit: int = 3
    reset_window_s: float = 600.0
    orphan_timeout_s: float | None = 60.0


@dataclass
class EngineCounters:
    submitted: int = 0
    rejected: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    decode_jobs: int = 0
    decode_rows: int = 0
    recoveries: int = 0
    resets: int = 0
    last_reset_reason: str = ""


class Engine:
    """Owns the scheduler, the executor and every sequence of one device."""

    def __init__(self, device: VirtualDevice, config: EngineConfig) -> None:
        self.device = device
        self.config = config
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.scheduler = Scheduler(config.policy)
        self.executor = Executor(device, 1 if config.synchronous else config.max_inflight)
        self.counters = EngineCounters()
        self.reset_budget = ResetBudget(config.reset_limit, config.reset_window_s)
        self.runtimes: dict[int, ModelRuntime] = {}  # generations whose jobs may run
        self.aliases: dict[str, ModelRuntime] = {}  # published alias -> serving generation
        self.known_aliases: set[str] = set()  # ever published here: unloaded ones are UNAVAILABLE
        self.sequences: dict[str, Sequence] = {}  # live sequences
        self.finished: OrderedDict[str, Sequence] = OrderedDict()  # retained for Wait
        self.by_client_id: dict[tuple[str, str], str] = {}
        self.admitting = True
        self.device_lost = False
        self._boot = os.urandom(3).hex()
        self._ids = itertools.count(1)
        self._stopping = False
        self._applier = CompletionApplier(self)
        self._threads: list[threading.Thread] = []
        self.health_listeners: list[Callable[[], None]] = []  # called when the board stops serving

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        names = [("calculet-engine", self._engine_loop)]
        if not self.config.synchronous:
            names.append(("calculet-completion", self._completion_loop))
        for name, target in names:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop both threads after in-flight jobs finish (buffers are never abandoned mid-DMA)."""
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=self.config.job_timeout_s + 5)
        self._threads.clear()

    # ---- models ---------------------------------------------------------------------------

    def add_runtime(self, rt: ModelRuntime) -> None:
        """Let jobs of this generation run (warming included); publishing is separate."""
        with self.cond:
            self.runtimes[rt.generation] = rt
            self.cond.notify_all()

    def publish(self, rt: ModelRuntime) -> ModelRuntime | None:
        """Atomically point the alias at `rt`; returns the generation it replaced."""
        with self.cond:
            old = self.aliases.get(rt.alias)
            self.aliases[rt.alias] = rt
            self.known_aliases.add(rt.alias)
            return old

    def unpublish(self, alias: str, generation: int) -> None:
        with self.cond:
            if (rt := self.aliases.get(alias)) is not None and rt.generation == generation:
                del self.aliases[alias]

    def remove_runtime(self, generation: int) -> None:
        with self.cond:
            self.runtimes.pop(generation, None)

    def count_sequences(self, generation: int) -> int:
        with self.cond:
            return sum(1 for s in self.sequences.values() if s.generation == generation)

    def wait_generation_idle(self, generation: int, timeout: float) -> bool:
        """Block until the generation has no sequences and no jobs, or the timeout passes."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self._generation_busy(generation):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)
            return True

    def cancel_generation(self, generation: int, reason: str) -> int:
        """Cancel every sequence of a generation (unload after the drain timeout)."""
        with self.cond:
            seqs = [s for s in self.sequences.values() if s.generation == generation]
            for seq in seqs:
                # ERROR + UNAVAILABLE tells a gateway to resume the stream on another board.
                self._cancel_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, reason)
            self.cond.notify_all()
            return len(seqs)

    def reset_configuration(self, rt: ModelRuntime, reason: str) -> None:
        """Reset a generation's configuration on the device, which clears all its KV: every sequence
        holding a lane and not in a job re-prefills; those in a job learn it from their CCU-exception
        completion. Under the engine lock, so no job is planned on a cleared lane in between.

        A generation no longer running here (unloaded since the caller listed it) is skipped: its
        model is released, or about to be (removal from `runtimes` precedes the release).
        """
        with self.cond:
            if self.runtimes.get(rt.generation) is not rt or rt.model is None:
                return
            assert rt.kv is not None
            self.device.reset_configuration(rt.model)
            for job in self.executor.inflight:  # a job done on the device but not yet applied too
                if job.generation == rt.generation:
                    job.kv_lost = True
            for seq in [s for s in self.scheduler.ready.values() if s.generation == rt.generation]:
                self.scheduler.forget(seq)
                assert seq.lane is not None
                rt.kv.mark_unknown(seq.lane)
                self._applier.fail_or_recover(rt, seq, reason, lane_lost=True)
            self.cond.notify_all()

    # ---- requests -------------------------------------------------------------------------

    def submit(
        self, req: GenerationRequest, runtime: ModelRuntime | None = None, *, capture_logits: bool = False
    ) -> tuple[str, bool]:
        """Validate and queue a request.

        Args:
            req: the request.
            runtime: serve on this generation instead of the alias's (warm-up probes).
            capture_logits: keep the first step's logits on the sequence (golden check).

        Returns:
            (job id, deduplicated): a repeated client_request_id returns the first job.

        Raises:
            NotFound: unknown model alias.
            Unavailable: the model is not serving or the board is draining/unhealthy.
            InvalidArgument: the request does not fit the model.
            Overloaded: the admission queue is full.
            DeadlineExceeded: the request's deadline passed before it could be queued.
        """
        with self.cond:
            if req.client_request_id and (req.model, req.client_request_id) in self.by_client_id:
                return self.by_client_id[(req.model, req.client_request_id)], True
            rt = runtime or self._serving(req.model)
            if self.device_lost:  # warm-up probes too: nothing would ever run them
                raise Unavailable("device lost: board is not serving")
            assert rt.model is not None
            validate_request(req, rt.limits)
            if runtime is None and not self.admitting:
                raise Unavailable("board is draining: not admitting new requests")
            job_id = f"{self._boot}-{next(self._ids)}"
            seq = Sequence(job_id, req, rt.generation, rt.eos_ids)
            seq.capture_logits = capture_logits
            seq.internal = runtime is not None
            self._applier.attach_history(seq, rt)
            try:
                self.scheduler.enqueue(seq)
            except Overloaded:
                if seq.deadline is not None and seq.deadline <= time.monotonic():
                    # Not a capacity refusal: retrying elsewhere (what OVERLOADED invites) cannot help.
                    raise DeadlineExceeded(
                        f"deadline of {req.deadline_s}s passed before the request was queued"
                    ) from None
                self.counters.rejected += 1
                raise
            self.sequences[job_id] = seq
            if req.client_request_id:
                self.by_client_id[(req.model, req.client_request_id)] = job_id
            if runtime is None:  # warm-up probes are not client requests
                self.counters.submitted += 1
            self.cond.notify_all()
            return job_id, False

    def event_log(self, job_id: str, *, for_wait: bool = False) -> EventLog:
        """The job's event log.

        Raises:
            NotFound: unknown (or expired) job id.
            Cancelled: `for_wait` and its owner cancelled the job before this call (a Wait already
                streaming when the cancel comes ends with a CANCELLED final event instead).
        """
        with self.cond:
            seq = self.sequences.get(job_id) or self.finished.get(job_id)
            if seq is None:
                raise NotFound(f"unknown job id {job_id!r}")
            if for_wait and seq.cancel_requested and seq.pending_error is None:
                raise Cancelled(f"job {job_id} was cancelled")
            return seq.log

    def cancel(self, job_id: str) -> bool:
        """Cancel a job. Returns False if it had already finished.

        Raises:
            NotFound: unknown job id.
        """
        with self.cond:
            seq = self.sequences.get(job_id)
            if seq is None:
                if job_id in self.finished:
                    return False
                raise NotFound(f"unknown job id {job_id!r}")
            self._cancel_locked(seq, FinishReason.CANCELLED, None, "")
            self.cond.notify_all()
            return True

    def sequence(self, job_id: str) -> Sequence | None:
        with self.cond:
            return self.sequences.get(job_id) or self.finished.get(job_id)

    # ---- internals: both loops --------------------------------------------------------------

    def _serving(self, alias: str) -> ModelRuntime:
        rt = self.aliases.get(alias)
        if rt is None:
            if alias in self.known_aliases:
                raise Unavailable(f"model {alias!r} is not loaded on this board")
            raise NotFound(f"unknown model {alias!r}")
        if not rt.state.serving:
            raise Unavailable(f"model {alias!r} is {rt.state.value}")
        if self.device_lost:
            raise Unavailable("device lost: board is not serving")
        return rt

    def _generation_busy(self, generation: int) -> bool:
        return any(s.generation == generation for s in self.sequences.values()) or any(
            j.generation == generation for j in self.executor.inflight
        )

    def _cancel_locked(self, seq: Sequence, reason: FinishReason, kind: ErrorKind | None, message: str) -> None:
        """Stop delivering a job. Waiting/ready sequences end now; one in a device job ends when the
        completion path sees `cancel_requested` and the device is done with its lane."""
        seq.cancel_requested = True
        if kind is not None:  # cancelled by unload/drain, not by its owner: report the error
            seq.pending_error = (reason, kind, message)
        if seq.state is SeqState.WAITING:
            self.scheduler.remove_waiting(seq)
            self.finish(seq, reason, kind, message)
        elif seq.state in (SeqState.READY, SeqState.RECOVER):
            self.scheduler.forget(seq)
            self.finish(seq, reason, kind, message)

    def finish(self, seq: Sequence, reason: FinishReason, kind: ErrorKind | None, message: str) -> None:
        """End a sequence that is not in flight: free its lane, write the final event, retain it."""
        rt = self.runtimes.get(seq.generation)
        if seq.lane is not None and rt is not None and rt.kv is not None:
            rt.kv.release(seq.lane, seq.job_id)
            self.scheduler.lane_returned(seq.generation)
        seq.lane = None
        seq.finish(reason, kind, message)
        self.sequences.pop(seq.job_id, None)
        self.finished[seq.job_id] = seq
        while len(self.finished) > self.config.retention:
            _, old = self.finished.popitem(last=False)
            self.by_client_id.pop((old.request.model, old.request.client_request_id), None)
        if seq.internal:
            self.cond.notify_all()
            return
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.counters.completed += 1
        elif reason is FinishReason.CANCELLED:
            self.counters.cancelled += 1
        else:
            self.counters.failed += 1
        self.cond.notify_all()

    def _expire_locked(self) -> None:
        now = time.monotonic()
        for seq in self.scheduler.expire(now):
            if seq.deadline is not None and seq.deadline <= now:
                self.finish(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed in queue")
            else:
                self.counters.rejected += 1
                self.finish(seq, FinishReason.ERROR, ErrorKind.OVERLOADED, "admission deadline: no KV lane became free")
        for seq in [s for s in self.scheduler.ready.values() if s.deadline is not None and s.deadline <= now]:
            self.scheduler.forget(seq)
            self.finish(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed")
        limit = self.config.orphan_timeout_s
        if limit is not None:
            for seq in [s for s in self.sequences.values() if not s.internal and not s.cancel_requested]:
                if seq.log.detached_for(now) >= limit:
                    log.info("cancelling job %s: no Wait attached for %.0fs", seq.job_id, limit)
                    self._cancel_locked(seq, FinishReason.CANCELLED, None, "")

    def _next_wakeup(self) -> float | None:
        times = [t for t in [self.scheduler.next_deadline()] if t is not None]
        times += [s.deadline for s in self.scheduler.ready.values() if s.deadline is not None]
        limit = self.config.orphan_timeout_s
        clients = [s for s in self.sequences.values() if not s.internal and not s.cancel_requested]
        if limit is not None and clients:
            # A reader detaching does not wake this thread, so look again within one timeout: an
            # orphan is cancelled between one and two timeouts after its last Wait went away.
            now = time.monotonic()
            times += [now + limit - s.log.detached_for(now) for s in clients]
        return max(0.0, min(times) - time.monotonic()) if times else None

    # ---- the engine thread ------------------------------------------------------------------

    def _engine_loop(self) -> None:
        with self._crash_barrier("engine"):
            while True:
                with self.cond:
                    job = self._next_launch_locked()
                    if job is None:
                        return
                if self.config.synchronous:
                    self._wait_and_complete(job)

    @contextmanager
    def _crash_barrier(self, thread: str) -> Iterator[None]:
        """A bug in a device thread must not leave clients waiting forever: log it, fail every
        job, and report the board unhealthy (NOT_SERVING) so it is restarted or drained."""
        try:
            yield
        except Exception:
            log.exception("%s thread crashed; failing all jobs and marking the board unhealthy", thread)
            with self.cond:
                for job in list(self.executor.inflight):
                    self._applier.job_lost(job, f"internal error in the {thread} thread")
                    self.executor.retire(job)
                self._device_lost_locked(f"internal error in the {thread} thread")
                self.cond.notify_all()

    def _next_launch_locked(self) -> InFlight | None:
        """Sleep until a job can be launched; launch it. None when stopping."""
        while True:
            if self._stopping and not self.executor.inflight:
                return None
            self._expire_locked()
            if not self._stopping and not self.device_lost and self.executor.has_slot():
                # Draining refuses new Submits only; requests already accepted still run.
                decoding = Counter(j.generation for j in self.executor.inflight if j.plan.task is TaskType.DECODE)
                plan = self.scheduler.plan(self._admissible_runtimes(), decoding)
                while self.scheduler.orphans:
                    orphan = self.scheduler.orphans.pop()
                    self.finish(orphan, FinishReason.ERROR, ErrorKind.UNAVAILABLE, "model generation retired")
                if plan is not None:
                    job = self._launch_locked(plan)
                    if job is not None:
                        return job
                    continue
            self.cond.wait(self._next_wakeup())

    def _admissible_runtimes(self) -> dict[int, ModelRuntime]:
        return {g: rt for g, rt in self.runtimes.items() if rt.kv is not None}

    def _launch_locked(self, plan: JobPlan) -> InFlight | None:
        rt = plan.runtime
        assert rt.kv is not None
        targets: list[tuple[int, int]] = []
        for seq in plan.seqs:
            if plan.task is TaskType.PREFILL:
                self._take_lane(seq, rt)
                assert seq.lane is not None
                targets.append((seq.lane, len(seq.prefill_tokens)))
                seq.lifecycle.move(SeqState.PREFILL)
            else:
                assert seq.lane is not None
                targets.append((seq.lane, seq.kv_len_when_ready + 1))
                seq.lifecycle.move(SeqState.DECODE)
        try:
            job = self.executor.launch(plan, targets)
        except DeviceLost as exc:
            self._device_lost_locked(str(exc))
            return None
        except (DeviceError, CalculetError) as exc:
            self._launch_failed_locked(plan, exc)
            return None
        if job is None:
            # No free context although a bank is free: only possible while a faulted pool is
            # being rebuilt. Put everything back and wait for the next completion or change.
            self._unlaunch_locked(plan)
            log.error("no free job context for %s; waiting for a completion", plan.submodel.name)
            self.cond.wait(1.0)
            return None
        if plan.task is TaskType.DECODE:  # batch fill: decode_rows / decode_jobs
            self.counters.decode_jobs += 1
            self.counters.decode_rows += len(plan.seqs)
        self.cond.notify_all()
        return job

    def _take_lane(self, seq: Sequence, rt: ModelRuntime) -> None:
        assert rt.kv is not None
        if seq.state is SeqState.RECOVER and seq.lane is not None:
            rt.kv.rebuild(seq.lane, seq.job_id)
            return
        handle = rt.kv.assign(seq.job_id)
        assert handle is not None, "scheduler admitted a sequence without a free lane"
        seq.lane = handle.lane
        seq.t_admit = time.monotonic()
        self.scheduler.lane_taken(seq.generation)

    def _unlaunch_locked(self, plan: JobPlan) -> None:
        rt = plan.runtime
        for seq in plan.seqs:
            if plan.task is TaskType.PREFILL:
                assert rt.kv is not None and seq.lane is not None
                rt.kv.mark_unknown(seq.lane)  # the re-prefill path rebuilds it from scratch
                seq.lifecycle.move(SeqState.RECOVER)
                self.scheduler.mark_recover(seq)
            else:
                seq.lifecycle.move(SeqState.READY)
                self.scheduler.mark_ready(seq)

    def _launch_failed_locked(self, plan: JobPlan, exc: Exception) -> None:
        """The device refused the job (reservations already rolled back): fail its sequences."""
        log.warning("submit of %s job failed: %s", plan.task.value, exc)
        for seq in plan.seqs:
            self._applier.fail_or_recover(plan.runtime, seq, f"submit failed: {exc}", lane_lost=False)

    def _device_lost_locked(self, message: str) -> None:
        """Stop serving: fail every sequence except those of jobs still in flight, which the
        completion path fails when their job ends. A sequence in PREFILL/DECODE whose job never
        reached the executor (launch failed or crashed) is failed here too."""
        was_lost, self.device_lost = self.device_lost, True
        self.admitting = False
        if not was_lost:
            for listener in self.health_listeners:  # non-blocking by contract
                listener()
        in_flight = {s.job_id for job in self.executor.inflight for s in job.plan.seqs}
        for seq in list(self.sequences.values()):
            if seq.job_id in in_flight:
                continue
            self.scheduler.remove_waiting(seq)
            self.scheduler.forget(seq)
            self.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"device lost: {message}")

    # ---- the completion thread --------------------------------------------------------------

    def _completion_loop(self) -> None:
        with self._crash_barrier("completion"):
            while True:
                with self.cond:
                    while not self.executor.inflight and not self._stopping:
                        self.cond.wait()
                    if not self.executor.inflight:
                        return
                    job = self.executor.inflight[0]
                self._wait_and_complete(job)

    def _wait_and_complete(self, job: InFlight) -> None:
        status: JobStatus | None
        try:
            status = job.submission.wait(self.config.job_timeout_s)
        except WaitTimeout:
            status = self._reset_after_timeout(job)
        except DeviceLost as exc:
            self._job_lost(job, f"device lost: {exc}")
            return
        self._applier.apply(job, status)

    def _job_lost(self, job: InFlight, message: str) -> None:
        """The device is gone with this job: fail everything; the board stops serving."""
        with self.cond:
            self._applier.job_lost(job, message)
            self._device_lost_locked(message)
            self.executor.retire(job)
            self.cond.notify_all()

    def _reset_after_timeout(self, job: InFlight) -> JobStatus | None:
        """A job hung: reset the compute units so its buffers are released, then collect it."""
        reason = f"job {job.job_id} did not finish within {self.config.job_timeout_s}s"
        with self.cond:
            allowed = self.reset_budget.try_spend()
            if allowed:
                self.counters.resets += 1
                self.counters.last_reset_reason = reason
            self.executor.note_anomaly(reason)
        if not allowed:
            budget = self.reset_budget.view()
            message = f"{reason}; {budget.limit} automatic resets per {budget.window_s:g}s used up: needs an operator"
            log.error("%s", message)
            self._job_lost(job, message)
            return None
        log.error("%s: resetting CCU", reason)
        job.quarantine = True
        try:
            self.device.reset_ccu()
            return job.submission.wait(self.config.job_timeout_s)
        except (WaitTimeout, DeviceLost) as exc:
            self._job_lost(job, f"device unrecoverable after reset: {exc}")
            return None

    # ---- observation --------------------------------------------------------------------------

    def idle(self) -> bool:
        """No sequence and no device job left (the leak check tests use)."""
        with self.cond:
            return not self.sequences and not self.executor.inflight
