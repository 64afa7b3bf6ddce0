"""The reset controller: with the VirtualDevice, the model generations and the buffer pools, one of the
four things a board's daemon owns (docs/daemon.md, "Reset controller"; docs/sources.md 000 §14).

What it owns, all of one board:

- the reset lifecycle, `ResetState` (table `RESET_TRANSITIONS` in `budget.py`, held by its
  `ResetGate`; `Lifecycle.move` is the one transition function and an illegal edge raises):

      IDLE -> AUTOMATIC_CCU ---------------------------> IDLE   a hung device job (`after_timeout`)
      IDLE -> OPERATOR_CCU ------------> SETTLING -----> IDLE   the Reset RPC (`operator_reset`)
      IDLE -> OPERATOR_CONFIGURATION --> SETTLING -----> IDLE
      OPERATOR_CCU / OPERATOR_CONFIGURATION -----------> IDLE   an unexpected error before it settled

  One reset at a time: an operator reset meeting another is refused (FAILED_PRECONDITION); an
  automatic one never waits for an operator's and runs without the gate (the state stays the operator's);
- the halt, `BoardHalt` (table `HALT_TRANSITIONS`): NONE -> AWAITING_OPERATOR when the automatic
  reset budget is used up or an unload did not give its memory back, lifted (-> NONE) by a
  successful operator reset that finds the device's memory back at its baseline (`keeps_halt`); NONE or
  AWAITING_OPERATOR -> LOST (device lost, unrecoverable after a reset, a crashed device thread),
  which only a restart lifts. Independent of the reset lifecycle: an operator reset runs while the
  board is halted, since that is how a halt lifts. The board is `halted` in both halts;
- the automatic reset budget, the reset counters, the listeners told when the board halts, the
  device jobs given up at a halt while the device still held them, the launch holds, and the
  generations a configuration reset is dropping.

Locking: every piece of that state lives under the engine's lock (`cond`, lent at construction).
Methods named `*_locked` and the properties are called with it held; the others take it themselves
and never call the device under it: a reset *holds launches* (the engine thread prepares no new
device job, and the reset waits until none is being submitted), calls the device without the lock,
then marks what the reset hit under it. The board's audit trail (`core/audit.py`), which the
controller records its resets and escalations in, is lent to it and has its own lock.

Data flow: the engine's completion thread calls `after_timeout` for a hung device job and
`job_lost` when the device is gone; the engine calls `halt_locked` for failures it sees itself and
`lost_kv_locked` as it applies a settlement, and reads `halted`, `launches_held` and
`reconfiguring` when it plans. An operator's Reset comes from `DeviceCore` through
`operator.operator_reset`, which runs this controller's operator steps in order
(`begin_operator_reset` ... `end`). The controller acts on the engine only through `ResetHost` (the
job and lane bookkeeping it may ask for) and the engine's `Executor` (the device jobs a reset acts
on).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from calculet.common.errors import CalculetError, FailedPrecondition, Unavailable
from calculet.common.lifecycle import Lifecycle
from calculet.daemon.core.audit import AuditEntry, AuditPoint, BoardAudit, entry_around, escalation_entry
from calculet.daemon.core.engine_types import EngineConfig
from calculet.daemon.core.errors import BoardHalted, MemoryNotBack
from calculet.daemon.core.executor import DeviceJob, Executor
from calculet.daemon.core.job_buffers import BufferState
from calculet.daemon.core.observe.observer import FAULT_DEVICE_LOST, FAULT_HANG, FaultSeen, ObserverHub
from calculet.daemon.core.observe.status import ResetOutcome
from calculet.daemon.core.resets.budget import (
    HALT_TRANSITIONS,
    BoardHalt,
    BudgetView,
    ResetBudget,
    ResetCounts,
    ResetGate,
    ResetState,
    ResetTally,
)
from calculet.daemon.core.resets.host import ResetHost
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.device.api import VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost, ModelReleased, WaitTimeout
from calculet.daemon.device.types import JobStatus

log = logging.getLogger(__name__)


@dataclass
class ResetCounters:
    """Status counters of resets since start (`CounterView` carries them)."""

    resets: int = 0
    last_reset_reason: str = ""
    last_reset: ResetOutcome | None = None  # set when a reset ends, automatic or operator


class ResetController:
    """Resets and halts of one board (see the module docstring for its states and its lock).

    Args:
        cond: the engine's lock and condition; the controller's state lives under it.
        device: the board (called without the lock, with launches held).
        executor: the engine's device jobs, which resets mark, collect and retire (under the lock).
        host: the engine's bookkeeping the controller may ask for.
        observers: where fault events go.
        config: the job timeout and the automatic reset budget.
        audit: the board's audit trail (`core/audit.py`), where resets and escalations are recorded.
    """

    def __init__(
        self,
        cond: threading.Condition,
        device: VirtualDevice,
        executor: Executor,
        host: ResetHost,
        observers: ObserverHub,
        config: EngineConfig,
        audit: BoardAudit,
    ) -> None:
        self._cond = cond
        self._device = device
        self._executor = executor
        self._host = host
        self._observers = observers
        self._job_timeout_s = config.job_timeout_s
        self._budget = ResetBudget(config.reset_limit, config.reset_window_s)
        self._gate = ResetGate()  # the reset lifecycle, its holder and the running operator reset's tally
        self._halt: Lifecycle[BoardHalt] = Lifecycle("board halt", BoardHalt.NONE, HALT_TRANSITIONS)
        self._halt_note = ""  # why an AWAITING_OPERATOR halt that is not the budget's happened
        self._halt_listeners: list[Callable[[], None]] = []  # told when the board halts
        self._audit = audit  # the board's (`DeviceCore`'s); resets and escalations are recorded in it
        self._counters = ResetCounters()
        self._abandoned: list[DeviceJob] = []  # given up at a halt while the device still held them
        self._launch_holds = 0  # resets in progress that must not see a job being submitted
        self._reconfiguring: frozenset[int] = frozenset()  # generations a configuration reset is dropping

    # ---- what the engine reads (lock held) --------------------------------------------------

    @property
    def state(self) -> ResetState:
        """Which reset runs (IDLE when none)."""
        return self._gate.state

    @property
    def halt(self) -> BoardHalt:
        return self._halt.state

    @property
    def halted(self) -> bool:
        """The board stopped serving on its own (waiting for an operator, or lost)."""
        return self._halt.state is not BoardHalt.NONE

    @property
    def halt_note(self) -> str:
        """Why the board waits for an operator when the reset budget is not the reason ("" if none)."""
        return self._halt_note if self._halt.state is BoardHalt.AWAITING_OPERATOR else ""

    @property
    def launches_held(self) -> bool:
        """A reset is in progress that no device job may be submitted under."""
        return self._launch_holds > 0

    @property
    def reconfiguring(self) -> frozenset[int]:
        """Generations a configuration reset is dropping: none of their jobs is planned meanwhile."""
        return self._reconfiguring

    def halted_error_locked(self) -> BoardHalted:
        """Why a halted board refuses work: waiting for an operator, or lost until a restart."""
        if self._halt.state is BoardHalt.AWAITING_OPERATOR:
            why = self._halt_note or "automatic reset budget used up"
            return BoardHalted(f"{why}: the board waits for an operator reset")
        return BoardHalted("device lost: board is not serving")

    def refusal(self) -> BoardHalted | None:
        """Why the board refuses to configure a package now (it is halted), or None. Takes the lock."""
        with self._cond:
            return self.halted_error_locked() if self.halted else None

    def budget_locked(self) -> BudgetView:
        return self._budget.view()

    def history_locked(self) -> tuple[AuditEntry, ...]:
        """The board's audit trail, oldest first (bounded)."""
        return self._audit.entries()

    def counters_locked(self) -> ResetCounters:
        """A copy of the reset counters."""
        return replace(self._counters)

    def add_halt_listener_locked(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (from an engine thread; it must not block) when the board halts."""
        self._halt_listeners.append(listener)

    def clear_halt_listeners_locked(self) -> None:
        self._halt_listeners.clear()

    def lost_kv_locked(self, job: DeviceJob) -> None:
        """A device job's settlement lost KV: when a reset hit it, its sequences go in the running
        operator reset's tally (before their recovery counts move)."""
        if job.reset_hit and self._gate.tally is not None:
            self._gate.tally.add(job.plan.seqs)

    def set_budget(self, limit: int, window_s: float | None = None) -> None:
        """Change the automatic reset budget (a config reload); resets already spent still count."""
        with self._cond:
            self._budget.limit = limit
            if window_s is not None:
                self._budget.window_s = window_s

    # ---- halts ------------------------------------------------------------------------------

    def halt_locked(self, message: str, halt: BoardHalt = BoardHalt.LOST) -> None:
        """Stop serving: fail every job except those in device jobs, which their completion (or the
        path that gives the job up) fails. `halt` says whether an operator reset may lift it
        (AWAITING_OPERATOR) or only a restart (LOST); a LOST board stays LOST."""
        first = not self.halted
        if self._halt.can_move(halt):
            self._halt.move(halt)
        self._host.drop_parked(f"board stopped serving: {message}")
        if first:
            for listener in self._halt_listeners:  # non-blocking by contract
                listener()
            self._observers.emit(FaultSeen(FAULT_DEVICE_LOST, message, time.monotonic()))
        self._host.fail_unplaced(f"device lost: {message}")

    def halt_for_operator(self, note: str) -> None:
        """Stop serving until an operator reset, for `note` (an unload that did not give its memory
        back): every job fails UNAVAILABLE and Health says NOT_SERVING (the caller audits it)."""
        with self._cond:
            if not self.halted:
                self._halt_note = note
            self.halt_locked(note, BoardHalt.AWAITING_OPERATOR)
            self._cond.notify_all()

    def job_lost(self, job: DeviceJob, message: str, halt: BoardHalt = BoardHalt.LOST) -> None:
        """The device is gone with this job, or no reset may collect it: fail everything; the board
        halts. With AWAITING_OPERATOR the device still holds the job: it is kept until an operator
        reset ends it (`operator_reset_succeeded`)."""
        with self._cond:
            self._host.give_up_job(job, message)
            self.halt_locked(message, halt)
            self._executor.retire(job)
            if halt is BoardHalt.AWAITING_OPERATOR:
                self._abandoned.append(job)
            self._cond.notify_all()

    # ---- the automatic reset -----------------------------------------------------------------

    def after_timeout(self, job: DeviceJob) -> JobStatus | None:
        """A device job hung: reset the compute units so its buffers are released, then collect it
        (AUTOMATIC_CCU). Past the budget the job is given up and the board waits for an operator.

        Returns:
            The job's status to complete it with; None when it was given up.
        """
        assert job.submission is not None
        reason = f"device job {job.device_job_id} did not finish within {self._job_timeout_s}s"
        with self._cond:
            before = (not self.halted, self._host.serving_generations())
            hit = sum(len(j.plan.seqs) for j in self._executor.jobs())
            allowed = self._budget.try_spend()
            if allowed:
                self._counters.resets += 1
                self._counters.last_reset_reason = reason
                for other in self._executor.jobs():  # the hang is the anomaly, not the CCU exceptions it causes
                    other.reset_hit = True
                self._hold_launches_locked()
            self._executor.note_anomaly(reason)
            self._host.drop_parked(reason)
            self._observers.emit(FaultSeen(FAULT_HANG, reason, time.monotonic()))
            # Operators are refused while it runs; it never waits for an operator's reset to end.
            gated = allowed and self._gate.try_begin("automatic ccu reset", state=ResetState.AUTOMATIC_CCU)
        if not allowed:
            budget = self._budget.view()
            message = f"{reason}; {budget.limit} automatic resets per {budget.window_s:g}s used up: needs an operator"
            log.error("%s", message)
            self.job_lost(job, message, BoardHalt.AWAITING_OPERATOR)
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
            status = job.submission.wait(self._job_timeout_s)
            self.note_outcome("ccu", True)
            with self._cond:
                self._record_automatic_locked(reason, hit, before, True, "compute units reset; jobs re-prefill")
            return status
        except (WaitTimeout, DeviceLost) as exc:
            self.note_outcome("ccu", False)
            self.job_lost(job, f"device unrecoverable after reset: {exc}")
            with self._cond:
                self._record_automatic_locked(reason, hit, before, False, f"device unrecoverable after reset: {exc}")
            return None
        finally:
            if gated:
                self.end()

    def _record_automatic_locked(self, reason: str, hit: int, before: AuditPoint, ok: bool,
                                 message: str, fault: str = "hang", kind: str = "ccu") -> None:  # fmt: skip
        after = (not self.halted, self._host.serving_generations())
        entry = entry_around(
            before, after, kind=kind, automatic=True, reason=reason, fault=fault,
            inflight_jobs=hit, recovered=0, failed=0, ok=ok, message=message,
        )  # fmt: skip
        self._audit.record(entry)  # its own lock, taken under the engine's

    # ---- an escalation's reset, step by step (`automatic.py` orders them) -------------------

    def begin_automatic_reset(self, kind: str, reason: str, fault: str, *, lost: bool = False) -> ResetTally | None:
        """Take the gate for an escalation's reset ("ccu" or "configuration") and spend one automatic
        reset of the budget. Returns the tally the reset records the jobs it hit in (`end` gives the
        gate back); None when it does not run: the board is halted (unless `lost`: the unhealthy
        escalation's reset of a LOST board), another reset holds the gate (that one resets anyway), or
        the budget is used up: then the board halts and waits for an operator (a LOST one stays LOST),
        audited.
        """
        with self._cond:
            halted = self.halted and not (lost and self._halt.state is BoardHalt.LOST)
            if halted or self._gate.busy:
                log.warning("%s: no %s reset (%s)", reason, kind, "board halted" if self.halted else self._gate.holder)
                return None
            before = (not self.halted, self._host.serving_generations())
            if not self._budget.try_spend():
                budget = self._budget.view()
                message = f"{budget.limit} automatic resets per {budget.window_s:g}s used up: needs an operator"
                log.error("%s; %s", reason, message)
                self.halt_locked(message, BoardHalt.AWAITING_OPERATOR)
                self._record_automatic_locked(reason, 0, before, False, message, fault="budget exhausted", kind=kind)
                return None
            tally = ResetTally()
            state = ResetState.AUTOMATIC_CCU if kind == "ccu" else ResetState.AUTOMATIC_CONFIGURATION
            self._gate.try_begin(f"automatic {kind} reset ({fault})", tally, state)
            self._counters.resets += 1
            self._counters.last_reset_reason = reason
        return tally

    def lift_lost(self) -> bool:
        """The unhealthy escalation's device reset restored the board: lift a LOST halt (the models
        are warmed again next). Returns whether it was lifted."""
        with self._cond:
            if self._halt.state is not BoardHalt.LOST:
                return False
            self._halt.move(BoardHalt.NONE)
            self._executor.restore_limit("device reset after the board was lost")
            self._cond.notify_all()
            return True

    # ---- operator resets, step by step (`operator.py` orders them) ---------------------

    def begin_operator_reset(self, kind: str, reason: str) -> ResetTally:
        """Take the gate for an operator reset ("ccu" or "configuration") and count it. Returns the
        tally the reset records the jobs it hits in; `end` gives the gate back.

        Raises:
            FailedPrecondition: another reset is in progress (nothing changed).
        """
        tally = ResetTally()
        state = ResetState.OPERATOR_CCU if kind == "ccu" else ResetState.OPERATOR_CONFIGURATION
        with self._cond:
            if not self._gate.try_begin(f"operator {kind} reset", tally, state):
                raise FailedPrecondition(f"reset in progress ({self._gate.holder}): try again once it has ended")
            self._counters.resets += 1
            self._counters.last_reset_reason = f"operator {kind} reset: {reason}"
        return tally

    def reset_ccu(self) -> None:
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
            self._host.drop_parked("operator CCU reset")
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
            tally = self._gate.tally or ResetTally()
            live = {id(job) for job in self._executor.jobs()}
            for job in ended:
                if id(job) in live:  # one applied meanwhile was recorded by `lost_kv_locked`
                    tally.add(job.plan.seqs)

    def reset_configuration(self, reason: str) -> list[ModelRuntime]:
        """Reset the device's configuration, which (as on CalRT 0.7.6) drops every configured model:
        their device jobs end as CCU exceptions, their KV is gone and their handles are invalid.

        Every sequence holding a lane and not in a device job re-prefills; those in a job learn it
        from their completion. A Ready generation goes back to Configuring: its clients wait (no job
        of theirs is planned) until the caller has configured it again and its golden check passed
        (`Engine.replace_model`, `Engine.move_generation`). A Draining one ends its jobs with
        UNAVAILABLE.

        The device call runs outside the engine lock with launches held, so no job is planned on a
        lane the reset is clearing or submitted with a handle it is invalidating.

        Returns:
            The generations to configure and warm again, oldest first.

        Raises:
            DeviceError: the device failed the reset (nothing changed here).
        """
        with self._cond:
            self._hold_launches_locked()
            attempts = self._host.generation_count() + 1  # an unload may release a listed handle meanwhile
        configured: list[ModelRuntime] = []
        try:
            for _ in range(attempts):
                with self._cond:
                    configured = self._host.configured()
                    self._reconfiguring = frozenset(rt.generation for rt in configured)  # no client job meanwhile
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
                self._reconfiguring = frozenset()
                self._end_launch_hold_locked()
            raise
        with self._cond:
            self._end_launch_hold_locked()
            self._reconfiguring = frozenset()
            tally = self._gate.tally or ResetTally()  # the running operator reset's record of its hits
            return [rt for rt in configured if self._host.configuration_lost(rt, reason, tally)]

    def keeps_halt(self, memory: MemoryNotBack | None) -> MemoryNotBack | None:
        """An operator reset re-measured the device's memory: a board waiting for an operator stays
        halted while it is not back at its baseline (`memory`), since a halt lifts only once the
        memory is proven back (docs/daemon.md, "Device memory").

        Returns:
            `memory` when the halt stays for it; None when the memory is back, the board is not
            halted, or it is LOST (`operator_reset_succeeded` says why that one stays).
        """
        with self._cond:
            return memory if self._halt.state is BoardHalt.AWAITING_OPERATOR else None

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
                self._halt.move(BoardHalt.NONE)  # admitting again unless an operator drained meanwhile
                self._halt_note = ""
            else:
                upkeeps = []
            self._budget.clear()
            self._executor.restore_limit("operator reset")
            self._cond.notify_all()
        for upkeep in upkeeps:  # rebuilds: device calls, outside the lock
            self._host.run_upkeep(upkeep)
        return None

    def wait_settled(self, tally: ResetTally, timeout: float) -> ResetCounts:
        """The operator reset's device work is done (SETTLING): wait up to `timeout` seconds until
        every job it hit rebuilt its KV or ended; count them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._gate.settle()
            while not tally.settled() and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return tally.counts()

    def note_outcome(self, kind: str, ok: bool) -> None:
        """Record how the reset that just ended went (Status: ResetSummary.last_kind/at/ok)."""
        with self._cond:
            self._counters.last_reset = ResetOutcome(kind, time.time(), ok)

    def end(self) -> None:
        """Give the gate back (IDLE)."""
        with self._cond:
            self._gate.end()
            self._cond.notify_all()

    def record(self, entry: AuditEntry) -> None:
        """Add a reset to the board's audit trail, as it ends (`resets/operator.py`, `resets/automatic.py`)."""
        self._audit.record(entry)

    # ---- internals (lock held) ----------------------------------------------------------------

    def escalated_locked(self, kind: str, fault: str, reason: str, jobs: int) -> None:
        """An escalation that is not a reset (`kind` "drain": the board drained itself): tell the
        health listeners it stopped serving and audit it. The engine has already acted."""
        for listener in self._halt_listeners:  # non-blocking by contract
            listener()
        generations = self._host.serving_generations()
        message = f"{jobs} unfinished jobs ended UNAVAILABLE (resume elsewhere); calctl resume brings it back"
        before, after = (True, generations), (False, generations)
        self._audit.record(escalation_entry(kind, reason, fault, jobs, before, after, True, message))

    def _quarantine_abandoned_locked(self, job: DeviceJob) -> bool:
        """A job given up while the device still held it (the reset budget was used up), ended on
        the device by an operator reset since: its buffers must leave through quarantine and a pool
        rebuild, never reused. Its sequences were failed and its lanes freed when it was given up.

        Returns:
            Whether its context still needs ending (quarantine; the rebuild runs without the lock).
        """
        if not self._host.job_generation_runs(job):
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


def _status(job: DeviceJob) -> JobStatus:
    """A device job's status now; RUNNING when the device cannot say (lost) or has not got it yet."""
    if job.submission is None:
        return JobStatus.RUNNING
    try:
        return job.submission.status()
    except DeviceError:
        return JobStatus.RUNNING
