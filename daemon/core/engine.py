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

import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from calculet.daemon.core.completion import CompletionApplier
from calculet.daemon.core.events import EventLog, FinishReason, Retention, job_bytes
from calculet.daemon.core.executor import RESTORE_AFTER_CLEAN_JOBS, Executor, InFlight
from calculet.daemon.core.ids import new_sequence_id
from calculet.daemon.core.request import GenerationRequest, validate_request
from calculet.daemon.core.request_digest import request_digest
from calculet.daemon.core.reset_budget import (
    HALT_TRANSITIONS,
    BoardHalt,
    ResetBudget,
    ResetCounts,
    ResetGate,
    ResetTally,
)
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import JobPlan, Scheduler, SchedulingPolicy
from calculet.daemon.core.sequence import SeqState, Sequence
from calculet.daemon.core.status import ResetOutcome
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost, WaitTimeout
from calculet.daemon.device.types import JobStatus, TaskType
from calculet.daemon.errors import (
    CalculetError,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    FailedPrecondition,
    NotFound,
    Overloaded,
    Unavailable,
)
from calculet.daemon.lifecycle import Lifecycle

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
        restore_after_clean_jobs: consecutive clean completions after which an in-flight limit
            degraded by an anomaly comes back (0 = only a successful operator reset restores it).
        orphan_timeout_s: a job with no Wait stream attached for this long is cancelled, so a client
            that submits and disappears cannot hold a lane forever (None = never).
        retention_bytes / retention_s: finished jobs are kept for re-attaching `Wait` calls and
            idempotent Submit retries while their estimated bytes (`events.job_bytes`) fit and for
            at most this many seconds after their Final; the oldest go first.
    """

    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    max_inflight: int = 2
    synchronous: bool = False
    job_timeout_s: float = 30.0
    max_recoveries: int = 3
    retention_bytes: int = 256 * 1024 * 1024
    retention_s: float = 600.0
    reset_limit: int = 3
    reset_window_s: float = 600.0
    restore_after_clean_jobs: int = RESTORE_AFTER_CLEAN_JOBS
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
    last_reset: ResetOutcome | None = None  # set when a reset ends, automatic or operator


class Engine:
    """Owns the scheduler, the executor and every sequence of one device."""

    def __init__(self, device: VirtualDevice, config: EngineConfig) -> None:
        self.device = device
        self.config = config
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.scheduler = Scheduler(config.policy)
        self.executor = Executor(
            device, 1 if config.synchronous else config.max_inflight, config.restore_after_clean_jobs
        )
        self.counters = EngineCounters()
        self.reset_budget = ResetBudget(config.reset_limit, config.reset_window_s)
        self.reset_gate = ResetGate()
        self.halt: Lifecycle[BoardHalt] = Lifecycle("board halt", BoardHalt.NONE, HALT_TRANSITIONS)
        self.abandoned: list[InFlight] = []  # given up at a halt while the device still held them
        self._admitting_before_halt = True
        self.runtimes: dict[int, ModelRuntime] = {}  # generations whose jobs may run
        self.aliases: dict[str, ModelRuntime] = {}  # published alias -> serving generation
        self.known_aliases: set[str] = set()  # ever published here: unloaded ones are UNAVAILABLE
        self.sequences: dict[str, Sequence] = {}  # live sequences
        # Finished sequences kept for Wait and Submit retries (bytes and age bounded).
        self.finished: Retention[Sequence] = Retention(config.retention_bytes, config.retention_s)
        # client_request_id -> (job id, request digest), for live and retained jobs alike.
        self.by_client_id: dict[str, tuple[str, bytes]] = {}
        self.admitting = True
        self.device_lost = False
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

    def stop(self, timeout: float | None = None) -> bool:
        """Tell both threads to stop once no device job is in flight (buffers are never abandoned
        mid-DMA) and wait up to `timeout` seconds for them (None: the job timeout + 5).

        Returns:
            Whether both ended. A thread still waiting for a hung device job is left to the device's
            `close`, which ends that wait; the threads are daemons, so they never hold the process.
        """
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        deadline = time.monotonic() + (self.config.job_timeout_s + 5 if timeout is None else timeout)
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        return not self._threads

    def end_unfinished(self, reason: str) -> int:
        """Shutdown: end every unfinished job now with an in-band Final ERROR / UNAVAILABLE, which
        tells a gateway to resume it on another board with resume_tokens, without waiting for device
        jobs (a hung one would hold its Final for the whole job timeout).

        A sequence not in a device job finishes as in `cancel_generation`. One in a device job gets
        its Final written now but stays owned by that job's `InFlight` record: the job's completion,
        if the device ever delivers it, ends the sequence with the same error (its log keeps the
        first Final) and gives its lane and buffers back.

        Returns:
            How many jobs it ended (warm-up probes included); 0 when called again.
        """
        with self.cond:
            seqs = [s for s in self.sequences.values() if not s.log.finished]
            for seq in seqs:
                self._cancel_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, reason)
                if seq.state is not SeqState.DONE:  # in a device job: its client hears now all the same
                    seq.log.finish(FinishReason.ERROR, seq.usage(), seq.timings(), ErrorKind.UNAVAILABLE, reason)
            self.cond.notify_all()
            return len(seqs)

    def wait_device_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no device job is in flight. Returns whether none is."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.executor.inflight, timeout)

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
            tally = self.reset_gate.tally or ResetTally()  # the running operator reset's record of its hits
            for job in self.executor.inflight:  # a job done on the device but not yet applied too
                if job.generation == rt.generation:
                    job.kv_lost = True
                    tally.add(job.plan.seqs)
            for seq in [s for s in self.scheduler.ready.values() if s.generation == rt.generation]:
                tally.add((seq,))
                self.scheduler.forget(seq)
                assert seq.lane is not None
                rt.kv.mark_unknown(seq.lane)
                self._applier.fail_or_recover(rt, seq, reason, lane_lost=True)
            self.cond.notify_all()

    # ---- operator resets (DeviceCore.operator_reset drives them) -------------------------------

    def begin_operator_reset(self, kind: str, reason: str) -> ResetTally:
        """Take the reset gate for an operator reset and count it. Returns the tally the reset
        records the jobs it hits in; `end_reset` gives the gate back.

        Raises:
            FailedPrecondition: another reset is in progress (nothing changed).
        """
        tally = ResetTally()
        with self.cond:
            if not self.reset_gate.try_begin(f"operator {kind} reset", tally):
                raise FailedPrecondition(f"reset in progress ({self.reset_gate.holder}): try again once it has ended")
            self.counters.resets += 1
            self.counters.last_reset_reason = f"operator {kind} reset: {reason}"
        return tally

    def note_reset_outcome(self, kind: str, ok: bool) -> None:
        """Record how the reset that just ended went (Status: ResetSummary.last_kind/at/ok)."""
        with self.cond:
            self.counters.last_reset = ResetOutcome(kind, time.time(), ok)

    def end_reset(self) -> None:
        with self.cond:
            self.reset_gate.end()
            self.cond.notify_all()

    def operator_reset_ccu(self) -> None:
        """Reset the compute units: every job on the device ends as a CCU exception that is the
        reset's doing, not a device anomaly, and its sequences re-prefill. Under the engine lock, so
        the jobs it ended are marked (and recorded in the running reset's tally) before the
        completion thread applies them, and no job starts in between.

        Raises:
            DeviceError: the device failed the reset (nothing is marked).
        """
        with self.cond:
            self.device.reset_ccu()
            tally = self.reset_gate.tally or ResetTally()
            for job in self.executor.inflight:
                if job.kv_lost or _status(job) is JobStatus.CCU_EXCEPTION:  # not one that had finished
                    job.reset_hit = True
                    tally.add(job.plan.seqs)
            self.cond.notify_all()

    def operator_reset_succeeded(self) -> CalculetError | None:
        """After a successful operator reset: lift a halt for a used-up budget (once the jobs given
        up then have ended on the device), clear the automatic reset budget, restore the in-flight
        limit.

        Returns:
            Why the board still cannot serve (a given-up job still held by the device, or a halt
            only a restart lifts), or None.
        """
        with self.cond:
            if self.halt.state is BoardHalt.LOST:
                return Unavailable("the board stopped serving for good (device lost or a thread failed): restart it")
            if self.halt.state is BoardHalt.AWAITING_OPERATOR:
                held = [j for j in self.abandoned if not _status(j).finished]
                if held:
                    return FailedPrecondition(
                        f"device job {held[0].job_id} (generation {held[0].generation}) still hangs after this "
                        "reset: reset the CCU or that model's configuration"
                    )
                for job in self.abandoned:
                    self._applier.end_abandoned(job)
                self.abandoned.clear()
                self.halt.move(BoardHalt.NONE)
                self.device_lost = False
                self.admitting = self._admitting_before_halt
            self.reset_budget.clear()
            self.executor.restore_limit("operator reset")
            self.cond.notify_all()
            return None

    def wait_reset_settled(self, tally: ResetTally, timeout: float) -> ResetCounts:
        """Wait up to `timeout` seconds until every job the reset hit rebuilt its KV or ended; count."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not tally.settled() and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)
            return tally.counts()

    # ---- requests -------------------------------------------------------------------------

    def submit(
        self,
        req: GenerationRequest,
        runtime: ModelRuntime | None = None,
        *,
        capture_logits: bool = False,
        seed_given: bool = True,
    ) -> tuple[str, bool]:
        """`submit_sequence`, returning (job id, deduplicated)."""
        seq, deduplicated = self.submit_sequence(req, runtime, capture_logits=capture_logits, seed_given=seed_given)
        return seq.job_id, deduplicated

    def submit_sequence(
        self,
        req: GenerationRequest,
        runtime: ModelRuntime | None = None,
        *,
        capture_logits: bool = False,
        seed_given: bool = True,
    ) -> tuple[Sequence, bool]:
        """Validate and queue a request.

        Args:
            req: the request.
            runtime: serve on this generation instead of the alias's (warm-up probes).
            capture_logits: keep the first step's logits on the sequence (golden check).
            seed_given: the caller chose `req.sampling.seed` (False: it was drawn for this Submit, so
                an identical retry carries another one and is still the same request).

        Returns:
            (its sequence, deduplicated): a repeated client_request_id with an identical request
            returns the first job's while it is live or retained. The sequence, not its id: a job
            may finish and leave retention before the caller could look it up again.

        Raises:
            FailedPrecondition: the client_request_id belongs to a job with a different request.
            NotFound: unknown model alias.
            Unavailable: the model is not serving or the board is draining/unhealthy.
            InvalidArgument: the request does not fit the model.
            Overloaded: the admission queue is full.
            DeadlineExceeded: the request's deadline passed before it could be queued.
        """
        # O(prompt): outside the lock. Keyed by the client's id alone for now; once access planes give
        # callers an identity, the key becomes (caller identity, client_request_id) so one caller can
        # neither find nor block another's jobs.
        digest = request_digest(req, seed_given=seed_given) if req.client_request_id else b""
        with self.cond:
            if req.client_request_id and (first := self._deduplicate_locked(req.client_request_id, digest)):
                return first, True
            rt = self._admitting_runtime_locked(req.model, runtime)
        # O(prompt) work outside the lock, on a sequence nobody else can see yet: validation (the
        # transport has usually done it already) and the penalties' token history.
        validate_request(req, rt.limits)
        seq = Sequence(new_sequence_id(), req, rt.generation, rt.eos_ids)
        seq.capture_logits = capture_logits
        seq.internal = runtime is not None
        self._applier.attach_history(seq, rt)
        job_id = seq.job_id
        with self.cond:
            if req.client_request_id and (first := self._deduplicate_locked(req.client_request_id, digest)):
                return first, True  # an identical Submit won the race while this one was prepared
            if self._admitting_runtime_locked(req.model, runtime) is not rt:
                raise Unavailable(f"model {req.model!r} changed generation while the request was prepared; retry")
            try:
                self.scheduler.enqueue(seq)
            except Overloaded:
                if seq.deadline is not None and seq.deadline <= time.monotonic():
                    # Not a capacity refusal: retrying elsewhere (what OVERLOADED invites) cannot help.
                    raise DeadlineExceeded(
                        f"deadline of {req.deadline_s}s passed before the request was queued"
                    ) from None
                raise  # counted in `rejected` by the transport, with every other refused Submit
            self.sequences[job_id] = seq
            if req.client_request_id:
                self.by_client_id[req.client_request_id] = (job_id, digest)
            if runtime is None:  # warm-up probes are not client requests
                self.counters.submitted += 1
            self.cond.notify_all()
            return seq, False

    def _admitting_runtime_locked(self, alias: str, runtime: ModelRuntime | None) -> ModelRuntime:
        """The generation a new request of `alias` would run on (`runtime` for warm-up probes).

        Raises:
            NotFound / Unavailable: unknown alias, model not serving, device lost, board draining.
        """
        rt = runtime or self._serving(alias)
        if self.device_lost:  # warm-up probes too: nothing would ever run them
            raise self._halted_error_locked()
        assert rt.model is not None
        if runtime is None and not self.admitting:
            raise Unavailable("board is draining: not admitting new requests")
        return rt

    def _deduplicate_locked(self, client_id: str, digest: bytes) -> Sequence | None:
        """The job an earlier Submit with this client_request_id started, while it is live or retained.

        Raises:
            FailedPrecondition: that job's request differs from the one with `digest`.
        """
        self._expire_retained_locked()
        known = self.by_client_id.get(client_id)
        if known is None:
            return None
        job_id, first = known
        if not hmac.compare_digest(first, digest):
            # Neither the job id nor anything else about the first request is revealed.
            raise FailedPrecondition("client_request_id: already used for a different request; use a new id")
        seq = self.sequences.get(job_id) or self.finished.get(job_id)
        assert seq is not None, "by_client_id names only live and retained jobs"
        return seq

    def count_rejected(self) -> None:
        """Count one refused Submit (any error kind; the transport calls it for every refusal)."""
        with self.cond:
            self.counters.rejected += 1

    def event_log(self, job_id: str, *, for_wait: bool = False) -> EventLog:
        """The job's event log.

        Raises:
            NotFound: unknown (or expired) job id.
            Cancelled: `for_wait` and its owner cancelled the job before this call (a Wait already
                streaming when the cancel comes ends with a CANCELLED final event instead).
        """
        with self.cond:
            seq = self._job_locked(job_id)
            if seq is None:
                raise NotFound(f"unknown job id {job_id!r}")
            if for_wait and seq.cancel_requested and seq.pending_error is None:
                raise Cancelled(f"job {job_id} was cancelled")
            return seq.log

    def cancel(self, job_id: str) -> bool:
        """Cancel a job. Returns False if it had already finished.

        Raises:
            NotFound: unknown (or expired) job id.
        """
        with self.cond:
            seq = self._job_locked(job_id)
            if seq is None:
                raise NotFound(f"unknown job id {job_id!r}")
            if job_id not in self.sequences:
                return False
            self._cancel_locked(seq, FinishReason.CANCELLED, None, "")
            self.cond.notify_all()
            return True

    def sequence(self, job_id: str) -> Sequence | None:
        with self.cond:
            return self._job_locked(job_id)

    # ---- internals: the job table -------------------------------------------------------------

    def _job_locked(self, job_id: str) -> Sequence | None:
        """A live job, or a finished one still retained (those past the retention age go first)."""
        self._expire_retained_locked()
        return self.sequences.get(job_id) or self.finished.get(job_id)

    def _retain_locked(self, seq: Sequence) -> None:
        """Keep a finished sequence for Wait and Submit retries, within the retention bounds."""
        seq.history = None  # only sampling reads it, and it costs ~100 B per distinct token
        inputs = len(seq.request.prompt_tokens) + len(seq.request.resume_tokens)
        logits = seq.first_logits.nbytes if seq.first_logits is not None else 0  # warm-up probes: a vocab row
        self._forget_locked(self.finished.add(seq.job_id, seq, job_bytes(seq.log, inputs) + logits))

    def _expire_retained_locked(self) -> None:
        self._forget_locked(self.finished.expire())

    def _forget_locked(self, evicted: list[Sequence]) -> None:
        """Evicted jobs' ids answer NOT_FOUND from now on; their client_request_ids are free again."""
        for old in evicted:
            key = old.request.client_request_id
            if key and self.by_client_id.get(key, ("", b""))[0] == old.job_id:
                del self.by_client_id[key]

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
            raise self._halted_error_locked()
        return rt

    def _halted_error_locked(self) -> Unavailable:
        """Why a halted board refuses work: waiting for an operator, or lost until a restart."""
        if self.halt.state is BoardHalt.AWAITING_OPERATOR:
            return Unavailable("automatic reset budget used up: the board waits for an operator reset")
        return Unavailable("device lost: board is not serving")

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
        if self.sequences.pop(seq.job_id, None) is not None:  # not when finishing twice
            self._retain_locked(seq)
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
        self._expire_retained_locked()  # frees retained memory whenever the engine wakes anyway
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

    def _device_lost_locked(self, message: str, halt: BoardHalt = BoardHalt.LOST) -> None:
        """Stop serving: fail every sequence except those of jobs still in flight, which the
        completion path fails when their job ends. A sequence in PREFILL/DECODE whose job never
        reached the executor (launch failed or crashed) is failed here too. `halt` says whether an
        operator reset may lift it (AWAITING_OPERATOR) or only a restart (LOST)."""
        was_lost, self.device_lost = self.device_lost, True
        if self.halt.state is BoardHalt.NONE:
            self._admitting_before_halt = self.admitting
        if self.halt.can_move(halt):
            self.halt.move(halt)
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

    def _job_lost(self, job: InFlight, message: str, halt: BoardHalt = BoardHalt.LOST) -> None:
        """The device is gone with this job, or no reset may collect it: fail everything; the board
        stops serving. With AWAITING_OPERATOR the device still holds the job: it is kept in
        `abandoned` until an operator reset ends it."""
        with self.cond:
            self._applier.job_lost(job, message)
            self._device_lost_locked(message, halt)
            self.executor.retire(job)
            if halt is BoardHalt.AWAITING_OPERATOR:
                self.abandoned.append(job)
            self.cond.notify_all()

    def _reset_after_timeout(self, job: InFlight) -> JobStatus | None:
        """A job hung: reset the compute units so its buffers are released, then collect it."""
        reason = f"job {job.job_id} did not finish within {self.config.job_timeout_s}s"
        with self.cond:
            allowed = self.reset_budget.try_spend()
            if allowed:
                self.counters.resets += 1
                self.counters.last_reset_reason = reason
                for other in self.executor.inflight:  # the hang is the anomaly, not the CCU exceptions it causes
                    other.reset_hit = True
            self.executor.note_anomaly(reason)
            # Operators are refused while it runs; it never waits for an operator's reset to end.
            gated = allowed and self.reset_gate.try_begin("automatic ccu reset")
        if not allowed:
            budget = self.reset_budget.view()
            message = f"{reason}; {budget.limit} automatic resets per {budget.window_s:g}s used up: needs an operator"
            log.error("%s", message)
            self._job_lost(job, message, BoardHalt.AWAITING_OPERATOR)
            return None
        log.error("%s: resetting CCU", reason)
        job.quarantine = True
        try:
            self.device.reset_ccu()
            status = job.submission.wait(self.config.job_timeout_s)
            self.note_reset_outcome("ccu", True)
            return status
        except (WaitTimeout, DeviceLost) as exc:
            self.note_reset_outcome("ccu", False)
            self._job_lost(job, f"device unrecoverable after reset: {exc}")
            return None
        finally:
            if gated:
                self.end_reset()

    # ---- observation --------------------------------------------------------------------------

    def idle(self) -> bool:
        """No sequence and no device job left (the leak check tests use)."""
        with self.cond:
            return not self.sequences and not self.executor.inflight


def _status(job: InFlight) -> JobStatus:
    """A job's device status now; RUNNING when the device cannot say (lost)."""
    try:
        return job.submission.status()
    except DeviceError:
        return JobStatus.RUNNING
