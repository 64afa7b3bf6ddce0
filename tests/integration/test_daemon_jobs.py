"""The job table of a real daemon under a hostile client (issue 7, items 1, 4 and 9): a reused
client_request_id is refused instead of handing over another caller's job, job ids are random,
finished jobs expire by bytes and by age, and every refused Submit is counted. Raw stubs, so each
field is exactly what the test sends (an unset seed stays unset)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from calculet.daemon.core.events import EventLog, job_bytes
from calculet.v1 import daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

from .conftest import DaemonProcess, shared_daemon

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0


@pytest.fixture
def stub_for() -> Iterator[Callable[[Any], Any]]:
    channels: list[grpc.Channel] = []

    def connect(daemon: Any) -> Any:
        channel = grpc.insecure_channel(daemon.target)
        channels.append(channel)
        return daemon_pb2_grpc.DaemonStub(channel)

    yield connect
    for channel in channels:
        channel.close()


def _submit_pb(prompt: list[int], client_id: str = "", max_tokens: int = 8, **sampling: Any) -> Any:
    return inference_pb2.SubmitRequest(
        model="tiny",
        client_request_id=client_id,
        prompt_tokens=prompt,
        sampling=inference_pb2.SamplingParams(**sampling),  # no seed: the daemon draws one
        stopping=inference_pb2.StoppingParams(max_tokens=max_tokens, ignore_eos=True),
    )


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def _wait_all(stub: Any, job_id: str, from_index: int = 0) -> list[Any]:
    return list(stub.Wait(inference_pb2.WaitRequest(job_id=job_id, from_event_index=from_index), timeout=TIMEOUT_S))


def _expired(stub: Any, job_id: str) -> bool:
    try:
        _wait_all(stub, job_id)
    except grpc.RpcError as exc:
        assert exc.code() is grpc.StatusCode.NOT_FOUND, exc
        return True
    return False


# ---- item 1 ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[DaemonProcess]:
    """A plain tiny board for the tests below that need nothing of a fresh one (no counter, no bound)."""
    with shared_daemon(tmp_path_factory.mktemp("jobs"), models_root, "--model", "tiny=tiny") as board:
        yield board


def test_a_reused_client_request_id_gets_failed_precondition_not_the_other_callers_job(
    plain: DaemonProcess, stub_for: Any
) -> None:
    stub = stub_for(plain)
    first = stub.Submit(_submit_pb([1, 2, 3], "shared-key"), timeout=TIMEOUT_S)
    other = _submit_pb([9, 9, 9], "shared-key")
    with pytest.raises(grpc.RpcError) as info:
        stub.Submit(other, timeout=TIMEOUT_S)
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert first.job_id not in (info.value.details() or ""), "the refusal must not reveal the first job"
    events = _wait_all(stub, first.job_id)
    assert events[-1].HasField("final")
    # After the Final: still refused, and an identical retry (seed unset again) is the first job.
    assert _code(lambda: stub.Submit(other, timeout=TIMEOUT_S)) is grpc.StatusCode.FAILED_PRECONDITION
    retry = stub.Submit(_submit_pb([1, 2, 3], "shared-key"), timeout=TIMEOUT_S)
    assert retry.deduplicated and retry.job_id == first.job_id and retry.seed == first.seed
    named_seed = _submit_pb([1, 2, 3], "shared-key", seed=first.seed)
    assert _code(lambda: stub.Submit(named_seed, timeout=TIMEOUT_S)) is grpc.StatusCode.FAILED_PRECONDITION


def test_job_ids_are_random_and_fit_the_protocol(plain: DaemonProcess, stub_for: Any) -> None:
    stub = stub_for(plain)
    ids = [stub.Submit(_submit_pb([1, 2, 3], max_tokens=2), timeout=TIMEOUT_S).job_id for _ in range(8)]
    for job_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22,64}", job_id), f"guessable or too short: {job_id!r}"
        _wait_all(stub, job_id)
    assert len({job_id[:6] for job_id in ids}) == len(ids), f"ids share prefixes: {ids}"


# ---- item 4 ------------------------------------------------------------------------------------


def _estimate(tokens: int) -> int:
    log = EventLog("estimate")
    for t in range(tokens):
        log.append_tokens((t,))
    return job_bytes(log)


def test_finished_jobs_are_kept_within_the_byte_bound_oldest_first(start_daemon: Any, stub_for: Any) -> None:
    room = 10 * _estimate(40)  # ten finished 40-token jobs
    stub = stub_for(start_daemon("--model", "tiny=tiny", "--retention-bytes", str(room)))
    ids = []
    for i in range(40):
        job = stub.Submit(_submit_pb([1, 2, 3], f"fill-{i}", max_tokens=40), timeout=TIMEOUT_S)
        assert len(_wait_all(stub, job.job_id)) == 41
        ids.append(job.job_id)
    kept = [job_id for job_id in ids if not _expired(stub, job_id)]
    assert 5 <= len(kept) <= 10, f"{len(kept)} of 40 finished jobs kept within room for 10"
    assert kept == ids[-len(kept) :], "the oldest are evicted first"
    code = _code(lambda: stub.Cancel(inference_pb2.CancelRequest(job_id=ids[0]), timeout=TIMEOUT_S))
    assert code is grpc.StatusCode.NOT_FOUND
    fresh = stub.Submit(_submit_pb([7, 7, 7], "fill-0"), timeout=TIMEOUT_S)  # its key expired with it
    assert not fresh.deduplicated
    _wait_all(stub, fresh.job_id)


def test_finished_jobs_expire_after_the_retention_age(start_daemon: Any, stub_for: Any) -> None:
    stub = stub_for(start_daemon("--model", "tiny=tiny", "--retention-seconds", "0.5"))
    job = stub.Submit(_submit_pb([1, 2, 3], "aged"), timeout=TIMEOUT_S)
    assert len(_wait_all(stub, job.job_id)) == 9
    deadline = time.monotonic() + TIMEOUT_S
    while not _expired(stub, job.job_id):
        assert time.monotonic() < deadline, "a finished job outlived --retention-seconds"
        time.sleep(0.05)


# ---- item 9 ------------------------------------------------------------------------------------


def test_every_refused_submit_is_counted_whatever_its_error(start_daemon: Any, stub_for: Any) -> None:
    stub = stub_for(start_daemon("--model", "tiny=tiny"))

    def rejected() -> int:
        return int(stub.Status(observe_pb2.StatusRequest(), timeout=TIMEOUT_S).job_counters.rejected)

    def refuse(request: Any, expected: grpc.StatusCode) -> None:
        assert _code(lambda: stub.Submit(request, timeout=TIMEOUT_S)) is expected

    for _ in range(1000):
        refuse(_submit_pb([1, 2, 100_000]), grpc.StatusCode.INVALID_ARGUMENT)  # token id beyond the vocabulary
    assert rejected() == 1000
    job = stub.Submit(_submit_pb([1, 2, 3], "taken"), timeout=TIMEOUT_S)
    refuse(inference_pb2.SubmitRequest(model="tiny"), grpc.StatusCode.INVALID_ARGUMENT)  # empty prompt
    refuse(_bad_priority(), grpc.StatusCode.INVALID_ARGUMENT)
    refuse(inference_pb2.SubmitRequest(model="nope", prompt_tokens=[1]), grpc.StatusCode.NOT_FOUND)
    refuse(_submit_pb([4, 5, 6], "taken"), grpc.StatusCode.FAILED_PRECONDITION)
    stub.Drain(operate_pb2.DrainRequest(timeout_ms=10_000), timeout=TIMEOUT_S)
    refuse(_submit_pb([1, 2, 3]), grpc.StatusCode.UNAVAILABLE)
    assert rejected() == 1005
    counters = stub.Status(observe_pb2.StatusRequest(), timeout=TIMEOUT_S).job_counters
    assert counters.accepted == 1, counters
    assert len(_wait_all(stub, job.job_id)) == 9


def _bad_priority() -> Any:
    request = _submit_pb([1, 2, 3])
    request.priority = 5000  # outside -1000..1000: refused by the wire checks, before the core
    return request
