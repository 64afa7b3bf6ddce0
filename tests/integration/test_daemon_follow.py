"""Follow on a real daemon: many Waits on one stream (issue 22, item 3).

Concurrent generations through one `AsyncDaemonClient` (one Follow call) get the tokens of a
sequential, undisturbed run; one raw Follow stream carries several jobs' tokens in one reply; a
refused attachment is answered in-band while the stream goes on; a bad request fails only its
stream; and the board is idle afterwards (nothing leaked)."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from calculet.client import AsyncDaemonClient, DaemonClient
from calculet.v1 import common_pb2, daemon_pb2_grpc, inference_pb2

from .conftest import DaemonProcess, shared_daemon
from .helpers import assert_idle_soon
from .oracle import Req, make_requests, run_sequential

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


async def _generate_all(target: str, reqs: list[Req]) -> list[list[int]]:
    async with AsyncDaemonClient(target, timeout=TIMEOUT_S) as client:

        async def one(r: Req) -> list[int]:
            gen = await client.generate(
                "tiny", r.prompt, max_tokens=r.max_tokens, seed=r.seed, temperature=r.temperature,
                top_k=r.top_k, top_p=r.top_p, ignore_eos=r.ignore_eos,
            )  # fmt: skip
            return await gen.result()

        return await asyncio.gather(*(one(r) for r in reqs))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[DaemonProcess]:
    """One plain tiny board for the module's tests at time scale 0 (the paced one has its own): each
    test leaves it idle, and asserts so."""
    with shared_daemon(tmp_path_factory.mktemp("follow"), models_root, "--model", "tiny=tiny") as board:
        yield board


def test_concurrent_generations_on_one_follow_call_match_the_sequential_run(daemon: DaemonProcess) -> None:
    reqs = make_requests(12, vocab=512, seed=22)
    expected = run_sequential(daemon.target, "tiny", reqs)
    assert asyncio.run(_generate_all(daemon.target, reqs)) == expected
    with DaemonClient(daemon.target) as client:
        assert_idle_soon(client)


class FollowStream:
    """A raw Follow call: requests go through a queue, replies are read as they come."""

    def __init__(self, stub: Any) -> None:
        self._requests: queue.Queue[inference_pb2.FollowRequest | None] = queue.Queue()
        self.call = stub.Follow(iter(self._requests.get, None), timeout=TIMEOUT_S)

    def attach(self, follow_id: int, job_id: str, from_index: int = 0) -> None:
        wait = inference_pb2.WaitRequest(job_id=job_id, from_event_index=from_index)
        self._requests.put(
            inference_pb2.FollowRequest(attach=inference_pb2.FollowAttach(follow_id=follow_id, wait=wait))
        )

    def send(self, request: inference_pb2.FollowRequest) -> None:
        self._requests.put(request)

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def _serve(daemon: Any) -> Iterator[tuple[Any, Any]]:
    channel = grpc.insecure_channel(daemon.target)
    try:
        yield daemon, daemon_pb2_grpc.DaemonStub(channel)
    finally:
        channel.close()


@pytest.fixture
def stub(daemon: DaemonProcess) -> Iterator[tuple[Any, Any]]:
    yield from _serve(daemon)


@pytest.fixture
def paced_stub(start_daemon: Any) -> Iterator[tuple[Any, Any]]:
    """A board at time scale 2: four 24-token jobs decode together for over a second of wall time,
    however fast the machine. At time scale 0 they end in about 70 ms, so a test process held up that
    long between its Submits and its attaches found them finished, and then each reply carried one."""
    yield from _serve(start_daemon("--model", "tiny=tiny", "--time-scale", "2"))


def _submit(stub: Any, prompt: list[int], max_tokens: int) -> str:
    req = inference_pb2.SubmitRequest(
        model="tiny", prompt_tokens=prompt,
        sampling=inference_pb2.SamplingParams(temperature=0.0),
        stopping=inference_pb2.StoppingParams(max_tokens=max_tokens, ignore_eos=True),
    )  # fmt: skip
    return str(stub.Submit(req, timeout=TIMEOUT_S).job_id)


def _wait_tokens(stub: Any, job_id: str) -> list[int]:
    events = stub.Wait(inference_pb2.WaitRequest(job_id=job_id), timeout=TIMEOUT_S)
    return [t for e in events if e.HasField("tokens") for t in e.tokens.tokens]


def test_one_reply_carries_several_jobs_and_the_events_equal_waits(paced_stub: tuple[Any, Any]) -> None:
    daemon, s = paced_stub
    jobs = [_submit(s, [10 + i, 20 + i], 24) for i in range(4)]
    follow = FollowStream(s)
    for i, job in enumerate(jobs):
        follow.attach(i + 1, job)
    received: dict[int, list[Any]] = {i + 1: [] for i in range(4)}
    most_in_one_reply = 0
    finished: set[int] = set()
    for reply in follow.call:
        most_in_one_reply = max(most_in_one_reply, len(reply.updates))
        for update in reply.updates:
            assert not update.HasField("error")
            received[update.follow_id] += list(update.events)
            if update.events and update.events[-1].HasField("final"):
                finished.add(update.follow_id)
        if len(finished) == 4:
            break
    follow.close()
    assert most_in_one_reply >= 2  # the jobs decode in one batch: one message per step
    for i, job in enumerate(jobs):
        events = received[i + 1]
        assert [e.index for e in events] == list(range(len(events)))
        assert [t for e in events if e.HasField("tokens") for t in e.tokens.tokens] == _wait_tokens(s, job)
    with DaemonClient(daemon.target) as client:
        assert_idle_soon(client)


def test_a_refused_attachment_is_in_band_and_the_stream_goes_on(stub: tuple[Any, Any]) -> None:
    daemon, s = stub
    job = _submit(s, [3, 4], 6)
    follow = FollowStream(s)
    follow.attach(1, "no-such-job")
    follow.attach(2, job, from_index=10_000)
    follow.attach(3, job)
    errors: dict[int, int] = {}
    tokens: list[int] = []
    done = False
    for reply in follow.call:
        for update in reply.updates:
            if update.HasField("error"):
                errors[update.follow_id] = update.error.kind
            tokens += [t for e in update.events if e.HasField("tokens") for t in e.tokens.tokens]
            done = done or (update.follow_id == 3 and bool(update.events) and update.events[-1].HasField("final"))
        if done and len(errors) == 2:
            break
    follow.close()
    assert errors == {1: common_pb2.ERROR_KIND_NOT_FOUND, 2: common_pb2.ERROR_KIND_INVALID_ARGUMENT}
    assert tokens == _wait_tokens(s, job)
    with DaemonClient(daemon.target) as client:
        assert_idle_soon(client)


@pytest.mark.parametrize("bad", ["empty", "reused_id"])
def test_a_bad_request_fails_its_stream_only(stub: tuple[Any, Any], bad: str) -> None:
    daemon, s = stub
    job = _submit(s, [5], 200)
    follow = FollowStream(s)
    if bad == "empty":
        follow.send(inference_pb2.FollowRequest())
    else:
        follow.attach(7, job)
        follow.attach(7, job)
    with pytest.raises(grpc.RpcError) as info:
        for _ in follow.call:
            pass
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert len(_wait_tokens(s, job)) == 200  # the job was only detached, and finishes
    with DaemonClient(daemon.target) as client:
        assert client.health().status == common_pb2.SERVING_STATUS_SERVING
        assert_idle_soon(client)
