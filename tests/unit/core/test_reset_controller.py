"""The reset controller (issue 7, items 3, 5 and 6): the reset budget, the one-reset-at-a-time gate,
the in-flight limit's degradation and restoration, and the count of the jobs a reset hit.

Pure parts run on small objects; the rest on an in-process DeviceCore over calsim, with hangs
injected by job index and every wait a condition with a deadline."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from calculet.common.errors import ErrorKind, FailedPrecondition, IllegalTransition, InvalidArgument
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.client_job import ClientJob, SeqState
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.executor import InflightLimit, LimitState
from calculet.daemon.core.resets.budget import (
    BoardHalt,
    JobFate,
    ResetBudget,
    ResetCounts,
    ResetGate,
    ResetTally,
    fate,
)
from calculet.daemon.wire_views import status_to_pb
from calculet.v1 import common_pb2

from .engine_factories import (
    assert_clean,
    build_models,
    finish,
    generate_each,
    request,
    running_core,
    until,
    use_up_recoveries,
)

TIMEOUT = 20.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


# ---- the budget, the gate, the in-flight limit, the tally (no device) ---------------------------


def test_clearing_the_budget_forgets_its_resets_and_the_exhausted_mark() -> None:
    budget = ResetBudget(limit=1, window_s=600.0)
    assert budget.try_spend() and not budget.try_spend()
    assert budget.view().exhausted
    budget.clear()
    view = budget.view()
    assert (view.used, view.exhausted) == (0, False)
    assert budget.try_spend(), "a cleared budget allows automatic resets again"


def test_the_gate_admits_one_reset_at_a_time() -> None:
    gate = ResetGate()
    tally = ResetTally()
    assert gate.try_begin("operator ccu reset", tally)
    assert not gate.try_begin("operator configuration reset"), "a second reset must be refused"
    assert gate.holder == "operator ccu reset" and gate.tally is tally, "a refusal changes nothing"
    gate.end()
    assert not gate.busy and gate.tally is None
    with pytest.raises(IllegalTransition):
        gate.end()
    assert gate.try_begin("automatic ccu reset")


def test_an_anomaly_degrades_the_limit_and_clean_jobs_in_a_row_restore_it() -> None:
    limit = InflightLimit(2, restore_after=3)
    assert (limit.state, limit.value) == (LimitState.FULL, 2)
    assert limit.anomaly("job 4 ended ccu_exception")
    assert (limit.state, limit.value, limit.reason) == (LimitState.DEGRADED, 1, "job 4 ended ccu_exception")
    assert not limit.clean_completion() and not limit.clean_completion()
    assert not limit.anomaly("non-finite logits"), "already degraded"
    assert limit.anomalies == 2 and limit.clean == 0, "an anomaly restarts the clean period"
    assert [limit.clean_completion() for _ in range(3)] == [False, False, True]
    assert (limit.state, limit.value, limit.reason) == (LimitState.FULL, 2, "")
    assert not limit.clean_completion(), "clean jobs while FULL change nothing"


def test_a_successful_reset_restores_the_limit_and_restore_after_0_waits_for_one() -> None:
    limit = InflightLimit(2, restore_after=0)
    limit.anomaly("hang")
    assert not any(limit.clean_completion() for _ in range(1000)), "0: no clean period restores it"
    assert limit.restore() and limit.value == 2
    assert not limit.restore()


def test_a_one_job_device_never_degrades_and_bad_limits_are_refused() -> None:
    limit = InflightLimit(1)
    assert not limit.anomaly("hang")
    assert (limit.state, limit.value, limit.anomalies) == (LimitState.FULL, 1, 1)
    for full, after in ((0, 3), (2, -1)):
        with pytest.raises(InvalidArgument):
            InflightLimit(full, after)


def _seq(job_id: str) -> ClientJob:
    return ClientJob(job_id, request((1, 2, 3), 8, seed=1), 1, frozenset())


def test_the_fate_of_a_hit_job_follows_its_recovery() -> None:
    decode = _seq("a")
    decode.lifecycle.move(SeqState.PREFILL)
    decode.lifecycle.move(SeqState.READY)
    decode.lifecycle.move(SeqState.DECODE)
    tally = ResetTally()
    tally.add([decode])
    assert fate(decode, 0) is JobFate.PENDING, "its faulted job is not applied yet"
    decode.recoveries += 1
    decode.lifecycle.move(SeqState.RECOVER)
    decode.lifecycle.move(SeqState.PREFILL)
    assert not tally.settled(), "re-prefilling"
    decode.lifecycle.move(SeqState.READY)
    assert tally.settled() and tally.counts() == ResetCounts(1, 1, 0)

    failed, cancelled, untouched = _seq("b"), _seq("c"), _seq("d")
    tally.add([failed, cancelled, untouched])
    tally.add([decode])  # recorded once, with its count when the reset first hit it
    failed.recoveries += 1
    failed.finish(FinishReason.ERROR, ErrorKind.ABORTED, "recovery budget exhausted")
    cancelled.finish(FinishReason.CANCELLED)
    untouched.finish(FinishReason.LENGTH)  # its job finished before the reset reached it
    assert [fate(s, 0) for s in (failed, cancelled, untouched)] == [JobFate.FAILED, JobFate.NEITHER, JobFate.NEITHER]
    assert tally.counts() == ResetCounts(4, 1, 1)


def test_warm_up_probes_are_not_client_jobs() -> None:
    probe = _seq("probe")
    probe.internal = True
    tally = ResetTally()
    tally.add([probe])
    assert tally.counts() == ResetCounts(0, 0, 0)


# ---- item 5: an operator reset is not an anomaly; real anomalies degrade, then restore ------------


def _hung_job(core: DeviceCore, seed: int = 1) -> str:
    """Submit one request whose first device job hangs; return once that job is in flight."""
    core.inject_fault(Fault(FaultKind.HANG))
    job = core.submit(request((4, 5, 6), 6, seed=seed, temperature=0.8)).job_id
    until("the hung job in flight", lambda: core.snapshot().inflight == 1)
    return job


def test_an_operator_ccu_reset_is_not_an_anomaly(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        reference = generate_each(core, [request((4, 5, 6), 6, seed=1, temperature=0.8)])[0]
        job = _hung_job(core)
        ok, _ = core.reset("ccu", "operator unsticks a hung job")
        tokens, final = finish(core, job)
        assert ok and tokens == reference and final.reason is FinishReason.LENGTH
        assert core.snapshot().inflight_limit == 2, "an operator reset must not drop ping/pong"
        assert core.snapshot().anomalies == 0
        assert core.status().degraded_reason == ""
        assert_clean(core, quarantine_ok=False)


def test_a_ccu_exception_degrades_and_a_clean_period_restores_ping_pong(models: Path) -> None:
    with running_core(models, fault_injection=True, restore_after_clean_jobs=5) as core:
        core.inject_fault(Fault(FaultKind.CCU_EXCEPTION))
        finish(core, core.submit(request((1, 2, 3), 1, seed=1)).job_id)
        status = core.status()
        assert status.max_inflight == 1 and status.anomalies == 1 and "ccu_exception" in status.degraded_reason
        # The faulted prefill's re-prefill was clean (1); a prefill and 2 decodes make 4 in a row.
        finish(core, core.submit(request((1, 2, 3), 3, seed=2)).job_id)
        assert core.snapshot().inflight_limit == 1, "not clean for long enough yet"
        finish(core, core.submit(request((1, 2, 3), 2, seed=3)).job_id)  # 6 in a row
        status = core.status()
        assert status.max_inflight == 2 and status.degraded_reason == ""
        assert_clean(core, quarantine_ok=False)


def test_a_successful_operator_reset_restores_a_degraded_limit(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        core.inject_fault(Fault(FaultKind.NAN_LOGITS))
        finish(core, core.submit(request((1, 2, 3), 2, seed=1)).job_id)
        assert core.snapshot().inflight_limit == 1
        assert core.reset("configuration", "operator restores ping/pong")[0]
        assert core.snapshot().inflight_limit == 2


# ---- item 3: a successful operator reset lifts a halt for a used-up budget ------------------------


def _halt_on_a_hang(core: DeviceCore) -> str:
    """With a budget of 0, one hang stops the board; returns the failed job."""
    core.set_reset_budget(0)
    core.inject_fault(Fault(FaultKind.HANG))
    job = core.submit(request((4, 5, 6), 6, seed=1, temperature=0.8)).job_id
    _, final = finish(core, job)
    assert final.error_kind is ErrorKind.UNAVAILABLE
    health = core.health()
    assert not health.serving and health.reset_budget.exhausted
    assert core.snapshot().halt is BoardHalt.AWAITING_OPERATOR
    return job


@pytest.mark.parametrize("kind", ["ccu", "configuration"])
def test_a_successful_operator_reset_clears_a_used_up_budget_and_the_board_serves(models: Path, kind: str) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        reference = generate_each(core, [request((7, 8), 5, seed=2, temperature=0.8)])
        _halt_on_a_hang(core)
        core.set_reset_budget(3)

        assert core.reset(kind, "operator clears the budget")[0]

        health = core.health()
        assert health.serving and not health.reset_budget.exhausted and health.reset_budget.used == 0, health
        assert core.snapshot().halt is BoardHalt.NONE
        assert generate_each(core, [request((7, 8), 5, seed=2, temperature=0.8)]) == reference
        assert_clean(core, quarantine_ok=False)  # the given-up job's buffers left through quarantine and a rebuild


def test_a_drained_board_stays_drained_after_the_halt_is_lifted(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        core.set_reset_budget(0)
        core.inject_fault(Fault(FaultKind.HANG))
        job = core.submit(request((4, 5, 6), 6, seed=1)).job_id
        core.stop_admitting()  # the operator drains while the job hangs
        finish(core, job)
        assert core.snapshot().halt is BoardHalt.AWAITING_OPERATOR
        assert core.reset("ccu", "operator")[0]
        health = core.health()
        assert health.device_healthy and health.draining and not health.serving, health
        assert core.resume() and core.health().serving


def test_a_drain_issued_during_the_halt_holds_after_the_reset_lifts_it(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        _halt_on_a_hang(core)
        core.stop_admitting()  # the operator drains the halted board, then resets it
        assert core.reset("ccu", "operator")[0]
        health = core.health()
        assert core.snapshot().halt is BoardHalt.NONE and health.device_healthy, health
        assert health.draining and not health.serving, "the drain issued during the halt was lost"
        assert core.resume() and core.health().serving


def test_a_resume_issued_during_the_halt_takes_effect_when_the_reset_lifts_it(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        core.stop_admitting()
        _halt_on_a_hang_while_drained(core)
        core.resume()  # halted: nothing is admitted yet
        assert not core.health().serving
        assert core.reset("ccu", "operator")[0]
        assert core.health().serving, "the resume issued during the halt was lost"


def _halt_on_a_hang_while_drained(core: DeviceCore) -> None:
    """`_halt_on_a_hang` on a drained board: the hanging job was admitted before the drain."""
    core.resume()
    core.set_reset_budget(0)
    core.inject_fault(Fault(FaultKind.HANG))
    job = core.submit(request((4, 5, 6), 6, seed=1)).job_id
    core.stop_admitting()
    finish(core, job)
    assert core.snapshot().halt is BoardHalt.AWAITING_OPERATOR


def test_a_reset_that_does_not_end_the_hung_job_leaves_the_board_halted(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        _halt_on_a_hang(core)
        reset_ccu = core.device.reset_ccu
        core.device.reset_ccu = lambda: None  # type: ignore[method-assign]  # a reset the device shrugs off

        report = core.operator_reset("ccu", "a reset that leaves the job hanging")

        assert not report.ok and isinstance(report.error, FailedPrecondition), report
        assert "still hangs" in report.message
        assert not core.health().serving and core.health().reset_budget.exhausted
        core.device.reset_ccu = reset_ccu  # type: ignore[method-assign]
        assert core.operator_reset("ccu", "a reset that ends it").ok
        assert core.health().serving
        assert finish(core, core.submit(request((1, 2), 3, seed=1)).job_id)[1].reason is FinishReason.LENGTH


# ---- item 6: the jobs a reset hit are counted; one reset at a time ----------------------------------


def test_the_report_counts_the_jobs_a_configuration_reset_hit(models: Path) -> None:
    reqs = [request((10 + i, 20, 30), 40, seed=i, temperature=0.8) for i in range(4)]
    with running_core(models, device_options={"time_scale": 0.02}) as core:
        ids = [core.submit(r).job_id for r in reqs]
        until("every job streaming", lambda: all(core.event_log(j, for_wait=False).token_count >= 2 for j in ids))
        use_up_recoveries(core, ids[0])  # this reset ends that job

        report = core.operator_reset("configuration", "count them", settle_timeout_s=TIMEOUT)

        assert report.ok, report
        assert report.counts == ResetCounts(inflight=4, recovered=3, failed=1), report.counts
        assert finish(core, ids[0])[1].error_kind is ErrorKind.ABORTED
        assert all(finish(core, j)[1].reason is FinishReason.LENGTH for j in ids[1:])
        assert_clean(core, quarantine_ok=False)


def test_the_report_counts_the_hung_job_a_ccu_reset_recovered(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        job = _hung_job(core)
        report = core.operator_reset("ccu", "count it", settle_timeout_s=TIMEOUT)
        assert report.ok and report.counts == ResetCounts(1, 1, 0), report
        assert finish(core, job)[1].reason is FinishReason.LENGTH


def test_a_reset_in_progress_refuses_another_and_the_next_one_runs(models: Path) -> None:
    with running_core(models) as core:
        entered, go = threading.Event(), threading.Event()
        original = core.engine.resets.operator_reset_succeeded

        def held() -> object:
            entered.set()
            assert go.wait(TIMEOUT)
            return original()

        core.engine.resets.operator_reset_succeeded = held  # type: ignore[method-assign]
        first: list[object] = []
        resetter = threading.Thread(target=lambda: first.append(core.reset("ccu", "first")))
        resetter.start()
        assert entered.wait(TIMEOUT)
        resets = core.snapshot().counters.resets
        for kind in ("ccu", "configuration"):
            with pytest.raises(FailedPrecondition, match="reset in progress"):
                core.reset(kind, "second")
        assert core.snapshot().counters.resets == resets, "a refused reset is not counted"
        go.set()
        resetter.join(TIMEOUT)
        assert first and first[0] == (True, "compute units reset")
        core.engine.resets.operator_reset_succeeded = original  # type: ignore[method-assign]
        assert core.reset("configuration", "next")[0], "the gate is free again"
        assert finish(core, core.submit(request((1, 2), 3, seed=1)).job_id)[1].reason is FinishReason.LENGTH


# ---- issue 10 item 3: the reset audit trail ------------------------------------------------------


def test_every_reset_automatic_or_operator_leaves_an_audit_entry(models: Path) -> None:
    with running_core(models, fault_injection=True, job_timeout_s=0.3) as core:
        core.inject_fault(Fault(FaultKind.HANG))  # the reset controller resets the hung job's CCU
        assert finish(core, core.submit(request((4, 5, 6), 6, seed=1)).job_id)[1].reason is FinishReason.LENGTH
        assert core.reset("configuration", "operator check")[0]
        core.set_reset_budget(0)
        _halt_on_a_hang(core)  # no budget left: the controller gives the job up and the board halts

        history = core.status().reset_history
        assert [(e.kind, e.automatic, e.fault, e.ok) for e in history] == [
            ("ccu", True, "hang", True),
            ("configuration", False, "operator", True),
            ("ccu", True, "budget exhausted", False),
        ]
        hang, operator, refused = history
        assert "did not finish" in hang.reason and hang.inflight_jobs >= 1 and hang.serving_after
        assert operator.reason == "operator check" and operator.generations_before == ("tiny@1 (tiny)",)
        assert operator.generations_after == ("tiny@1 (tiny)",) and operator.serving_before and operator.serving_after
        assert refused.serving_before and not refused.serving_after and "operator" in refused.message
        assert [e.at for e in history] == sorted(e.at for e in history)
        wire = status_to_pb(core.status()).resets
        assert [r.fault for r in wire.history] == ["hang", "operator", "budget exhausted"]
        assert wire.history[2].health_after == common_pb2.SERVING_STATUS_NOT_SERVING
