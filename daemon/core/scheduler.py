"""Continuous batching: which job the device runs next (docs/daemon.md, docs/sources.md 000 §5-6).

The scheduler owns the waiting and ready sets of every sequence that is not in flight and turns
them into `JobPlan`s; it never touches the device. Order of preference for each free in-flight slot:

1. RECOVER sequences (lost KV) re-prefill first: they already hold a lane and a client waits.
2. decode-ready sequences, up to the largest decode batch, highest priority then least recently
   served; the model whose ready sequence has waited longest goes first;
3. a prefill: a short one (a request with at most `short_prefill_tokens` to prefill: a
   conversation's next turn, whose earlier turns a parked lane holds, is short however long its
   prompt), the next chunk of a short one part-way through its chunks before a new one; then the
   next chunk of a long PARTIAL prompt (oldest first), then a new long one. Shortest first keeps
   time to first token low for the many short prefills; a long prompt's chunk (or a new long
   prompt) is served once `long_prefill_budget` short-prefill tokens have passed it (token
   budget), and any prefill (chunk) is served before decode once `max_prefill_defer` decode jobs
   have passed it while it was admissible (bounded wait), so nothing starves.

Chunked prefill: a prefill job carries at most the model's `prefill_chunk` tokens from the lane's
committed length on (`past_kv_len` = the chunk's offset). With two in-flight slots a decode job and
a chunk alternate on the banks, so a running stream waits at most one chunk; with one slot the
`max_prefill_defer` rule interleaves them. A long prompt finishes in bounded time: each chunk is
served after at most `max_prefill_defer` decode jobs.

Prefix reuse: a new sequence's lane comes from `KVManager.take`, which matches its prefill tokens
against the generation's parked lanes (`prefix_match.py`); the lane keeps the shared prefix and the
prefill starts after it. Its `cached_tokens` (usage) and the generation's `PrefixStats` record it.

With two in-flight slots a prefill naturally runs beside a decode job on other lanes: the decode job
holds every ready lane, so the other slot takes the prefill.

Lanes: the scheduler is the one owner of lane assignment. `plan` gives a prefill's sequence its lane
(a free one, or its own UNKNOWN lane rebuilt for a re-prefill) and hands the plan's sequences to the
job (state PREFILL/DECODE) with each row's target KV length; `unplan` takes them back if the job
never starts; `release_lane` frees a finished sequence's lane and `lose_lane` marks the lane of a
sequence outside any job untrusted. The executor only reserves, commits or rolls back the rows a plan
gave it. How many lanes a generation uses is read from its `KVManager`, never counted on the side.
A finished sequence's lane is parked instead of freed when `release_lane` is told to park it.

Fixed slots (a device without lane selection, `device/slots.py`): a decode job's rows are in slot
order and its batch is the smallest that covers the highest slot (`ModelRuntime.decode_submodel_for_lanes`);
the executor masks the idle slots. A new sequence takes the lowest FREE slot (`prefix_match`), a
parked lane is its slot, and `compaction` picks the decode-ready sequences in the highest slots to
move into the lowest FREE or PARKED ones by re-prefill when `compaction.compaction_plan` says so.

Admission bound: `queue_depth` counts only requests that wait for a lane. A request that arrives
while its generation has more free (or parked) lanes than requests queued ahead of it will get one
at the next plan, so it is queued whatever the depth; a burst of `lanes + queue_depth` is admitted
whole and the next request is refused.

Lock: none of its own. The engine lock guards the scheduler, its admission queues and (through it)
the generations' KV managers; every method is called with it held.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from calculet.common.error_codes import DEFAULT_RETRY_AFTER_S
from calculet.common.errors import Overloaded
from calculet.daemon.core.admission import AdmissionQueue
from calculet.daemon.core.chunking import CHUNK_AUTO
from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.compaction import Occupant, SlotMove, compaction_plan
from calculet.daemon.core.kv import LaneHandle, LaneState
from calculet.daemon.core.prefix_match import LaneSource
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.device.types import SubmodelInfo, TaskType

DECODE_JOBS_AUTO = 0
"""`SchedulingPolicy.decode_jobs_per_model`: a second decode cohort only when it would be full."""
MAX_DECODE_JOBS_PER_MODEL = 2  # one per engine bank


@dataclass(frozen=True)
class SchedulingPolicy:
    """Knobs of the scheduler.

    Attributes:
        max_active: sequences holding lanes at once per model (1 for the serial policy).
        short_prefill_tokens: requests with at most this many tokens to prefill (prompt and resumed
            tokens less what a parked lane holds when queued) use the short-prefill queue.
        long_prefill_budget: short-prefill tokens that may pass a waiting long prompt or chunk.
        max_prefill_defer: decode jobs that may pass an admissible waiting prefill.
        decode_jobs_per_model: decode jobs of one model in flight at once. 1 keeps every ready
            sequence in one batch (a batch of 16 costs 2.5 t1, two of 8 cost 3.4 t1 under the timing
            model); the other bank then carries prefills. 2 lets two decode cohorts alternate
            between the banks, so one cohort's sampling and next submit overlap the other's device
            step. `DECODE_JOBS_AUTO` (0, the default) starts a second cohort only when the ready
            sequences alone fill the largest decode batch: then it shrinks no batch (they could not
            have joined the running job) and the host time between steps leaves the critical path.
        queue_depth: requests of one generation that may wait for a lane before Submit is refused
            (RESOURCE_EXHAUSTED); requests a free or parked lane awaits do not count.
        admission_timeout_s: how long a request may wait for a lane before it is refused.
        retry_after_s: the retry hint of every OVERLOADED answer of this scheduler: a refused Submit
            (trailing metadata) and an in-band Final (admission deadline, no KV space).
        priority_aging_s: waiting time that raises a request's priority by one.
        prefix_reuse: finished sequences park their lanes and new ones match against them, in each
            generation whose prefill is proven to run at an offset (`prefill_offset.py`; resolved per
            model when it is loaded: `ModelRuntime.prefix_reuse`).
        prefix_min_tokens: the shortest shared prefix a sequence takes a parked lane for.
        prefill_chunk: `chunking.CHUNK_AUTO`, `CHUNK_OFF` or tokens per prefill job (resolved per
            model when it is configured: `ModelRuntime.prefill_chunk`; no chunks where its prefill is
            not proven to run at an offset).
        prefix_reuse_forced / prefill_chunk_forced: the operator asked for them explicitly: a
            package whose prefill is not proven to run at an offset fails to load instead.
    """

    max_active: int = 1 << 30
    short_prefill_tokens: int = 512
    long_prefill_budget: int = 512
    max_prefill_defer: int = 2
    decode_jobs_per_model: int = DECODE_JOBS_AUTO
    queue_depth: int = 1024
    admission_timeout_s: float = 30.0
    retry_after_s: float = DEFAULT_RETRY_AFTER_S
    priority_aging_s: float | None = 5.0
    prefix_reuse: bool = True
    prefix_min_tokens: int = 16
    prefill_chunk: int = CHUNK_AUTO
    prefix_reuse_forced: bool = False
    prefill_chunk_forced: bool = False


@dataclass
class JobPlan:
    """One device job to build: a prefill of one sequence or a decode step of several.

    Attributes:
        seqs: the sequences the job carries, each already holding its lane.
        targets: per sequence, (lane, KV length after the job): what the executor reserves.
    """

    runtime: ModelRuntime
    task: TaskType
    submodel: SubmodelInfo
    seqs: list[ClientJob]
    targets: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    """Waiting, recovering and ready sequences of every model, and the choice of the next job."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        aging = policy.priority_aging_s
        self.short: AdmissionQueue[ClientJob] = AdmissionQueue(None, aging_s=aging)  # bounded by `enqueue`
        self.long: AdmissionQueue[ClientJob] = AdmissionQueue(None, aging_s=aging)
        self.ready: OrderedDict[str, ClientJob] = OrderedDict()  # least recently served first
        self.recover: deque[ClientJob] = deque()
        self.partial: deque[ClientJob] = deque()  # part-way through a chunked prefill, oldest first
        self._queued: Counter[int] = Counter()  # sequences in short/long per generation
        self.orphans: list[ClientJob] = []  # recovering sequences whose generation no longer runs
        self._short_tokens_passed_long = 0
        self._decodes_passed_prefill = 0
        self._serving: AbstractSet[int] | None = None  # the current `plan` call's

    # ---- bookkeeping --------------------------------------------------------------------

    def enqueue(self, seq: ClientJob, free_lanes: int, expected_keep: int = 0) -> None:
        """Queue a new sequence for admission.

        Args:
            free_lanes: FREE and PARKED lanes of its generation now: that many queued requests of the
                generation get a lane at the next plan and do not count against `queue_depth`.
            expected_keep: its prefill tokens a parked lane holds now (`KVManager.expected_keep`):
                it is short or long by what is left to prefill.

        Raises:
            Overloaded: `queue_depth` requests of the generation already wait for a lane.
        """
        waiting_for_lane = self._queued[seq.generation] - free_lanes
        if waiting_for_lane >= self.policy.queue_depth:
            raise Overloaded(
                f"admission queue full ({self.policy.queue_depth} requests wait for a KV lane)",
                retry_after_s=self.policy.retry_after_s,
            )
        deadline = time.monotonic() + self.policy.admission_timeout_s
        if seq.deadline is not None:
            deadline = min(deadline, seq.deadline)
        seq.expected_uncached = len(seq.prompt) + len(seq.generated) - expected_keep
        queue = self.short if seq.expected_uncached <= self.policy.short_prefill_tokens else self.long
        queue.enqueue(seq.job_id, seq, deadline=deadline, priority=seq.request.priority)
        self._queued[seq.generation] += 1

    def remove_waiting(self, seq: ClientJob) -> bool:
        """Take a sequence out of the admission queues (cancel). Returns whether it was there."""
        for queue in (self.short, self.long):
            if seq.job_id in queue:
                queue.cancel(seq.job_id)
                self._dequeued(seq)
                return True
        return False

    def mark_ready(self, seq: ClientJob) -> None:
        self.ready[seq.job_id] = seq

    def mark_recover(self, seq: ClientJob) -> None:
        self.ready.pop(seq.job_id, None)
        self.recover.append(seq)

    def mark_partial(self, seq: ClientJob) -> None:
        """A chunk of the sequence's prefill is done; its next chunk waits."""
        self.partial.append(seq)

    def forget(self, seq: ClientJob) -> None:
        """The sequence left the READY/RECOVER/PARTIAL sets (finished or cancelled)."""
        self.ready.pop(seq.job_id, None)
        if seq in self.recover:
            self.recover.remove(seq)
        if seq in self.partial:
            self.partial.remove(seq)

    def holding_kv(self, generation: int) -> list[ClientJob]:
        """Sequences of `generation` outside any job whose lane holds KV they rely on (READY, PARTIAL)."""
        return [s for s in (*self.ready.values(), *self.partial) if s.generation == generation]

    def _dequeued(self, seq: ClientJob) -> None:
        self._queued[seq.generation] -= 1
        if not self._queued[seq.generation]:
            del self._queued[seq.generation]

    # ---- lanes ----------------------------------------------------------------------------

    def release_lane(self, seq: ClientJob, rt: ModelRuntime | None, *, park_at: float | None = None) -> int | None:
        """Free (or park) the lane of a sequence that is not in a job (it finished). `rt` None: its
        generation is gone, and its lanes with it.

        Args:
            park_at: park the lane (monotonic now) when its KV is trusted (ACTIVE, non-empty, open on
                the device): it keeps `prefill_tokens[:length]` for a later sequence; None frees it.

        Returns:
            The lane, when it was freed while open on the device and must be closed there (KV Free).
        """
        lane, seq.lane = seq.lane, None
        if lane is None or rt is None or rt.kv is None:
            return None
        if park_at is not None:
            held = rt.kv.lane(lane)
            if held.state is LaneState.ACTIVE and held.length and not rt.kv.needs_open(lane):
                tokens = seq.prefill_array()[: held.length]
                hashes = tuple(seq.block_hashes(held.length))
                prompt_len = min(len(seq.prompt), held.length)  # a cancelled chunked prefill holds less
                rt.kv.park(lane, seq.job_id, tokens, hashes, park_at, prompt_len=prompt_len)
                return None
        return lane if rt.kv.release(lane, seq.job_id) else None

    def lose_lane(self, seq: ClientJob, rt: ModelRuntime) -> None:
        """The KV of a sequence outside any job is no longer trusted (its lane was cleared, or its job
        never ran): mark it UNKNOWN, so a re-prefill rebuilds it from scratch."""
        assert rt.kv is not None
        if seq.lane is not None and rt.kv.lane(seq.lane).state is not LaneState.UNKNOWN:
            rt.kv.mark_unknown(seq.lane)

    def unplan(self, plan: JobPlan) -> None:
        """Take back the sequences of a plan whose job never started (no free job context): a prefill
        (chunk) re-prefills its lane from scratch, a decode row is ready again."""
        for seq in plan.seqs:
            if plan.task is TaskType.PREFILL:
                self.lose_lane(seq, plan.runtime)
                seq.lifecycle.move(SeqState.RECOVER)
                self.mark_recover(seq)
            else:
                seq.lifecycle.move(SeqState.READY)
                self.mark_ready(seq)

    def _hand_to_job(self, plan: JobPlan) -> JobPlan:
        """Give a prefill's sequence its lane, move the plan's sequences into the job and fill in each
        row's target KV length (a prefill: at most one chunk past what the lane holds)."""
        rt = plan.runtime
        kv = rt.kv
        assert kv is not None
        for seq in plan.seqs:
            if plan.task is TaskType.PREFILL:
                if seq.state is SeqState.RECOVER and seq.lane is not None:
                    kv.rebuild(seq.lane, seq.job_id)
                elif seq.state is not SeqState.PARTIAL:
                    self._take_lane(seq, rt)
                assert seq.lane is not None
                past = kv.lane(seq.lane).length
                chunk = seq.probe.chunk if seq.probe is not None and seq.probe.chunk else rt.prefill_chunk
                plan.targets.append((seq.lane, min(len(seq.prefill_tokens), past + chunk)))
                seq.lifecycle.move(SeqState.PREFILL)
            else:
                assert seq.lane is not None
                plan.targets.append((seq.lane, seq.kv_len_when_ready + 1))
                seq.lifecycle.move(SeqState.DECODE)
        return plan

    def _take_lane(self, seq: ClientJob, rt: ModelRuntime) -> LaneHandle:
        """A lane for a sequence that holds none: matched against the parked lanes on its first
        admission (client jobs of a generation with prefix reuse on, and the offset check's
        continued probe, which keeps at most `probe.keep` tokens), else any FREE or evicted one."""
        assert rt.kv is not None
        first = seq.state is SeqState.WAITING
        keep = seq.probe.keep if seq.probe is not None and seq.probe.keep else None
        matching = first and ((rt.prefix_reuse and not seq.internal) or keep is not None)
        tokens = seq.prefill_array() if matching else None
        min_tokens = 1 if keep is not None else self.policy.prefix_min_tokens
        handle = rt.kv.take(seq.job_id, tokens, min_tokens, keep)
        assert handle is not None, "a prefill was planned without a free or parked lane"
        seq.lane = handle.lane
        if handle.source is LaneSource.EVICTED:
            rt.prefix.evictions += 1
        if first:
            seq.t_admit = time.monotonic()
            seq.cached_tokens = handle.kept
            seq.seed_block_hashes(handle.kept_hashes)
            if not seq.internal:  # a probe's reuse is no client's saving
                stats = rt.prefix
                stats.hits += 1 if handle.kept else 0
                stats.misses += 0 if handle.kept else 1
                stats.hit_tokens += handle.kept
                stats.miss_tokens += len(seq.prefill_tokens) - handle.kept
        return handle

    def compaction(self, rt: ModelRuntime) -> list[tuple[ClientJob, SlotMove]]:
        """With fixed slots: the moves of `compaction.compaction_plan` (the sequences in the highest
        slots, highest first, into the lowest FREE or PARKED slots) and the sequence of each, when the
        plan pays and every sequence it moves is a decode-ready client sequence; empty otherwise.
        Changes nothing: the engine moves them all at once (each lane freed, a re-prefill into the
        new one, as a recovery without a fault; each re-prefill takes the lowest free slot,
        `prefix_match.choose_lane`, and recovering sequences re-prefill in the order they moved)."""
        kv = rt.kv
        if rt.fixed_slots is None or kv is None or rt.prefill is None:
            return []
        lanes = kv.snapshot()
        free = [lane.lane for lane in lanes if lane.state in (LaneState.FREE, LaneState.PARKED)]
        ready = {s.lane: s for s in self.ready.values() if s.generation == rt.generation and s.lane is not None}
        occupants = []
        for lane in lanes:
            if lane.owner is None:
                continue
            seq = ready.get(lane.lane)
            kv_len = len(seq.prompt) + len(seq.generated) if seq is not None else lane.length
            occupants.append(Occupant(lane.lane, kv_len, seq.remaining if seq is not None else 0))
        moves = compaction_plan(rt.manifest.timing, [d.batch for d in rt.decodes], occupants, free)
        movers = [ready.get(m.from_slot) for m in moves]
        chosen = [(s, m) for s, m in zip(movers, moves, strict=True) if s is not None]
        if len(chosen) < len(moves) or any(s.internal or not self._eligible(s) for s, _ in chosen):
            return []  # one is in a job, prefilling or recovering, or a warm-up probe: not now
        return chosen

    def expire(self, now: float) -> list[ClientJob]:
        expired = [*self.short.expire(now), *self.long.expire(now)]
        for seq in expired:
            self._dequeued(seq)
        return expired

    def next_deadline(self) -> float | None:
        times = [t for t in (self.short.next_deadline(), self.long.next_deadline()) if t is not None]
        return min(times) if times else None

    def depths(self, generation: int, sequences: Iterable[ClientJob]) -> tuple[int, int, int]:
        """(decode-ready, short-prefill, long-prefill) sequences of one generation, as queued; a
        PARTIAL sequence (the next chunk of a long prompt) counts as a long prefill."""
        mine = [s for s in sequences if s.generation == generation]
        return (
            sum(1 for s in mine if s.job_id in self.ready),
            sum(1 for s in mine if s.job_id in self.short),
            sum(1 for s in mine if s.job_id in self.long or s.state is SeqState.PARTIAL),
        )

    def waiting(self) -> int:
        """Prefills waiting: queued requests and PARTIAL sequences' next chunks."""
        return len(self.short) + len(self.long) + len(self.partial)

    # ---- the choice ---------------------------------------------------------------------

    def plan(
        self, runtimes: dict[int, ModelRuntime], decoding: Mapping[int, int], serving: AbstractSet[int] | None = None
    ) -> JobPlan | None:
        """The next job to run, its sequences handed over to it with their lanes, or None when
        nothing can run now. Recovering sequences whose generation no longer runs go to `orphans`.

        Args:
            runtimes: running generations by number (the ones whose lanes may be used).
            decoding: decode jobs in flight per generation.
            serving: generations whose client jobs may run (None: all). Others run only warm-up
                probes: a generation configured again after a configuration reset serves its
                clients once its golden check has passed.
        """
        self._serving = serving
        plan = self._choose(runtimes, decoding)
        return self._hand_to_job(plan) if plan is not None else None

    def _eligible(self, seq: ClientJob) -> bool:
        return seq.internal or self._serving is None or seq.generation in self._serving

    def _choose(self, runtimes: dict[int, ModelRuntime], decoding: Mapping[int, int]) -> JobPlan | None:
        held: list[ClientJob] = []  # recovering, but their generation is warming up again
        try:
            while self.recover:
                seq = self.recover.popleft()
                rt = runtimes.get(seq.generation)
                if rt is None or rt.prefill is None:
                    self.orphans.append(seq)  # its generation is gone; the engine fails it
                elif not self._eligible(seq) or (seq.lane is None and (rt.kv is None or not rt.kv.free_count())):
                    held.append(seq)  # warming up again, or it gave its lane back and none is free yet
                else:
                    return JobPlan(rt, TaskType.PREFILL, rt.prefill, [seq])
        finally:
            self.recover.extendleft(reversed(held))
        if self._decodes_passed_prefill < self.policy.max_prefill_defer:
            decode = self._plan_decode(runtimes, decoding)
            if decode is not None:
                if self.waiting():
                    self._decodes_passed_prefill += 1
                return decode
        prefill = self._plan_prefill(runtimes)
        if prefill is not None:
            self._decodes_passed_prefill = 0
            return prefill
        return self._plan_decode(runtimes, decoding)

    def _plan_decode(self, runtimes: dict[int, ModelRuntime], decoding: Mapping[int, int]) -> JobPlan | None:
        ready: dict[int, list[ClientJob]] = {}  # by generation, in the order their first sequence got ready
        for s in self.ready.values():
            if s.generation in runtimes and self._eligible(s):
                ready.setdefault(s.generation, []).append(s)
        for generation, candidates in ready.items():
            rt = runtimes[generation]
            if not self._may_start_decode(rt, decoding.get(generation, 0), len(candidates)):
                continue
            # Highest priority first; among equals the least recently served (dict order is stable).
            candidates.sort(key=lambda s: -s.request.priority)
            chosen = candidates[: rt.max_decode_batch]
            for seq in chosen:
                del self.ready[seq.job_id]
            if rt.fixed_slots:  # row i is slot i: rows in slot order, the batch covers the highest
                chosen.sort(key=lambda s: s.lane if s.lane is not None else 0)
            lanes = [s.lane if s.lane is not None else 0 for s in chosen]
            return JobPlan(rt, TaskType.DECODE, rt.decode_submodel_for_lanes(lanes), chosen)
        return None

    def _may_start_decode(self, rt: ModelRuntime, in_flight: int, ready: int) -> bool:
        """Whether another decode job of `rt` may start while `in_flight` of its decode jobs run."""
        jobs = self.policy.decode_jobs_per_model
        if in_flight == 0:
            return True
        if jobs == DECODE_JOBS_AUTO:
            return in_flight < MAX_DECODE_JOBS_PER_MODEL and ready >= rt.max_decode_batch
        return in_flight < jobs

    def _plan_prefill(self, runtimes: dict[int, ModelRuntime]) -> JobPlan | None:
        """Short new prefills first, then the next chunk of a PARTIAL prompt, then a new long one;
        once `long_prefill_budget` short tokens passed waiting long work, that work goes first."""
        long_due = self._short_tokens_passed_long >= self.policy.long_prefill_budget
        if long_due:
            plan = self._next_chunk(runtimes, short=False) or self._new_prefill(self.long, runtimes)
            if plan is not None:
                self._short_tokens_passed_long = 0
                return plan
        # A short prefill part-way through its chunks finishes before another starts (shortest
        # remaining work first: one first token now beats two later).
        plan = self._next_chunk(runtimes, short=True) or self._new_prefill(self.short, runtimes)
        if plan is not None:
            if self._long_waiting():
                self._short_tokens_passed_long += self._prefill_left(plan.seqs[0], plan.runtime)
            return plan
        plan = self._next_chunk(runtimes, short=False) or self._new_prefill(self.long, runtimes)
        if plan is not None:
            self._short_tokens_passed_long = 0
        return plan

    def _long_waiting(self) -> bool:
        return len(self.long) > 0 or any(s.expected_uncached > self.policy.short_prefill_tokens for s in self.partial)

    @staticmethod
    def _prefill_left(seq: ClientJob, rt: ModelRuntime) -> int:
        """Prefill tokens the sequence still has to run (what its lane does not hold yet)."""
        held = rt.kv.lane(seq.lane).length if rt.kv is not None and seq.lane is not None else 0
        return len(seq.prompt) + len(seq.generated) - held

    def _next_chunk(self, runtimes: dict[int, ModelRuntime], *, short: bool) -> JobPlan | None:
        """The next chunk of the oldest PARTIAL sequence of that class (`short`: it was queued as a
        short prefill) that may run; orphans are set aside."""
        for held in list(self.partial):
            held_rt = runtimes.get(held.generation)
            if held_rt is None or held_rt.prefill is None:
                self.partial.remove(held)
                self.orphans.append(held)  # its generation is gone; the engine fails it
            elif self._eligible(held) and (held.expected_uncached <= self.policy.short_prefill_tokens) == short:
                self.partial.remove(held)
                return JobPlan(held_rt, TaskType.PREFILL, held_rt.prefill, [held])
        return None

    def _new_prefill(self, queue: AdmissionQueue[ClientJob], runtimes: dict[int, ModelRuntime]) -> JobPlan | None:
        """The most urgent admissible request of `queue` (a lane free or parked for it), or None."""

        def admissible(seq: ClientJob) -> bool:
            rt = runtimes.get(seq.generation)
            return (
                rt is not None
                and self._eligible(seq)
                and rt.kv is not None
                and rt.kv.free_count() > 0
                and rt.kv.used_count() < self.policy.max_active
            )

        seq = queue.pop_ready(admissible)
        if seq is None:
            return None
        self._dequeued(seq)
        rt = runtimes[seq.generation]
        assert rt.prefill is not None
        return JobPlan(rt, TaskType.PREFILL, rt.prefill, [seq])


__all__ = ["JobPlan", "Scheduler", "SchedulingPolicy", "SeqState"]
