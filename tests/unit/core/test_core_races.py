"""Races and edge cases of the daemon core: each test pins one race or edge case that broke a
request's tokens, stranded a job, hung or crashed a caller, or gave the wrong error kind. Most run a
real in-process DeviceCore on calsim; one drives an Engine on `FakeDevice` to finish the device's
jobs out of order. Races are staged with events and fault plans by job index, never with sleeps."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from calculet.common.errors import DeadlineExceeded, ErrorKind, FailedPrecondition, Unavailable
from calculet.daemon.core.chunking import CHUNK_OFF
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.engine import Engine, EngineConfig
from calculet.daemon.core.events import FinalEvent, FinishReason, wait_finished
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.device.types import JobStatus
from calculet.daemon.package.manifest import load_manifest

from .engine_factories import (
    WARM_UP_JOBS,
    assert_clean,
    build_models,
    finish,
    generate_each,
    request,
    running_core,
    until,
)
from .fakes import FakeDevice

TIMEOUT = 20.0


SHORT_BUCKET = 32  # > the tiny golden prompt (29 tokens), far below its 256-token context


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_models(tmp_path_factory.mktemp("models"))
    # "short": the tiny package with a prefill bucket much smaller than its context (a package may
    # declare that), so a sequence can outgrow the bucket while it decodes.
    shutil.copytree(root / "tiny", root / "short")
    manifest_path = root / "short" / "calculet-package.json"
    manifest = json.loads(manifest_path.read_text())
    prefill = next(s for s in manifest["submodels"] if s["role"] == "prefill")
    prefill["max_tokens"] = SHORT_BUCKET
    for tensor in prefill["inputs"]:
        tensor["shape"] = [1, SHORT_BUCKET]
    manifest_path.write_text(json.dumps(manifest))
    return root


def _serving(core: DeviceCore, alias: str = "tiny") -> ModelRuntime:
    rt = core.models.published(alias)
    assert rt is not None and rt.sampler is not None and rt.kv is not None
    return rt


@contextmanager
def paused_sampling(rt: ModelRuntime, at_call: int) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the completion thread inside the sampler (outside the engine lock) on its `at_call`-th
    call (1-based) until the test sets `go`; `entered` is set when it is held there."""
    assert rt.sampler is not None
    original = rt.sampler.sample
    entered, go = threading.Event(), threading.Event()
    calls = [0]

    def hooked(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == at_call:
            entered.set()
            assert go.wait(TIMEOUT), "test never released the sampler"
        return original(*args)

    rt.sampler.sample = hooked  # type: ignore[method-assign]
    try:
        yield entered, go
    finally:
        go.set()
        rt.sampler.sample = original  # type: ignore[method-assign]


def _run_while_sampling_paused(
    core: DeviceCore, at_call: int, action: Callable[[], object], req: Any
) -> tuple[list[int], Any]:
    """Submit `req`, hold its `at_call`-th completion in the sampler, run `action`, release."""
    rt = _serving(core)
    with paused_sampling(rt, at_call) as (entered, go):
        job = core.submit(req).job_id
        assert entered.wait(TIMEOUT)
        action()
        go.set()
        return finish(core, job)


# ---- 1. configuration reset vs a completion being sampled -----------------------------------


def test_configuration_reset_while_a_done_job_is_sampled_does_not_commit_cleared_kv(models: Path) -> None:
    """A job DONE on the device, already past `apply`'s checks and being sampled, when an operator
    resets the configuration (which clears its lanes): its KV must not be committed as valid."""
    req = request((5, 6, 7, 8), 12, seed=3, temperature=0.7)
    with running_core(models) as core:
        (reference,) = generate_each(core, [req])
        rt = _serving(core)
        resetter = threading.Thread(target=lambda: core.reset("configuration", "test"))

        def reset_reaches_the_engine() -> None:
            # The reset re-warms the model through the completion thread, which the test holds in the
            # sampler: release it once the reset has cleared the lanes (the generation left READY).
            resetter.start()
            until("the configuration reset applied", lambda: rt.state is not ModelState.READY)

        tokens, final = _run_while_sampling_paused(core, 4, reset_reaches_the_engine, req)
        resetter.join(TIMEOUT)
        assert not resetter.is_alive()
        assert final.reason is FinishReason.LENGTH
        assert tokens == reference, "a commit trusted KV the configuration reset had cleared"
        assert core.snapshot().counters.recoveries >= 1
        assert_clean(core)


# ---- 2. recovery of a sequence that outgrew the prefill bucket --------------------------------


def test_lost_kv_of_a_sequence_longer_than_the_prefill_bucket_fails_that_job_not_the_board(models: Path) -> None:
    """Chunked prefill off: a CCU exception once prompt + generated exceeds the prefill bucket: the
    re-prefill cannot be built. That one job must end with a typed error; the board and the other
    jobs keep serving."""
    # The warm-up's jobs come first; the traffic's prefill is the next, so WARM_UP_JOBS + n is decode step n.
    plan = {"faults": [{"kind": "ccu_exception", "job": WARM_UP_JOBS + 20}]}
    long_req = request(tuple(range(1, 21)), 40, seed=1, model="short")  # 20 + 20 > 32 at the fault
    options = {"fault_plan": plan}
    with running_core(models, model="short", device_options=options, prefill_chunk=CHUNK_OFF) as core:
        tokens, final = finish(core, core.submit(long_req).job_id)
        assert final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.ABORTED, final
        assert len(tokens) == 1 + 19, "the prefill's token and decode steps 1..19 were delivered"
        assert core.health().serving, "one unrecoverable sequence must not stop the board"
        short_req = request((1, 2, 3), 5, seed=2, model="short")
        assert finish(core, core.submit(short_req).job_id)[1].reason is FinishReason.LENGTH
        assert_clean(core)


def test_with_chunked_prefill_a_sequence_longer_than_the_prefill_bucket_recovers_exactly(models: Path) -> None:
    """The same fault with chunked prefill on (the default): the re-prefill of prompt + generated runs
    as chunks of at most the bucket, and the job continues with the undisturbed run's tokens."""
    plan = {"faults": [{"kind": "ccu_exception", "job": WARM_UP_JOBS + 20}]}
    long_req = request(tuple(range(1, 21)), 40, seed=1, model="short")
    with running_core(models, model="short") as core:
        reference, _ = finish(core, core.submit(long_req).job_id)
    with running_core(models, model="short", device_options={"fault_plan": plan}) as core:
        rt = core.models.published("short")
        assert rt is not None and rt.prefill is not None and rt.prefill_chunk == rt.prefill.max_tokens == 32
        tokens, final = finish(core, core.submit(long_req).job_id)
        assert final.reason is FinishReason.LENGTH and tokens == reference
        assert core.status().recoveries == 1
        assert_clean(core)


# ---- 3. a bug while launching a job -----------------------------------------------------------


def test_a_bug_while_launching_fails_the_jobs_being_launched_instead_of_stranding_them(models: Path) -> None:
    """The crash barrier fails what is in flight and what is queued; the sequences of the plan being
    launched were neither (already PREFILL, never submitted), and their Waits must end too."""
    with running_core(models, job_timeout_s=1.0) as core:

        def broken(*_args: object) -> None:
            raise RuntimeError("simulated bug in launch")

        core.device.submit = broken  # type: ignore[method-assign]
        job = core.submit(request((1, 2, 3), 5, seed=1)).job_id
        tokens, final = finish(core, job, timeout=5.0)
        assert final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.UNAVAILABLE
        assert tokens == []
        assert not core.health().serving
        assert not core.status().jobs


# ---- 4. operator resets and unloads at the same time --------------------------------------------


def test_configuration_reset_racing_an_unload_skips_the_released_model(models: Path) -> None:
    """The reset lists the configured models and resets through one's handle; an unload that releases
    that model in between must not turn the operator's reset into an error: it resets through a model
    still configured, and that one is warmed again and serves."""
    with running_core(models) as core:
        core.load("qwen", "qwen")
        original = core.device.reset_configuration
        entered, go = threading.Event(), threading.Event()

        def held(model: Any) -> None:
            if not go.is_set():  # preempted between listing the models and the device call
                entered.set()
                assert go.wait(TIMEOUT)
            original(model)

        core.device.reset_configuration = held  # type: ignore[method-assign]
        result: list[object] = []
        resetter = threading.Thread(target=lambda: result.append(_outcome(lambda: core.reset("configuration", "x"))))
        resetter.start()
        assert entered.wait(TIMEOUT)
        core.unload("tiny", 0.0)  # the oldest model: the handle the reset is about to use
        go.set()
        resetter.join(TIMEOUT)
        assert len(result) == 1 and result[0][0] is True, result  # succeeded, no error
        assert "qwen" in result[0][1] and "tiny" not in result[0][1], result
        qwen = request(tuple(range(100, 110)), 4, seed=1, model="qwen")
        assert finish(core, core.submit(qwen).job_id)[1].reason is FinishReason.LENGTH


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as exc:  # the test compares what came out, error or not
        return exc


# ---- 5. replace while the alias is being unloaded -----------------------------------------------


def test_replace_while_the_old_generation_is_draining_for_an_unload_succeeds(models: Path) -> None:
    """An Unload is draining generation 1 when a Load(replace) of the same alias publishes
    generation 2 and retires its predecessor: that retire is already under way, so the Load must
    report success (the new generation serves), not an illegal DRAINING -> DRAINING transition."""
    with running_core(models) as core:
        old = _serving(core)
        original = core.engine.generations.wait_generation_idle
        draining, go = threading.Event(), threading.Event()

        def held(generation: int, timeout: float) -> bool:
            if generation == old.generation and not go.is_set():
                draining.set()
                assert go.wait(TIMEOUT)
            return original(generation, timeout)

        core.engine.generations.wait_generation_idle = held  # type: ignore[method-assign]
        unloaded: list[object] = []
        unloader = threading.Thread(target=lambda: unloaded.append(_outcome(lambda: core.unload("tiny", 5.0))))
        unloader.start()
        assert draining.wait(TIMEOUT)
        with pytest.raises(FailedPrecondition, match="already being unloaded"):
            core.unload("tiny", 5.0)
        new = _outcome(lambda: core.load("tiny", "tiny", replace=True))
        go.set()
        unloader.join(TIMEOUT)
        assert isinstance(new, ModelRuntime) and new.generation > old.generation, new
        assert unloaded == [old], "unload returns the retired generation"
        assert old.state is ModelState.UNLOADED
        assert _serving(core) is new and new.state is ModelState.READY
        assert finish(core, core.submit(request((1, 2, 3), 4, seed=1)).job_id)[1].reason is FinishReason.LENGTH


# ---- 6. the golden check keeps the logits of the step that produced its first token --------------


@pytest.mark.parametrize("kind", ["nan_logits", "ccu_exception"])
def test_a_recovered_fault_on_the_warm_up_prefill_does_not_fail_the_golden_check(models: Path, kind: str) -> None:
    """The warm-up prefill (job 0) faults and is re-prefilled; the golden check must compare the
    logits of the re-prefill that produced the first token, not the faulted job's NaN logits."""
    plan = {"faults": [{"kind": kind, "job": 0}]}
    with running_core(models, device_options={"fault_plan": plan}) as core:
        rt = _serving(core)
        assert rt.state is ModelState.READY
        assert core.snapshot().counters.recoveries == 1, "the warm-up recovered from the fault"


def test_load_on_a_board_that_stopped_serving_fails_at_once_instead_of_waiting_for_its_warm_up(
    models: Path,
) -> None:
    """After the engine stopped serving (here: a bug while launching), a Load's warm-up probe was
    still queued although nothing would ever run it: the Load waited out the warm-up timeout."""
    with running_core(models, job_timeout_s=1.0) as core:
        original = core.device.submit

        def broken(*_args: object) -> None:
            raise RuntimeError("simulated bug in launch")

        core.device.submit = broken  # type: ignore[method-assign]
        finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id, timeout=5.0)
        core.device.submit = original  # type: ignore[method-assign]
        core.models.warm_timeout_s = 10.0
        # Refused before it configures anything, as UNAVAILABLE (issue 30): it was FAILED_PRECONDITION
        # once its warm-up probe had been refused.
        with pytest.raises(Unavailable, match="not serving"):
            core.load("other", "tiny")
        assert core.models.published("other") is None


# ---- 7. a device that finishes the other bank's job while the oldest one hangs ------------------


@contextmanager
def fake_engine(models: Path, **config: Any) -> Iterator[tuple[Engine, FakeDevice]]:
    """An Engine serving the tiny manifest on a `FakeDevice` (jobs end only when the test says)."""
    device = FakeDevice(ping_pong=True)
    engine = Engine(device, EngineConfig(**config))
    rt = ModelRuntime("tiny", 1, load_manifest(models / "tiny"), models / "tiny")
    rt.attach(device, device.configure(models / "tiny", rt.manifest), engine.engine_slots)
    for state in (ModelState.VALIDATING, ModelState.CONFIGURING, ModelState.WARMING, ModelState.READY):
        rt.lifecycle.move(state)
    engine.generations.start_jobs(rt)
    engine.generations.publish(rt)
    engine.start()
    try:
        yield engine, device
    finally:
        device.close()
        engine.stop()


@pytest.mark.parametrize("status", [JobStatus.DONE, JobStatus.CCU_EXCEPTION])
def test_a_job_finishing_after_the_board_stopped_serving_ends_its_sequences(models: Path, status: JobStatus) -> None:
    """The oldest job hangs past the reset budget (no reset: the board stops serving) while the
    other bank's job finishes, as a device may do. That job's sequence must not go back to READY
    or RECOVER, where nothing would ever schedule it: its Wait would never end."""
    with fake_engine(models, job_timeout_s=0.3, reset_limit=0) as (engine, device):
        hung, done = (engine.submit(request((i + 1, 2, 3), 4, seed=i)).job_id for i in range(2))
        until("both prefills on the device", lambda: len(device.inflight) == 2)
        second = device.inflight[max(device.inflight)][0]
        lanes = {j.job_id: j.lane for j in engine.snapshot().jobs}
        assert [r.lane for r in second.spec.rows] == [lanes[done]]
        device.finish(second, status)
        for job_id in (hung, done):
            events = engine.event_log(job_id)
            assert wait_finished(events, TIMEOUT), f"{job_id} never finished"
            final = events.read(0)[-1]
            assert isinstance(final, FinalEvent) and final.error_kind is ErrorKind.UNAVAILABLE, final
        assert engine.idle()


# ---- 8. error kinds ---------------------------------------------------------------------------


def test_a_deadline_that_passes_before_the_request_is_queued_is_deadline_exceeded_not_overloaded(
    models: Path,
) -> None:
    """RESOURCE_EXHAUSTED tells a gateway to try another board; a passed deadline must not."""
    with running_core(models) as core:
        r = request((1, 2, 3), 4, seed=1)
        late = GenerationRequest(r.model, r.prompt_tokens, r.sampling, r.stopping, deadline_s=1e-9)
        with pytest.raises(DeadlineExceeded):
            core.submit(late)
        assert core.snapshot().counters.rejected == 0, "a passed deadline is not a capacity rejection"
        assert not core.status().jobs
