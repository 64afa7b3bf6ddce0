"""The engine's job table under attack (issue 7, items 1 and 4): a reused `client_request_id` must
not hand one caller another's job, job ids must not be guessable, and finished jobs are retained
within a byte and an age bound, oldest evicted first. Real in-process DeviceCores on calsim at
time scale 0; the Retention table itself on a fake clock."""

from __future__ import annotations

import dataclasses
import gc
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calculet.common.errors import FailedPrecondition, InvalidArgument, NotFound
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import EventLog, Retention, TokenLogprob, job_bytes
from calculet.daemon.core.ids import MAX_SEQUENCE_ID_CHARS
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.core.request_digest import request_digest
from calculet.daemon.main import main as daemon_main
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.settings import config_from

from .engine_factories import OwnerLock, build_models, finish, request, running_core, track_engine_lock

TIMEOUT = 20.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


def _with_id(req: GenerationRequest, client_id: str, **changes: Any) -> GenerationRequest:
    return dataclasses.replace(req, client_request_id=client_id, **changes)


def _poll(condition: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _gone(core: DeviceCore, job_id: str) -> bool:
    try:
        core.event_log(job_id, for_wait=False)
    except NotFound:
        return True
    return False


# ---- item 1: client_request_id reuse --------------------------------------------------------------


def test_a_reused_client_request_id_with_another_prompt_is_failed_precondition_not_the_first_job(
    models: Path,
) -> None:
    with running_core(models) as core:
        first = core.submit(_with_id(request((1, 2, 3), 8, seed=1), "abc"))
        with pytest.raises(FailedPrecondition, match="client_request_id"):
            core.submit(_with_id(request((9, 9, 9), 8, seed=1), "abc"))
        finish(core, first.job_id)


def test_a_reused_client_request_id_is_refused_after_the_first_job_finished_too(models: Path) -> None:
    with running_core(models) as core:
        first = core.submit(_with_id(request((1, 2, 3), 4, seed=1), "abc"))
        finish(core, first.job_id)
        with pytest.raises(FailedPrecondition):
            core.submit(_with_id(request((1, 2, 3), 5, seed=1), "abc"))
        again = core.submit(_with_id(request((1, 2, 3), 4, seed=1), "abc"))
        assert again.job_id == first.job_id and again.deduplicated, "an identical retry still finds its job"


def test_without_a_seed_a_retry_dedups_and_a_different_request_is_refused(models: Path) -> None:
    """The wire draws a seed for a Submit without one, so the drawn value must not be compared."""
    with running_core(models) as core:
        base = request((1, 2, 3), 4, seed=111, temperature=1.0)
        first = core.submit(_with_id(base, "s"), seed_given=False)
        drawn_again = dataclasses.replace(base.sampling, seed=222)
        retry = core.submit(_with_id(base, "s", sampling=drawn_again), seed_given=False)
        assert retry.job_id == first.job_id and retry.deduplicated and retry.seed == 111
        with pytest.raises(FailedPrecondition):
            core.submit(_with_id(request((4, 5, 6), 4, seed=333, temperature=1.0), "s"), seed_given=False)
        with pytest.raises(FailedPrecondition, match="client_request_id"):  # now naming the seed it got
            core.submit(_with_id(base, "s"), seed_given=True)
        finish(core, first.job_id)


def test_the_same_client_request_id_on_another_model_is_refused(models: Path) -> None:
    with running_core(models) as core:
        core.load("qwen", "qwen")
        first = core.submit(_with_id(request((1, 2, 3), 4, seed=1), "abc"))
        with pytest.raises(FailedPrecondition):
            core.submit(_with_id(request((1, 2, 3), 4, seed=1, model="qwen"), "abc"))
        finish(core, first.job_id)


_FIELD_CHANGES: dict[str, dict[str, Any]] = {
    "model": {"model": "other"},
    "prompt": {"prompt_tokens": (1, 2, 4)},
    "resume": {"resume_tokens": (7,)},
    "seed": {"sampling": SamplingParams(seed=2, temperature=0.5)},
    "temperature": {"sampling": SamplingParams(seed=1, temperature=0.6)},
    "logprobs": {"sampling": SamplingParams(seed=1, temperature=0.5, logprobs=0)},
    "max_tokens": {"stopping": StoppingParams(max_tokens=9)},
    "stop_ids": {"stopping": StoppingParams(max_tokens=8, stop_token_ids=(3,))},
    "ignore_eos": {"stopping": StoppingParams(max_tokens=8, ignore_eos=True)},
    "priority": {"priority": 1},
    "session": {"session_id": "s2"},
    "labels": {"labels": {"k": "v"}},
}


@pytest.mark.parametrize("field", sorted(_FIELD_CHANGES))
def test_the_digest_covers_every_field_of_the_request(field: str) -> None:
    base = GenerationRequest(
        "tiny", (1, 2, 3), SamplingParams(seed=1, temperature=0.5), StoppingParams(max_tokens=8), "id", session_id="s"
    )
    changed = dataclasses.replace(base, **_FIELD_CHANGES[field])
    assert request_digest(base, seed_given=True) == request_digest(dataclasses.replace(base), seed_given=True)
    assert request_digest(base, seed_given=True) != request_digest(changed, seed_given=True)


def test_a_retry_with_its_remaining_deadline_is_the_same_request() -> None:
    # inference.proto: a retrying client sends the remaining budget as deadline_ms.
    base = GenerationRequest(
        "tiny", (1, 2, 3), SamplingParams(seed=1), StoppingParams(max_tokens=8), "id", deadline_s=9.0
    )
    retry = dataclasses.replace(base, deadline_s=4.5)
    assert request_digest(base, seed_given=True) == request_digest(retry, seed_given=True)


def test_the_digest_ignores_a_drawn_seed_but_not_whether_one_was_given() -> None:
    a = request((1, 2, 3), 4, seed=1)
    b = request((1, 2, 3), 4, seed=2)
    assert request_digest(a, seed_given=False) == request_digest(b, seed_given=False)
    assert request_digest(a, seed_given=True) != request_digest(a, seed_given=False)
    assert request_digest(request((256, 1 << 40), 4, seed=1), seed_given=True) != request_digest(
        request((256, 1 << 41), 4, seed=1), seed_given=True
    ), "ids beyond uint32 (in-process callers) are encoded too"


def test_job_ids_are_random_url_safe_and_fit_the_protocol(models: Path) -> None:
    with running_core(models) as core:
        ids = [core.submit(request((1, 2, 3), 2, seed=i)).job_id for i in range(40)]
        for job_id in ids:
            finish(core, job_id)
    assert len(set(ids)) == len(ids)
    for job_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22,64}", job_id), job_id
        assert len(job_id) <= MAX_SEQUENCE_ID_CHARS
    # A counter (with or without a boot prefix) shares long prefixes between neighbours.
    assert len({job_id[:6] for job_id in ids}) == len(ids), f"job ids share prefixes: {ids[:3]}"


# ---- item 4: retention by bytes and age -------------------------------------------------------------


def test_retention_holds_its_byte_bound_and_evicts_the_oldest_jobs(models: Path) -> None:
    one_job = job_bytes(_log_of(40))
    bound = 10 * one_job  # room for ten finished jobs of 40 tokens
    with running_core(models, retention_bytes=bound) as core:
        ids = []
        for i in range(30):
            job = core.submit(_with_id(request((1, 2, 3), 40, seed=i), f"c{i}"))
            finish(core, job.job_id)
            ids.append(job.job_id)
            assert core.snapshot().retained_bytes <= bound
        kept = [j for j in ids if not _gone(core, j)]
        assert 5 <= len(kept) <= 10 and kept == ids[-len(kept) :], "the newest jobs are kept, the oldest evicted"
        with pytest.raises(NotFound):
            core.cancel(ids[0])
        # The evicted job's idempotency key is forgotten with it: the id is free for a new request.
        reused = core.submit(_with_id(request((5, 6, 7), 4, seed=9), "c0"))
        assert not reused.deduplicated and reused.job_id != ids[0]
        with pytest.raises(FailedPrecondition):  # a kept job's key is still bound to its request
            core.submit(_with_id(request((5, 6, 7), 4, seed=9), "c29"))
        finish(core, reused.job_id)


def test_a_finished_job_expires_after_the_retention_age(models: Path) -> None:
    with running_core(models, retention_s=0.2) as core:
        job = core.submit(_with_id(request((1, 2, 3), 4, seed=1), "x"))
        tokens, _ = finish(core, job.job_id)
        assert len(tokens) == 4
        assert _poll(lambda: _gone(core, job.job_id)), "the job outlived its retention age"
        with pytest.raises(NotFound):
            core.cancel(job.job_id)
        assert not core.submit(_with_id(request((4, 5, 6), 4, seed=1), "x")).deduplicated


def test_retention_evicts_by_age_then_bytes_oldest_first_on_a_fake_clock() -> None:
    now = [0.0]
    kept: Retention[str] = Retention(max_bytes=300, max_age_s=10.0, clock=lambda: now[0])
    assert kept.add("a", "a", 100) == []
    now[0] = 1.0
    assert kept.add("b", "b", 100) == []
    assert kept.add("c", "c", 150) == ["a"], "over the byte bound: the oldest goes"
    assert kept.nbytes == 250 and "a" not in kept and kept.get("b") == "b"
    assert kept.add("huge", "huge", 301) == ["b", "c", "huge"], "a job larger than the budget is not kept"
    assert kept.nbytes == 0 and len(kept) == 0
    kept.add("d", "d", 10)  # finished at 1.0
    now[0] = 10.5
    kept.add("e", "e", 10)
    assert kept.expire() == [] and kept.get("d") == "d", "9.5 s after its finish, not yet expired"
    now[0] = 11.0
    assert kept.expire() == ["d"] and kept.get("e") == "e"
    with pytest.raises(InvalidArgument):
        Retention(max_bytes=-1, max_age_s=1.0)
    with pytest.raises(InvalidArgument):
        Retention(max_bytes=1, max_age_s=float("inf"))


def test_the_byte_estimate_bounds_what_finished_jobs_really_hold(models: Path) -> None:
    """The estimate is calibrated against tracemalloc: not below what 20 retained jobs with logprobs
    hold, and not absurdly above it (then the bound would evict jobs for nothing)."""
    with running_core(models) as core:
        warm = request((1, 2, 3), 4, seed=1, logprobs=2)
        finish(core, core.submit(warm).job_id)
        ids, measured = _retained(core, 20, lambda i: request(tuple(range(300, 340)), 60, seed=i, logprobs=2))
        estimated = sum(job_bytes(core.event_log(j, for_wait=False)) for j in ids)
        assert measured <= estimated <= 3 * measured, (measured, estimated)


def _retained(core: DeviceCore, jobs: int, make: Callable[[int], GenerationRequest]) -> tuple[list[str], int]:
    """Submit and finish `jobs` requests `make(i)`; their job ids, and the bytes they hold once
    retained (tracemalloc). Each request is built inside the trace, with a prompt of its own as each
    Submit has, so a prompt the retained job kept would count."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        ids = [core.submit(make(i)).job_id for i in range(jobs)]
        for job_id in ids:
            finish(core, job_id)
        assert _poll(lambda: core.engine.idle())
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return ids, sum(d.size_diff for d in after.compare_to(before, "filename"))


def _retained_bytes(core: DeviceCore, prompt_len: int, jobs: int) -> int:
    """What `jobs` finished jobs with prompts of `prompt_len` tokens hold once retained."""
    return _retained(core, jobs, lambda i: request(tuple(range(300, 300 + prompt_len)), 8, seed=i))[1]


def test_a_retained_job_holds_no_prompt(models: Path) -> None:
    """Retention keeps a finished job for minutes: its prompt goes at its Final, so what a board
    holds does not follow the prompts it served (a long prompt's ints would be ~36 B a token)."""
    with running_core(models) as core:
        finish(core, core.submit(request((1, 2, 3), 4, seed=1)).job_id)
        short = _retained_bytes(core, 3, 20)
        long = _retained_bytes(core, 200, 20)
        assert long - short < 20 * 200 * 4, (short, long)  # under 4 B a prompt token: none of them kept
        retried = core.submit(_with_id(request(tuple(range(300, 500)), 8, seed=77), "kept"))
        finish(core, retried.job_id)
        again = core.submit(_with_id(request(tuple(range(300, 500)), 8, seed=77), "kept"))
        assert again.deduplicated and again.job_id == retried.job_id and again.seed == 77, "a retry still finds it"


def test_retention_settings_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="retention_bytes"):
        DaemonConfig(retention_bytes=-1)
    with pytest.raises(InvalidArgument, match="retention_s"):
        DaemonConfig(retention_s=0.0)


def _log_of(tokens: int) -> EventLog:
    log = EventLog("x")
    for t in range(tokens):
        log.append_tokens((t,), ())
    return log


def test_logprobs_count_in_the_estimate() -> None:
    plain, rich = EventLog("a"), EventLog("b")
    plain.append_tokens((1,))
    rich.append_tokens((1,), (TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.0))),))
    assert rich.approx_bytes > plain.approx_bytes > 0


@pytest.mark.parametrize(
    "flags",
    [
        ["--retention-bytes", "-1"],
        ["--retention-seconds", "0"],
        ["--retention-seconds", "nan"],
        ["--retention-seconds", "inf"],
    ],
)
def test_bad_retention_flags_end_the_daemon_with_a_usage_error(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert daemon_main(["--device", "calsim", *flags]) == 2
    assert "retention" in capsys.readouterr().err


def test_retention_flags_and_config_keys_reach_the_engine() -> None:
    config = config_from({"models": {}, "retention_bytes": 4096, "retention_seconds": 5})
    assert (config.retention_bytes, config.retention_s) == (4096, 5.0)
    engine = config.engine_config()
    assert (engine.retention_bytes, engine.retention_s) == (4096, 5.0)
    default = config_from({"models": {}})
    assert (default.retention_bytes, default.retention_s) == (256 * 1024 * 1024, 600.0)


def test_with_no_retention_submit_still_answers_and_finished_jobs_are_gone(models: Path) -> None:
    """A job may finish and leave retention before Submit returns: Submit must not look it up again."""
    with running_core(models, retention_bytes=0) as core:
        jobs = [core.submit(_with_id(request((1, 2, 3), 1, seed=i), f"k{i}")) for i in range(50)]
        assert all(not j.deduplicated for j in jobs)
        assert _poll(lambda: core.engine.idle())
        assert all(_gone(core, j.job_id) for j in jobs)
        snap = core.snapshot()
        assert snap.retained_jobs == 0 and snap.client_ids == 0


def test_submit_builds_the_sequence_outside_the_engine_lock(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Same class as item 2: building a 40,960-token history under the lock stalled every other
    # thread for ~15 ms per Submit. Validation and the history are O(prompt): outside the lock.
    from calculet.daemon.core import engine as engine_module

    held: dict[str, bool] = {}
    locks: list[OwnerLock] = []
    with running_core(models, before_start=lambda core: locks.append(track_engine_lock(core))) as core:
        lock = locks[0]
        real_validate, real_history = engine_module.servable, engine_module.TokenHistory

        def validate(req: GenerationRequest, limits: Any) -> GenerationRequest:
            held["validate"] = lock.held_here()
            return real_validate(req, limits)

        def history(*args: Any) -> Any:
            held["history"] = lock.held_here()
            return real_history(*args)

        monkeypatch.setattr(engine_module, "servable", validate)
        monkeypatch.setattr(engine_module, "TokenHistory", history)
        job = core.submit(request((1, 2, 3), 4, seed=1, temperature=0.8, repetition_penalty=1.1)).job_id
        finish(core, job)
        assert held == {"validate": False, "history": False}
        held.clear()
        plain = core.submit(request((1, 2, 3), 4, seed=2)).job_id  # no penalties: no history at all
        finish(core, plain)
    assert held == {"validate": False}
