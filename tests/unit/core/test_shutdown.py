"""Issue 7 items 2 and 10b in the core: request validation checks lengths before ids, vectorised, and
a request checked off the engine lock is not checked again under it; at shutdown every unfinished
job ends at once with an in-band Final ERROR / UNAVAILABLE, hung device jobs included, and `close`
does not wait the job timeout for a hung job.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from calculet.common.errors import ErrorKind, InvalidArgument
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core import request as request_module
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent, FinishReason
from calculet.daemon.core.request import (
    CheckedRequest,
    GenerationRequest,
    ModelLimits,
    StoppingParams,
    prevalidate,
    servable,
    validate_request,
)
from calculet.daemon.sampling.params import SamplingParams

from .engine_factories import request

LIMITS = ModelLimits(vocab_size=512, context=256, prefill_tokens=256, eos_token_ids=frozenset({2}))
JOB_TIMEOUT_S = 60.0  # a hung job's timeout: close must not wait for it
POLL_S = 20.0


def _req(prompt: tuple[int, ...] = (1, 2, 3), resume: tuple[int, ...] = (), max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest("tiny", prompt, SamplingParams(), StoppingParams(max_tokens), resume_tokens=resume)


def _refusal(req: GenerationRequest, limits: ModelLimits = LIMITS) -> str:
    with pytest.raises(InvalidArgument) as info:
        validate_request(req, limits)
    return str(info.value)


# ---------------------------------------------------------------- validation


def test_an_oversized_prompt_is_refused_for_its_length_before_any_id_is_read() -> None:
    prompt = (600,) * 300  # every id outside the vocabulary, and too long: the length is what is named
    assert _refusal(_req(prompt)).startswith("prompt_tokens: 300 tokens")


@pytest.mark.parametrize("position", [0, 1, 127, 198])
@pytest.mark.parametrize("bad", [-1, 512, 2**40, 2**70])
def test_the_first_id_outside_the_vocabulary_is_named_wherever_it_is(position: int, bad: int) -> None:
    prompt = [5] * 200
    prompt[position] = bad
    prompt[-1] = 700  # a later bad id is not the one reported
    message = _refusal(_req(tuple(prompt)))
    assert message.startswith("prompt_tokens"), message
    if bad < 2**63:  # beyond int64 the id cannot be located cheaply; the field is still named
        assert message.startswith(f"prompt_tokens[{position}]: token id {bad}"), message


def test_a_resumed_stop_token_is_named_at_its_position() -> None:
    message = _refusal(_req(resume=(5, 7, 2, 2), max_tokens=8))
    assert message.startswith("resume_tokens[2]: 2 is a stop token"), message


def test_a_prevalidated_request_is_not_checked_again_against_equal_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = prevalidate(_req(), LIMITS)
    assert checked == CheckedRequest(_req(), LIMITS)  # the request as it came, and the limits it passed

    def scanned(*args: object) -> None:
        raise AssertionError("token ids scanned again")

    monkeypatch.setattr(request_module, "_check_ids", scanned)
    assert servable(checked, dataclasses.replace(LIMITS)) == _req()  # equal limits: validation is pure
    with pytest.raises(AssertionError, match="scanned again"):  # other limits (another generation took the alias)
        servable(checked, dataclasses.replace(LIMITS, vocab_size=600))
    with pytest.raises(AssertionError, match="scanned again"):  # a plain request is always checked
        servable(_req(), LIMITS)


def test_a_checked_request_is_refused_against_limits_it_does_not_fit() -> None:
    checked = prevalidate(_req((1, 500)), LIMITS)
    with pytest.raises(InvalidArgument, match=r"prompt_tokens\[1\]"):
        servable(checked, dataclasses.replace(LIMITS, vocab_size=400))


def test_prevalidate_refuses_what_validate_request_refuses() -> None:
    with pytest.raises(InvalidArgument):
        prevalidate(_req((1, 600)), LIMITS)


# ---------------------------------------------------------------- shutdown with a hung device job


def _core_with_a_hung_job(models_root: Path) -> tuple[DeviceCore, str]:
    config = DaemonConfig(
        models_root=models_root,
        models=(("tiny", "tiny"),),
        device_options={"time_scale": 0.0},
        fault_injection=True,
        job_timeout_s=JOB_TIMEOUT_S,
    )
    core = DeviceCore(config)
    core.start()
    core.inject_fault(Fault(FaultKind.HANG))  # the next device job: this request's prefill
    job_id = core.submit(request((1, 2, 3), 8, seed=1)).job_id
    deadline = time.monotonic() + POLL_S
    while core.planned_faults() or not core.status().inflight:
        assert time.monotonic() < deadline, "the hang did not fire"
        time.sleep(0.01)
    return core, job_id


def _finals(core: DeviceCore, job_id: str) -> list[FinalEvent]:
    return [e for e in core.event_log(job_id, for_wait=False).read(0) if isinstance(e, FinalEvent)]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from calculet.ops.sim_packages.build import build_sim_package

    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    return root


def test_end_unfinished_writes_the_final_of_a_job_still_on_the_device(tiny_root: Path) -> None:
    core, job_id = _core_with_a_hung_job(tiny_root)
    try:
        assert core.end_unfinished("shutting down") == 1
        assert core.status().inflight == 1  # still held by the device ...
        (final,) = _finals(core, job_id)  # ... and its client already has its Final
        assert (final.reason, final.error_kind) == (FinishReason.ERROR, ErrorKind.UNAVAILABLE)
        assert core.end_unfinished("again") == 0
    finally:
        closer = threading.Thread(target=core.close, daemon=True)
        closer.start()
        closer.join(JOB_TIMEOUT_S)
    assert not closer.is_alive(), f"close waited the job timeout ({JOB_TIMEOUT_S}s) for a hung job"
    assert len(_finals(core, job_id)) == 1  # the device's late end of the job wrote no second Final
    snap = core.snapshot()
    assert snap.counters.failed == 1 and not snap.jobs


def test_close_ends_a_hung_job_in_band_without_waiting_for_the_job_timeout(tiny_root: Path) -> None:
    core, job_id = _core_with_a_hung_job(tiny_root)
    closer = threading.Thread(target=core.close, daemon=True)
    closer.start()
    closer.join(JOB_TIMEOUT_S)
    assert not closer.is_alive(), f"close waited the job timeout ({JOB_TIMEOUT_S}s) for a hung job"
    (final,) = _finals(core, job_id)
    assert (final.reason, final.error_kind) == (FinishReason.ERROR, ErrorKind.UNAVAILABLE)
