"""Continuous-batching choices: decode first, bounded prefill wait, long prompts not starved,
priority honoured, serial policy admits one sequence at a time. Pure: no device, no threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calculet.common.errors import Overloaded
from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.kv import KVManager, LaneState
from calculet.daemon.core.observe.prefix_views import pending_prefill_tokens
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.core.scheduler import DECODE_JOBS_AUTO, JobPlan, Scheduler, SchedulingPolicy
from calculet.daemon.device.types import SubmodelInfo, TaskType, TensorSpec
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package

from .engine_factories import request


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sim_package("tiny", tmp_path_factory.mktemp("pkg") / "tiny")


def _sub(name: str, task: TaskType, batch: int, tokens: int) -> SubmodelInfo:
    t = TensorSpec("tokens", (batch, tokens), "int32")
    return SubmodelInfo(name, task, batch, tokens, (t,), ())


def make_runtime(manifest_dir: Path, lanes: int = 4, generation: int = 1) -> ModelRuntime:
    rt = ModelRuntime("tiny", generation, load_manifest(manifest_dir), manifest_dir)
    rt.kv = KVManager(lanes, 256, generation)
    rt.prefill = _sub("prefill", TaskType.PREFILL, 1, 256)
    rt.decodes = [_sub("decode_b1", TaskType.DECODE, 1, 1), _sub("decode_b4", TaskType.DECODE, 4, 1)]
    rt.prefill_chunk, rt.chunked = 256, True
    return rt


class Harness:
    """Plays the engine's and executor's part: runs each planned job at once and marks its sequences
    ready (the scheduler itself assigns the lanes)."""

    def __init__(self, rt: ModelRuntime, policy: SchedulingPolicy) -> None:
        self.rt, self.sched = rt, Scheduler(policy)
        self.n = 0

    def add(self, prompt_len: int = 4, priority: int = 0) -> ClientJob:
        self.n += 1
        req = request(tuple(range(1, prompt_len + 1)), 8, seed=self.n, priority=priority)
        seq = ClientJob(f"s{self.n}", req, self.rt.generation, frozenset())
        assert self.rt.kv is not None
        self.sched.enqueue(seq, self.rt.kv.free_count())
        return seq

    def step(self) -> JobPlan | None:
        """Plan one job and complete it at once."""
        plan = self.sched.plan({self.rt.generation: self.rt}, {})
        if plan is None:
            return None
        assert self.rt.kv is not None
        for seq, (lane, target) in zip(plan.seqs, plan.targets, strict=True):
            assert seq.lane == lane and seq.state in (SeqState.PREFILL, SeqState.DECODE), "handed to the job"
            self.rt.kv.commit(self.rt.kv.reserve(lane, seq.job_id, target, self.n))
            if plan.task is TaskType.PREFILL and target < len(seq.prefill_tokens):  # a chunk: no token yet
                seq.lifecycle.move(SeqState.PARTIAL)
                self.sched.mark_partial(seq)
                continue
            seq.generated.append(7)
            seq.lifecycle.move(SeqState.READY)
            self.sched.mark_ready(seq)
        return plan


def test_decode_runs_first_but_a_waiting_prefill_is_served_within_the_bound(manifest_dir: Path) -> None:
    h = Harness(make_runtime(manifest_dir), SchedulingPolicy(max_prefill_defer=2))
    h.add()
    assert h.step().task is TaskType.PREFILL  # type: ignore[union-attr]
    h.add()
    tasks = [h.step().task for _ in range(3)]  # type: ignore[union-attr]
    assert tasks == [TaskType.DECODE, TaskType.DECODE, TaskType.PREFILL]


def test_decode_batches_every_ready_sequence_into_the_smallest_fitting_submodel(manifest_dir: Path) -> None:
    h = Harness(make_runtime(manifest_dir), SchedulingPolicy(max_prefill_defer=0))
    for _ in range(3):
        h.add()
    while h.sched.waiting():
        assert h.step().task is TaskType.PREFILL  # type: ignore[union-attr]
    plan = h.step()
    assert plan is not None and plan.task is TaskType.DECODE
    assert len(plan.seqs) == 3 and plan.submodel.name == "decode_b4"


def test_long_prompt_is_not_starved_by_a_stream_of_short_ones(manifest_dir: Path) -> None:
    policy = SchedulingPolicy(short_prefill_tokens=16, long_prefill_budget=40, max_prefill_defer=0)
    h = Harness(make_runtime(manifest_dir, lanes=64), policy)
    long = h.add(prompt_len=100)
    served: list[str] = []
    for _ in range(30):
        h.add(prompt_len=10)
        plan = h.sched._plan_prefill({h.rt.generation: h.rt})
        assert plan is not None
        served.append(plan.seqs[0].job_id)
        if plan.seqs[0] is long:
            break
    assert long.job_id in served, "the long prompt waited forever"
    assert len(served) <= 6, f"served after {len(served) - 1} short prompts (budget 40 tokens = 4 prompts)"


def test_higher_priority_is_admitted_and_decoded_first(manifest_dir: Path) -> None:
    h = Harness(make_runtime(manifest_dir, lanes=8), SchedulingPolicy(max_prefill_defer=0, priority_aging_s=None))
    low = h.add(priority=0)
    high = h.add(priority=5)
    first = h.step()
    assert first is not None and first.seqs == [high]
    h.step()  # the low one
    for _ in range(4):
        h.add(priority=-1)
    while h.sched.waiting():
        h.step()
    plan = h.sched.plan({h.rt.generation: h.rt}, {})
    assert plan is not None and plan.task is TaskType.DECODE and len(plan.seqs) == 4
    assert high in plan.seqs and low in plan.seqs, "ready sequences above the batch: priority picks"


def test_serial_policy_admits_one_sequence_at_a_time(manifest_dir: Path) -> None:
    h = Harness(make_runtime(manifest_dir), SchedulingPolicy(max_active=1, max_prefill_defer=0))
    h.add()
    h.add()
    assert h.step().task is TaskType.PREFILL  # type: ignore[union-attr]
    for _ in range(5):
        plan = h.step()
        assert plan is not None and plan.task is TaskType.DECODE and plan.submodel.batch == 1
    assert h.sched.waiting() == 1


@pytest.mark.parametrize("limit", [DECODE_JOBS_AUTO, 1, 2])
def test_decode_jobs_per_model_keeps_ready_sequences_in_one_cohort(manifest_dir: Path, limit: int) -> None:
    h = Harness(make_runtime(manifest_dir), SchedulingPolicy(max_prefill_defer=0, decode_jobs_per_model=limit))
    for _ in range(2):
        h.add()
    while h.sched.waiting():
        h.step()
    runtimes = {h.rt.generation: h.rt}
    plan = h.sched.plan(runtimes, {h.rt.generation: 1})  # one decode job of this model in flight
    if limit in (DECODE_JOBS_AUTO, 1):
        assert plan is None, "a second decode cohort would split the batch"
    else:
        assert plan is not None and plan.task is TaskType.DECODE


@pytest.mark.parametrize("sequences", [6, 8])
def test_auto_starts_a_second_decode_cohort_only_when_it_is_full(manifest_dir: Path, sequences: int) -> None:
    rt = make_runtime(manifest_dir, lanes=8)  # decode batches 1 and 4
    h = Harness(rt, SchedulingPolicy(max_prefill_defer=0, decode_jobs_per_model=DECODE_JOBS_AUTO))
    for _ in range(sequences):
        h.add()
    while h.sched.waiting():
        h.step()
    runtimes = {rt.generation: rt}
    first = h.sched.plan(runtimes, {})
    assert first is not None and first.task is TaskType.DECODE and len(first.seqs) == 4
    second = h.sched.plan(runtimes, {rt.generation: 1})  # the first cohort is in flight
    if sequences == 8:
        assert second is not None and len(second.seqs) == 4 and not set(second.seqs) & set(first.seqs)
        assert h.sched.plan(runtimes, {rt.generation: 2}) is None, "at most one decode job per bank"
    else:
        assert second is None, "2 ready sequences would make a second, smaller batch: they wait"


def test_the_scheduler_assigns_and_frees_lanes_and_counts_them_from_the_kv_manager(manifest_dir: Path) -> None:
    rt = make_runtime(manifest_dir, lanes=2)
    assert rt.kv is not None
    sched = Scheduler(SchedulingPolicy(max_active=1))
    first = ClientJob("a", request((1, 2, 3), 4, seed=1), rt.generation, frozenset())
    second = ClientJob("b", request((4, 5), 4, seed=2), rt.generation, frozenset())
    sched.enqueue(first, rt.kv.free_count())
    sched.enqueue(second, rt.kv.free_count())

    plan = sched.plan({rt.generation: rt}, {})
    assert plan is not None and plan.seqs == [first] and first.state is SeqState.PREFILL
    assert first.lane is not None and plan.targets == [(first.lane, 3)]
    assert rt.kv.lane_of("a") == first.lane and rt.kv.used_count() == 1
    assert sched.plan({rt.generation: rt}, {}) is None, "max_active 1: the KV manager says one lane is used"

    sched.unplan(plan)  # the job never started: its lane is untrusted, it re-prefills first
    assert first.state is SeqState.RECOVER and rt.kv.lane(first.lane).state is LaneState.UNKNOWN
    again = sched.plan({rt.generation: rt}, {})
    assert again is not None and again.seqs == [first] and rt.kv.lane(first.lane).state is LaneState.ACTIVE

    first.lifecycle.move(SeqState.DONE)
    sched.release_lane(first, rt)
    assert first.lane is None and rt.kv.used_count() == 0
    nxt = sched.plan({rt.generation: rt}, {})
    assert nxt is not None and nxt.seqs == [second], "the freed lane admits the next request"


def test_a_long_prompt_runs_as_chunks_between_decode_steps_and_finishes_in_bounded_time(manifest_dir: Path) -> None:
    rt = make_runtime(manifest_dir)
    rt.prefill_chunk = 4
    h = Harness(rt, SchedulingPolicy(max_prefill_defer=2))
    stream = h.add(prompt_len=3)
    assert h.step().targets == [(stream.lane, 3)]  # type: ignore[union-attr]
    long = h.add(prompt_len=10)
    tasks, chunk_targets = [], []
    while long.state is not SeqState.READY:
        plan = h.step()
        assert plan is not None
        tasks.append(plan.task)
        if plan.seqs == [long]:
            chunk_targets.append(plan.targets[0][1])
            assert h.sched.waiting() == (0 if long.state is SeqState.READY else 1), "its next chunk waits"
    assert chunk_targets == [4, 8, 10], "chunks of 4 from what the lane holds, the last one short"
    assert tasks == [TaskType.DECODE, TaskType.DECODE, TaskType.PREFILL] * 3, "decode steps between chunks"
    assert stream.state is SeqState.READY and len(stream.generated) == 1 + 6


def test_queue_depth_counts_only_requests_that_wait_for_a_lane(manifest_dir: Path) -> None:
    rt = make_runtime(manifest_dir, lanes=16)
    assert rt.kv is not None
    for lane in range(8):  # half the lanes parked: they count as free
        owner = f"old{lane}"
        handle = rt.kv.assign(owner)
        assert handle is not None
        rt.kv.opened(handle.lane, owner)
        rt.kv.commit(rt.kv.reserve(handle.lane, owner, 3, lane))
        rt.kv.park(handle.lane, owner, np.array([1, 2, 3], dtype=np.int32), (), 0.0, prompt_len=2)
    assert rt.kv.free_count() == 16
    sched = Scheduler(SchedulingPolicy(queue_depth=8, retry_after_s=2.5))
    burst = [ClientJob(f"b{i}", request((i + 1, 2, 3), 4, seed=i), rt.generation, frozenset()) for i in range(25)]
    for seq in burst[:24]:
        sched.enqueue(seq, rt.kv.free_count())  # 16 get a lane at the next plan, 8 wait for one
    with pytest.raises(Overloaded, match="8 requests wait for a KV lane") as refused:
        sched.enqueue(burst[24], rt.kv.free_count())
    assert refused.value.retry_after_s == 2.5
    plan = sched.plan({rt.generation: rt}, {})  # one admitted: one lane fewer, one request fewer
    assert plan is not None and rt.kv.free_count() == 15
    with pytest.raises(Overloaded):
        sched.enqueue(burst[24], rt.kv.free_count())
    other = make_runtime(manifest_dir, lanes=1, generation=2)
    assert other.kv is not None
    sched.enqueue(ClientJob("x", request((1,), 4, seed=9), 2, frozenset()), other.kv.free_count())  # per generation


def test_short_prefills_pass_a_long_prompts_chunks_until_the_budget_then_a_chunk_goes(manifest_dir: Path) -> None:
    rt = make_runtime(manifest_dir, lanes=64)
    rt.prefill_chunk = 4
    h = Harness(rt, SchedulingPolicy(short_prefill_tokens=8, long_prefill_budget=10, max_prefill_defer=0))
    long = h.add(prompt_len=40)
    first = h.sched._plan_prefill({rt.generation: rt})  # alone: its first chunk runs
    assert first is not None and first.seqs == [long]
    h.sched._hand_to_job(first)
    assert rt.kv is not None
    rt.kv.commit(rt.kv.reserve(first.targets[0][0], long.job_id, first.targets[0][1], 99))
    long.lifecycle.move(SeqState.PARTIAL)
    h.sched.mark_partial(long)
    served = []
    for _ in range(6):
        h.add(prompt_len=4)  # a short prefill arrives before every choice
        plan = h.sched._plan_prefill({rt.generation: rt})
        assert plan is not None
        served.append("long" if plan.seqs == [long] else "short")
        if plan.seqs == [long]:
            break
    assert served == ["short", "short", "short", "long"], "3 shorts of 4 tokens pass (12 >= budget 10), then a chunk"


def test_a_conversation_s_next_turn_is_a_short_prefill_however_long_its_prompt(manifest_dir: Path) -> None:
    rt = make_runtime(manifest_dir)
    assert rt.kv is not None
    sched = Scheduler(SchedulingPolicy(short_prefill_tokens=16))
    history = np.arange(1, 101, dtype=np.int32)
    handle = rt.kv.assign("turn1")
    assert handle is not None
    rt.kv.opened(handle.lane, "turn1")
    rt.kv.commit(rt.kv.reserve(handle.lane, "turn1", 100, 1))
    rt.kv.park(handle.lane, "turn1", history, (), 0.0, prompt_len=90)
    nxt = ClientJob("turn2", request((*range(1, 101), 7, 8), 4, seed=1), rt.generation, frozenset())
    sched.enqueue(nxt, rt.kv.free_count(), rt.kv.expected_keep(nxt.prefill_array(), 16))
    assert nxt.job_id in sched.short and nxt.expected_uncached == 2
    stranger = ClientJob("other", request(tuple(range(500, 600)), 4, seed=2), rt.generation, frozenset())
    sched.enqueue(stranger, rt.kv.free_count(), rt.kv.expected_keep(stranger.prefill_array(), 16))
    assert stranger.job_id in sched.long
    # The load report counts what each has left to prefill: 2 tokens for the next turn, not 102.
    assert pending_prefill_tokens(rt, [nxt, stranger], 16) == (2 + 100, 2)


def test_pending_prefill_counts_what_is_left_and_the_short_part(manifest_dir: Path) -> None:
    rt = make_runtime(manifest_dir)
    assert rt.kv is not None
    sched = Scheduler(SchedulingPolicy(short_prefill_tokens=16))
    short = ClientJob("s", request(tuple(range(1, 11)), 4, seed=1), rt.generation, frozenset())
    long = ClientJob("l", request(tuple(range(1, 41)), 4, seed=2), rt.generation, frozenset())
    for seq in (short, long):
        sched.enqueue(seq, rt.kv.free_count())
    assert pending_prefill_tokens(rt, [short, long], 16) == (50, 10)
    plan = sched.plan({rt.generation: rt}, {})  # the short one is admitted: its prefill is in flight
    assert plan is not None and plan.seqs == [short]
    rt.kv.commit(rt.kv.reserve(plan.targets[0][0], "s", plan.targets[0][1], 1))
    short.generated.append(7)
    short.lifecycle.move(SeqState.READY)
    assert pending_prefill_tokens(rt, [short, long], 16) == (40, 0), "a READY sequence has nothing left"
