"""The engine end to end in-process (DeviceCore + calsim, no gRPC): batching and every fault kind
keep each request's tokens equal to its undisturbed run, and leave nothing leaked."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from calculet.common.errors import ErrorKind, NotFound, Unavailable
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.kv import LaneState
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.resets.submit_streak import SubmitErrorStreak
from calculet.daemon.device.errors import ModelReleased

from .engine_factories import (
    WARM_UP_JOBS,
    assert_clean,
    build_models,
    finish,
    generate_all,
    generate_each,
    request,
    running_core,
    until,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


def _reqs(n: int, vocab: int = 512, seed: int = 1) -> list:
    rng = random.Random(seed)
    return [
        request(
            tuple(rng.randrange(vocab) for _ in range(rng.randint(2, 30))),
            rng.randint(4, 20),
            seed=i,
            temperature=0.0 if i % 2 else 0.9,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def reference(models: Path) -> list[list[int]]:
    with running_core(models) as core:
        return generate_each(core, _reqs(8))


FIXED_SLOTS = {"lane_selection": False, "inactive_rows": "all"}  # row i is slot i (`device/slots.py`)


@pytest.mark.parametrize("options", [{}, FIXED_SLOTS], ids=["any-lane", "fixed-slots"])
def test_batched_run_equals_one_at_a_time(models: Path, reference: list[list[int]], options: dict) -> None:
    with running_core(models, device_options=options) as core:
        assert generate_all(core, _reqs(8)) == reference
        assert core.snapshot().counters.decode_rows > core.snapshot().counters.decode_jobs, "no batching happened"
        assert_clean(core)


@pytest.mark.parametrize(
    ("kind", "job", "slots"),
    [
        *(
            pytest.param(kind, job, {}, id=f"{kind}-{job}")
            for job in (3, WARM_UP_JOBS + 3, WARM_UP_JOBS + 16)
            for kind in ("ccu_exception", "nan_logits", "submit_error")
        ),
        pytest.param("ccu_exception", WARM_UP_JOBS + 3, FIXED_SLOTS, id="ccu_exception-traffic-fixed-slots"),
        pytest.param("nan_logits", WARM_UP_JOBS + 16, FIXED_SLOTS, id="nan_logits-late-fixed-slots"),
    ],
)
def test_fault_is_recovered_without_changing_tokens(models: Path, reference, kind: str, job: int, slots: dict) -> None:
    # Job indices count the warm-up's jobs (golden and offset checks), so the last two land in the traffic.
    plan = {"faults": [{"kind": kind, "job": job}]}
    with running_core(models, device_options={"fault_plan": plan, **slots}) as core:
        got = generate_all(core, _reqs(8))
        recoveries = core.snapshot().counters.recoveries
        anomalies = core.snapshot().anomalies
        assert_clean(core)
    if job < WARM_UP_JOBS:  # the fault hit the warm-up, which recovered before the model was published
        assert got == reference
        return
    assert got == reference, f"{kind} at job {job} changed the output"
    assert recoveries >= 1, "the fault should have forced a re-prefill"
    if kind != "submit_error":
        assert anomalies >= 1


def test_hung_job_is_reset_and_recovered(models: Path, reference) -> None:
    plan = {"faults": [{"kind": "hang", "job": WARM_UP_JOBS + 6}]}
    # The timeout is wall time: 3 s, so no healthy job of a CPU-starved machine (load 16 once made one
    # outlive 0.5 s) is taken for the hang; only the hung job waits it out.
    with running_core(models, device_options={"fault_plan": plan}, job_timeout_s=3.0) as core:
        got = generate_all(core, _reqs(8))
        assert core.snapshot().counters.resets == 1
        assert core.snapshot().inflight_limit == 1, "a hang is an anomaly: in-flight drops to 1"
        assert core.status().pool.quarantined == 0, "quarantined buffers are rebuilt, never reused"
        assert_clean(core)
    assert got == reference


def test_recovery_budget_exhausted_fails_with_aborted(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        core.inject_fault(Fault(FaultKind.CCU_EXCEPTION, probability=1.0))
        tokens, final = finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)
        assert final.reason is FinishReason.ERROR
        assert final.error_kind is ErrorKind.ABORTED
        assert tokens == []
        assert_clean(core)


def test_device_lost_fails_jobs_unavailable_and_health_not_serving(models: Path) -> None:
    plan = {"faults": [{"kind": "device_lost", "job": WARM_UP_JOBS + 3}]}
    with running_core(models, device_options={"fault_plan": plan}) as core:
        ids = [core.submit(r).job_id for r in _reqs(4)]
        finals = [finish(core, j)[1] for j in ids]
        assert all(f.error_kind is ErrorKind.UNAVAILABLE for f in finals if f.reason is FinishReason.ERROR)
        assert any(f.reason is FinishReason.ERROR for f in finals)
        health = core.health()
        assert not health.serving and not health.device_healthy
        status = core.status()  # still answers on a lost board
        assert not status.health.serving and not status.jobs


def test_synthetic_qwen_batched_equals_one_at_a_time(models: Path) -> None:
    reqs = [request(tuple(random.Random(i).randrange(151_936) for _ in range(40)), 12, seed=i, model="qwen",
                    temperature=0.8) for i in range(6)]  # fmt: skip
    with running_core(models, model="qwen") as core:
        alone = generate_each(core, reqs)
        together = generate_all(core, reqs)
        assert_clean(core)
    assert together == alone


def test_a_bug_in_the_completion_path_fails_jobs_instead_of_hanging_them(models: Path) -> None:
    with running_core(models) as core:
        rt = core.models.published("tiny")
        assert rt is not None and rt.sampler is not None

        def broken(*_args: object) -> None:
            raise RuntimeError("simulated bug")

        rt.sampler.sample = broken  # type: ignore[method-assign]
        ids = [core.submit(r).job_id for r in _reqs(3)]
        finals = [finish(core, j, timeout=10)[1] for j in ids]
        assert all(f.reason is FinishReason.ERROR and f.error_kind is ErrorKind.UNAVAILABLE for f in finals)
        assert not core.health().serving


def test_completion_of_a_retired_generation_is_dropped_not_applied(models: Path) -> None:
    # A slow first traffic job (modelled 4 s, scaled to 0.2 s) leaves time to retire its generation.
    plan = {"faults": [{"kind": "slow_job", "job": WARM_UP_JOBS, "delay_ms": 4000}]}
    with running_core(models, device_options={"fault_plan": plan, "time_scale": 0.05}) as core:
        rt = core.models.published("tiny")
        assert rt is not None and rt.kv is not None
        job = core.submit(request((1, 2, 3), 5, seed=1)).job_id
        until("its first device job in flight", lambda: core.snapshot().inflight == 1)
        core.engine.generations.fence_generation(rt.generation)  # the generation is gone while its job runs
        tokens, final = finish(core, job)
        assert final.error_kind is ErrorKind.UNAVAILABLE and "retired" in final.error_message
        assert tokens == [], "no token of a retired generation may be delivered"
        lane = next(lane for lane in rt.kv.snapshot() if lane.owner == job)
        assert lane.state is LaneState.RESERVED and lane.length == 0, "its KV was never committed"


def test_hangs_past_the_reset_budget_stop_the_board_instead_of_resetting_again(models: Path) -> None:
    plan = {"faults": [{"kind": "hang", "job": WARM_UP_JOBS + 3}, {"kind": "hang", "job": WARM_UP_JOBS + 11}]}
    with running_core(models, device_options={"fault_plan": plan}, job_timeout_s=0.3, reset_limit=1) as core:
        ids = [core.submit(r).job_id for r in _reqs(6)]
        finals = [finish(core, j)[1] for j in ids]
        assert core.snapshot().counters.resets == 1, "only the budgeted reset happened"
        health = core.health()
        assert health.reset_budget.exhausted and not health.serving
        assert any(f.error_kind is ErrorKind.UNAVAILABLE for f in finals)


@pytest.mark.parametrize("kind", ["ccu", "configuration"])
def test_operator_reset_under_traffic_changes_no_token(models: Path, reference, kind: str) -> None:
    with running_core(models, device_options={"time_scale": 0.02}) as core:
        ids = [core.submit(r).job_id for r in _reqs(8)]
        log = core.event_log(ids[0], for_wait=False)
        while log.token_count < 2:  # let traffic get going
            time.sleep(0.005)
        assert core.reset(kind, "test") == (True, core.reset(kind, "again")[1])
        got = [finish(core, j)[0] for j in ids]
        assert core.snapshot().counters.resets == 2
        if kind == "configuration":  # clears every lane; a CCU reset only hits jobs on the device
            assert core.snapshot().counters.recoveries > 0, "running sequences should have lost their KV"
        assert_clean(core)
    assert got == reference


def test_a_configuration_reset_drops_every_model_and_each_is_warmed_again_before_it_serves(models: Path) -> None:
    """As on CalRT 0.7.6 a configuration reset drops every configured calbin, whichever model the
    operator names: the old handles are dead, each model is configured again and passes its golden
    check, and the jobs of both continue with exactly the tokens of an undisturbed run."""
    tiny_req = request((5, 6, 7), 40, seed=3, temperature=0.8)
    qwen_req = request(tuple(range(100, 140)), 40, seed=4, temperature=0.8, model="qwen")
    with running_core(models, device_options={"time_scale": 0.02}) as core:
        core.load("qwen", "qwen")
        alone = generate_each(core, [tiny_req, qwen_req])
        old = {alias: core.models.published(alias) for alias in ("tiny", "qwen")}
        old_handles = {alias: rt.model for alias, rt in old.items() if rt is not None}
        warmups_before = core.device.counters().submitted
        ids = [core.submit(r).job_id for r in (tiny_req, qwen_req)]
        until("both jobs streaming", lambda: all(core.event_log(j, for_wait=False).token_count >= 3 for j in ids))
        with pytest.raises(NotFound):
            core.reset("configuration", "test", model="nope")

        ok, message = core.reset("configuration", "test", model="qwen")

        assert ok and "tiny" in message and "qwen" in message, message
        for alias, handle in old_handles.items():
            assert handle is not None
            with pytest.raises(ModelReleased):
                core.device.release(handle)  # the reset dropped it: the old handle is dead
            rt = core.models.published(alias)
            assert rt is old[alias] and rt is not None and rt.model is not handle, "same generation, new handle"
            assert rt.state is ModelState.READY and "warmed again" in rt.message
        got = [finish(core, j)[0] for j in ids]
        assert all(core.job_generation(j)[1] >= 1 for j in ids), "both lost their KV and re-prefilled"
        golden_jobs = sum(len(rt.manifest.golden.decode_tokens) for rt in old.values() if rt is not None)
        assert core.device.counters().submitted - warmups_before >= golden_jobs, "the golden checks ran again"
        assert_clean(core)
    assert got == alone


# ---- issue 21: a streak of submit errors drains the board -------------------------------------


def test_a_streak_of_submit_errors_drains_the_board_until_an_operator_resumes(models: Path) -> None:
    with running_core(models, fault_injection=True, submit_error_streak=3) as core:
        first = core.inject_fault(Fault(FaultKind.SUBMIT_ERROR))
        for k in (1, 2):  # the next three submit attempts fail: the prefill and its two retries
            core.inject_fault(Fault(FaultKind.SUBMIT_ERROR, job=first.job + k))
        tokens, final = finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)
        assert tokens == [] and final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.UNAVAILABLE
        assert "board stopped serving" in final.error_message, "the Final tells a gateway to resume elsewhere"
        health = core.health()
        assert not health.serving and not health.draining and health.device_healthy, health  # NOT_SERVING
        assert health.reason.startswith("3 consecutive submit errors"), health.reason
        (entry,) = core.status().reset_history
        assert (entry.kind, entry.automatic, entry.fault, entry.inflight_jobs) == (
            "drain",
            True,
            "submit error streak",
            1,
        )
        with pytest.raises(Unavailable, match="not serving: 3 consecutive submit errors"):
            core.submit(request((1, 2), 3, seed=2))
        assert_clean(core)
        assert core.resume() and core.health().serving
        assert finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)[1].reason is FinishReason.LENGTH


def test_a_submit_the_device_takes_breaks_the_streak(models: Path) -> None:
    with running_core(models, fault_injection=True, submit_error_streak=2) as core:
        for seed in range(3):  # one error, then the retry is taken: never two in a row
            core.inject_fault(Fault(FaultKind.SUBMIT_ERROR))
            assert finish(core, core.submit(request((1, 2, 3), 3, seed=seed)).job_id)[1].reason is FinishReason.LENGTH
        assert core.health().serving and core.status().reset_history == ()


def test_the_streak_counts_only_consecutive_failures_and_zero_never_escalates() -> None:
    streak = SubmitErrorStreak(limit=2)
    assert not streak.failed() and streak.failed() and not streak.failed(), "exactly the second escalates"
    streak.succeeded()
    assert not streak.failed()
    never = SubmitErrorStreak(limit=0)
    assert not any(never.failed() for _ in range(100))


def test_a_job_the_board_keeps_refusing_ends_unavailable_to_resume_elsewhere(models: Path) -> None:
    """Submit errors short of a streak spend the job's recovery budget; spent, the job ends
    UNAVAILABLE (a gateway resumes it on another board), not ABORTED: the board refused it, nothing
    says the job is at fault. A job faulted on the device still ends ABORTED."""
    with running_core(models, fault_injection=True, max_recoveries=1, submit_error_streak=5) as core:
        first = core.next_job_index()
        for k in range(2):  # the prefill and its one allowed retry
            core.inject_fault(Fault(FaultKind.SUBMIT_ERROR, job=first + k))
        _, final = finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)
        assert (final.reason, final.error_kind) == (FinishReason.ERROR, ErrorKind.UNAVAILABLE), final
        assert "recovery budget exhausted here" in final.error_message and core.health().serving
        first = core.next_job_index()
        for k in range(2):
            core.inject_fault(Fault(FaultKind.CCU_EXCEPTION, job=first + k))
        _, final = finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)
        assert (final.reason, final.error_kind) == (FinishReason.ERROR, ErrorKind.ABORTED), final
        assert_clean(core)
