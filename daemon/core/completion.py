"""The completion step: what a finished device job means for its rows, decided without changing
anything (docs/daemon.md).

Two functions, both free of engine state:

- `sample(job)` (no lock; the completion thread owns the job's buffers now) turns the context's
  logits into one token per row;
- `settle(job, status, sampled, facts)` (called under the engine lock, so what it reads of the
  sequences is stable) returns a `Settlement`: per row the KV effect (commit or lose), the token to
  stream, and what follows (next step, re-prefill, or end with a reason); plus the anomaly to count.

The engine applies the settlement: the executor commits or loses the rows' reservations and ends the
context, the sequences stream and move on, the scheduler frees lanes of those that end. Rules:

- DONE: each row's KV is committed and its token streamed; a NaN/Inf row is an anomaly, its KV is
  lost and it re-prefills. A constrained row whose grammar then forces a run of tokens streams the
  run too (jump-forward, `jump.py`): the run ends the sequence, or a prefill of it follows
  (`Jumped`). A prefill chunk that is not its prompt's last (chunked prefill) samples nothing: its
  KV is committed, its logits only checked for NaN/Inf, and the sequence's next chunk follows
  (`Chunked`). A configuration reset that cleared the job's lanes (`kv_lost`) makes it a
  fault even if the device says DONE.
- CCU exception or a hung job collected after a reset: every row's KV is unknown; the sequences
  re-prefill, at most `max_recoveries` times each. A reset's own CCU exceptions are not anomalies.
- Generation fencing: a job whose generation no longer runs touches no lane, no buffer and no result
  of another generation; its sequences end with UNAVAILABLE.
- Once the board stopped serving, a sequence ends instead of continuing or re-prefilling.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum, auto

import ml_dtypes
import numpy as np

from calculet.common.errors import ErrorKind
from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.events import FinishReason, TokenLogprob
from calculet.daemon.core.executor import DeviceJob
from calculet.daemon.core.jump import Jumped, forced_logprobs, forced_run, settle_run
from calculet.daemon.core.row_masks import RowMasks
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.utilization import JobCopies
from calculet.daemon.device.types import JobStatus, TaskType
from calculet.daemon.grammar.matcher import NO_RUN, ForcedRun, MatcherState
from calculet.daemon.sampling.sampler import Sampler
from calculet.daemon.sampling.thinking import ThinkPhase
from calculet.daemon.sampling.topk import TopkRows
from calculet.daemon.sampling.types import RowResult, RowSampling


class KvEffect(Enum):
    NONE = auto()  # the generation is gone: its lanes are not touched
    COMMIT = auto()  # the row's output is trusted: the lane holds the reserved length
    LOSE = auto()  # the row's KV is untrusted: the lane becomes UNKNOWN


@dataclass(frozen=True)
class End:
    """The sequence ends with this Final."""

    reason: FinishReason
    kind: ErrorKind | None = None
    message: str = ""


@dataclass(frozen=True)
class Recover:
    """The sequence re-prefills its prompt and tokens into its (rebuilt) lane."""

    message: str


@dataclass(frozen=True)
class Continue:
    """The sequence is ready for its next decode step."""


@dataclass(frozen=True)
class Chunked:
    """A chunk of the sequence's prefill is in its lane; the next chunk follows."""


Next = End | Recover | Continue | Chunked | Jumped


@dataclass(frozen=True)
class RowOutcome:
    """What one row of a device job means for its sequence.

    Attributes:
        row: the row's index in the device job (its reservation).
        token / logprob: the token to stream (None: nothing to stream).
        first_logits: the step's logits, for a sequence that captures them (golden check).
        lost_kv: the row lost its KV (the sequence's recovery count goes up, as in Status).
        nonfinite: the row's logits were NaN/Inf (a probe counts them: its golden re-check judges them).
        forced / forced_logprobs: the run the grammar forces after `token` (jump-forward), streamed
            after it, and their logprobs when asked for (`jump.forced_logprobs`).
    """

    row: int
    seq: ClientJob
    kv: KvEffect
    then: Next
    token: int | None = None
    logprob: TokenLogprob | None = None
    first_logits: np.ndarray | None = None
    lost_kv: bool = False
    nonfinite: bool = False
    forced: tuple[int, ...] = ()
    forced_logprobs: tuple[TokenLogprob, ...] = ()


class DeviceFault(Enum):
    """The device fault a settlement saw, for the escalations (`resets/escalation_watch.py`): a CCU exception
    the device raised on its own (not a reset's), or non-finite logits in any row."""

    NONE = auto()
    CCU_EXCEPTION = auto()
    NONFINITE = auto()


@dataclass(frozen=True)
class Settlement:
    """A finished device job, decided. `anomalies`: device anomalies to count (each drops the in-flight
    limit); `clean`: a DONE job with none (enough in a row restore a degraded limit); `fault`: the
    device fault it saw, which the escalations count."""

    rows: tuple[RowOutcome, ...]
    anomalies: tuple[str, ...] = ()
    clean: bool = False
    fault: DeviceFault = DeviceFault.NONE


@dataclass(frozen=True)
class Sampled:
    """The sampled rows of a DONE job and the captured logits (None where not captured). A row that
    is a non-final prefill chunk has no result: `chunk_finite` says whether its logits were finite.
    A constrained row's `grammar_stop`: its token completes the grammar (the sequence ends STOP);
    `grammar_failed`: why its matcher allowed no token (it ends with an error; empty: none did).
    `runs`: per row, the run its grammar forces after its token (`jump.forced_run`; empty: the
    model does not jump)."""

    results: list[RowResult | None]
    captured: list[np.ndarray | None]
    chunk_finite: list[bool]
    grammar_stop: tuple[bool, ...] = ()
    grammar_failed: tuple[str | None, ...] = ()
    runs: tuple[ForcedRun, ...] = ()


@dataclass(frozen=True)
class BoardFacts:
    """What `settle` needs to know about the board, read under the engine lock.

    Attributes:
        fenced: the job's generation no longer runs.
        serving: the board still serves (not lost, not halted).
        max_recoveries: re-prefills a sequence may need before it fails.
        device_left / expected_left: unfinished jobs the device reports (None: it could not say)
            and the number the executor expects besides this one.
        running: sequences holding lanes of the job's generation (the streams decode steps are
            shared among: jump-forward's threshold, `jump.py`).
    """

    fenced: bool
    serving: bool
    max_recoveries: int
    device_left: int | None = None
    expected_left: int = 0
    running: int = 1


def prepare_masks(job: DeviceJob) -> None:
    """Compute the job's constrained rows' masks now, while the device runs it (the waiting thread
    calls this between the job's submit and its wait): the matchers cannot change before its
    settlement, because only accepting one of this job's tokens advances them."""
    if job.masks is None and any(s.answer_grammar is not None for s in job.plan.seqs):
        job.masks = row_masks(job.plan.seqs)


def sample(job: DeviceJob) -> Sampled:
    """Sample one token per row from the job's logits (no lock: the job's buffers are the completion
    thread's until the settlement is applied)."""
    job.ctx.mark_completing()
    rt = job.plan.runtime
    assert rt.sampler is not None
    seqs = job.plan.seqs
    if "topk_ids" in job.ctx.outputs:
        return _sample_topk(job, rt.sampler)
    # Each sequence's row (fixed slots: its slot; a gather copies only when idle rows lie between).
    logits = job.ctx.logits[: len(seqs)] if job.rows_in_place else job.ctx.logits[list(job.out_rows)]
    chunks = [is_chunk(job, i) for i in range(len(seqs))]
    if any(chunks):  # a prefill job has one row: a chunk is checked, never sampled
        finite = [rt.sampler.finite(logits[i]) for i in range(len(seqs))]
        return Sampled([None] * len(seqs), [None] * len(seqs), finite)
    rows, failed = _rows(job)
    results: list[RowResult | None] = _forced(seqs, rt.sampler.sample(logits, rows))
    captured = [logits[i].astype(np.float32) if s.capture_logits else None for i, s in enumerate(seqs)]
    stops = _grammar_stops(seqs, results, failed)
    return Sampled(results, captured, [True] * len(seqs), stops, failed, _runs(job, results, stops, failed))


def row_masks(seqs: list[ClientJob]) -> RowMasks:
    """Per row, the mask its matcher allows next (None: unconstrained, or inside a think block), and
    why a matcher allows nothing (a FAILED matcher: such a row is sampled unconstrained and its token
    never used). A thinking row whose first token may still open its block may also draw the open
    token (docs/daemon.md "Thinking budget")."""
    masks: list[np.ndarray | None] = []
    failed: list[str | None] = []
    for s in seqs:
        allowed = None
        problem = None
        g = s.answer_grammar  # read once: a sequence that ends drops its matcher (`ClientJob.finish`)
        if g is not None:
            allowed = g.allowed() if g.state is MatcherState.ACTIVE else None
            if allowed is None or not allowed.any():
                problem = f"the {g.field} matcher allows no token ({g.error or g.state.name})"
                allowed = None
            elif s.thinking is not None and s.thinking.phase is ThinkPhase.PENDING:
                allowed[s.thinking.budget.open_token] = True  # `allowed()` is a fresh array
        masks.append(allowed)
        failed.append(problem)
    return RowMasks(tuple(masks), tuple(failed))


def _rows(job: DeviceJob) -> tuple[list[RowSampling], tuple[str | None, ...]]:
    """Each row's sampling, a constrained one's under its mask (`prepare_masks`'s, or computed now
    for a job sampled without that wait)."""
    seqs = job.plan.seqs
    masks = job.masks if job.masks is not None else row_masks(seqs)
    rows = [RowSampling(s.request.sampling, s.step, s.history, m) for s, m in zip(seqs, masks.allowed, strict=True)]
    return rows, masks.failed


def _grammar_stops(
    seqs: list[ClientJob], results: list[RowResult | None] | list[RowResult], failed: tuple[str | None, ...]
) -> tuple[bool, ...]:
    """Per row, whether its drawn token completes its grammar (checked without advancing it)."""
    stops = []
    for s, res, problem in zip(seqs, results, failed, strict=True):
        token = res.token if res is not None else None
        g = s.answer_grammar
        answer = token is not None and (s.thinking is None or s.thinking.is_answer(token))
        stops.append(g is not None and problem is None and token is not None and answer and g.would_stop(token))
    return tuple(stops)


def _runs(
    job: DeviceJob,
    results: list[RowResult | None] | list[RowResult],
    stops: tuple[bool, ...],
    failed: tuple[str | None, ...],
) -> tuple[ForcedRun, ...]:
    """Per row, the run its grammar forces after its drawn token (jump-forward, `jump.py`): only for
    a model that jumps, and a row whose token neither completes its grammar nor is a stop token."""
    rt = job.plan.runtime
    if not rt.jump_min_runs or rt.model is None:
        return ()
    context = min(rt.model.lane_context, rt.manifest.context)
    runs = []
    for s, res, stop, problem in zip(job.plan.seqs, results, stops, failed, strict=True):
        token = res.token if res is not None else None
        if token is None or stop or problem is not None or token in s.stop_ids:
            runs.append(NO_RUN)
        else:
            runs.append(forced_run(s, token, context=context, chunk=rt.prefill_chunk))
    return tuple(runs)


def _forced(seqs: list[ClientJob], results: Iterable[RowResult]) -> list[RowResult | None]:
    """The drawn results, with the close token in place of the draw of each row whose thinking budget
    is used up, and of each constrained row that drew a stop token inside its think block: such a job
    may end only by completing its constraint, after the close, so a model that would end there ends
    its thinking instead (docs/daemon.md "Thinking budget"). The draw itself is discarded, so the RNG
    stream, keyed by (seed, step), is that of any other step. A forced token's logprob is 0.0 (it was
    certain) with no alternatives, when logprobs are asked for. A row with non-finite logits keeps
    its anomaly: its KV is untrusted whatever the token."""
    out: list[RowResult | None] = []
    for s, res in zip(seqs, results, strict=True):
        close = s.thinking.forced_next() if s.thinking is not None else None
        if close is None and s.thinking is not None and s.grammar is not None and res.token in s.stop_ids:
            close = s.thinking.budget.close_token if s.thinking.phase is ThinkPhase.THINKING else None
        if close is not None and res.token is not None:
            res = RowResult(close, 0.0 if s.request.sampling.logprobs is not None else None)
        out.append(res)
    return out


def _sample_topk(job: DeviceJob, sampler: Sampler) -> Sampled:
    """A top-k decode job (`package/logits_output.py`): each row from its top K, its full row read
    from the device only when the top K cannot decide (`Sampler.sample_topk`); a row captured for a
    probe is read whole.

    Raises:
        DeviceLost: the device stopped answering a row read (the job is lost, as in `wait`).
    """
    seqs = job.plan.seqs
    n = len(seqs)
    out = job.ctx.outputs
    rows_of: slice | list[int] = slice(0, n) if job.rows_in_place else list(job.out_rows)  # as `sample`
    top = TopkRows(
        ids=out["topk_ids"].array[rows_of],
        values=out["topk_values"].array[rows_of].astype(np.float32),
        tail_max=out["tail_max"].array[rows_of].astype(np.float32),
        finite=out["finite"].array[rows_of].astype(bool),
        vocab_size=sampler.vocab_size,
    )
    submission = job.submission
    assert submission is not None
    row_buffer: list[np.ndarray] = []  # one bf16 row for the job's reads, made at the first

    def read_full(r: int) -> np.ndarray:
        if not row_buffer:
            row_buffer.append(np.empty(sampler.vocab_size, dtype=ml_dtypes.bfloat16))
        submission.read_logits_row(job.row_of(r), row_buffer[0])
        return row_buffer[0]

    rows, failed = _rows(job)
    drawn, tally = sampler.sample_topk(top, rows, read_full)
    results = _forced(seqs, drawn)
    job.full_row_reads = tally.full_reads
    captured = [read_full(i).astype(np.float32) if s.capture_logits else None for i, s in enumerate(seqs)]
    stops = _grammar_stops(seqs, results, failed)
    return Sampled(results, captured, [True] * n, stops, failed, _runs(job, results, stops, failed))


def copies(job: DeviceJob, sampled: Sampled) -> JobCopies:
    """What a sampled job copied back: its outputs' active rows (every output buffer's rows are
    `[batch, ...]`), plus the full bf16 rows its sampling read from the device; and the rows it
    sampled (a prefill chunk's row is checked, not sampled)."""
    active = len(job.plan.seqs)
    row_bytes = sum(b.array.nbytes // b.array.shape[0] for b in job.ctx.outputs.values())
    vocab = job.plan.runtime.manifest.architecture.vocab_size
    rows = sum(1 for r in sampled.results if r is not None)
    return JobCopies(active * row_bytes + job.full_row_reads * vocab * 2, rows, job.full_row_reads)


def is_chunk(job: DeviceJob, row: int) -> bool:
    """Whether a row of the job is a prefill chunk that leaves part of its sequence's prefill for
    later (no token is sampled from it)."""
    seq = job.plan.seqs[row]
    return job.plan.task is TaskType.PREFILL and job.reservations[row].target_len < len(seq.prompt) + len(seq.generated)


def settle(job: DeviceJob, status: JobStatus, sampled: Sampled | None, facts: BoardFacts) -> Settlement:
    """Decide what a finished device job means (under the engine lock; changes nothing).

    Args:
        status: the job's device status.
        sampled: its sampled rows when it was sampled (a DONE job of a running generation).
    """
    if facts.fenced:
        return _fenced(job)
    if status is JobStatus.DONE and sampled is not None and not job.quarantine and not job.kv_lost:
        return _done(job, sampled, facts)
    return _fault(job, status, facts)


def recovery(
    seq: ClientJob, rt: ModelRuntime, message: str, *, serving: bool, max_recoveries: int, refused: bool = False
) -> End | Recover:
    """What follows for a sequence that just lost its KV (this loss already counted or not: the
    verdict uses `seq.recoveries + 1`). `refused`: the board refused to take its job (a submit
    error): past the budget it ends UNAVAILABLE, to resume on another board, since nothing says the
    job itself is at fault; a job faulted on the device ends ABORTED."""
    if seq.cancel_requested:
        return _cancelled(seq)
    if not serving:
        return End(FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"{message}; board stopped serving")
    if seq.recoveries + 1 > max_recoveries:
        if refused:
            return End(FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"{message} (recovery budget exhausted here)")
        return End(FinishReason.ERROR, ErrorKind.ABORTED, f"{message} (recovery budget exhausted)")
    if not rt.chunked and rt.prefill is not None and len(seq.prefill_tokens) > rt.prefill.max_tokens:
        # A package may declare a prefill bucket smaller than its context: with chunked prefill off, a
        # sequence that grew past it cannot be re-prefilled in one job, so it cannot recover.
        return End(
            FinishReason.ERROR,
            ErrorKind.ABORTED,
            f"{message}; cannot re-prefill {len(seq.prefill_tokens)} tokens into the "
            f"{rt.prefill.max_tokens}-token prefill bucket",
        )
    return Recover(message)


def _recovery(seq: ClientJob, rt: ModelRuntime, message: str, facts: BoardFacts) -> End | Recover:
    return recovery(seq, rt, message, serving=facts.serving, max_recoveries=facts.max_recoveries)


def _done(job: DeviceJob, sampled: Sampled, facts: BoardFacts) -> Settlement:
    rows: list[RowOutcome] = []
    anomalies: list[str] = []
    now = time.monotonic()
    rt = job.plan.runtime
    for row, (seq, res, cap) in enumerate(zip(job.plan.seqs, sampled.results, sampled.captured, strict=True)):
        if res is None:
            rows.append(_chunk_done(row, seq, rt, sampled.chunk_finite[row], facts))
            anomalies += [] if sampled.chunk_finite[row] else ["non-finite logits"]
            continue
        if res.token is None:  # NaN/Inf logits: the output is untrustworthy, so is the KV it wrote
            anomalies.append("non-finite logits")
            lost = _recovery(seq, rt, "non-finite logits from the device", facts)
            rows.append(RowOutcome(row, seq, KvEffect.LOSE, lost, lost_kv=True, nonfinite=True))
            continue
        first = cap if seq.first_logits is None else None  # the logits of its first token
        if seq.cancel_requested:
            rows.append(RowOutcome(row, seq, KvEffect.COMMIT, _cancelled(seq), first_logits=first))
            continue
        problem = sampled.grammar_failed[row] if sampled.grammar_failed else None
        if problem is not None:  # never expected: every token it consumed came from its own mask
            rows.append(RowOutcome(row, seq, KvEffect.COMMIT, End(FinishReason.ERROR, ErrorKind.INTERNAL, problem)))
            continue
        logprob = None
        if seq.request.sampling.logprobs is not None and res.logprob is not None:
            logprob = TokenLogprob(res.token, res.logprob, res.top_logprobs)
        grammar_stop = bool(sampled.grammar_stop) and sampled.grammar_stop[row]
        then: Next = End(FinishReason.STOP) if grammar_stop else _after_token(seq, res.token, now, facts)
        forced: tuple[int, ...] = ()
        if isinstance(then, Continue) and sampled.runs and sampled.runs[row].tokens:
            jump = settle_run(seq, sampled.runs[row], rt.jump_threshold(facts.running))
            if jump is not None:
                forced, reason = jump
                then = End(reason) if reason is not None else Jumped()
        outcome = RowOutcome(row, seq, KvEffect.COMMIT, then, res.token, logprob, first)
        if forced:
            outcome = replace(outcome, forced=forced, forced_logprobs=forced_logprobs(seq, forced))
        rows.append(outcome)
    if facts.device_left is not None and facts.device_left > facts.expected_left:
        # The device may be ahead of us (the other bank finished too), never behind.
        anomalies.append(f"device reports {facts.device_left} jobs left, executor expects {facts.expected_left}")
    fault = DeviceFault.NONFINITE if "non-finite logits" in anomalies else DeviceFault.NONE
    return Settlement(tuple(rows), tuple(anomalies), clean=not anomalies, fault=fault)


def _chunk_done(row: int, seq: ClientJob, rt: ModelRuntime, finite: bool, facts: BoardFacts) -> RowOutcome:
    """A non-final prefill chunk finished: its KV is trusted unless its logits were not finite."""
    if not finite:
        lost = _recovery(seq, rt, "non-finite logits from the device", facts)
        return RowOutcome(row, seq, KvEffect.LOSE, lost, lost_kv=True, nonfinite=True)
    if seq.cancel_requested:
        return RowOutcome(row, seq, KvEffect.COMMIT, _cancelled(seq))
    if seq.deadline is not None and seq.deadline <= time.monotonic():
        return RowOutcome(
            row, seq, KvEffect.COMMIT, End(FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed")
        )
    if not facts.serving:
        return RowOutcome(
            row, seq, KvEffect.COMMIT, End(FinishReason.ERROR, ErrorKind.UNAVAILABLE, "board stopped serving")
        )
    return RowOutcome(row, seq, KvEffect.COMMIT, Chunked())


def _after_token(seq: ClientJob, token: int, now: float, facts: BoardFacts) -> Next:
    stop = seq.stop_reason_after(token)
    if stop is not None:
        return End(stop)
    if seq.deadline is not None and seq.deadline <= now:
        return End(FinishReason.DEADLINE, ErrorKind.DEADLINE_EXCEEDED, "deadline passed")
    if not facts.serving:  # the board stopped serving while this job ran: no next step will run
        return End(FinishReason.ERROR, ErrorKind.UNAVAILABLE, "board stopped serving")
    return Continue()


def _fault(job: DeviceJob, status: JobStatus, facts: BoardFacts) -> Settlement:
    """CCU exception, a hung job collected after a reset, or a job whose lanes a configuration reset
    cleared: every row's KV is unknown, its sequence recovers."""
    rt = job.plan.runtime
    reason = "a configuration reset cleared its KV" if job.kv_lost else f"device job ended {status.value}"
    rows = tuple(
        RowOutcome(row, seq, KvEffect.LOSE, _recovery(seq, rt, reason, facts), lost_kv=True)
        for row, seq in enumerate(job.plan.seqs)
    )
    # A reset's deliberate CCU exception (or a cleared configuration) is not a device anomaly.
    deliberate = job.kv_lost or job.reset_hit
    if deliberate:
        return Settlement(rows)
    fault = DeviceFault.CCU_EXCEPTION if status is JobStatus.CCU_EXCEPTION else DeviceFault.NONE
    return Settlement(rows, (f"device job {job.device_job_id} ended {status.value}",), fault=fault)


def _fenced(job: DeviceJob) -> Settlement:
    """The job's generation is gone: its results must not reach anything of another one."""
    end = End(FinishReason.ERROR, ErrorKind.UNAVAILABLE, "model generation retired")
    rows = (RowOutcome(i, s, KvEffect.NONE, end) for i, s in enumerate(job.plan.seqs) if s.state is not SeqState.DONE)
    return Settlement(tuple(rows))


def _cancelled(seq: ClientJob) -> End:
    """A cancelled sequence's Final: CANCELLED, or the error of the unload/drain that cancelled it."""
    reason, kind, message = seq.pending_error or (FinishReason.CANCELLED, None, "")
    return End(reason, kind, message)
