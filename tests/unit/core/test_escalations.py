"""Issue 21, docs/sources.md 000 §14: the escalations past the first response, in-process (DeviceCore +
calsim at time scale 0, no gRPC).

- The watch: CCU exceptions and non-finite outputs counted in a sliding window; the CCU ladder (a
  ResetCCU, then a ResetConfiguration when they recur within the window); 0 never escalates.
- Repeated CCU exceptions reset the board automatically, within the reset budget, audited; the
  requests they hit keep exactly their undisturbed tokens.
- Repeated non-finite outputs quarantine the generation: its jobs end UNAVAILABLE (to resume
  elsewhere), its golden check runs again, it serves again; a failed check rolls back to the package
  the alias served before, or unloads it when there is none; each audited as kind "quarantine".
- The re-check judges the model, not the weather (issue 30): a CCU exception or a NaN during it is
  re-prefilled past, a run they cut short is made again, a storm of them leaves it inconclusive and
  serving, never unloaded; a NaN each time a step runs fails it only when a second run reproduces it.
- A lost device: the reset cannot restore it, so the board asks to exit (EXIT_DEVICE_UNHEALTHY),
  audited as kind "restart"; with `unhealthy_exit` off it stays up, NOT_SERVING.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind, Unavailable
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.audit import AuditEntry
from calculet.daemon.core.completion import DeviceFault
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.golden import RECHECK_ATTEMPTS, GoldenVerdict
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.resets.budget import BoardHalt
from calculet.daemon.core.resets.escalation_watch import EscalationKind, EscalationWatch, FaultWindow

from .engine_factories import assert_clean, build_models, finish, generate_each, request, running_core, until

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_models(tmp_path_factory.mktemp("models"))
    shutil.copytree(root / "tiny", root / "tiny-v2")  # a second package for replace and rollback
    return root


# ---- the watch (pure) ---------------------------------------------------------------------------


@given(st.lists(st.floats(0, 1000, allow_nan=False), max_size=40), st.integers(0, 5), st.floats(1, 100))
def test_a_fault_window_fires_exactly_when_the_limit_is_reached_within_the_window(
    times: list[float], limit: int, window: float
) -> None:
    fw, kept, fired = FaultWindow(limit, window), [], []
    for t in sorted(times):
        kept = [k for k in kept if k > t - window] + [t]
        expect = limit > 0 and len(kept) >= limit
        fired.append(fw.note(t))
        assert fired[-1] == expect
        if expect:
            kept = []
    assert limit > 0 or not any(fired), "0 never escalates"


def test_ccu_exceptions_escalate_to_a_ccu_reset_then_to_a_configuration_reset_when_they_recur() -> None:
    watch = EscalationWatch(ccu_limit=2, nan_limit=0, window_s=10.0)
    seen = [watch.saw(DeviceFault.CCU_EXCEPTION, 1, True, t) for t in (0.0, 1.0)]
    assert seen[0] is None and seen[1] is not None and seen[1].reset_kind == "ccu"
    again = [watch.saw(DeviceFault.CCU_EXCEPTION, 1, True, t) for t in (5.0, 6.0)]
    assert again[1] is not None and again[1].reset_kind == "configuration", "recurred within the window"
    later = [watch.saw(DeviceFault.CCU_EXCEPTION, 1, True, t) for t in (30.0, 31.0)]
    assert later[1] is not None and later[1].reset_kind == "ccu", "a quiet window starts the ladder again"
    assert watch.saw(DeviceFault.NONFINITE, 1, True, 32.0) is None, "nan_limit 0 never quarantines"


def test_non_finite_outputs_quarantine_only_a_ready_generation_and_count_per_generation() -> None:
    watch = EscalationWatch(ccu_limit=0, nan_limit=2, window_s=10.0)
    assert watch.saw(DeviceFault.NONFINITE, 1, True, 0.0) is None
    assert watch.saw(DeviceFault.NONFINITE, 2, True, 0.5) is None, "another generation's count is its own"
    assert watch.saw(DeviceFault.NONFINITE, 1, False, 1.0) is None, "warming or quarantined: not counted"
    esc = watch.saw(DeviceFault.NONFINITE, 1, True, 2.0)
    assert esc is not None and esc.kind is EscalationKind.QUARANTINE and esc.generation == 1
    assert watch.saw(DeviceFault.CCU_EXCEPTION, 1, True, 3.0) is None, "ccu_limit 0 never resets"


# ---- CCU exceptions ----------------------------------------------------------------------------


def _history(core) -> tuple[AuditEntry, ...]:  # type: ignore[no-untyped-def]
    return core.status().reset_history


def _plan_run(core, kind: FaultKind, count: int, offset: int = 0) -> int:  # type: ignore[no-untyped-def]
    """Plan `kind` at `count` consecutive submit attempts, `offset` attempts from the next one (each
    faulted job's re-prefill is the next attempt when one request runs). Returns the first index."""
    first = core.next_job_index() + offset
    for k in range(count):
        core.inject_fault(Fault(kind, job=first + k))
    return first


def test_repeated_ccu_exceptions_reset_the_compute_units_and_change_no_token(models: Path) -> None:
    reqs = [request((1, 2, 3, k), 60, seed=k, temperature=0.8) for k in range(3)]
    with running_core(models) as core:
        alone = generate_each(core, reqs)
    with running_core(models, fault_injection=True, ccu_escalation=3, escalation_window_s=600.0) as core:
        _plan_run(core, FaultKind.CCU_EXCEPTION, 3)
        ids = [core.submit(r).job_id for r in reqs]
        got = [finish(core, j, TIMEOUT)[0] for j in ids]
        assert core.wait_escalations(TIMEOUT)
        (entry,) = _history(core)
        assert (entry.kind, entry.automatic, entry.fault, entry.ok) == ("ccu", True, "ccu exceptions", True), entry
        assert entry.reason.startswith("3 CCU exceptions within 600s") and entry.serving_after
        assert core.snapshot().budget.used == 1, "an escalation's reset spends the automatic budget"
        assert core.health().serving
        assert_clean(core)
    assert got == alone


def test_ccu_exceptions_that_recur_after_the_reset_reset_the_configuration_and_warm_it_again(models: Path) -> None:
    reqs = [request((4, 5, 6, k), 80, seed=10 + k, temperature=0.9) for k in range(2)]
    with running_core(models) as core:
        alone = generate_each(core, reqs)
    # Four faults and two resets may hit one request: more than the default 3 re-prefills.
    config = {"ccu_escalation": 2, "escalation_window_s": 600.0, "max_recoveries": 8}
    with running_core(models, fault_injection=True, **config) as core:
        first = _plan_run(core, FaultKind.CCU_EXCEPTION, 2)
        for k in (20, 21):  # a second pair later in the same run: the ladder's next step
            core.inject_fault(Fault(FaultKind.CCU_EXCEPTION, job=first + k))
        ids = [core.submit(r).job_id for r in reqs]
        got, finals = zip(*(finish(core, j, TIMEOUT) for j in ids), strict=True)
        assert all(f.reason is FinishReason.LENGTH for f in finals), finals
        assert core.wait_escalations(TIMEOUT)
        kinds = [(e.kind, e.fault, e.ok) for e in _history(core)]
        assert kinds == [("ccu", "ccu exceptions", True), ("configuration", "ccu exceptions", True)], kinds
        rt = core.models.published("tiny")
        assert rt is not None and rt.state is ModelState.READY and "warmed again" in rt.message
        assert_clean(core)
    assert list(got) == alone


def test_an_escalation_past_the_reset_budget_halts_the_board_for_an_operator(models: Path) -> None:
    with running_core(models, fault_injection=True, ccu_escalation=2, reset_limit=0) as core:
        _plan_run(core, FaultKind.CCU_EXCEPTION, 2)
        finish(core, core.submit(request((1, 2), 40, seed=1)).job_id, TIMEOUT)
        assert core.wait_escalations(TIMEOUT)
        assert core.engine.resets.halt is BoardHalt.AWAITING_OPERATOR and not core.health().serving
        (entry,) = _history(core)
        assert (entry.kind, entry.fault, entry.ok) == ("ccu", "budget exhausted", False), entry
        assert core.reset("ccu", "operator")[0] and core.health().serving, "an operator reset lifts it"


# ---- non-finite outputs -------------------------------------------------------------------------


def test_repeated_non_finite_outputs_quarantine_the_generation_until_its_golden_check_passes(models: Path) -> None:
    with running_core(models, fault_injection=True, nan_escalation=2) as core:
        rt = core.models.published("tiny")
        # Decode step 20 and its re-prefill: the quarantine comes while ~220 steps are left to run.
        _plan_run(core, FaultKind.NAN_LOGITS, 2, offset=20)
        _, final = finish(core, core.submit(request((7, 8, 9), 240, seed=3)).job_id, TIMEOUT)
        assert final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.UNAVAILABLE, final
        assert "quarantined" in final.error_message, "the Final tells a gateway to resume it elsewhere"
        assert core.wait_escalations(TIMEOUT)
        (entry,) = _history(core)
        assert (entry.kind, entry.automatic, entry.fault, entry.ok) == ("quarantine", True, "non-finite logits", True)
        assert "golden check passed" in entry.message and entry.serving_after, entry
        assert core.models.published("tiny") is rt and rt is not None and rt.state is ModelState.READY
        assert finish(core, core.submit(request((7, 8, 9), 5, seed=3)).job_id)[1].reason is FinishReason.LENGTH
        assert_clean(core)


def test_a_quarantined_generation_refuses_new_work(models: Path) -> None:
    with running_core(models) as core:
        rt = core.models.published("tiny")
        assert rt is not None and core.engine.generations.quarantine_generation(rt, "test")
        with pytest.raises(Unavailable, match="quarantined"):
            core.submit(request((1, 2), 3, seed=1))
        assert not core.engine.generations.quarantine_generation(rt, "again"), "only a Ready generation"
        core.engine.generations.move_generation(rt, ModelState.READY)
        assert finish(core, core.submit(request((1, 2), 3, seed=1)).job_id)[1].reason is FinishReason.LENGTH


def _probe_runs(core, kind: FaultKind, runs: int) -> None:  # type: ignore[no-untyped-def]
    """Plan `kind` on every device job of the next `runs` re-check runs: each run's probe faults on
    its prefill and on every re-prefill until its recovery budget is used up."""
    _plan_run(core, kind, runs * (core.engine.config.max_recoveries + 1))


def test_a_failed_recheck_rolls_back_to_the_package_the_alias_served_before(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        old = core.models.published("tiny")
        new = core.load("tiny", "tiny-v2", replace=True)
        assert old is not None and new.package_dir.name == "tiny-v2"
        _probe_runs(core, FaultKind.NAN_LOGITS, 2)  # NaN/Inf each time, in two runs: a reproduced mismatch
        outcome = core.models.recheck(new, "test")
        assert outcome is not None and not outcome.passed and outcome.serving, outcome
        assert outcome.verdict is GoldenVerdict.FAILED and "mismatch reproduced in 2 run(s)" in outcome.message
        assert "rolled back to tiny" in outcome.message, outcome.message
        back = core.models.published("tiny")
        assert back is not None and back.state is ModelState.READY and back.package_dir.name == "tiny"
        assert new.state is ModelState.UNLOADED
        assert finish(core, core.submit(request((1, 2), 3, seed=1)).job_id)[1].reason is FinishReason.LENGTH
        assert_clean(core)


def test_a_failed_recheck_without_an_earlier_package_unloads_the_model(models: Path) -> None:
    with running_core(models, fault_injection=True) as core:
        rt = core.models.published("tiny")
        assert rt is not None
        _probe_runs(core, FaultKind.NAN_LOGITS, 2)
        outcome = core.models.recheck(rt, "test")
        assert outcome is not None and not outcome.passed and not outcome.serving, outcome
        assert "no earlier package" in outcome.message and rt.state is ModelState.UNLOADED
        with pytest.raises(Unavailable):
            core.submit(request((1, 2), 3, seed=1))
        assert_clean(core)


# ---- the re-check judges the model, not the weather (issue 30) -----------------------------------


AFTER = request((9, 9, 1), 12, seed=7, temperature=0.8)  # served once the re-check is over


@pytest.fixture(scope="module")
def after_alone(models: Path) -> list[int]:
    """The oracle: `AFTER`'s tokens on an undisturbed board."""
    with running_core(models) as core:
        return finish(core, core.submit(AFTER).job_id)[0]


def _still_serving(core, rt, outcome, after_alone: list[int]) -> None:  # type: ignore[no-untyped-def]
    """The re-check left the board's only model serving: Ready, published, answering exactly."""
    assert outcome is not None and outcome.serving, outcome
    assert rt.state is ModelState.READY and core.models.published("tiny") is rt, rt.message
    assert finish(core, core.submit(AFTER).job_id)[0] == after_alone
    assert_clean(core)


def test_a_ccu_exception_during_the_recheck_is_re_prefilled_and_not_held_against_the_model(
    models: Path, after_alone: list[int]
) -> None:
    with running_core(models, fault_injection=True, ccu_escalation=0) as core:
        rt = core.models.published("tiny")
        assert rt is not None
        core.inject_fault(Fault(FaultKind.CCU_EXCEPTION))  # the re-check's prefill
        outcome = core.models.recheck(rt, "test")
        assert outcome is not None and outcome.passed, outcome
        assert "re-prefilled past 1 device fault(s)" in outcome.message, outcome.message
        _still_serving(core, rt, outcome, after_alone)


def test_a_recheck_run_its_device_faults_cut_short_runs_again(models: Path, after_alone: list[int]) -> None:
    with running_core(models, fault_injection=True, ccu_escalation=0) as core:
        rt = core.models.published("tiny")
        assert rt is not None
        _probe_runs(core, FaultKind.CCU_EXCEPTION, 1)  # the first run uses up its re-prefills
        outcome = core.models.recheck(rt, "test")
        assert outcome is not None and outcome.passed, outcome
        assert f"passed on run 2 of {RECHECK_ATTEMPTS}" in outcome.message, outcome.message
        assert "run 1: golden check failed: device job ended ccu_exception" in outcome.message, outcome.message
        _still_serving(core, rt, outcome, after_alone)


def test_a_board_never_unloads_its_last_model_for_ccu_exceptions_during_the_recheck(
    models: Path, after_alone: list[int]
) -> None:
    with running_core(models, fault_injection=True, ccu_escalation=0) as core:
        rt = core.models.published("tiny")
        assert rt is not None
        _probe_runs(core, FaultKind.CCU_EXCEPTION, RECHECK_ATTEMPTS)  # every run, within the bound
        outcome = core.models.recheck(rt, "test")
        assert outcome is not None and outcome.serving, outcome
        assert outcome.verdict is GoldenVerdict.INCONCLUSIVE, outcome
        assert f"inconclusive after {RECHECK_ATTEMPTS} run(s)" in outcome.message, outcome.message
        _still_serving(core, rt, outcome, after_alone)


def test_a_nan_the_step_does_not_repeat_when_re_prefilled_is_not_held_against_the_model(
    models: Path, after_alone: list[int]
) -> None:
    with running_core(models, fault_injection=True) as core:
        rt = core.models.published("tiny")
        assert rt is not None
        core.inject_fault(Fault(FaultKind.NAN_LOGITS))  # the re-check's prefill only
        outcome = core.models.recheck(rt, "test")
        assert outcome is not None and outcome.passed, outcome
        assert "re-prefilled past 1 device fault(s), 1 of them NaN/Inf" in outcome.message, outcome.message
        _still_serving(core, rt, outcome, after_alone)


def test_a_nan_each_time_the_step_runs_fails_the_recheck_only_when_a_second_run_reproduces_it(
    models: Path, after_alone: list[int]
) -> None:
    with running_core(models, fault_injection=True) as core:
        rt = core.models.published("tiny")
        assert rt is not None
        _probe_runs(core, FaultKind.NAN_LOGITS, 1)  # the first run only
        outcome = core.models.recheck(rt, "test")
        assert outcome is not None and outcome.passed, outcome
        assert f"passed on run 2 of {RECHECK_ATTEMPTS} (run 1: non-finite logits each of the" in outcome.message
        _still_serving(core, rt, outcome, after_alone)


# ---- a lost device ------------------------------------------------------------------------------


@pytest.mark.parametrize("unhealthy_exit", [True, False])
def test_a_device_a_reset_cannot_restore_asks_for_a_restart(models: Path, unhealthy_exit: bool) -> None:
    asked: list[str] = []
    with running_core(models, fault_injection=True, unhealthy_exit=unhealthy_exit) as core:
        core.on_exit_request(asked.append)
        core.inject_fault(Fault(FaultKind.DEVICE_LOST))
        _, final = finish(core, core.submit(request((1, 2), 5, seed=1)).job_id, TIMEOUT)
        assert final.error_kind is ErrorKind.UNAVAILABLE
        assert core.wait_escalations(TIMEOUT)
        entries = [(e.kind, e.fault, e.ok) for e in _history(core)]
        assert entries == [("configuration", "device unhealthy", False), ("restart", "device unhealthy", False)]
        assert not core.health().serving
        if unhealthy_exit:
            assert len(asked) == 1 and core.exit_reason == asked[0], asked
        else:
            assert asked == [] and core.exit_reason == "" and "--unhealthy-exit off" in _history(core)[-1].message


def test_a_lost_board_whose_reset_restores_the_device_serves_again(models: Path) -> None:
    """calsim's lost device never comes back; a job that hangs even after a CCU reset makes the
    board LOST while the device still answers, so the configuration reset restores it."""
    with running_core(models, fault_injection=True) as core:
        until("the board serves", lambda: core.health().serving)
        with core.engine._cond:  # white-box: halt as the completion path does for an unrecoverable job
            core.engine.resets.halt_locked("device unrecoverable after reset: test")
        assert core.wait_escalations(TIMEOUT)
        (entry,) = _history(core)
        assert (entry.kind, entry.fault, entry.ok) == ("configuration", "device unhealthy", True), entry
        assert core.health().serving and core.engine.resets.halt is BoardHalt.NONE and core.exit_reason == ""
        assert finish(core, core.submit(request((1, 2), 5, seed=1)).job_id)[1].reason is FinishReason.LENGTH
        assert_clean(core)
