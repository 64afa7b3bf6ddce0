"""The engine: every client job, the scheduler, the device jobs and the model generations of one
board, behind one lock (docs/daemon.md).

State and its owner (all private; other modules call methods that return copies or frozen views):

    client jobs (live + retained)   `JobTable`          engine lock
    model generations, aliases      `GenerationTable`   engine lock
    waiting/ready sets, lane use    `Scheduler` (+ each generation's `KVManager`)   engine lock
    device jobs, banks, limit       `Executor`          engine lock (its `submit` runs without it)
    lanes to close on the device    `LaneCloses`        engine lock (closed without it)
    counters, admitting (drain)     the engine          engine lock
    resets, halts, reset budget,    `ResetController`   engine lock, lent to it (`resets/controller.py`)
    gate
    the board's audit trail         `BoardAudit`        its own lock (`DeviceCore`'s, lent: `audit.py`)
    device utilisation              `UtilizationTracker` engine lock (fed by each completion)

How jobs are queued, moved out of device jobs and ended is the engine's `Bookkeeper`
(`bookkeeping.py`), which acts on these components under the lock and holds no state of its own.

The lock is `_cond`'s. It is held only for bookkeeping: no device call runs under it (submits, lane
opens and closes, resets, status queries and buffer-pool rebuilds all run outside it), so Health,
Status and Submit never wait behind the device.

Threads:
- callers (gRPC handlers, the ModelManager) call the public methods; each takes the lock briefly;
- the **engine thread** sleeps on the condition until there is work, a free bank and no launch held
  by the completion thread, takes a plan
  from the scheduler (which hands over the sequences with their lanes), has the executor prepare
  it under the lock, then fills and submits it *outside* the lock and records it as started. With
  the serial policy (one device job at a time, the baseline) it also waits for that job at once;
- the **completion thread** waits (outside the lock) for the oldest submitted device job, samples
  its logits outside the lock (overlapping the other bank's device work), then under the lock
  `completion.settle` decides what the job means and the engine applies it. With
  `launch_from_completion` (the default) it then plans, prepares and submits the next device job
  itself, as the engine thread would: with one decode cohort that job waits on these tokens, and
  this thread's core is awake, where waking the engine thread costs a hand-off and a core that
  slept through the step (`bench/step_gap.py --launch` measures it). One launch
  runs at a time, whichever thread holds it (`_submitting`), so the device takes jobs in the order
  they were prepared. The Wait streams' wake-ups of that settlement are held until the next device
  job is submitted (or none was to be), so the gRPC loop streaming the tokens does not contend for
  the GIL with that submit while the device waits (`_complete`, `_release_wakeups_locked`). A job
  that hangs or a device that is lost goes to the reset controller (`after_timeout`, `job_lost`).
The reset controller holds launches (no job is being submitted) while the device resets, then marks
what the reset hit; it reaches the engine's bookkeeping only through the `ResetHost` the engine hands
it. Nothing polls: every wait is on the condition, an event log listener, or the device's wait.

Telemetry: where something happens (queued, refused, device job started/done, finished, reset, fault)
the engine emits an event to its `ObserverHub` (a queue put, also under the lock; `observer_records`
builds them); the hub's thread calls the observers (`observe/observer.py`), never an engine thread. With no
observer no event is built.

A sequence in WAITING/READY/RECOVER belongs to the scheduler; one in PREFILL/DECODE belongs to the
`DeviceJob` carrying it until its settlement is applied; a DONE one is retained in the job table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from calculet.common.errors import CalculetError, Cancelled, ErrorKind, NotFound, Unavailable
from calculet.daemon.core import completion, expiry
from calculet.daemon.core.audit import BoardAudit
from calculet.daemon.core.bookkeeping import Bookkeeper, EngineCounters
from calculet.daemon.core.client_job import ClientJob, ProbeShape, SeqState
from calculet.daemon.core.completion import BoardFacts
from calculet.daemon.core.engine_types import EngineConfig, ProbeOutcome, SubmitReceipt
from calculet.daemon.core.events import (
    EventLog,
    FinalEvent,
    FinishReason,
    Listener,
    call_listeners,
    deferred_listeners,
    wait_finished,
)
from calculet.daemon.core.executor import DeviceJob, Executor, PoolUpkeep
from calculet.daemon.core.generation_ops import GenerationOps
from calculet.daemon.core.generations import GenerationTable
from calculet.daemon.core.heartbeat import Heartbeat
from calculet.daemon.core.ids import new_sequence_id
from calculet.daemon.core.job_table import JobTable
from calculet.daemon.core.lane_closes import LaneClose, LaneCloses, close_lanes
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.observe import observer_records
from calculet.daemon.core.observe.observer import (
    DeviceJobDone,
    DeviceJobStarted,
    EngineObserver,
    ObserverHub,
    ResetRecorded,
)
from calculet.daemon.core.observe.snapshot import CounterView, EngineSnapshot
from calculet.daemon.core.observe.snapshot_parts import generation_view, job_view, pool_view
from calculet.daemon.core.request import CheckedRequest, GenerationRequest, servable
from calculet.daemon.core.request_digest import request_digest
from calculet.daemon.core.resets.controller import ResetController
from calculet.daemon.core.resets.escalation_watch import Escalation, EscalationWatch
from calculet.daemon.core.resets.host import ResetHost
from calculet.daemon.core.resets.submit_streak import SubmitErrorStreak, escalation_reason
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import JobPlan, Scheduler
from calculet.daemon.core.utilization import UtilizationTracker
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost, OutOfKV, StaleKV, WaitTimeout
from calculet.daemon.device.types import EngineSlot, JobStatus, JobTimestamps, TaskType
from calculet.daemon.os_threads import named
from calculet.daemon.sampling.history import TokenHistory
from calculet.daemon.sampling.thinking import ThinkingTracker

log = logging.getLogger(__name__)


class Engine:
    """Owns the client jobs, the scheduler, the executor and the model generations of one device, and
    the board's `ResetController`, which shares its lock.

    Args:
        device: the opened board (the engine calls it, never under its lock).
        config: engine settings.
        audit: the board's audit trail (`DeviceCore`'s; None: an in-memory one of the engine's own).
    """

    def __init__(self, device: VirtualDevice, config: EngineConfig, audit: BoardAudit | None = None) -> None:
        self._device = device
        self._audit = BoardAudit() if audit is None else audit
        self._config = config
        self._cond = threading.Condition(threading.Lock())
        self._scheduler = Scheduler(config.policy)
        self._executor = Executor(
            device, 1 if config.synchronous else config.max_inflight, config.restore_after_clean_jobs
        )
        self._generations = GenerationTable()
        self._jobs = JobTable(config.retention_bytes, config.retention_s)
        self._counters = EngineCounters()
        self._observers = ObserverHub()  # telemetry: events delivered on the hub's own thread
        self._lane_closes = LaneCloses()  # lanes to close on the device (KV Free), outside the lock
        self._book = Bookkeeper(
            config,
            scheduler=self._scheduler,
            jobs=self._jobs,
            generations=self._generations,
            executor=self._executor,
            lane_closes=self._lane_closes,
            counters=self._counters,
            observers=self._observers,
            halted=lambda: self._resets.halted,
            notify=lambda: self._cond.notify_all(),
        )
        book = self._book
        self._generation_ops = GenerationOps(self._cond, self._generations, self._jobs, book, self._executor)
        host = ResetHost(
            drop_parked=book.drop_parked,
            give_up_job=book.give_up_job,
            fail_unplaced=book.fail_unplaced,
            serving_generations=book.serving_generations,
            generation_count=lambda: len(self._generations.all()),
            configured=book.configured,
            configuration_lost=book.configuration_lost,
            job_generation_runs=lambda job: self._generations.running(job.generation) is job.plan.runtime,
            run_upkeep=self._run_upkeep,
        )
        self._resets = ResetController(self._cond, device, self._executor, host, self._observers, config, self._audit)
        self._audit.on_record(lambda entry: self._observers.emit(ResetRecorded(entry)))  # metrics and logs
        # The operator's drain (stop_admitting until resume), kept apart from halts so a drain or
        # resume issued while the board is halted still holds when the halt lifts.
        self._draining = False
        self._drain_reason = ""  # set when the engine drained the board itself (a submit-error streak)
        self._submit_streak = SubmitErrorStreak(config.submit_error_streak)
        self._escalation_watch = EscalationWatch(
            config.ccu_escalation, config.nan_escalation, config.escalation_window_s
        )
        self._escalate: Callable[[Escalation], None] | None = None  # the Escalator's, non-blocking
        self._stopping = False
        self._crashed = False  # a device thread crashed: only a process restart brings the board back
        # Wait-stream wake-ups of a settled job, held for the engine thread to call once it has submitted
        # the next device job (or found none): `_complete`, `_release_wakeups_locked`.
        self._held_wakeups: list[Listener] = []
        self._submitting = False  # a thread (engine or completion) holds a prepared job not yet handed over
        self._threads: list[threading.Thread] = []
        self._heartbeat = Heartbeat()  # listeners called from the engine thread's loop
        self._utilization = UtilizationTracker(self._executor.engine_slots, time.monotonic())

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def engine_slots(self) -> tuple[EngineSlot, ...]:
        """The device banks jobs are submitted to (a generation's buffer pool has contexts per bank)."""
        return self._executor.engine_slots

    @property
    def generations(self) -> GenerationOps:
        """The engine's generation operations (`generation_ops.py`), for the model manager and the
        reset controller's callers. They share the engine lock; each method takes it itself."""
        return self._generation_ops

    @property
    def resets(self) -> ResetController:
        """The board's reset controller: operator resets (`resets/operator.py`), the reset budget. It
        shares the engine lock; its public methods take it themselves."""
        return self._resets

    @property
    def audit(self) -> BoardAudit:
        """The board's audit trail (its own lock; `core/audit.py`)."""
        return self._audit

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        names = [("calculet-engine", self._engine_loop)]
        if not self._config.synchronous:
            names.append(("calculet-completion", self._completion_loop))
        for name, target in names:
            thread = threading.Thread(target=named(name, target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float | None = None) -> bool:
        """Tell both threads to stop once no device job is in flight (buffers are never abandoned
        mid-DMA) and wait up to `timeout` seconds for them (None: the job timeout + 5).

        Returns:
            Whether both ended. A thread still waiting for a hung device job is left to the device's
            `close`, which ends that wait; the threads are daemons, so they never hold the process.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + (self._config.job_timeout_s + 5 if timeout is None else timeout)
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        if not self._threads:
            self._observers.close()  # after delivering what the threads emitted
        return not self._threads

    def end_unfinished(self, reason: str) -> int:
        """Shutdown: end every unfinished job now with an in-band Final ERROR / UNAVAILABLE, which
        tells a gateway to resume it on another board with resume_tokens, without waiting for device
        jobs (a hung one would hold its Final for the whole job timeout).

        A sequence not in a device job finishes as in `cancel_generation`. One in a device job gets
        its Final written now but stays owned by that `DeviceJob`: the job's completion, if the
        device ever delivers it, ends the sequence with the same error (its log keeps the first
        Final) and gives its lane and buffers back.

        Returns:
            How many jobs it ended (warm-up probes included); 0 when called again.
        """
        with self._cond:
            ended = self._end_unfinished_locked(reason)
            self._cond.notify_all()
            return ended

    def _end_unfinished_locked(self, reason: str) -> int:
        seqs = [s for s in self._jobs if not s.log.finished]
        for seq in seqs:
            self._book.cancel(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, reason)
            if seq.state is not SeqState.DONE:  # in a device job: its client hears now all the same
                seq.log.finish(FinishReason.ERROR, seq.usage(), seq.timings(), ErrorKind.UNAVAILABLE, reason)
        return len(seqs)

    def wait_device_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no device job is in flight. Returns whether none is."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._executor, timeout)

    @property
    def _admitting(self) -> bool:
        """New client Submits are taken: no operator drain and no halt."""
        return not self._draining and not self._resets.halted

    def stop_admitting(self) -> int:
        """Refuse new Submits (drain); jobs already accepted still run. Issued during a halt, the
        drain still holds after an operator reset lifts the halt. Returns how many jobs are left."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            return len(self._jobs)

    def resume(self) -> bool:
        """End an operator drain. A halted board admits again only once its halt lifts. Returns
        whether it was not admitting."""
        with self._cond:
            was = not self._admitting
            self._draining, self._drain_reason = False, ""
            self._submit_streak.clear()
            self._cond.notify_all()
            return was

    def wait_drained(self, timeout: float) -> int:
        """Wait up to `timeout` seconds until no job is left. Returns how many are left."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._jobs) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return len(self._jobs)

    def add_health_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (from an engine thread; it must not block) when the board stops serving
        on its own: device lost, automatic reset budget used up, a crashed device thread."""
        with self._cond:
            self._resets.add_halt_listener_locked(listener)

    def add_heartbeat_listener(self, listener: Callable[[], None], interval_s: float) -> None:
        """Call `listener()` from the engine thread's own loop at least every `interval_s` seconds
        (a service watchdog): a wedged engine thread stops calling it. It must not block.

        Raises:
            InvalidArgument: `interval_s` is not a positive number of seconds.
        """
        with self._cond:
            self._heartbeat.add(listener, interval_s)
            self._cond.notify_all()

    def clear_health_listeners(self) -> None:
        with self._cond:
            self._resets.clear_halt_listeners_locked()

    @property
    def crashed(self) -> bool:
        """A device thread crashed (the board is LOST for good: no device reset restarts the thread)."""
        with self._cond:
            return self._crashed

    def set_escalation_handler(self, handler: Callable[[Escalation], None]) -> None:
        """Hand every escalation the watch decides to `handler` (the `Escalator`'s `request`; called
        from the completion thread without the lock; it must not block)."""
        with self._cond:
            self._escalate = handler

    def forget_escalations(self, generation: int) -> None:
        """A quarantined generation was decided: count its faults afresh."""
        with self._cond:
            self._escalation_watch.forget(generation)

    def add_observer(self, observer: EngineObserver) -> None:
        """Deliver the engine's events from now on to `observer`, on the hub's thread (`observe/observer.py`)."""
        self._observers.add(observer)

    def flush_observers(self, timeout: float) -> bool:
        """Wait until the events emitted so far were delivered. Returns whether they were in time."""
        return self._observers.flush(timeout)

    # ---- client jobs ------------------------------------------------------------------------

    def submit(self, req: GenerationRequest | CheckedRequest, *, seed_given: bool = True) -> SubmitReceipt:
        """Validate and queue a request. Never waits on the device.

        Args:
            req: the request (checked already by `request.prevalidate`, or not).
            seed_given: the caller chose `req.sampling.seed` (False: it was drawn for this Submit, so
                an identical retry carries another one and is still the same request).

        Returns:
            The receipt; a repeated client_request_id with an identical request returns the first
            job's while it is live or retained (`deduplicated`).

        Raises:
            FailedPrecondition: the client_request_id belongs to a job with a different request.
            NotFound: unknown model alias.
            Unavailable: the model is not serving or the board is draining/unhealthy.
            InvalidArgument: the request does not fit the model.
            Overloaded: the admission queue is full.
            DeadlineExceeded: the request's deadline passed before it could be queued.
        """
        seq, deduplicated = self._queue(req, None, capture_logits=False, seed_given=seed_given)
        return SubmitReceipt(seq.job_id, deduplicated, seq.request.sampling.seed, seq.generation)

    def _queue(
        self,
        submitted: GenerationRequest | CheckedRequest,
        runtime: ModelRuntime | None,
        *,
        capture_logits: bool,
        seed_given: bool,
        probe: ProbeShape | None = None,
    ) -> tuple[ClientJob, bool]:
        """`submit`, returning the sequence itself (a probe waits on it even if it leaves retention at
        once). `runtime`: serve on this generation instead of the alias's (warm-up probes)."""
        req = submitted.request if isinstance(submitted, CheckedRequest) else submitted
        # O(prompt): outside the lock. Keyed by the client's id alone for now; once access planes give
        # callers an identity, the key becomes (caller identity, client_request_id) so one caller can
        # neither find nor block another's jobs.
        digest = request_digest(req, seed_given=seed_given) if req.client_request_id else b""
        with self._cond:
            if req.client_request_id and (first := self._jobs.deduplicate(req.client_request_id, digest)):
                return first, True
            try:
                rt = self._admitting_runtime_locked(req.model, runtime)
            except CalculetError as exc:
                self._book.rejected(req.model, exc.kind.value)
                raise
        # O(prompt) work outside the lock, on a sequence nobody else can see yet: validation (the
        # transport has usually done it already) and the penalties' token history (only the sampler's
        # penalties read it: without them it would cost a set and three arrays of appends per token).
        limits = rt.limits
        req = servable(submitted, limits)
        seq = ClientJob(new_sequence_id(), req, rt.generation, rt.eos_ids)
        seq.capture_logits = capture_logits
        seq.internal = runtime is not None
        seq.probe = probe if seq.internal else None
        if req.sampling.has_penalties:
            seq.history = TokenHistory(limits.vocab_size, req.prompt_tokens, seq.generated)
        answer_from = 0  # the first resumed token a constraint sees (after a think block)
        if req.sampling.thinking is not None:
            # O(prompt) scan for a block the prompt leaves open, then the resumed tokens replayed.
            seq.thinking = ThinkingTracker(req.sampling.thinking, req.prompt_tokens, seq.job_id)
            answer_from = seq.thinking.replay(req.resume_tokens)
        if req.sampling.constraint is not None:
            # Compiled once per (package, constraint) and cached (`grammar/compiler.py`); a resumed
            # request's matcher replays the answer tokens it already has (InvalidArgument if it cannot).
            seq.grammar = rt.grammar.matcher(req.sampling.constraint)
            seq.grammar.replay(req.resume_tokens[answer_from:], answer_from)
        if rt.prefix_reuse and runtime is None:
            seq.prefill_array()  # O(prompt), outside the lock: matched against parked lanes under it
        with self._cond:
            if req.client_request_id and (first := self._jobs.deduplicate(req.client_request_id, digest)):
                return first, True  # an identical Submit won the race while this one was prepared
            if self._admitting_runtime_locked(req.model, runtime) is not rt:
                raise Unavailable(f"model {req.model!r} changed generation while the request was prepared; retry")
            self._book.enqueue(seq, digest, rt)
            self._cond.notify_all()
            return seq, False

    def count_rejected(self) -> None:
        """Count one refused Submit (any error kind; the transport calls it for every refusal)."""
        with self._cond:
            self._counters.rejected += 1

    def event_log(self, job_id: str, *, for_wait: bool = False) -> EventLog:
        """The job's event log (append-only; readers follow it without the engine lock).

        Raises:
            NotFound: unknown (or expired) job id.
            Cancelled: `for_wait` and its owner cancelled the job before this call (a Wait already
                streaming when the cancel comes ends with a CANCELLED final event instead).
        """
        with self._cond:
            seq = self._jobs.get(job_id)
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
        with self._cond:
            seq = self._jobs.get(job_id)
            if seq is None:
                raise NotFound(f"unknown job id {job_id!r}")
            if not self._jobs.is_live(job_id):
                return False
            self._book.cancel(seq, FinishReason.CANCELLED, None, "")
            self._cond.notify_all()
            return True

    def job_generation(self, job_id: str) -> tuple[int, int] | None:
        """(model generation, recoveries) of a live or retained job, or None."""
        with self._cond:
            seq = self._jobs.get(job_id)
            return (seq.generation, seq.recoveries) if seq is not None else None

    def probe(
        self, req: GenerationRequest, rt: ModelRuntime, timeout: float, shape: ProbeShape | None = None
    ) -> ProbeOutcome | None:
        """Run a warm-up probe on a generation that is not published yet and wait for it (the
        golden check; `shape`: how the offset check runs it, `offset_probe.py`). Blocks the caller,
        never the engine threads.

        Returns:
            Its Final, tokens and first logits; None when it did not finish within `timeout` seconds
            (it is cancelled).

        Raises:
            As `submit`.
        """
        seq, _ = self._queue(req, rt, capture_logits=True, seed_given=True, probe=shape)
        if not wait_finished(seq.log, timeout):
            with self._cond:
                if self._jobs.is_live(seq.job_id):
                    self._book.cancel(seq, FinishReason.CANCELLED, None, "")
            return None
        with self._cond:
            final = seq.log.read(0)[-1]
            assert isinstance(final, FinalEvent)
            return ProbeOutcome(
                final, tuple(seq.generated), seq.first_logits, seq.recoveries, seq.nonfinite, seq.cached_tokens
            )

    # ---- observation --------------------------------------------------------------------------

    def snapshot(self) -> EngineSnapshot:
        """Everything Health, Status and WatchLoad report, copied in one step."""
        with self._cond:
            self._jobs.expire()
            seqs = list(self._jobs)
            now = time.monotonic()
            table, scheduler, policy = self._generations, self._scheduler, self._config.policy
            generations = tuple(generation_view(rt, seqs, table, scheduler, policy) for rt in table.all())
            resets = self._resets
            return EngineSnapshot(
                admitting=self._admitting,
                drain_reason=self._drain_reason if self._draining else "",
                device_lost=resets.halted,
                halt=resets.halt,
                halt_note=resets.halt_note,
                budget=resets.budget_locked(),
                counters=CounterView(**vars(self._counters), **vars(resets.counters_locked())),  # shallow copies
                generations=generations,
                jobs=tuple(job_view(s, now) for s in seqs),
                inflight=len(self._executor),
                inflight_limit=self._executor.limit,
                degraded_reason=self._executor.degraded_reason,
                anomalies=self._executor.anomalies,
                pool=pool_view(self._generations.all()),
                retained_jobs=self._jobs.retained_count,
                retained_bytes=self._jobs.retained_bytes,
                client_ids=self._jobs.client_ids,
                reset_history=resets.history_locked(),
                utilization=self._utilization.view(now),
            )

    def idle(self) -> bool:
        """No sequence and no device job left (the leak check tests use)."""
        with self._cond:
            return not len(self._jobs) and not self._executor

    # ---- internals: admission -------------------------------------------------------------

    def _admitting_runtime_locked(self, alias: str, runtime: ModelRuntime | None) -> ModelRuntime:
        """The generation a new request of `alias` would run on (`runtime` for warm-up probes).

        Raises:
            NotFound / Unavailable: unknown alias, model not serving, device lost, board draining.
        """
        rt = runtime or self._generations.serving_or_raise(alias)
        if self._resets.halted:  # warm-up probes too: nothing would ever run them
            raise self._resets.halted_error_locked()
        assert rt.model is not None
        if runtime is None and not self._admitting:
            if self._drain_reason:
                raise Unavailable(f"board is not serving: {self._drain_reason}")
            raise Unavailable("board is draining: not admitting new requests")
        return rt

    # ---- the engine thread ------------------------------------------------------------------

    def _engine_loop(self) -> None:
        with self._crash_barrier("engine"):
            while True:
                with self._cond:
                    job = self._next_job_locked()
                    closes = self._lanes_to_close_locked()
                if job is None:
                    close_lanes(self._device, closes)
                    return
                submitted = self._launch(job, closes)
                if submitted and self._config.synchronous:
                    self._wait_and_complete(job)

    def _lanes_to_close_locked(self) -> list[LaneClose]:
        """Evicted and dropped lanes, to close on the device before any lane is opened again."""
        self._lane_closes.collect(self._generations.all())
        return self._lane_closes.take()

    def _launch(self, job: DeviceJob, closes: list[LaneClose]) -> bool:
        """Close `closes`, then submit `job`, which this thread prepared and holds (`_submitting`);
        hand the launch back and release the held wake-ups. Returns whether the device took it."""
        close_lanes(self._device, closes)  # before any lane is opened again
        submitted = self._submit_device_job(job)
        with self._cond:
            self._submitting = False
            self._release_wakeups_locked()
            self._cond.notify_all()  # the engine thread may launch on the other bank now
        return submitted

    @contextmanager
    def _crash_barrier(self, thread: str) -> Iterator[None]:
        """A bug in a device thread must not leave clients waiting forever: log it, fail every
        job, and report the board unhealthy (NOT_SERVING) so it is restarted or drained."""
        try:
            yield
        except Exception:
            log.exception("%s thread crashed; failing all jobs and marking the board unhealthy", thread)
            with self._cond:
                self._crashed = True
                self._release_wakeups_locked()
                for job in self._executor.jobs():
                    self._book.give_up_job(job, f"internal error in the {thread} thread")
                    self._executor.retire(job)
                self._resets.halt_locked(f"internal error in the {thread} thread")
                self._cond.notify_all()

    def _next_job_locked(self) -> DeviceJob | None:
        """Sleep until a device job can be prepared; prepare it. None when stopping."""
        while True:
            self._heartbeat.beat(time.monotonic())  # rate-limited: the longest silence is one device job
            if self._stopping and not self._executor:
                self._release_wakeups_locked()
                return None
            self._book.expire()
            plan = self._plan_locked()
            if plan is not None:
                job = self._prepare_locked(plan)
                if job is not None:
                    self._submitting = True
                    return job
                continue
            self._release_wakeups_locked()  # nothing to submit now: the held wake-ups go out before the sleep
            wakeup = expiry.next_wakeup(self._scheduler, self._jobs, self._config.orphan_timeout_s)
            if (beat := self._heartbeat.interval_s) is not None:  # sleep no longer than a beat: idle, it beats
                wakeup = beat if wakeup is None else min(wakeup, beat)
            self._cond.wait(wakeup)

    def _plan_locked(self) -> JobPlan | None:
        """The scheduler's next device job, when one may launch now (no other thread holds a launch,
        a bank is free); the scheduler's orphans end on the way."""
        if not self._may_launch_locked():
            return None
        decoding = Counter(j.generation for j in self._executor.jobs() if j.plan.task is TaskType.DECODE)
        runnable = self._generations.runnable()
        serving = {
            g
            for g, rt in runnable.items()
            if rt.state in (ModelState.READY, ModelState.DRAINING) and g not in self._resets.reconfiguring
        }
        for g, rt in runnable.items():
            if g in serving:
                self._compact_locked(rt)
        plan = self._scheduler.plan(runnable, decoding, serving)
        while self._scheduler.orphans:
            orphan = self._scheduler.orphans.pop()
            self._book.finish(orphan, FinishReason.ERROR, ErrorKind.UNAVAILABLE, "model generation retired")
        return plan

    def _compact_locked(self, rt: ModelRuntime) -> None:
        """Fixed slots: move the sequences in the highest slots into the lowest free ones when the
        saved padding pays for their re-prefills (`Scheduler.compaction`). Each one's lane is freed
        (closed on the device before the next launch) and it re-prefills its prompt and generated
        tokens into the new slot, as a recovery does, without a fault: KV is never copied
        (docs/sources.md 000 §7)."""
        for seq, move in self._scheduler.compaction(rt):  # highest slot first
            self._book.vacate_lane(seq, rt)
            seq.lifecycle.move(SeqState.RECOVER)
            self._scheduler.mark_recover(seq)
            rt.slots.compactions += 1
            rt.slots.compacted_tokens += move.tokens
            log.debug(
                "compaction: %s from slot %d to %d (%d tokens)", seq.job_id, move.from_slot, move.to_slot, move.tokens
            )

    def _claim_launch_locked(self) -> tuple[DeviceJob, list[LaneClose]] | None:
        """The completion thread's launch: prepare the next device job, if one may launch now, and
        hold it (`_submitting`) with the lanes to close first. None: nothing to launch now, or no job
        context is free (the engine thread waits for the pool's rebuild)."""
        plan = self._plan_locked()
        if plan is None:
            return None
        job = self._prepare_locked(plan, wait_for_pool=False)
        if job is None:
            self._cond.notify_all()
            return None
        self._submitting = True
        return job, self._lanes_to_close_locked()

    def _release_wakeups_locked(self) -> None:
        """Call the Wait-stream wake-ups `_complete` held (non-blocking by contract, as when appended)."""
        held, self._held_wakeups = self._held_wakeups, []
        call_listeners(held)

    def _engine_will_release_locked(self) -> bool:
        """Whether the engine thread will soon pass a point that releases held wake-ups: it is running
        (not stopping, the board not lost) and not inside a device submit that may be slow."""
        return not (self._stopping or self._resets.halted or self._submitting)

    def _may_launch_locked(self) -> bool:
        # Draining refuses new Submits only; requests already accepted still run. One launch at a time
        # (`_submitting`), so the device takes jobs in the order they were prepared.
        blocked = self._stopping or self._resets.halted or self._resets.launches_held or self._submitting
        return not blocked and self._executor.has_slot()

    def _prepare_locked(self, plan: JobPlan, *, wait_for_pool: bool = True) -> DeviceJob | None:
        """Prepare `plan`'s device job. None: the launch failed (`launch_failed` dealt with its
        sequences), or no job context is free (the plan is put back; `wait_for_pool`: wait up to 1 s
        for the pool's rebuild)."""
        try:
            job = self._executor.prepare(plan)
        except CalculetError as exc:
            self._book.launch_failed(plan, exc)
            return None
        if job is None:
            # No free context although a bank is free: only while a quarantined context's pool is
            # rebuilt (outside the lock). Put everything back; the rebuild's end wakes this thread.
            self._scheduler.unplan(plan)
            if not wait_for_pool:
                return None
            log.warning("no free job context for %s: waiting for its pool's rebuild", plan.submodel.name)
            self._release_wakeups_locked()
            self._cond.wait(1.0)
        return job

    def _submit_device_job(self, job: DeviceJob) -> bool:
        """Open the rows' new lanes and submit a prepared job, outside the engine lock. Returns
        whether the device took it."""
        try:
            self._executor.open_lanes(job)
            submission = self._executor.submit(job)
        except (DeviceError, CalculetError) as exc:
            if isinstance(exc, StaleKV):  # a daemon bug: its KV bookkeeping disagrees with the device's
                log.error("device refused stale KV (KV bookkeeping bug): %s; dropping parked lanes", exc)
            with self._cond:
                self._executor.lanes_opened(job)
                self._executor.abort(job)
                self._submit_failed_locked(job, exc)
                self._cond.notify_all()
            return False
        with self._cond:
            self._executor.lanes_opened(job)
            self._executor.started(job, submission)
            self._submit_streak.succeeded()
            if job.plan.task is TaskType.DECODE:  # batch fill: decode_rows / decode_jobs
                self._counters.decode_jobs += 1
                self._counters.decode_rows += len(job.plan.seqs)
            if self._observers.wants(DeviceJobStarted):
                self._observers.emit(observer_records.started(job))
            self._cond.notify_all()
        return True

    def _submit_failed_locked(self, job: DeviceJob, exc: CalculetError) -> None:
        """The device did not take a prepared job (it is aborted, its reservations rolled back)."""
        if isinstance(exc, OutOfKV):  # capacity, not a fault: these jobs end OVERLOADED, to retry elsewhere
            for seq in job.plan.seqs:
                self._book.finish(seq, FinishReason.ERROR, ErrorKind.OVERLOADED, f"no KV space on the device: {exc}")
        elif isinstance(exc, DeviceLost):
            self._resets.halt_locked(str(exc))
        else:
            if isinstance(exc, StaleKV):
                self._book.drop_parked("the device refused stale KV")
            if not self._submit_streak.failed():
                self._book.launch_failed(job.plan, exc)
                return
            # docs/sources.md 000 §14: a streak of submit errors drains the board (`resets/submit_streak.py`):
            # this job's sequences and every other unfinished one end UNAVAILABLE (resume elsewhere),
            # whatever their recovery budget says.
            reason = escalation_reason(self._submit_streak.limit, str(exc))
            log.error("%s", reason)
            self._draining, self._drain_reason = True, reason
            self._book.launch_failed(job.plan, exc, serving=False)
            ended = len(job.plan.seqs) + self._end_unfinished_locked(reason)
            self._resets.escalated_locked("drain", "submit error streak", reason, ended)

    # ---- the completion thread --------------------------------------------------------------

    def _completion_loop(self) -> None:
        with self._crash_barrier("completion"):
            while True:
                with self._cond:
                    while (job := self._executor.oldest_submitted()) is None and not (
                        self._stopping and not self._executor
                    ):
                        self._cond.wait()
                if job is None:
                    return
                self._wait_and_complete(job, launch_next=self._config.launch_from_completion)

    def _wait_and_complete(self, job: DeviceJob, *, launch_next: bool = False) -> None:
        assert job.submission is not None
        status: JobStatus | None
        # Constrained rows' masks while the device runs the job, off the step's critical path.
        completion.prepare_masks(job)
        try:
            status = job.submission.wait(self._config.job_timeout_s)
        except WaitTimeout:
            status = self._resets.after_timeout(job)
        except DeviceLost as exc:
            self._resets.job_lost(job, f"device lost: {exc}")
            return
        if status is not None:
            self._complete(job, status, launch_next=launch_next)

    def _complete(self, job: DeviceJob, status: JobStatus, *, launch_next: bool = False) -> None:
        """Sample (no lock), then settle and apply under the lock. `launch_next` (the completion
        thread): then launch the next device job from this thread (`_claim_launch_locked`), whose
        core is awake, and release the settlement's wake-ups after that submit."""
        waited = time.perf_counter()
        rt = job.plan.runtime
        with self._cond:
            fenced = self._generations.running(job.generation) is not rt
        sampled = None
        device_left = None
        sampling_s = 0.0
        if status is JobStatus.DONE and not fenced and not job.quarantine and not job.kv_lost:
            began = time.perf_counter()
            try:
                sampled = completion.sample(job)
            except DeviceLost as exc:  # a top-k job's full-row read found the device gone
                self._resets.job_lost(job, f"device lost: {exc}")
                return
            sampling_s = time.perf_counter() - began
            device_left = self._device_left()
        stamps = _timestamps(job)  # a device query: outside the lock
        with self._cond:
            facts = BoardFacts(
                fenced=self._generations.running(job.generation) is not rt,
                serving=not self._resets.halted,
                max_recoveries=self._config.max_recoveries,
                device_left=device_left,
                expected_left=len(self._executor) - 1,
                running=rt.kv.used_count() if rt.kv is not None else 1,
            )
            settlement = completion.settle(job, status, sampled, facts)
            tokens = sum(1 + len(r.forced) for r in settlement.rows if r.token is not None and not r.seq.internal)
            copies = completion.copies(job, sampled) if sampled is not None else None
            self._utilization.record(job.engine_slot, stamps, tokens, sampling_s, time.monotonic(), copies)
            if self._observers.wants(DeviceJobDone):  # before the rows' Finals: their last token comes first
                post_s = time.perf_counter() - waited - sampling_s
                self._observers.emit(observer_records.job_done(job, status, settlement, stamps, (sampling_s, post_s)))
            # The settlement's Wait-stream wake-ups are held until the engine thread has submitted the
            # next device job: the gRPC loop streaming these tokens would otherwise contend with that
            # submit for the GIL while the device waits. Tokens reach clients one submit later.
            with deferred_listeners() as woken:
                if any(r.lost_kv for r in settlement.rows):  # before their recovery counts move
                    self._resets.lost_kv_locked(job)  # a running reset's tally records the jobs it hit
                self._book.apply(job, settlement)
            ready = rt.state is ModelState.READY
            escalation = self._escalation_watch.saw(settlement.fault, job.generation, ready, time.monotonic())
            upkeep = self._executor.end_context(job)
            self._executor.retire(job)
            escalate = self._escalate
            launch = self._claim_launch_locked() if launch_next else None
            if launch is None and not launch_next and self._engine_will_release_locked():
                self._held_wakeups.extend(woken)
                woken = []
        if launch is not None:
            self._launch(*launch)
        call_listeners(woken)
        self._run_upkeep(upkeep)
        if escalation is not None and escalate is not None:
            escalate(escalation)

    def _run_upkeep(self, upkeep: PoolUpkeep | None) -> None:
        """A pool's device work (rebuild after a quarantine, unregistering old buffers), without the
        lock; then wake the engine thread, which may be waiting for the rebuilt contexts."""
        if upkeep is None:
            return
        try:
            upkeep.run()
        finally:
            with self._cond:
                self._cond.notify_all()

    def _device_left(self) -> int | None:
        """The device's count of unfinished jobs (None when it cannot say: lost meanwhile, and the
        path that saw it first fails the board)."""
        try:
            return self._device.counters().left
        except DeviceError:
            return None


def _timestamps(job: DeviceJob) -> JobTimestamps | None:
    """A finished device job's own timestamps; None when the device cannot say (lost meanwhile)."""
    if job.submission is None:
        return None
    try:
        return job.submission.timestamps()
    except DeviceError:
        return None
