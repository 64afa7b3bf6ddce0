"""Model lifecycle in-process: concurrent loads, one-configuration devices, failed warm-ups, drain."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from calculet.common.errors import (
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.calsim.memory import chip_needs
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.resets.budget import BoardHalt
from calculet.daemon.package.manifest import load_manifest

from .engine_factories import build_models, finish, request, running_core, until


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


def test_second_load_of_a_loading_alias_is_refused(models: Path) -> None:
    with running_core(models) as core:
        entered, release = threading.Event(), threading.Event()
        original = core.models._golden_check

        def slow_golden(rt, *shape):  # hold the first load in Warming
            entered.set()
            release.wait(10)
            return original(rt, *shape)

        core.models._golden_check = slow_golden  # type: ignore[method-assign]
        first = threading.Thread(target=core.load, args=("other", "tiny"))
        first.start()
        assert entered.wait(10)
        with pytest.raises(FailedPrecondition, match="already loading"):
            core.load("other", "tiny")
        release.set()
        first.join(10)
        assert core.models.published("other") is not None


def test_the_last_load_progress_comes_once_the_alias_is_free_again(models: Path, tmp_path: Path) -> None:
    # A client that loads again as soon as it reads the last progress (READY or FAILED) was told
    # "already loading" now and then: the done progress came before the alias was released.
    bad = tmp_path / "root"
    shutil.copytree(models / "tiny", bad / "tiny")
    (bad / "tiny" / "calculet-package.json").write_text("{")
    with running_core(models) as core:
        seen: list[tuple[ModelState, bool]] = []

        def progress(p):  # type: ignore[no-untyped-def]
            if p.done:
                seen.append((p.state, "other" in core.models._loading))

        core.load("other", "tiny", progress=progress)
        core.models.models_root = bad.resolve()
        with pytest.raises(FailedPrecondition):
            core.load(
                "broken",
                "tiny",
                progress=lambda p: seen.append((p.state, "broken" in core.models._loading)) if p.done else None,
            )
    assert seen == [(ModelState.READY, False), (ModelState.FAILED, False)]


def test_loaded_alias_needs_replace(models: Path) -> None:
    """On a two-model board (calsim-dev) the new generation loads beside the old one, which drains
    only once the new one is Ready."""
    with running_core(models) as core:
        with pytest.raises(FailedPrecondition, match="already loaded"):
            core.load("tiny", "tiny")
        old = core.models.published("tiny")
        new = core.load("tiny", "tiny", replace=True)
        assert old is not None and new.generation > old.generation
        assert old.state is ModelState.UNLOADED, "the replaced generation is drained and released"


def test_one_configuration_device_drains_the_old_generation_first(models: Path) -> None:
    with running_core(models, device_options={"profile": "calrt-0.7.6"}) as core:
        job = core.submit(request((1, 2, 3), 30, seed=1)).job_id
        new = core.load("tiny", "tiny", replace=True)
        tokens, final = finish(core, job)
        assert len(tokens) == 30 and final.reason.value == "length", "it finished on the old generation first"
        assert new.state is ModelState.READY
        assert len([r for r in core.models.all() if r.model is not None]) == 1
        with pytest.raises(FailedPrecondition, match="maximum"):
            core.load("second", "qwen")


def test_a_replace_that_does_not_fit_beside_the_old_generation_drains_it_first(models: Path) -> None:
    """Two-model board, memory for one (as a large model on a real board): the replace must not
    fail for lack of memory; the old generation finishes its jobs, unloads, and the new one serves."""
    need = max(n.dram for n in chip_needs(load_manifest(models / "tiny"), 2))
    with running_core(models, device_options={"dram_bytes": need + need // 2}) as core:
        job = core.submit(request((1, 2, 3), 30, seed=1)).job_id
        new = core.load("tiny", "tiny", replace=True)
        tokens, final = finish(core, job)
        assert len(tokens) == 30 and final.reason is FinishReason.LENGTH, "it finished on the old generation first"
        assert new.state is ModelState.READY and core.models.published("tiny") is new
        assert len([r for r in core.models.all() if r.model is not None]) == 1


def test_failed_golden_check_leaves_nothing_behind(models: Path, tmp_path: Path) -> None:
    bad = tmp_path / "root"
    shutil.copytree(models / "tiny", bad / "tiny")
    manifest = json.loads((bad / "tiny" / "calculet-package.json").read_text())
    manifest["golden"]["decode_tokens"][3] = (manifest["golden"]["decode_tokens"][3] + 1) % 512
    (bad / "tiny" / "calculet-package.json").write_text(json.dumps(manifest))
    with running_core(models) as core:
        core.models.models_root = bad.resolve()
        memory_before = core.device.memory_usage()
        with pytest.raises(FailedPrecondition, match="golden decode mismatch"):
            core.load("broken", "tiny")
        assert core.models.published("broken") is None
        assert core.device.memory_usage() == memory_before, "a failed load must give its memory back"
        assert [r.alias for r in core.models.all()] == ["tiny"]


def test_paths_are_confined_to_the_models_root(models: Path) -> None:
    with running_core(models) as core:
        with pytest.raises(PermissionDenied):
            core.load("x", "../..")
        with pytest.raises(NotFound):
            core.load("x", "missing")
        with pytest.raises(InvalidArgument):
            core.load("bad alias!", "tiny")


def test_unload_then_submit_is_unavailable_and_unknown_alias_not_found(models: Path) -> None:
    with running_core(models) as core:
        core.unload("tiny")
        with pytest.raises(Unavailable):
            core.submit(request((1, 2), 3, seed=1))
        with pytest.raises(NotFound):
            core.submit(request((1, 2), 3, seed=1, model="never"))


def test_unload_cancels_what_outlives_the_drain_timeout(models: Path) -> None:
    with running_core(models, device_options={"time_scale": 0.05}) as core:
        job = core.submit(request((1, 2, 3), 200, seed=1)).job_id
        core.unload("tiny", timeout_s=0.2)
        tokens, final = finish(core, job)
        assert final.error_kind is not None and final.error_kind.value == "unavailable"
        assert 0 < len(tokens) < 200


def test_drain_stops_admission_and_resume_restores_it(models: Path) -> None:
    with running_core(models) as core:
        job = core.submit(request((1, 2, 3), 10, seed=1)).job_id
        drained, remaining, _ = core.drain(timeout_s=30)
        assert drained and remaining == 0
        assert len(finish(core, job)[0]) == 10, "running work finishes during a drain"
        assert not core.health().serving
        with pytest.raises(Unavailable):
            core.submit(request((1, 2), 3, seed=1))
        assert core.resume() is True
        assert core.health().serving
        finish(core, core.submit(request((1, 2), 3, seed=1)).job_id)
        assert core.resume() is False, "not draining: nothing to resume, nothing audited"
        trail = core.status().reset_history
        assert [(e.kind, e.automatic, e.reason) for e in trail] == [
            ("drain", False, "operator drain"),
            ("resume", False, "operator resume"),
        ], trail
        assert (trail[0].serving_before, trail[0].serving_after) == (True, False)
        assert (trail[1].serving_before, trail[1].serving_after) == (False, True)
        assert trail[0].generations_before == trail[1].generations_after == ("tiny@1 (tiny)",)
        assert core.audit.entries() == trail and core.engine.audit is core.audit, "one trail, the board's"


def test_load_with_fewer_lanes_and_bad_lane_counts(models: Path) -> None:
    with running_core(models) as core:
        rt = core.load("two", "tiny", lanes=2)
        assert rt.kv is not None and rt.kv.lanes == 2
        assert [len(m.lanes) for m in core.status().models if m.alias == "two"] == [2]
        for bad in (0, 5):
            with pytest.raises(InvalidArgument, match="lanes"):
                core.load("bad", "tiny", lanes=bad)


def test_unload_reports_drained_and_interrupted_jobs_and_health_needs_a_ready_model(models: Path) -> None:
    with running_core(models, device_options={"time_scale": 0.05}) as core:
        core.submit(request((1, 2, 3), 200, seed=1))
        retired = core.unload("tiny", timeout_s=0.1)
        assert (retired.drained_jobs, retired.interrupted_jobs) == (0, 1)
        health = core.health()
        assert not health.serving and health.reason == "no model is ready"


@pytest.mark.parametrize("cut_off_by", ["unload", "interrupting drain"])
def test_a_hung_job_cut_off_by_an_operator_ends_through_a_ccu_reset_not_the_job_timeout(
    models: Path, cut_off_by: str
) -> None:
    """The job timeout is an hour away, so only the reset path can end the hung job: the unload or
    drain returns, the audit records an operator CCU reset naming why, and no hang was detected."""
    with running_core(models, fault_injection=True, job_timeout_s=3600.0) as core:
        core.inject_fault(Fault(FaultKind.HANG))
        job = core.submit(request((4, 5, 6), 40, seed=2)).job_id
        until("the job is on the device", lambda: core.snapshot().inflight > 0)
        if cut_off_by == "unload":
            retired = core.unload("tiny", timeout_s=0.0)
            assert retired.interrupted_jobs == 1 and retired.state is ModelState.UNLOADED
        else:
            drained, remaining, interrupted = core.drain(timeout_s=0.0, interrupt=True)
            # Counted after the interruption: the reset ended the hung job, so none is left (a
            # rollout with --interrupt once failed on the count taken before it).
            assert (drained, remaining, interrupted) == (True, 0, 1)
            assert core.engine.wait_device_idle(60.0), "the reset ended the hung job"
        _, final = finish(core, job)
        assert final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.UNAVAILABLE
        trail = core.status().reset_history
        resets = [e for e in trail if e.kind == "ccu"]
        assert [(r.kind, r.automatic, r.ok) for r in resets] == [("ccu", False, True)], trail
        assert cut_off_by in resets[0].reason and "cancelled" in resets[0].reason
        if cut_off_by == "interrupting drain":  # the drain is audited too: begun, then the jobs it ended
            assert [(e.kind, e.reason) for e in trail] == [
                ("drain", "operator drain"),
                ("ccu", resets[0].reason),
                ("drain", "drain interrupted"),
            ], trail
            assert (trail[2].inflight_jobs, trail[2].failed) == (1, 1)
        else:
            assert trail == tuple(resets)
        assert core.health().device_healthy and core.snapshot().halt is BoardHalt.NONE


def test_a_job_nobody_waits_for_is_cancelled_after_the_orphan_timeout(models: Path) -> None:
    """One device job at a time, and that job hangs (no reset: the job timeout is far away), so the
    orphan queued behind it cannot finish on its own whatever the machine's speed: only the orphan
    timeout can end it. The hung job has a Wait attached and must outlive the orphan timeout."""
    with running_core(models, max_inflight=1, fault_injection=True, orphan_timeout_s=0.3, job_timeout_s=120.0) as core:
        core.inject_fault(Fault(FaultKind.HANG))
        watched = core.submit(request((4, 5, 6), 40, seed=2)).job_id
        unsubscribe = core.event_log(watched, for_wait=False).subscribe(lambda: None)  # a Wait is attached
        orphan = core.submit(request((1, 2, 3), 200, seed=1)).job_id  # nobody waits for it

        # Poll instead of waiting on its log: a waiter would be a reader, and it would not be an orphan.
        until("the orphan cancelled", lambda: core.event_log(orphan, for_wait=False).finished)
        tokens, final = finish(core, orphan)

        assert final.reason is FinishReason.CANCELLED and final.error_kind is None and tokens == []
        assert not core.event_log(watched, for_wait=False).finished, "an attached job is never an orphan"
        assert core.reset("ccu", "unstick the hung job")[0]
        _, watched_final = finish(core, watched)
        unsubscribe()
        assert watched_final.reason is FinishReason.LENGTH
        assert core.status().cancelled == 1
