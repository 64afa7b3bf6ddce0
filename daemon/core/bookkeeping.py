"""The engine's job and lane bookkeeping: how a client job (a `ClientJob`) moves between the
scheduler, the device jobs and the job table, and how it ends.

`Bookkeeper` queues new sequences (`enqueue`); ends them (parking or freeing their lanes, queueing
lane closes, writing Finals, retaining and counting them); moves them out of a finished device job
(`apply`: next step, next chunk, a jump-forward's prefill, re-prefill, end); re-prefills those whose
KV was lost outside a device job; expires them; and fails them when the board halts or a
configuration reset drops their model (the `ResetHost` half the reset controller asks for).

Ownership: the engine owns its `Bookkeeper` and the components it acts on (scheduler, job table,
generation table, executor, lane closes, counters, observer hub); the bookkeeper owns no state of its
own. Every method is called with the engine lock held, and none calls the device. `halted` reads the
reset controller's halt; `notify` wakes the engine's waiters (`Condition.notify_all`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from calculet.common.errors import DeadlineExceeded, ErrorKind, Overloaded
from calculet.daemon.core import completion, expiry
from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.completion import Chunked, Continue, Next, Recover, Settlement
from calculet.daemon.core.engine_types import EngineConfig
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.executor import DeviceJob, Executor
from calculet.daemon.core.generations import GenerationTable
from calculet.daemon.core.job_table import JobTable
from calculet.daemon.core.jump import Jumped
from calculet.daemon.core.lane_closes import LaneCloses
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.observe import observer_records
from calculet.daemon.core.observe.observer import ObserverHub, RequestFinished, RequestQueued, RequestRejected
from calculet.daemon.core.resets.budget import ResetTally
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import JobPlan, Scheduler

log = logging.getLogger(__name__)

# Finishes after which a lane's KV is trusted and worth keeping warm (prefix reuse).
_PARKABLE = frozenset({FinishReason.STOP, FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.DEADLINE})


@dataclass
class EngineCounters:
    """The engine's counters since start (Status; `CounterView`), under the engine lock."""

    submitted: int = 0
    rejected: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    decode_jobs: int = 0
    decode_rows: int = 0
    recoveries: int = 0


class Bookkeeper:
    """Moves and ends the engine's sequences (engine lock held for every method).

    Args:
        halted: whether the board is halted (`ResetController.halted`).
        notify: wake every waiter on the engine's condition.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        scheduler: Scheduler,
        jobs: JobTable,
        generations: GenerationTable,
        executor: Executor,
        lane_closes: LaneCloses,
        counters: EngineCounters,
        observers: ObserverHub,
        halted: Callable[[], bool],
        notify: Callable[[], None],
    ) -> None:
        self._config = config
        self._scheduler = scheduler
        self._jobs = jobs
        self._generations = generations
        self._executor = executor
        self._lane_closes = lane_closes
        self._counters = counters
        self._observers = observers
        self._halted = halted
        self._notify = notify

    def enqueue(self, seq: ClientJob, digest: bytes, rt: ModelRuntime) -> None:
        """Queue a new job of `rt` for a KV lane and add it to the job table; the caller checked that
        the board admits it (its prefill array, if prefix reuse needs one, was built before the lock).

        Raises:
            DeadlineExceeded: its deadline passed before it could be queued.
            Overloaded: the admission queue is full.
        """
        model = seq.request.model
        try:
            self._scheduler.enqueue(seq, rt.kv.free_count() if rt.kv is not None else 0, self._expected_keep(seq, rt))
        except Overloaded:
            if seq.deadline is not None and seq.deadline <= time.monotonic():
                # Not a capacity refusal: retrying elsewhere (what OVERLOADED invites) cannot help.
                self.rejected(model, "deadline")
                raise DeadlineExceeded(
                    f"deadline of {seq.request.deadline_s}s passed before the request was queued"
                ) from None
            self.rejected(model, "queue_full")
            raise  # counted in `rejected` by the transport, with every other refused Submit
        self._jobs.add(seq, digest)
        if not seq.internal:  # warm-up probes are not client requests
            self._counters.submitted += 1
        if self._observers.wants(RequestQueued):
            self._observers.emit(observer_records.queued(seq))

    def _expected_keep(self, seq: ClientJob, rt: ModelRuntime) -> int:
        """Prefill tokens of a new client request that a parked lane holds now (lock held; its array
        was built before the lock): what the scheduler classifies it by."""
        policy = self._config.policy
        if not rt.prefix_reuse or seq.internal or rt.kv is None or not rt.kv.parked_count():
            return 0
        return rt.kv.expected_keep(seq.prefill_array(), policy.prefix_min_tokens)

    def rejected(self, model: str, reason: str) -> None:
        """Tell the observers admission refused a Submit (the transport counts it in `rejected`)."""
        if self._observers.wants(RequestRejected):
            self._observers.emit(RequestRejected(model, reason, time.monotonic()))

    def launch_failed(self, plan: JobPlan, exc: Exception, *, serving: bool = True) -> None:
        """The job never reached the device (reservations already rolled back): re-prefill its
        sequences from scratch, or fail them (UNAVAILABLE, resume elsewhere, when not `serving`)."""
        log.warning("submit of %s job failed: %s", plan.task.value, exc)
        for seq in plan.seqs:
            self.lose_kv(seq, plan.runtime, f"submit failed: {exc}", serving=serving, refused=True)

    def apply(self, job: DeviceJob, settlement: Settlement) -> None:
        """Carry out a settlement: KV effects through the executor, tokens and moves on the
        sequences, anomalies. The caller has told the reset controller of lost KV first, and then
        returns the job's buffers and retires it."""
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
            if row.nonfinite:
                seq.nonfinite += 1
            if row.token is not None:
                seq.accept(row.token, row.logprob)
            if row.forced:  # jump-forward: the run the grammar forced after it, as if each was drawn
                for i, token in enumerate(row.forced):
                    seq.accept(token, row.forced_logprobs[i] if row.forced_logprobs else None)
                stats = job.plan.runtime.jumps
                stats.runs += 1
                stats.tokens += len(row.forced)
                stats.ended += not isinstance(row.then, Jumped)
            self.follow(seq, row.then)
        if settlement.anomalies or any(r.lost_kv for r in settlement.rows):
            self.drop_parked(f"device job {job.device_job_id} lost KV")  # never trust KV after a fault
        for anomaly in settlement.anomalies:
            self._executor.note_anomaly(anomaly)
        if settlement.clean:
            self._executor.note_clean()
        self._notify()

    # ---- ending and moving sequences ------------------------------------------------------

    def cancel(self, seq: ClientJob, reason: FinishReason, kind: ErrorKind | None, message: str) -> None:
        """Stop delivering a job. Waiting/ready sequences end now; one in a device job ends when its
        completion sees `cancel_requested` and the device is done with its lane."""
        seq.cancel_requested = True
        if kind is not None:  # cancelled by unload/drain, not by its owner: report the error
            seq.pending_error = (reason, kind, message)
        if seq.state is SeqState.WAITING:
            self._scheduler.remove_waiting(seq)
            self.finish(seq, reason, kind, message)
        elif seq.state in (SeqState.READY, SeqState.RECOVER, SeqState.PARTIAL):
            self._scheduler.forget(seq)
            self.finish(seq, reason, kind, message)

    def finish(self, seq: ClientJob, reason: FinishReason, kind: ErrorKind | None, message: str) -> None:
        """End a sequence that is not in a device job: park or free its lane, write its Final, retain it."""
        rt = self._generations.running(seq.generation)
        park_at = time.monotonic() if self._may_park(seq, rt, reason) else None
        lane = self._scheduler.release_lane(seq, rt, park_at=park_at)
        if lane is not None and rt is not None and rt.model is not None:
            self._lane_closes.add(rt.model, lane)  # closed on the device outside the lock
        retry_after_s = self._scheduler.policy.retry_after_s if kind is ErrorKind.OVERLOADED else None
        seq.finish(reason, kind, message, retry_after_s)
        retired = self._jobs.retire(seq)
        if retired and self._observers.wants(RequestFinished):
            self._observers.emit(observer_records.finished(seq))
        if retired and not seq.internal:  # counted once, client jobs only
            if reason in (FinishReason.STOP, FinishReason.LENGTH):
                self._counters.completed += 1
            elif reason is FinishReason.CANCELLED:
                self._counters.cancelled += 1
            else:
                self._counters.failed += 1
        self._notify()

    def follow(self, seq: ClientJob, then: Next) -> None:
        """Move a sequence out of its finished device job: next step, re-prefill, or its end."""
        if isinstance(then, Continue):
            seq.lifecycle.move(SeqState.READY)
            self._scheduler.mark_ready(seq)
        elif isinstance(then, Chunked):
            seq.lifecycle.move(SeqState.PARTIAL)
            self._scheduler.mark_partial(seq)
        elif isinstance(then, Jumped):
            # Its lane lacks the drawn token and the forced run: a short prefill, classed as one.
            rt = self._generations.running(seq.generation)
            held = rt.kv.lane(seq.lane).length if rt is not None and rt.kv is not None and seq.lane is not None else 0
            seq.expected_uncached = len(seq.prompt) + len(seq.generated) - held
            seq.lifecycle.move(SeqState.PARTIAL)
            self._scheduler.mark_partial(seq)
        elif isinstance(then, Recover):
            seq.lifecycle.move(SeqState.RECOVER)
            self._scheduler.mark_recover(seq)
            rt = self._generations.running(seq.generation)
            if rt is not None and rt.state in (ModelState.CONFIGURING, ModelState.WARMING) and not seq.internal:
                self.vacate_lane(seq, rt)  # its KV is gone anyway; the golden check needs a lane
        else:
            self.finish(seq, then.reason, then.kind, then.message)

    def _may_park(self, seq: ClientJob, rt: ModelRuntime | None, reason: FinishReason) -> bool:
        """Whether a finishing client sequence leaves its lane parked (its KV trusted, for a later
        request to reuse): prefix reuse is on for its generation, which is Ready on a serving board,
        and it ended normally (stop, length, its client's cancel, its deadline) rather than by a
        fault. The offset check's first probe parks too (`ProbeShape.park`), while it warms up."""
        if rt is None or self._halted() or reason not in _PARKABLE:
            return False
        if seq.internal:
            return seq.probe is not None and seq.probe.park
        return rt.prefix_reuse and rt.state is ModelState.READY

    def drop_parked(self, why: str) -> None:
        """Drop every parked lane of the board: after a reset or a fault whose KV effect is unknown,
        no parked KV is trusted (open lanes are closed on the device before any is opened again)."""
        for rt in self._generations.all():
            if rt.kv is not None and (dropped := rt.kv.drop_parked()):
                rt.prefix.dropped += len(dropped)
                log.info("dropped %d parked lane(s) of %s@%d: %s", len(dropped), rt.alias, rt.generation, why)

    def vacate_lane(self, seq: ClientJob, rt: ModelRuntime) -> None:
        """A recovering sequence gives its lane back; it re-prefills into a free lane later."""
        if (lane := self._scheduler.release_lane(seq, rt)) is not None and rt.model is not None:
            self._lane_closes.add(rt.model, lane)

    def lose_kv(
        self, seq: ClientJob, rt: ModelRuntime, message: str, *, serving: bool = True, refused: bool = False
    ) -> None:
        """A sequence outside any device job lost its KV (its job never ran, or a reset cleared its
        lane): re-prefill it, or end it when it may not recover any more or the board stops serving.
        `refused`: the device refused its job (`completion.recovery`)."""
        self._scheduler.lose_lane(seq, rt)
        serving = serving and not self._halted()
        then = completion.recovery(
            seq, rt, message, serving=serving, max_recoveries=self._config.max_recoveries, refused=refused
        )
        seq.recoveries += 1
        self._counters.recoveries += 1
        self.follow(seq, then)

    def expire(self) -> None:
        """End what ran out of time: queued jobs past their deadline or the admission timeout, lane
        holders past their deadline, orphans (`expiry.py`)."""
        self._jobs.expire()  # frees retained memory whenever the engine wakes anyway
        now = time.monotonic()
        for seq in self._scheduler.expire(now):
            if seq.deadline is not None and seq.deadline <= now:
                self.finish(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed in queue")
            else:
                self._counters.rejected += 1
                self.rejected(seq.request.model, "admission_timeout")
                self.finish(seq, FinishReason.ERROR, ErrorKind.OVERLOADED, "admission deadline: no KV lane became free")
        for seq in expiry.past_deadline(self._scheduler, now):
            self._scheduler.forget(seq)
            self.finish(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed")
        limit = self._config.orphan_timeout_s
        if limit is not None:
            for seq in expiry.clients(self._jobs):
                if seq.log.detached_for(now) >= limit:
                    log.info("cancelling job %s: no Wait attached for %.0fs", seq.job_id, limit)
                    self.cancel(seq, FinishReason.CANCELLED, None, "")

    # ---- what the reset controller may ask for (`ResetHost`) --------------------------------

    def serving_generations(self) -> tuple[str, ...]:
        """The serving models as the reset audit records them: "alias@generation (package)", so a
        rollback or a rollout shows which package served before and after."""
        published = self._generations.all_published()
        return tuple(f"{rt.alias}@{rt.generation} ({rt.package_dir.name})" for rt in published if rt.state.serving)

    def configured(self) -> list[ModelRuntime]:
        """Generations holding a configured model whose jobs may run, oldest first."""
        return [
            rt
            for rt in self._generations.all()
            if rt.model is not None and self._generations.running(rt.generation) is rt
        ]

    def configuration_lost(self, rt: ModelRuntime, reason: str, tally: ResetTally) -> bool:
        """A reset dropped this generation's configuration. Returns whether it must be configured
        and warmed again (it was Ready)."""
        for job in self._executor.jobs():  # a job done on the device but not yet applied too
            if job.generation == rt.generation:
                job.kv_lost = True
                tally.add(job.plan.seqs)
        for seq in self._scheduler.holding_kv(rt.generation):
            tally.add((seq,))
            self._scheduler.forget(seq)
            self.lose_kv(seq, rt, reason)
        assert rt.kv is not None
        self.drop_parked(reason)
        rt.kv.forget_device_lanes()  # the device dropped them with the configuration
        if rt.state is ModelState.READY:  # its recovering jobs give their lanes to the warm-up probe
            for seq in [s for s in self._scheduler.recover if s.generation == rt.generation]:
                self.vacate_lane(seq, rt)
        dropped = rt.model
        self._lane_closes.forget_model(dropped)
        if rt.state is ModelState.READY:
            rt.lifecycle.move(ModelState.CONFIGURING)
            return True
        for seq in [s for s in self._jobs if s.generation == rt.generation]:
            self.cancel(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"{reason}: model {rt.state.value}")
        return False

    def fail_unplaced(self, message: str) -> None:
        """The board halted: fail every sequence except those in device jobs, which their completion
        (or the path that gives the job up) fails."""
        in_jobs = {s.job_id for job in self._executor.jobs() for s in job.plan.seqs}
        for seq in list(self._jobs):
            if seq.job_id in in_jobs:
                continue
            self._scheduler.remove_waiting(seq)
            self._scheduler.forget(seq)
            self.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, message)

    def give_up_job(self, job: DeviceJob, message: str) -> None:
        """The device is gone with this job: its lanes become UNKNOWN and its sequences fail; its
        buffers are abandoned with the device."""
        for row, seq in enumerate(job.plan.seqs):
            if job.plan.runtime.kv is not None:
                self._executor.lose_row(job, row)
            if seq.state is not SeqState.DONE:
                self.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, message)
