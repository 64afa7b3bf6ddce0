"""The engine: every client job, the scheduler, the device jobs and the model generations of one
board, behind one lock (DESIGN.md section 3).

State and its owner (all private; other modules call methods that return copies or frozen views):

    client jobs (live + retained)   `JobTable`          engine lock
    model generations, aliases      `GenerationTable`   engine lock
    waiting/ready sets, lane use    `Scheduler` (+ each generation's `KVManager`)   engine lock
    device jobs, banks, limit       `Executor`          engine lock (its `submit` runs without it)
    counters, admitting, halt,      the engine          engine lock
    reset budget, gate, audit trail
    device utilisation              `UtilizationTracker` engine lock (fed by each completion)

The lock is `_cond`'s. It is held only for bookkeeping: no device call runs under it (submits, lane
opens and closes, resets, status queries and buffer-pool rebuilds all run outside it), so Health,
Status and Submit never wait behind the device.

Threads:
- callers (gRPC handlers, the ModelManager) call the public methods; each takes the lock briefly;
- the **engine thread** sleeps on the condition until there is work and a free bank, takes a plan
  from the scheduler (which hands over the sequences with their lanes), has the executor prepare
  it under the lock, then fills and submits it *outside* the lock and records it as started. With
  the serial policy it also waits for that job at once, like today's product;
- the **completion thread** waits (outside the lock) for the oldest submitted device job, samples
  its logits outside the lock (overlapping the other bank's device work), then under the lock
  `completion.settle` decides what the job means and the engine applies it. The Wait streams'
  wake-ups of that settlement are held until the engine thread has submitted the next device job
  (or found none to submit), so the gRPC loop streaming the tokens does not contend for the GIL
  with that submit while the device waits (`_complete`, `_release_wakeups_locked`).
Resets hold launches (no job is being submitted) while the device resets, then mark what they hit.
Nothing polls: every wait is on the condition, an event log listener, or the device's wait.

Telemetry: where something happens (queued, refused, device job started/done, finished, reset, fault)
the engine emits an event to its `ObserverHub` (a queue put, also under the lock); the hub's thread
calls the observers (`observer.py`), never an engine thread. With no observer no event is built.

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
from dataclasses import dataclass, field

import numpy as np

from calculet.daemon.core import completion
from calculet.daemon.core.completion import BoardFacts, Chunked, Continue, Next, Recover, Settlement
from calculet.daemon.core.events import (
    EventLog,
    FinalEvent,
    FinishReason,
    Listener,
    call_listeners,
    deferred_listeners,
    wait_finished,
)
from calculet.daemon.core.executor import RESTORE_AFTER_CLEAN_JOBS, DeviceJob, Executor, PoolUpkeep
from calculet.daemon.core.generations import GenerationTable
from calculet.daemon.core.ids import new_sequence_id
from calculet.daemon.core.job_table import JobTable
from calculet.daemon.core.jobs import BufferState
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.observer import (
    FAULT_CCU_EXCEPTION,
    FAULT_COUNTER_MISMATCH,
    FAULT_DEVICE_LOST,
    FAULT_HANG,
    FAULT_NON_FINITE,
    DeviceJobDone,
    DeviceJobStarted,
    EngineObserver,
    FaultSeen,
    ObserverHub,
    RequestFinished,
    RequestQueued,
    RequestRejected,
    ResetRecorded,
    RowDone,
)
from calculet.daemon.core.prefix_advert import advertise, tips
from calculet.daemon.core.prefix_views import lane_chains, pending_prefill_tokens, prefix_cache_view
from calculet.daemon.core.request import GenerationRequest, ModelLimits, validate_request
from calculet.daemon.core.request_digest import request_digest
from calculet.daemon.core.reset_audit import ResetAudit, ResetEntry
from calculet.daemon.core.reset_audit import now as reset_audit_now
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
from calculet.daemon.core.snapshot import CounterView, EngineSnapshot, GenerationView
from calculet.daemon.core.status import JobView, PoolView, QueueView, ResetOutcome
from calculet.daemon.core.utilization import UtilizationTracker
from calculet.daemon.device.api import ConfiguredModel, VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost, ModelReleased, OutOfKV, StaleKV, WaitTimeout
from calculet.daemon.device.types import EngineSlot, JobStatus, JobTimestamps, TaskType
from calculet.daemon.errors import (
    CalculetError,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    Unavailable,
)
from calculet.daemon.lifecycle import Lifecycle
from calculet.daemon.sampling.history import TokenHistory

log = logging.getLogger(__name__)

# Finishes after which a lane's KV is trusted and worth keeping warm (prefix reuse).
_PARKABLE = frozenset({FinishReason.STOP, FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.DEADLINE})


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        policy: scheduling knobs.
        max_inflight: device jobs in flight at once (capped by the device's capability).
        synchronous: wait for each device job right after submitting it (the serial policy).
        job_timeout_s: wall-clock wait for one device job before the device is reset.
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


@dataclass(frozen=True)
class SubmitReceipt:
    """What Submit answers: the job's id, whether an earlier identical Submit already started it, its
    seed and the model generation it runs on."""

    job_id: str
    deduplicated: bool
    seed: int
    generation: int


@dataclass(frozen=True)
class ProbeOutcome:
    """A finished warm-up probe: its Final, its tokens and its first step's logits."""

    final: FinalEvent
    tokens: tuple[int, ...]
    first_logits: np.ndarray | None


@dataclass
class _Counters:
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
    """Owns the client jobs, the scheduler, the executor and the model generations of one device.

    Args:
        device: the opened board (the engine calls it, never under its lock).
        config: engine settings.
    """

    def __init__(self, device: VirtualDevice, config: EngineConfig) -> None:
        self._device = device
        self._config = config
        self._cond = threading.Condition(threading.Lock())
        self._scheduler = Scheduler(config.policy)
        self._executor = Executor(
            device, 1 if config.synchronous else config.max_inflight, config.restore_after_clean_jobs
        )
        self._generations = GenerationTable()
        self._jobs = JobTable(config.retention_bytes, config.retention_s)
        self._counters = _Counters()
        self._reset_budget = ResetBudget(config.reset_limit, config.reset_window_s)
        self._reset_gate = ResetGate()
        self._reset_audit = ResetAudit()
        self._halt: Lifecycle[BoardHalt] = Lifecycle("board halt", BoardHalt.NONE, HALT_TRANSITIONS)
        self._abandoned: list[DeviceJob] = []  # given up at a halt while the device still held them
        # The operator's drain (stop_admitting until resume), kept apart from halts so a drain or
        # resume issued while the board is halted still holds when the halt lifts.
        self._draining = False
        self._device_lost = False
        self._stopping = False
        self._launch_holds = 0  # resets in progress that must not see a job being submitted
        self._reconfiguring: set[int] = set()  # generations a configuration reset is dropping
        self._lane_closes: list[tuple[ConfiguredModel, int]] = []  # lanes to close on the device (KV Free)
        # Wait-stream wake-ups of a settled job, held for the engine thread to call once it has submitted
        # the next device job (or found none): `_complete`, `_release_wakeups_locked`.
        self._held_wakeups: list[Listener] = []
        self._submitting = False  # the engine thread holds a prepared job it has not yet handed over
        self._threads: list[threading.Thread] = []
        self._health_listeners: list[Callable[[], None]] = []  # called when the board stops serving
        self._heartbeat_listeners: list[Callable[[], None]] = []  # called from the engine thread's loop
        self._heartbeat_s: float | None = None
        self._last_beat = 0.0
        self._observers = ObserverHub()  # telemetry: events delivered on the hub's own thread
        self._utilization = UtilizationTracker(self._executor.engine_slots, time.monotonic())

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def engine_slots(self) -> tuple[EngineSlot, ...]:
        """The device banks jobs are submitted to (a generation's buffer pool has contexts per bank)."""
        return self._executor.engine_slots

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        names = [("calculet-engine", self._engine_loop)]
        if not self._config.synchronous:
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
            seqs = [s for s in self._jobs if not s.log.finished]
            for seq in seqs:
                self._cancel_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, reason)
                if seq.state is not SeqState.DONE:  # in a device job: its client hears now all the same
                    seq.log.finish(FinishReason.ERROR, seq.usage(), seq.timings(), ErrorKind.UNAVAILABLE, reason)
            self._cond.notify_all()
            return len(seqs)

    def wait_device_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no device job is in flight. Returns whether none is."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._executor, timeout)

    @property
    def _admitting(self) -> bool:
        """New client Submits are taken: no operator drain and no halt."""
        return not self._draining and not self._device_lost

    def stop_admitting(self) -> None:
        """Refuse new Submits (drain); jobs already accepted still run. Issued during a halt, the
        drain still holds after an operator reset lifts the halt."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    def resume(self) -> bool:
        """End an operator drain. A halted board admits again only once its halt lifts. Returns
        whether it was not admitting."""
        with self._cond:
            was = not self._admitting
            self._draining = False
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
            self._health_listeners.append(listener)

    def add_heartbeat_listener(self, listener: Callable[[], None], interval_s: float) -> None:
        """Call `listener()` from the engine thread's own loop at least every `interval_s` seconds
        (a service watchdog): a wedged engine thread stops calling it. It must not block.

        Raises:
            InvalidArgument: `interval_s` is not a positive number of seconds.
        """
        if not (interval_s > 0 and interval_s < float("inf")):
            raise InvalidArgument(f"heartbeat interval: must be a positive number of seconds, got {interval_s}")
        with self._cond:
            self._heartbeat_listeners.append(listener)
            self._heartbeat_s = min(interval_s, self._heartbeat_s or interval_s)
            self._cond.notify_all()

    def clear_health_listeners(self) -> None:
        with self._cond:
            self._health_listeners.clear()

    def add_observer(self, observer: EngineObserver) -> None:
        """Deliver the engine's events from now on to `observer`, on the hub's thread (`observer.py`)."""
        self._observers.add(observer)

    def flush_observers(self, timeout: float) -> bool:
        """Wait until the events emitted so far were delivered. Returns whether they were in time."""
        return self._observers.flush(timeout)

    # ---- model generations ---------------------------------------------------------------

    def add_generation(self, rt: ModelRuntime) -> None:
        """A new generation exists (Validating); it runs no job until `start_jobs`."""
        with self._cond:
            self._generations.add(rt)

    def start_jobs(self, rt: ModelRuntime) -> None:
        """Let jobs of this configured generation run (warming included); publishing is separate."""
        with self._cond:
            self._generations.start_jobs(rt)
            self._cond.notify_all()

    def publish(self, rt: ModelRuntime) -> ModelRuntime | None:
        """Atomically point the alias at `rt`; returns the generation it replaced."""
        with self._cond:
            return self._generations.publish(rt)

    def unpublish(self, alias: str, generation: int) -> None:
        with self._cond:
            self._generations.unpublish(alias, generation)

    def fence_generation(self, generation: int) -> None:
        """From now on no job of this generation runs, and a late completion touches nothing of it."""
        with self._cond:
            self._generations.stop_jobs(generation)

    def remove_generation(self, generation: int) -> None:
        with self._cond:
            self._generations.remove(generation)

    def begin_draining(self, rt: ModelRuntime) -> bool:
        """Move a Ready generation to Draining (its alias answers UNAVAILABLE unless a newer one took
        it over). Returns False when it is not Ready: someone else is retiring it."""
        with self._cond:
            if rt.state is not ModelState.READY:
                return False
            rt.lifecycle.move(ModelState.DRAINING)
            return True

    def generation_list(self) -> list[ModelRuntime]:
        """Every generation not yet unloaded, oldest first."""
        with self._cond:
            return self._generations.all()

    def serving(self, alias: str) -> ModelRuntime | None:
        """The generation published under `alias` (in any state), or None."""
        with self._cond:
            return self._generations.serving(alias)

    def serving_limits(self, alias: str) -> ModelLimits | None:
        """The limits of the alias's serving generation, or None when none serves. O(1)."""
        with self._cond:  # a published runtime keeps its model until it is unpublished
            rt = self._generations.serving(alias)
            return rt.limits if rt is not None and rt.model is not None and rt.state.serving else None

    def count_sequences(self, generation: int) -> int:
        with self._cond:
            return sum(1 for s in self._jobs if s.generation == generation)

    def wait_generation_idle(self, generation: int, timeout: float) -> bool:
        """Block until the generation has no sequences and no device jobs, or the timeout passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation_busy_locked(generation):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def cancel_generation(self, generation: int, reason: str) -> int:
        """Cancel every sequence of a generation (unload after the drain timeout). Returns how many."""
        with self._cond:
            seqs = [s for s in self._jobs if s.generation == generation]
            for seq in seqs:
                # ERROR + UNAVAILABLE tells a gateway to resume the stream on another board.
                self._cancel_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, reason)
            self._cond.notify_all()
            return len(seqs)

    # ---- resets --------------------------------------------------------------------------

    def reset_configuration(self, reason: str) -> list[ModelRuntime]:
        """Reset the device's configuration, which (as on CalRT 0.7.6) drops every configured model:
        their device jobs end as CCU exceptions, their KV is gone and their handles are invalid.

        Every sequence holding a lane and not in a device job re-prefills; those in a job learn it
        from their completion. A Ready generation goes back to Configuring: its clients wait (no job
        of theirs is planned) until the caller has configured it again and its golden check passed
        (`replace_model`, `move_generation`). A Draining one ends its jobs with UNAVAILABLE.

        The device call runs outside the engine lock with launches held, so no job is planned on a
        lane the reset is clearing or submitted with a handle it is invalidating.

        Returns:
            The generations to configure and warm again, oldest first.

        Raises:
            DeviceError: the device failed the reset (nothing changed here).
        """
        with self._cond:
            self._hold_launches_locked()
            attempts = len(self._generations.all()) + 1  # an unload may release a listed handle meanwhile
        configured: list[ModelRuntime] = []
        try:
            for _ in range(attempts):
                with self._cond:
                    configured = self._configured_locked()
                    self._reconfiguring = {rt.generation for rt in configured}  # no client job meanwhile
                if not configured:
                    break
                model = configured[0].model
                assert model is not None
                try:
                    self._device.reset_configuration(model)
                    break
                except ModelReleased:
                    continue  # unloaded since it was listed (fenced first): reset through another model
        except DeviceError:
            with self._cond:
                self._reconfiguring = set()
                self._end_launch_hold_locked()
            raise
        with self._cond:
            self._end_launch_hold_locked()
            self._reconfiguring = set()
            return [rt for rt in configured if self._configuration_lost_locked(rt, reason)]

    def _configured_locked(self) -> list[ModelRuntime]:
        """Generations holding a configured model whose jobs may run, oldest first."""
        return [
            rt
            for rt in self._generations.all()
            if rt.model is not None and self._generations.running(rt.generation) is rt
        ]

    def _configuration_lost_locked(self, rt: ModelRuntime, reason: str) -> bool:
        """A reset dropped this generation's configuration. Returns whether it must be configured
        and warmed again (it was Ready)."""
        tally = self._reset_gate.tally or ResetTally()  # the running operator reset's record of its hits
        for job in self._executor.jobs():  # a job done on the device but not yet applied too
            if job.generation == rt.generation:
                job.kv_lost = True
                tally.add(job.plan.seqs)
        for seq in self._scheduler.holding_kv(rt.generation):
            tally.add((seq,))
            self._scheduler.forget(seq)
            self._lose_kv_locked(seq, rt, reason)
        assert rt.kv is not None
        self._drop_parked_locked(reason)
        rt.kv.forget_device_lanes()  # the device dropped them with the configuration
        if rt.state is ModelState.READY:  # its recovering jobs give their lanes to the warm-up probe
            for seq in [s for s in self._scheduler.recover if s.generation == rt.generation]:
                self._vacate_lane_locked(seq, rt)
        dropped = rt.model
        self._lane_closes = [(m, lane) for m, lane in self._lane_closes if m is not dropped]
        if rt.state is ModelState.READY:
            rt.lifecycle.move(ModelState.CONFIGURING)
            return True
        for seq in [s for s in self._jobs if s.generation == rt.generation]:
            self._cancel_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"{reason}: model {rt.state.value}")
        return False

    def replace_model(self, rt: ModelRuntime, model: ConfiguredModel) -> None:
        """A generation whose configuration a reset dropped was configured again: its jobs use the
        new handle from now on, and it warms up (Configuring -> Warming)."""
        with self._cond:
            rt.model = model
            rt.lifecycle.move(ModelState.WARMING)
            self._cond.notify_all()

    def move_generation(self, rt: ModelRuntime, state: ModelState) -> None:
        """Move a generation's model state under the engine lock (its clients' jobs are planned only
        while it is Ready or Draining), and wake the engine thread."""
        with self._cond:
            rt.lifecycle.move(state)
            self._cond.notify_all()

    def begin_operator_reset(self, kind: str, reason: str) -> ResetTally:
        """Take the reset gate for an operator reset and count it. Returns the tally the reset
        records the jobs it hits in; `end_reset` gives the gate back.

        Raises:
            FailedPrecondition: another reset is in progress (nothing changed).
        """
        tally = ResetTally()
        with self._cond:
            if not self._reset_gate.try_begin(f"operator {kind} reset", tally):
                raise FailedPrecondition(f"reset in progress ({self._reset_gate.holder}): try again once it has ended")
            self._counters.resets += 1
            self._counters.last_reset_reason = f"operator {kind} reset: {reason}"
        return tally

    def set_reset_budget(self, limit: int, window_s: float | None = None) -> None:
        """Change the automatic reset budget (a config reload); resets already spent still count."""
        with self._cond:
            self._reset_budget.limit = limit
            if window_s is not None:
                self._reset_budget.window_s = window_s

    def record_reset(self, entry: ResetEntry) -> None:
        """Add an operator reset to the audit trail (automatic ones are recorded here)."""
        with self._cond:
            self._reset_audit.record(entry)
            self._observers.emit(ResetRecorded(entry))

    def _serving_generations_locked(self) -> tuple[str, ...]:
        return tuple(f"{rt.alias}@{rt.generation}" for rt in self._generations.published() if rt.state.serving)

    def _record_automatic_locked(self, reason: str, hit: int, before: tuple[bool, tuple[str, ...]], ok: bool,
                                 message: str, fault: str = "hang") -> None:  # fmt: skip
        entry = ResetEntry(
            at=reset_audit_now(),
            kind="ccu",
            automatic=True,
            reason=reason,
            fault=fault,
            inflight_jobs=hit,
            recovered=0,
            failed=0,
            generations_before=before[1],
            generations_after=self._serving_generations_locked(),
            serving_before=before[0],
            serving_after=not self._device_lost,
            ok=ok,
            message=message,
        )
        self._reset_audit.record(entry)
        self._observers.emit(ResetRecorded(entry))

    def note_reset_outcome(self, kind: str, ok: bool) -> None:
        """Record how the reset that just ended went (Status: ResetSummary.last_kind/at/ok)."""
        with self._cond:
            self._counters.last_reset = ResetOutcome(kind, time.time(), ok)

    def end_reset(self) -> None:
        with self._cond:
            self._reset_gate.end()
            self._cond.notify_all()

    def operator_reset_ccu(self) -> None:
        """Reset the compute units: every job on the device ends as a CCU exception that is the
        reset's doing, not a device anomaly, and its sequences re-prefill.

        Launches are held and every device job is marked `reset_hit` before the device call (outside
        the engine lock), so a completion applied meanwhile is not taken for an anomaly; afterwards
        the jobs it ended are recorded in the running reset's tally.

        Raises:
            DeviceError: the device failed the reset (the marks are undone).
        """
        with self._cond:
            self._hold_launches_locked()
            self._drop_parked_locked("operator CCU reset")
            jobs = self._executor.jobs()
            marked = [(job, job.reset_hit) for job in jobs]
            for job in jobs:
                job.reset_hit = True
        try:
            self._device.reset_ccu()
        except DeviceError:
            with self._cond:
                for job, before in marked:
                    job.reset_hit = before
                self._end_launch_hold_locked()
            raise
        ended = [job for job in jobs if job.kv_lost or _status(job) is JobStatus.CCU_EXCEPTION]  # no lock
        with self._cond:
            self._end_launch_hold_locked()
            tally = self._reset_gate.tally or ResetTally()
            live = {id(job) for job in self._executor.jobs()}
            for job in ended:
                if id(job) in live:  # one applied meanwhile was recorded by `_apply_locked`
                    tally.add(job.plan.seqs)

    def operator_reset_succeeded(self) -> CalculetError | None:
        """After a successful operator reset: lift a halt for a used-up budget (once the jobs given
        up then have ended on the device), clear the automatic reset budget, restore the in-flight
        limit.

        Returns:
            Why the board still cannot serve (a given-up job still held by the device, or a halt
            only a restart lifts), or None.
        """
        with self._cond:
            abandoned = list(self._abandoned)
        held = [j for j in abandoned if not _status(j).finished]  # device queries: no lock
        with self._cond:
            if self._halt.state is BoardHalt.LOST:
                return Unavailable("the board stopped serving for good (device lost or a thread failed): restart it")
            if self._halt.state is BoardHalt.AWAITING_OPERATOR:
                if held:
                    return FailedPrecondition(
                        f"device job {held[0].device_job_id} (generation {held[0].generation}) still hangs after "
                        "this reset: reset the CCU or that model's configuration"
                    )
                ended = [job for job in self._abandoned if self._quarantine_abandoned_locked(job)]
                upkeeps = [self._executor.end_context(job) for job in ended]
                self._abandoned.clear()
                self._halt.move(BoardHalt.NONE)
                self._device_lost = False  # admitting again unless an operator drained meanwhile
            else:
                upkeeps = []
            self._reset_budget.clear()
            self._executor.restore_limit("operator reset")
            self._cond.notify_all()
        for upkeep in upkeeps:  # rebuilds: device calls, outside the lock
            self._run_upkeep(upkeep)
        return None

    def wait_reset_settled(self, tally: ResetTally, timeout: float) -> ResetCounts:
        """Wait up to `timeout` seconds until every job the reset hit rebuilt its KV or ended; count."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not tally.settled() and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return tally.counts()

    # ---- client jobs ------------------------------------------------------------------------

    def submit(self, req: GenerationRequest, *, seed_given: bool = True) -> SubmitReceipt:
        """Validate and queue a request. Never waits on the device.

        Args:
            req: the request.
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
        self, req: GenerationRequest, runtime: ModelRuntime | None, *, capture_logits: bool, seed_given: bool
    ) -> tuple[Sequence, bool]:
        """`submit`, returning the sequence itself (a probe waits on it even if it leaves retention at
        once). `runtime`: serve on this generation instead of the alias's (warm-up probes)."""
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
                self._rejected_locked(req.model, exc.kind.value)
                raise
        # O(prompt) work outside the lock, on a sequence nobody else can see yet: validation (the
        # transport has usually done it already) and the penalties' token history.
        limits = rt.limits
        validate_request(req, limits)
        seq = Sequence(new_sequence_id(), req, rt.generation, rt.eos_ids)
        seq.capture_logits = capture_logits
        seq.internal = runtime is not None
        seq.history = TokenHistory(limits.vocab_size, req.prompt_tokens, seq.generated)
        if self._config.policy.prefix_reuse and runtime is None:
            seq.prefill_array()  # O(prompt), outside the lock: matched against parked lanes under it
        with self._cond:
            if req.client_request_id and (first := self._jobs.deduplicate(req.client_request_id, digest)):
                return first, True  # an identical Submit won the race while this one was prepared
            if self._admitting_runtime_locked(req.model, runtime) is not rt:
                raise Unavailable(f"model {req.model!r} changed generation while the request was prepared; retry")
            try:
                self._scheduler.enqueue(
                    seq, rt.kv.free_count() if rt.kv is not None else 0, self._expected_keep(seq, rt)
                )
            except Overloaded:
                if seq.deadline is not None and seq.deadline <= time.monotonic():
                    # Not a capacity refusal: retrying elsewhere (what OVERLOADED invites) cannot help.
                    self._rejected_locked(req.model, "deadline")
                    raise DeadlineExceeded(
                        f"deadline of {req.deadline_s}s passed before the request was queued"
                    ) from None
                self._rejected_locked(req.model, "queue_full")
                raise  # counted in `rejected` by the transport, with every other refused Submit
            self._jobs.add(seq, digest)
            if runtime is None:  # warm-up probes are not client requests
                self._counters.submitted += 1
            if self._observers.wants(RequestQueued):
                self._observers.emit(_queued(seq))
            self._cond.notify_all()
            return seq, False

    def _expected_keep(self, seq: Sequence, rt: ModelRuntime) -> int:
        """Prefill tokens of a new client request that a parked lane holds now (lock held; its array
        was built before the lock): what the scheduler classifies it by."""
        policy = self._config.policy
        if not policy.prefix_reuse or seq.internal or rt.kv is None or not rt.kv.parked_count():
            return 0
        return rt.kv.expected_keep(seq.prefill_array(), policy.prefix_min_tokens)

    def _rejected_locked(self, model: str, reason: str) -> None:
        """Tell the observers admission refused a Submit (the transport counts it in `rejected`)."""
        if self._observers.wants(RequestRejected):
            self._observers.emit(RequestRejected(model, reason, time.monotonic()))

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
            self._cancel_locked(seq, FinishReason.CANCELLED, None, "")
            self._cond.notify_all()
            return True

    def job_generation(self, job_id: str) -> tuple[int, int] | None:
        """(model generation, recoveries) of a live or retained job, or None."""
        with self._cond:
            seq = self._jobs.get(job_id)
            return (seq.generation, seq.recoveries) if seq is not None else None

    def probe(self, req: GenerationRequest, rt: ModelRuntime, timeout: float) -> ProbeOutcome | None:
        """Run a warm-up probe on a generation that is not published yet and wait for it (the
        golden check). Blocks the caller, never the engine threads.

        Returns:
            Its Final, tokens and first logits; None when it did not finish within `timeout` seconds
            (it is cancelled).

        Raises:
            As `submit`.
        """
        seq, _ = self._queue(req, rt, capture_logits=True, seed_given=True)
        if not wait_finished(seq.log, timeout):
            with self._cond:
                if self._jobs.is_live(seq.job_id):
                    self._cancel_locked(seq, FinishReason.CANCELLED, None, "")
            return None
        with self._cond:
            final = seq.log.read(0)[-1]
            assert isinstance(final, FinalEvent)
            return ProbeOutcome(final, tuple(seq.generated), seq.first_logits)

    # ---- observation --------------------------------------------------------------------------

    def snapshot(self) -> EngineSnapshot:
        """Everything Health, Status and WatchLoad report, copied in one step."""
        with self._cond:
            self._jobs.expire()
            seqs = list(self._jobs)
            now = time.monotonic()
            generations = tuple(self._generation_view_locked(rt, seqs) for rt in self._generations.all())
            return EngineSnapshot(
                admitting=self._admitting,
                device_lost=self._device_lost,
                halt=self._halt.state,
                budget=self._reset_budget.view(),
                counters=CounterView(**vars(self._counters)),  # shallow: ResetOutcome is frozen
                generations=generations,
                jobs=tuple(_job_view(s, now) for s in seqs),
                inflight=len(self._executor),
                inflight_limit=self._executor.limit,
                degraded_reason=self._executor.degraded_reason,
                anomalies=self._executor.anomalies,
                pool=self._pool_view_locked(),
                retained_jobs=self._jobs.retained_count,
                retained_bytes=self._jobs.retained_bytes,
                client_ids=self._jobs.client_ids,
                reset_history=self._reset_audit.entries(),
                utilization=self._utilization.view(now),
            )

    def idle(self) -> bool:
        """No sequence and no device job left (the leak check tests use)."""
        with self._cond:
            return not len(self._jobs) and not self._executor

    def _generation_view_locked(self, rt: ModelRuntime, seqs: list[Sequence]) -> GenerationView:
        mine = [s for s in seqs if s.generation == rt.generation]
        waiting = sum(1 for s in mine if s.state is SeqState.WAITING)
        kv = rt.kv
        prefix = prefix_cache_view(rt, self._config.policy)
        chains = lane_chains(rt, mine) if prefix is not None and prefix.enabled else None
        hashes, truncated = advertise(chains) if chains is not None else (None, False)
        short_bound = self._config.policy.short_prefill_tokens
        pending, pending_short = pending_prefill_tokens(rt, mine, short_bound)
        return GenerationView(
            alias=rt.alias,
            generation=rt.generation,
            state=rt.state,
            published=self._generations.is_published(rt),
            ready_at=rt.ready_at,
            package_name=rt.manifest.name,
            package_dir=rt.package_dir,
            message=rt.message,
            lanes=kv.snapshot() if kv is not None else (),
            queues=QueueView(*self._scheduler.depths(rt.generation, mine)),
            waiting=waiting,
            running=len(mine) - waiting,
            free_lanes=kv.free_count() if kv is not None else 0,
            lanes_total=kv.lanes if kv is not None else 0,
            prefix_cache=prefix,
            prefix_hashes=hashes,
            prefix_truncated=truncated,
            prefix_tips=tips(chains) if chains is not None else (),
            pending_prefill_tokens=pending,
            pending_short_prefill_tokens=pending_short,
            short_prefill_tokens=short_bound,
            prefill_chunk_tokens=rt.prefill_chunk,
        )

    def _pool_view_locked(self) -> PoolView:
        in_use = free = quarantined = waits = 0
        for rt in self._generations.all():
            if rt.pool is None:
                continue
            st = rt.pool.stats()
            in_use += st.in_use
            quarantined += st.quarantined
            waits += st.acquire_misses
            free += sum(k.free for k in st.per_key.values())
        return PoolView(in_use, free, quarantined, waits)

    # ---- internals: admission -------------------------------------------------------------

    def _admitting_runtime_locked(self, alias: str, runtime: ModelRuntime | None) -> ModelRuntime:
        """The generation a new request of `alias` would run on (`runtime` for warm-up probes).

        Raises:
            NotFound / Unavailable: unknown alias, model not serving, device lost, board draining.
        """
        rt = runtime or self._generations.serving_or_raise(alias)
        if self._device_lost:  # warm-up probes too: nothing would ever run them
            raise self._halted_error_locked()
        assert rt.model is not None
        if runtime is None and not self._admitting:
            raise Unavailable("board is draining: not admitting new requests")
        return rt

    def _halted_error_locked(self) -> Unavailable:
        """Why a halted board refuses work: waiting for an operator, or lost until a restart."""
        if self._halt.state is BoardHalt.AWAITING_OPERATOR:
            return Unavailable("automatic reset budget used up: the board waits for an operator reset")
        return Unavailable("device lost: board is not serving")

    def _generation_busy_locked(self, generation: int) -> bool:
        return any(s.generation == generation for s in self._jobs) or any(
            j.generation == generation for j in self._executor.jobs()
        )

    # ---- internals: ending and moving sequences (lock held) ---------------------------------

    def _cancel_locked(self, seq: Sequence, reason: FinishReason, kind: ErrorKind | None, message: str) -> None:
        """Stop delivering a job. Waiting/ready sequences end now; one in a device job ends when its
        completion sees `cancel_requested` and the device is done with its lane."""
        seq.cancel_requested = True
        if kind is not None:  # cancelled by unload/drain, not by its owner: report the error
            seq.pending_error = (reason, kind, message)
        if seq.state is SeqState.WAITING:
            self._scheduler.remove_waiting(seq)
            self._finish_locked(seq, reason, kind, message)
        elif seq.state in (SeqState.READY, SeqState.RECOVER, SeqState.PARTIAL):
            self._scheduler.forget(seq)
            self._finish_locked(seq, reason, kind, message)

    def _finish_locked(self, seq: Sequence, reason: FinishReason, kind: ErrorKind | None, message: str) -> None:
        """End a sequence that is not in a device job: park or free its lane, write its Final, retain it."""
        rt = self._generations.running(seq.generation)
        park_at = time.monotonic() if self._may_park_locked(seq, rt, reason) else None
        lane = self._scheduler.release_lane(seq, rt, park_at=park_at)
        if lane is not None and rt is not None and rt.model is not None:
            self._lane_closes.append((rt.model, lane))  # closed on the device outside the lock
        retry_after_s = self._scheduler.policy.retry_after_s if kind is ErrorKind.OVERLOADED else None
        seq.finish(reason, kind, message, retry_after_s)
        retired = self._jobs.retire(seq)
        if retired and self._observers.wants(RequestFinished):
            self._observers.emit(_finished(seq))
        if retired and not seq.internal:  # counted once, client jobs only
            if reason in (FinishReason.STOP, FinishReason.LENGTH):
                self._counters.completed += 1
            elif reason is FinishReason.CANCELLED:
                self._counters.cancelled += 1
            else:
                self._counters.failed += 1
        self._cond.notify_all()

    def _follow_locked(self, seq: Sequence, then: Next) -> None:
        """Move a sequence out of its finished device job: next step, re-prefill, or its end."""
        if isinstance(then, Continue):
            seq.lifecycle.move(SeqState.READY)
            self._scheduler.mark_ready(seq)
        elif isinstance(then, Chunked):
            seq.lifecycle.move(SeqState.PARTIAL)
            self._scheduler.mark_partial(seq)
        elif isinstance(then, Recover):
            seq.lifecycle.move(SeqState.RECOVER)
            self._scheduler.mark_recover(seq)
            rt = self._generations.running(seq.generation)
            if rt is not None and rt.state in (ModelState.CONFIGURING, ModelState.WARMING) and not seq.internal:
                self._vacate_lane_locked(seq, rt)  # its KV is gone anyway; the golden check needs a lane
        else:
            self._finish_locked(seq, then.reason, then.kind, then.message)

    def _may_park_locked(self, seq: Sequence, rt: ModelRuntime | None, reason: FinishReason) -> bool:
        """Whether a finishing client sequence leaves its lane parked (its KV trusted, for a later
        request to reuse): prefix reuse is on, its generation is Ready on a serving board, and it
        ended normally (stop, length, its client's cancel, its deadline) rather than by a fault."""
        return (
            self._config.policy.prefix_reuse
            and not seq.internal
            and rt is not None
            and rt.state is ModelState.READY
            and not self._device_lost
            and reason in _PARKABLE
        )

    def _drop_parked_locked(self, why: str) -> None:
        """Drop every parked lane of the board: after a reset or a fault whose KV effect is unknown,
        no parked KV is trusted (open lanes are closed on the device before any is opened again)."""
        for rt in self._generations.all():
            if rt.kv is not None and (dropped := rt.kv.drop_parked()):
                rt.prefix.dropped += len(dropped)
                log.info("dropped %d parked lane(s) of %s@%d: %s", len(dropped), rt.alias, rt.generation, why)

    def _collect_kv_closes_locked(self) -> None:
        """Queue the device closes (KV Free) of lanes the KV managers evicted or dropped."""
        for rt in self._generations.all():
            if rt.kv is not None and rt.model is not None:
                self._lane_closes += [(rt.model, lane) for lane in rt.kv.take_device_closes()]

    def _vacate_lane_locked(self, seq: Sequence, rt: ModelRuntime) -> None:
        """A recovering sequence gives its lane back; it re-prefills into a free lane later."""
        if (lane := self._scheduler.release_lane(seq, rt)) is not None and rt.model is not None:
            self._lane_closes.append((rt.model, lane))

    def _lose_kv_locked(self, seq: Sequence, rt: ModelRuntime, message: str) -> None:
        """A sequence outside any device job lost its KV (its job never ran, or a reset cleared its
        lane): re-prefill it, or end it when it may not recover any more."""
        self._scheduler.lose_lane(seq, rt)
        then = completion.recovery(
            seq, rt, message, serving=not self._device_lost, max_recoveries=self._config.max_recoveries
        )
        seq.recoveries += 1
        self._counters.recoveries += 1
        self._follow_locked(seq, then)

    def _expire_locked(self) -> None:
        self._jobs.expire()  # frees retained memory whenever the engine wakes anyway
        now = time.monotonic()
        for seq in self._scheduler.expire(now):
            if seq.deadline is not None and seq.deadline <= now:
                self._finish_locked(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed in queue")
            else:
                self._counters.rejected += 1
                self._rejected_locked(seq.request.model, "admission_timeout")
                self._finish_locked(
                    seq, FinishReason.ERROR, ErrorKind.OVERLOADED, "admission deadline: no KV lane became free"
                )
        holding = [*self._scheduler.ready.values(), *self._scheduler.partial]
        for seq in [s for s in holding if s.deadline is not None and s.deadline <= now]:
            self._scheduler.forget(seq)
            self._finish_locked(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed")
        limit = self._config.orphan_timeout_s
        if limit is not None:
            for seq in [s for s in self._jobs if not s.internal and not s.cancel_requested]:
                if seq.log.detached_for(now) >= limit:
                    log.info("cancelling job %s: no Wait attached for %.0fs", seq.job_id, limit)
                    self._cancel_locked(seq, FinishReason.CANCELLED, None, "")

    def _next_wakeup_locked(self) -> float | None:
        times = [t for t in [self._scheduler.next_deadline()] if t is not None]
        holding = [*self._scheduler.ready.values(), *self._scheduler.partial]
        times += [s.deadline for s in holding if s.deadline is not None]
        limit = self._config.orphan_timeout_s
        clients = [s for s in self._jobs if not s.internal and not s.cancel_requested]
        if limit is not None and clients:
            # A reader detaching does not wake this thread, so look again within one timeout: an
            # orphan is cancelled between one and two timeouts after its last Wait went away.
            now = time.monotonic()
            times += [now + limit - s.log.detached_for(now) for s in clients]
        return max(0.0, min(times) - time.monotonic()) if times else None

    # ---- internals: halts ---------------------------------------------------------------

    def _device_lost_locked(self, message: str, halt: BoardHalt = BoardHalt.LOST) -> None:
        """Stop serving: fail every sequence except those in device jobs, which their completion (or
        the path that gives the job up) fails. `halt` says whether an operator reset may lift it
        (AWAITING_OPERATOR) or only a restart (LOST)."""
        was_lost, self._device_lost = self._device_lost, True
        if self._halt.can_move(halt):
            self._halt.move(halt)
        self._drop_parked_locked(f"board stopped serving: {message}")
        if not was_lost:
            for listener in self._health_listeners:  # non-blocking by contract
                listener()
            self._observers.emit(FaultSeen(FAULT_DEVICE_LOST, message, time.monotonic()))
        in_jobs = {s.job_id for job in self._executor.jobs() for s in job.plan.seqs}
        for seq in list(self._jobs):
            if seq.job_id in in_jobs:
                continue
            self._scheduler.remove_waiting(seq)
            self._scheduler.forget(seq)
            self._finish_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"device lost: {message}")

    def _give_up_job_locked(self, job: DeviceJob, message: str) -> None:
        """The device is gone with this job: its lanes become UNKNOWN and its sequences fail; its
        buffers are abandoned with the device."""
        for row, seq in enumerate(job.plan.seqs):
            if job.plan.runtime.kv is not None:
                self._executor.lose_row(job, row)
            if seq.state is not SeqState.DONE:
                self._finish_locked(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, message)

    def _quarantine_abandoned_locked(self, job: DeviceJob) -> bool:
        """A job given up while the device still held it (the reset budget was used up), ended on
        the device by an operator reset since: its buffers must leave through quarantine and a pool
        rebuild, never reused. Its sequences were failed and its lanes freed when it was given up.

        Returns:
            Whether its context still needs ending (quarantine; the rebuild runs without the lock).
        """
        if self._generations.running(job.generation) is not job.plan.runtime:
            return False  # its generation is gone, and its pool with it
        if job.ctx.state in (BufferState.SUBMITTED, BufferState.RUNNING):
            job.quarantine = True
            return True
        return False

    def _hold_launches_locked(self) -> None:
        """Stop the engine thread from launching, and wait until no device job is being submitted."""
        self._launch_holds += 1
        self._cond.wait_for(lambda: not self._executor.submitting())

    def _end_launch_hold_locked(self) -> None:
        self._launch_holds -= 1
        self._cond.notify_all()

    # ---- the engine thread ------------------------------------------------------------------

    def _engine_loop(self) -> None:
        with self._crash_barrier("engine"):
            while True:
                with self._cond:
                    job = self._next_job_locked()
                    self._collect_kv_closes_locked()  # evicted/dropped lanes close before any lane opens
                    closes, self._lane_closes = self._lane_closes, []
                self._close_lanes(closes)  # before any lane is opened again
                if job is None:
                    return
                submitted = self._submit_device_job(job)
                with self._cond:
                    self._submitting = False
                    self._release_wakeups_locked()
                if submitted and self._config.synchronous:
                    self._wait_and_complete(job)

    @contextmanager
    def _crash_barrier(self, thread: str) -> Iterator[None]:
        """A bug in a device thread must not leave clients waiting forever: log it, fail every
        job, and report the board unhealthy (NOT_SERVING) so it is restarted or drained."""
        try:
            yield
        except Exception:
            log.exception("%s thread crashed; failing all jobs and marking the board unhealthy", thread)
            with self._cond:
                self._release_wakeups_locked()
                for job in self._executor.jobs():
                    self._give_up_job_locked(job, f"internal error in the {thread} thread")
                    self._executor.retire(job)
                self._device_lost_locked(f"internal error in the {thread} thread")
                self._cond.notify_all()

    def _next_job_locked(self) -> DeviceJob | None:
        """Sleep until a device job can be prepared; prepare it. None when stopping."""
        while True:
            self._beat_locked()  # rate-limited: the longest silence is one device job (serial policy)
            if self._stopping and not self._executor:
                self._release_wakeups_locked()
                return None
            self._expire_locked()
            if self._may_launch_locked():
                decoding = Counter(j.generation for j in self._executor.jobs() if j.plan.task is TaskType.DECODE)
                runnable = self._generations.runnable()
                serving = {
                    g
                    for g, rt in runnable.items()
                    if rt.state in (ModelState.READY, ModelState.DRAINING) and g not in self._reconfiguring
                }
                plan = self._scheduler.plan(runnable, decoding, serving)
                while self._scheduler.orphans:
                    orphan = self._scheduler.orphans.pop()
                    self._finish_locked(orphan, FinishReason.ERROR, ErrorKind.UNAVAILABLE, "model generation retired")
                if plan is not None:
                    job = self._prepare_locked(plan)
                    if job is not None:
                        self._submitting = True
                        return job
                    continue
            self._release_wakeups_locked()  # nothing to submit now: the held wake-ups go out before the sleep
            wakeup = self._next_wakeup_locked()
            if self._heartbeat_s is not None:  # sleep no longer than a beat: an idle engine still beats
                wakeup = self._heartbeat_s if wakeup is None else min(wakeup, self._heartbeat_s)
            self._cond.wait(wakeup)

    def _release_wakeups_locked(self) -> None:
        """Call the Wait-stream wake-ups `_complete` held (non-blocking by contract, as when appended)."""
        held, self._held_wakeups = self._held_wakeups, []
        call_listeners(held)

    def _engine_will_release_locked(self) -> bool:
        """Whether the engine thread will soon pass a point that releases held wake-ups: it is running
        (not stopping, the board not lost) and not inside a device submit that may be slow."""
        return not (self._stopping or self._device_lost or self._submitting)

    def _beat_locked(self) -> None:
        """Tell the heartbeat listeners the engine thread is alive (at most once per half interval)."""
        if self._heartbeat_s is None:
            return
        now = time.monotonic()
        if now - self._last_beat >= self._heartbeat_s / 2:
            self._last_beat = now
            for listener in self._heartbeat_listeners:  # non-blocking by contract
                listener()

    def _may_launch_locked(self) -> bool:
        # Draining refuses new Submits only; requests already accepted still run.
        return not self._stopping and not self._device_lost and self._launch_holds == 0 and self._executor.has_slot()

    def _prepare_locked(self, plan: JobPlan) -> DeviceJob | None:
        try:
            job = self._executor.prepare(plan)
        except CalculetError as exc:
            self._launch_failed_locked(plan, exc)
            return None
        if job is None:
            # No free context although a bank is free: only while a quarantined context's pool is
            # rebuilt (outside the lock). Put everything back; the rebuild's end wakes this thread.
            self._scheduler.unplan(plan)
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
        except OutOfKV as exc:  # capacity, not a fault: these jobs end OVERLOADED, to retry elsewhere
            with self._cond:
                self._executor.lanes_opened(job)
                self._executor.abort(job)
                message = f"no KV space on the device: {exc}"
                for seq in job.plan.seqs:
                    self._finish_locked(seq, FinishReason.ERROR, ErrorKind.OVERLOADED, message)
                self._cond.notify_all()
            return False
        except DeviceLost as exc:
            with self._cond:
                self._executor.lanes_opened(job)
                self._executor.abort(job)
                self._device_lost_locked(str(exc))
                self._cond.notify_all()
            return False
        except StaleKV as exc:  # a daemon bug: its KV bookkeeping disagrees with the device's
            log.error("device refused stale KV (KV bookkeeping bug): %s; dropping parked lanes", exc)
            with self._cond:
                self._executor.lanes_opened(job)
                self._executor.abort(job)
                self._drop_parked_locked("the device refused stale KV")
                self._launch_failed_locked(job.plan, exc)
                self._cond.notify_all()
            return False
        except (DeviceError, CalculetError) as exc:
            with self._cond:
                self._executor.lanes_opened(job)
                self._executor.abort(job)
                self._launch_failed_locked(job.plan, exc)
                self._cond.notify_all()
            return False
        with self._cond:
            self._executor.lanes_opened(job)
            self._executor.started(job, submission)
            if job.plan.task is TaskType.DECODE:  # batch fill: decode_rows / decode_jobs
                self._counters.decode_jobs += 1
                self._counters.decode_rows += len(job.plan.seqs)
            if self._observers.wants(DeviceJobStarted):
                self._observers.emit(_started(job))
            self._cond.notify_all()
        return True

    def _launch_failed_locked(self, plan: JobPlan, exc: Exception) -> None:
        """The job never reached the device (reservations already rolled back): re-prefill its
        sequences from scratch, or fail them."""
        log.warning("submit of %s job failed: %s", plan.task.value, exc)
        for seq in plan.seqs:
            self._lose_kv_locked(seq, plan.runtime, f"submit failed: {exc}")

    def _close_lanes(self, closes: list[tuple[ConfiguredModel, int]]) -> None:
        """Close lanes whose sequences left them (KV Free), without the lock. A stale handle means the
        lane went with its configuration; a lost device is the completion path's to report."""
        for model, lane in closes:
            try:
                self._device.close_lane(model, lane)
            except (ModelReleased, DeviceLost):
                pass
            except DeviceError as exc:
                log.warning("closing KV lane %d on the device failed: %s", lane, exc)

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
                self._wait_and_complete(job)

    def _wait_and_complete(self, job: DeviceJob) -> None:
        assert job.submission is not None
        status: JobStatus | None
        try:
            status = job.submission.wait(self._config.job_timeout_s)
        except WaitTimeout:
            status = self._reset_after_timeout(job)
        except DeviceLost as exc:
            self._job_lost(job, f"device lost: {exc}")
            return
        if status is not None:
            self._complete(job, status)

    def _complete(self, job: DeviceJob, status: JobStatus) -> None:
        """Sample (no lock), then settle and apply under the lock."""
        waited = time.perf_counter()
        rt = job.plan.runtime
        with self._cond:
            fenced = self._generations.running(job.generation) is not rt
        sampled = None
        device_left = None
        sampling_s = 0.0
        if status is JobStatus.DONE and not fenced and not job.quarantine and not job.kv_lost:
            began = time.perf_counter()
            sampled = completion.sample(job)
            sampling_s = time.perf_counter() - began
            device_left = self._device_left()
        stamps = _timestamps(job)  # a device query: outside the lock
        with self._cond:
            facts = BoardFacts(
                fenced=self._generations.running(job.generation) is not rt,
                serving=not self._device_lost,
                max_recoveries=self._config.max_recoveries,
                device_left=device_left,
                expected_left=len(self._executor) - 1,
            )
            settlement = completion.settle(job, status, sampled, facts)
            tokens = sum(1 for r in settlement.rows if r.token is not None and not r.seq.internal)
            self._utilization.record(job.engine_slot, stamps, tokens, sampling_s, time.monotonic())
            if self._observers.wants(DeviceJobDone):  # before the rows' Finals: their last token comes first
                post_s = time.perf_counter() - waited - sampling_s
                self._observers.emit(_job_done(job, status, settlement, stamps, (sampling_s, post_s)))
            # The settlement's Wait-stream wake-ups are held until the engine thread has submitted the
            # next device job: the gRPC loop streaming these tokens would otherwise contend with that
            # submit for the GIL while the device waits. Tokens reach clients one submit later.
            with deferred_listeners() as woken:
                self._apply_locked(job, settlement)
            if self._engine_will_release_locked():
                self._held_wakeups.extend(woken)
                woken = []
            upkeep = self._executor.end_context(job)
            self._executor.retire(job)
        call_listeners(woken)
        self._run_upkeep(upkeep)

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

    def _apply_locked(self, job: DeviceJob, settlement: Settlement) -> None:
        """Carry out a settlement: KV effects through the executor, tokens and moves on the
        sequences, anomalies. The caller then returns the job's buffers and retires it."""
        tally = self._reset_gate.tally
        if job.reset_hit and tally is not None and any(r.lost_kv for r in settlement.rows):
            tally.add(job.plan.seqs)  # before their recovery counts move: the running reset hit them
        for row in settlement.rows:
            seq = row.seq
            if row.kv is completion.KvEffect.COMMIT:
                self._executor.commit_row(job, row.row)
            elif row.kv is completion.KvEffect.LOSE:
                self._executor.lose_row(job, row.row)
            if row.first_logits is not None and seq.first_logits is None:
                seq.first_logits = row.first_logits
            if row.lost_kv:
                seq.recoveries += 1
                self._counters.recoveries += 1
            if row.token is not None:
                seq.accept(row.token, row.logprob)
            self._follow_locked(seq, row.then)
        if settlement.anomalies or any(r.lost_kv for r in settlement.rows):
            self._drop_parked_locked(f"device job {job.device_job_id} lost KV")  # never trust KV after a fault
        for anomaly in settlement.anomalies:
            self._executor.note_anomaly(anomaly)
        if settlement.clean:
            self._executor.note_clean()
        self._cond.notify_all()

    def _job_lost(self, job: DeviceJob, message: str, halt: BoardHalt = BoardHalt.LOST) -> None:
        """The device is gone with this job, or no reset may collect it: fail everything; the board
        stops serving. With AWAITING_OPERATOR the device still holds the job: it is kept in
        `_abandoned` until an operator reset ends it."""
        with self._cond:
            self._give_up_job_locked(job, message)
            self._device_lost_locked(message, halt)
            self._executor.retire(job)
            if halt is BoardHalt.AWAITING_OPERATOR:
                self._abandoned.append(job)
            self._cond.notify_all()

    def _reset_after_timeout(self, job: DeviceJob) -> JobStatus | None:
        """A job hung: reset the compute units so its buffers are released, then collect it."""
        assert job.submission is not None
        reason = f"device job {job.device_job_id} did not finish within {self._config.job_timeout_s}s"
        with self._cond:
            before = (not self._device_lost, self._serving_generations_locked())
            hit = sum(len(j.plan.seqs) for j in self._executor.jobs())
            allowed = self._reset_budget.try_spend()
            if allowed:
                self._counters.resets += 1
                self._counters.last_reset_reason = reason
                for other in self._executor.jobs():  # the hang is the anomaly, not the CCU exceptions it causes
                    other.reset_hit = True
                self._hold_launches_locked()
            self._executor.note_anomaly(reason)
            self._drop_parked_locked(reason)
            self._observers.emit(FaultSeen(FAULT_HANG, reason, time.monotonic()))
            # Operators are refused while it runs; it never waits for an operator's reset to end.
            gated = allowed and self._reset_gate.try_begin("automatic ccu reset")
        if not allowed:
            budget = self._reset_budget.view()
            message = f"{reason}; {budget.limit} automatic resets per {budget.window_s:g}s used up: needs an operator"
            log.error("%s", message)
            self._job_lost(job, message, BoardHalt.AWAITING_OPERATOR)
            with self._cond:
                self._record_automatic_locked(reason, hit, before, False, message, fault="budget exhausted")
            return None
        log.error("%s: resetting CCU", reason)
        job.quarantine = True
        try:
            try:
                self._device.reset_ccu()
            finally:
                with self._cond:
                    self._end_launch_hold_locked()
            status = job.submission.wait(self._config.job_timeout_s)
            self.note_reset_outcome("ccu", True)
            with self._cond:
                self._record_automatic_locked(reason, hit, before, True, "compute units reset; jobs re-prefill")
            return status
        except (WaitTimeout, DeviceLost) as exc:
            self.note_reset_outcome("ccu", False)
            self._job_lost(job, f"device unrecoverable after reset: {exc}")
            with self._cond:
                self._record_automatic_locked(reason, hit, before, False, f"device unrecoverable after reset: {exc}")
            return None
        finally:
            if gated:
                self.end_reset()


def _job_view(s: Sequence, now: float) -> JobView:
    return JobView(
        s.job_id,
        s.request.model,
        s.generation,
        s.state.name,
        s.lane,
        len(s.request.prompt_tokens),
        len(s.generated),
        s.request.priority,
        now - s.t_submit,
        s.request.client_request_id,
    )


def _timestamps(job: DeviceJob) -> JobTimestamps | None:
    """A finished device job's own timestamps; None when the device cannot say (lost meanwhile)."""
    if job.submission is None:
        return None
    try:
        return job.submission.timestamps()
    except DeviceError:
        return None


def _queued(seq: Sequence) -> RequestQueued:
    req = seq.request
    return RequestQueued(
        seq.job_id, req.model, seq.generation, len(req.prompt_tokens), len(req.resume_tokens),
        req.client_request_id, seq.internal, seq.t_submit, req.trace,
    )  # fmt: skip


def _finished(seq: Sequence) -> RequestFinished:
    """The observers' record of a request's Final: the one its log holds (the first written wins, as
    its client saw it), so the metrics carry exactly the usage and timings the client got."""
    final = seq.log.read(seq.log.produced() - 1)[-1]
    assert isinstance(final, FinalEvent)
    return RequestFinished(
        seq.job_id, seq.request.model, seq.generation, final.reason, final.error_kind, final.usage, final.timings,
        seq.internal, time.monotonic(),
    )  # fmt: skip


def _started(job: DeviceJob) -> DeviceJobStarted:
    plan = job.plan
    job_ids = tuple(s.job_id for s in plan.seqs)
    return DeviceJobStarted(
        job.device_job_id, plan.task, job.engine_slot, plan.runtime.alias, job.generation, job_ids, job.t_submit
    )


def _job_done(
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
        tuple(_fault_kind(status, anomaly) for anomaly in settlement.anomalies),
    )  # fmt: skip


def _fault_kind(status: JobStatus, anomaly: str) -> str:
    """The FAULT_* kind of one of a settlement's anomalies (`completion.settle` names them)."""
    if status is JobStatus.CCU_EXCEPTION:
        return FAULT_CCU_EXCEPTION
    if anomaly.startswith("non-finite"):
        return FAULT_NON_FINITE
    return FAULT_COUNTER_MISMATCH


def _status(job: DeviceJob) -> JobStatus:
    """A device job's status now; RUNNING when the device cannot say (lost) or has not got it yet."""
    if job.submission is None:
        return JobStatus.RUNNING
    try:
        return job.submission.status()
    except DeviceError:
        return JobStatus.RUNNING
