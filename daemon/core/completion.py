"""Applying finished device jobs to sequences, KV and buffers (the completion path).

For a DONE job: sample every row from the context's logits outside the engine lock, then under
it commit each row's KV reservation, stream the token, and either finish the sequence or put it
back into the ready set; finally return the context to its pool. A configuration reset may clear
the job's lanes while it is sampled, so `kv_lost` is checked again under the lock before any
commit. For a CCU exception: the KV effect is unknown, so every lane of the job becomes UNKNOWN
and its sequence re-prefills (bounded by `max_recoveries`). Generation fencing: a job whose
generation is no longer running is dropped without touching any lane, buffer or result of another
generation. Once the board stopped serving, a sequence is failed instead of requeued.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from calculet.daemon.core.events import FinishReason, TokenLogprob
from calculet.daemon.core.executor import InFlight
from calculet.daemon.core.jobs import BufferState
from calculet.daemon.core.kv import LaneState, Reservation
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.sequence import SeqState, Sequence
from calculet.daemon.device.errors import DeviceError
from calculet.daemon.device.types import JobStatus
from calculet.daemon.errors import ErrorKind
from calculet.daemon.sampling.history import TokenHistory
from calculet.daemon.sampling.types import RowResult, RowSampling

if TYPE_CHECKING:
    from calculet.daemon.core.engine import Engine

log = logging.getLogger(__name__)


class CompletionApplier:
    """The completion path of one engine (called from its completion thread)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ---- per sequence setup --------------------------------------------------------------

    def attach_history(self, seq: Sequence, rt: ModelRuntime) -> None:
        assert rt.model is not None
        seq.history = TokenHistory(rt.model.vocab_size, seq.request.prompt_tokens, seq.generated)

    # ---- completions ---------------------------------------------------------------------

    def apply(self, job: InFlight, status: JobStatus | None) -> None:
        """Apply a finished job (status None: the job was already failed by the caller)."""
        engine = self.engine
        rt = job.plan.runtime
        with engine.cond:
            fenced = engine.runtimes.get(job.generation) is not rt
        if status is None:
            return
        if status is JobStatus.DONE and not fenced and not job.quarantine and not job.kv_lost:
            self._apply_done(job, rt)
        elif fenced:
            self._drop_fenced(job, rt)
        else:
            self._apply_fault(job, rt, status)

    def _apply_done(self, job: InFlight, rt: ModelRuntime) -> None:
        engine = self.engine
        job.ctx.mark_completing()
        n = len(job.plan.seqs)
        logits = job.ctx.logits[:n]
        rows = [RowSampling(s.request.sampling, s.step, s.history) for s in job.plan.seqs]
        assert rt.sampler is not None
        results = rt.sampler.sample(logits, rows)
        captured = [logits[i].astype(np.float32) if s.capture_logits else None for i, s in enumerate(job.plan.seqs)]
        with engine.cond:
            if job.kv_lost:  # a configuration reset cleared its lanes while we sampled: nothing to commit
                self._fault_locked(job, rt, JobStatus.DONE)
                return
            anomalies = engine.executor.anomalies
            for seq, res, r, cap in zip(job.plan.seqs, results, job.reservations, captured, strict=True):
                if cap is not None and res.token is not None and seq.first_logits is None:
                    seq.first_logits = cap  # the logits of its first token (a NaN row re-prefills)
                self._row_done(rt, seq, res, r)
            assert rt.pool is not None
            rt.pool.release(job.ctx)
            self._check_counters(job)
            if engine.executor.anomalies == anomalies:  # no NaN row, counters agree: a clean job
                engine.executor.note_clean()
            engine.executor.retire(job)
            engine.cond.notify_all()

    def _row_done(self, rt: ModelRuntime, seq: Sequence, res: RowResult, r: Reservation) -> None:
        engine = self.engine
        assert rt.kv is not None
        if res.token is None:  # NaN/Inf logits: the output is untrustworthy, so is the KV it wrote
            rt.kv.rollback(r)
            rt.kv.mark_unknown(r.lane)
            engine.executor.note_anomaly("non-finite logits")
            self.fail_or_recover(rt, seq, "non-finite logits from the device", lane_lost=True)
            return
        rt.kv.commit(r)
        if seq.cancel_requested:
            reason, kind, message = seq.pending_error or (FinishReason.CANCELLED, None, "")
            engine.finish(seq, reason, kind, message)
            return
        logprob = None
        if seq.request.sampling.logprobs is not None and res.logprob is not None:
            logprob = TokenLogprob(res.token, res.logprob, res.top_logprobs)
        assert seq.history is not None
        seq.history.append(res.token)
        finished = seq.accept(res.token, logprob)
        if finished is not None:
            engine.finish(seq, finished, None, "")
        elif seq.deadline is not None and seq.deadline <= time.monotonic():
            engine.finish(seq, FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed")
        elif engine.device_lost:  # the board stopped serving while this job ran: no next step will run
            engine.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, "board stopped serving")
        else:
            seq.lifecycle.move(SeqState.READY)
            engine.scheduler.mark_ready(seq)

    def _apply_fault(self, job: InFlight, rt: ModelRuntime, status: JobStatus) -> None:
        """CCU exception, a hung job collected after a reset, or a job whose lanes a configuration
        reset cleared: lanes unknown, sequences recover."""
        with self.engine.cond:
            self._fault_locked(job, rt, status)

    def _fault_locked(self, job: InFlight, rt: ModelRuntime, status: JobStatus) -> None:
        engine = self.engine
        if not (job.kv_lost or job.reset_hit):  # a reset's deliberate CCU exception is not a device anomaly
            engine.executor.note_anomaly(f"job {job.job_id} ended {status.value}")
        assert rt.kv is not None and rt.pool is not None
        reason = "a configuration reset cleared its KV" if job.kv_lost else f"device job ended {status.value}"
        for seq, r in zip(job.plan.seqs, job.reservations, strict=True):
            rt.kv.mark_unknown(r.lane)
            self.fail_or_recover(rt, seq, reason, lane_lost=True)
        self._end_context(job, rt)
        engine.executor.retire(job)
        engine.cond.notify_all()

    def _drop_fenced(self, job: InFlight, rt: ModelRuntime) -> None:
        """The job's generation is gone: its results must not reach anything of another one."""
        engine = self.engine
        log.warning("dropping completion of job %s from retired generation %s", job.job_id, job.generation)
        with engine.cond:
            for seq in job.plan.seqs:
                if seq.state is not SeqState.DONE:
                    engine.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, "model generation retired")
            if rt.pool is not None and job.ctx.state is not BufferState.RETIRED:
                self._end_context(job, rt)
            engine.executor.retire(job)
            engine.cond.notify_all()

    def job_lost(self, job: InFlight, message: str) -> None:
        """The device is gone: fail the job's sequences; its buffers are abandoned with the device."""
        rt = job.plan.runtime
        for seq, r in zip(job.plan.seqs, job.reservations, strict=True):
            if rt.kv is not None and rt.kv.lane(r.lane).state in (LaneState.ACTIVE, LaneState.RESERVED):
                rt.kv.mark_unknown(r.lane)
            if seq.state is not SeqState.DONE:
                self.engine.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, message)

    def end_abandoned(self, job: InFlight) -> None:
        """A job given up while the device still held it (the reset budget was used up), ended on
        the device by an operator reset since: its buffers leave through quarantine and a pool
        rebuild, never reused. Its sequences were failed and its lanes freed when it was given up.
        Engine lock held."""
        rt = job.plan.runtime
        if self.engine.runtimes.get(job.generation) is not rt or rt.pool is None:
            return  # its generation is gone, and its pool with it
        if job.ctx.state in (BufferState.SUBMITTED, BufferState.RUNNING):
            job.quarantine = True
            self._end_context(job, rt)

    # ---- shared helpers (engine lock held) ------------------------------------------------

    def fail_or_recover(self, rt: ModelRuntime, seq: Sequence, message: str, *, lane_lost: bool) -> None:
        """Re-prefill a sequence whose job failed, or end it when it may not recover any more."""
        engine = self.engine
        assert rt.kv is not None
        if not lane_lost and seq.lane is not None:
            rt.kv.mark_unknown(seq.lane)  # simplest correct retry: rebuild the lane from scratch
        seq.recoveries += 1
        engine.counters.recoveries += 1
        if seq.cancel_requested:
            reason, kind, msg = seq.pending_error or (FinishReason.CANCELLED, None, "")
            engine.finish(seq, reason, kind, msg)
        elif engine.device_lost:  # the board stopped serving: no re-prefill will run
            engine.finish(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"{message}; board stopped serving")
        elif seq.recoveries > engine.config.max_recoveries:
            engine.finish(seq, FinishReason.ERROR, ErrorKind.ABORTED, f"{message} (recovery budget exhausted)")
        elif rt.prefill is not None and len(seq.prefill_tokens) > rt.prefill.max_tokens:
            # A package may declare a prefill bucket smaller than its context: a sequence that grew
            # past it cannot be re-prefilled in one job (no chunked prefill), so it cannot recover.
            engine.finish(
                seq,
                FinishReason.ERROR,
                ErrorKind.ABORTED,
                f"{message}; cannot re-prefill {len(seq.prefill_tokens)} tokens into the "
                f"{rt.prefill.max_tokens}-token prefill bucket",
            )
        else:
            seq.lifecycle.move(SeqState.RECOVER)
            engine.scheduler.mark_recover(seq)

    def _end_context(self, job: InFlight, rt: ModelRuntime) -> None:
        """Return a faulted job's context: quarantined (and the pool rebuilt) after a timeout or
        reset, since the device may have held it; otherwise the job finished and it is reusable."""
        assert rt.pool is not None
        if job.quarantine:
            rt.pool.quarantine(job.ctx)
            rt.pool.rebuild(rt.pool.generation + 1)
        else:
            if job.ctx.state is not BufferState.COMPLETING:  # the DONE path already took it back
                job.ctx.mark_completing()
            rt.pool.release(job.ctx)

    def _check_counters(self, job: InFlight) -> None:
        """The device's count of unfinished jobs must match ours (minus the one just finished)."""
        engine = self.engine
        try:
            left = engine.device.counters().left
        except DeviceError:  # lost meanwhile: the path that saw it first fails the board
            return
        expected = len(engine.executor.inflight) - 1
        if left > expected:  # the device may be ahead of us (the other bank finished too), never behind
            engine.executor.note_anomaly(f"device reports {left} jobs left, executor expects {expected}")
