"""`AsyncDaemonClient` against the in-process fake daemon: the same behaviour as the sync client
(streaming tokens and chunks, re-attach, typed errors, metadata, health Watch), each test one
`asyncio.run`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2

from calculet.client import (
    AsyncDaemonClient,
    FinalEvent,
    FinishReason,
    LoadReport,
    ModelInfo,
    ModelState,
    SamplingParams,
    ServingStatus,
    StreamState,
    TokenChunk,
)
from calculet.common.error_codes import RETRY_AFTER_KEY
from calculet.common.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    Unavailable,
)
from calculet.v1 import common_pb2, inference_pb2

from .conftest import start_server
from .fake_daemon import DAEMON_SEED, Failure, FakeDaemon, completion_tokens, final_event, tokens_of

T = TypeVar("T")


# Every test runs twice: generations on the shared Follow call (the default), and on one Wait
# stream per job; the fake daemon serves both with the same events, gates and breaks.
FOLLOW = {"follow": True}


@pytest.fixture(autouse=True, params=[True, False], ids=["follow", "wait"])
def _stream_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(FOLLOW, "follow", request.param)


def with_client(target: str, body: Callable[[AsyncDaemonClient], Awaitable[T]], **kw: object) -> T:
    async def main() -> T:
        kw.setdefault("follow", FOLLOW["follow"])
        async with AsyncDaemonClient(target, timeout=10.0, token="tok-2", **kw) as client:  # type: ignore[arg-type]
            return await body(client)

    return asyncio.run(main())


def test_generate_streams_tokens_and_the_daemons_seed(daemon: str, fake: FakeDaemon) -> None:
    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [3, 4], max_tokens=5)
        assert gen.seed == DAEMON_SEED and gen.job_id == "job-1"
        assert [t async for t in gen] == completion_tokens([3, 4], 0, 5) == gen.tokens
        assert gen.final is not None and gen.state is StreamState.DONE

    with_client(daemon, body)
    for method in ("Submit", "Wait"):
        ((_, metadata),) = fake.calls_of(method)
        assert metadata["authorization"] == "Bearer tok-2"


def test_tokens_arrive_before_the_job_ends(daemon: str, fake: FakeDaemon) -> None:
    gate = threading.Event()
    fake.next_gates = {1: gate}

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [2], max_tokens=4)
        first = await anext(gen)
        assert gen.final is None and not gen.done
        gate.set()
        assert [first, *[t async for t in gen]] == completion_tokens([2], 0, 4)

    with_client(daemon, body)


def test_a_broken_stream_is_reattached(daemon: str, fake: FakeDaemon) -> None:
    fake.next_breaks = {2}

    async def body(client: AsyncDaemonClient) -> list[int]:
        return await (await client.generate("tiny", [8, 9], max_tokens=6)).result()

    assert with_client(daemon, body) == completion_tokens([8, 9], 0, 6)
    assert [req.from_event_index for req, _ in fake.calls_of("Wait")] == [0, 2]


def test_a_job_lost_with_its_stream_is_unavailable(daemon: str, fake: FakeDaemon) -> None:
    fake.next_breaks, fake.next_lost_on_break = {1}, True

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [8], max_tokens=6)
        with pytest.raises(Unavailable, match="resubmit with resume_tokens"):
            await gen.result()
        assert gen.tokens == completion_tokens([8], 0, 2)

    with_client(daemon, body)


def test_the_reattach_budget_is_bounded(daemon: str, fake: FakeDaemon) -> None:
    fake.fail["Wait"] = Failure(grpc.StatusCode.UNAVAILABLE, "Socket closed")

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [1], max_tokens=2)
        with pytest.raises(Unavailable):
            await gen.result()

    with_client(daemon, body, max_reattach=1)
    assert len(fake.calls_of("Wait")) == 2


def test_chunks_stream_across_a_reattach(daemon: str, fake: FakeDaemon) -> None:
    fake.next_breaks = {1}

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [3, 4], max_tokens=5)
        chunks = [c async for c in gen.chunks()]
        want = completion_tokens([3, 4], 0, 5)
        assert [c.tokens for c in chunks] == [tuple(want[0:2]), tuple(want[2:4]), tuple(want[4:5])]
        assert [(c.index, c.first_index) for c in chunks] == [(0, 0), (1, 2), (2, 4)]
        assert all(isinstance(c, TokenChunk) and c.logprobs == () for c in chunks)
        assert gen.final is not None and gen.final.reason is FinishReason.LENGTH and gen.tokens == want

    with_client(daemon, body)
    assert [req.from_event_index for req, _ in fake.calls_of("Wait")] == [0, 1]


def test_chunks_raise_the_final_error(daemon: str, fake: FakeDaemon) -> None:
    error = common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_UNAVAILABLE, message="model draining")
    fake.script = lambda req, generation: [
        inference_pb2.WaitEvent(index=0, tokens=inference_pb2.TokenChunk(first_index=0, tokens=[7])),
        final_event(1, inference_pb2.FINISH_REASON_ERROR, error=error),
    ]

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [1])
        got: list[TokenChunk] = []
        with pytest.raises(Unavailable, match="model draining"):
            async for chunk in gen.chunks():
                got.append(chunk)
        assert [c.tokens for c in got] == [(7,)]
        assert gen.final is not None and isinstance(gen.final.error, Unavailable)

    with_client(daemon, body)


def test_max_reattach_zero_fails_over_at_once(daemon: str, fake: FakeDaemon) -> None:
    fake.next_breaks = {1}

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [8], max_tokens=6)
        with pytest.raises(Unavailable, match="Socket closed"):
            _ = [c async for c in gen.chunks()]
        assert gen.tokens == completion_tokens([8], 0, 2) and gen.state is StreamState.LOST

    with_client(daemon, body, max_reattach=0)
    assert len(fake.calls_of("Wait")) == 1


def test_a_failed_final_raises_its_typed_error(daemon: str, fake: FakeDaemon) -> None:
    error = common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_ABORTED, message="recovery budget exhausted")
    fake.script = lambda req, generation: [final_event(0, inference_pb2.FINISH_REASON_ERROR, error=error)]

    async def body(client: AsyncDaemonClient) -> None:
        gen = await client.generate("tiny", [1])
        with pytest.raises(Aborted, match="recovery budget exhausted"):
            await gen.result()

    with_client(daemon, body)


def test_submit_wait_cancel(daemon: str) -> None:
    async def body(client: AsyncDaemonClient) -> None:
        job = await client.submit("tiny", (5, 6), sampling=SamplingParams(seed=1), max_tokens=3)
        assert job.seed == 1
        events = [e async for e in client.wait(job.job_id)]
        assert tokens_of(events) == completion_tokens([5, 6], 0, 3) and isinstance(events[-1], FinalEvent)
        assert await client.cancel(job.job_id) is True
        assert await client.cancel(job.job_id) is False
        with pytest.raises(NotFound):
            await client.cancel("nope")
        with pytest.raises(NotFound):
            _ = [e async for e in client.wait("nope")]

    with_client(daemon, body)


def test_refusals_are_typed(daemon: str, fake: FakeDaemon) -> None:
    async def body(client: AsyncDaemonClient) -> None:
        with pytest.raises(NotFound, match="ghost"):
            await client.generate("ghost", [1])
        with pytest.raises(InvalidArgument, match="prompt_tokens"):
            await client.generate("tiny", [])
        with pytest.raises(InvalidArgument, match="sampling"):
            await client.generate("tiny", [1], seed=1, sampling=SamplingParams())
        fake.fail["Submit"] = Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", ((RETRY_AFTER_KEY, "0.5"),))
        with pytest.raises(Overloaded) as info:
            await client.generate("tiny", [1])
        assert info.value.retry_after_s == 0.5

    with_client(daemon, body)


def test_observation_plane(daemon: str, fake: FakeDaemon) -> None:
    fake.tokenizer_json = b"x" * (5 * 1024 * 1024)

    async def body(client: AsyncDaemonClient) -> None:
        assert (await client.health()).status == common_pb2.SERVING_STATUS_SERVING
        assert len((await client.status()).models[0].lanes) == 5
        model = await client.get_model("tiny")
        assert isinstance(model, ModelInfo) and model.tokenizer_json == fake.tokenizer_json
        assert (model.vocab_size, model.state, model.eos_token_ids, model.bos_token_id) == (
            1000,
            ModelState.READY,
            (2,),
            1,
        )
        reports = client.watch_load(50)
        async with contextlib.aclosing(reports):  # type: ignore[type-var]
            got = [await anext(reports) for _ in range(3)]
        assert [r.sequence for r in got] == [0, 1, 2]
        assert all(isinstance(r, LoadReport) and r.status is ServingStatus.SERVING for r in got)
        assert [(m.alias, m.ready, m.queue_depth, m.free_lanes) for m in got[2].models] == [("tiny", True, 2, 3)]
        with pytest.raises(InvalidArgument, match="interval_ms"):
            await anext(client.watch_load(70000))

    with_client(daemon, body)


def test_watch_health_follows_the_standard_health_service(daemon: str, fake: FakeDaemon) -> None:
    async def body(client: AsyncDaemonClient) -> None:
        board = client.watch_health()
        async with contextlib.aclosing(board):  # type: ignore[type-var]
            assert await anext(board) is ServingStatus.SERVING
            fake.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            assert await anext(board) is ServingStatus.NOT_SERVING
            fake.health.set("", health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)  # same mapped status: skipped
            fake.health.set("", health_pb2.HealthCheckResponse.SERVING)
            assert await anext(board) is ServingStatus.SERVING
        model = client.watch_health("tiny")
        async with contextlib.aclosing(model):  # type: ignore[type-var]
            assert await anext(model) is ServingStatus.NOT_SERVING  # SERVICE_UNKNOWN: not published yet

    with_client(daemon, body)


def test_watch_health_of_a_dead_daemon_is_unavailable(tmp_path: Path, fake: FakeDaemon) -> None:
    sock = tmp_path / "w.sock"
    server = start_server(fake, sock)

    async def main() -> None:
        async with AsyncDaemonClient(str(tmp_path / "nobody.sock"), timeout=5.0) as gone:
            with pytest.raises(Unavailable):
                await anext(gone.watch_health())
        async with AsyncDaemonClient(f"unix://{sock}", timeout=5.0) as client:
            statuses = client.watch_health()
            assert await anext(statuses) is ServingStatus.SERVING
            server.stop(grace=None).wait(5)
            with pytest.raises(Unavailable):
                await anext(statuses)

    try:
        asyncio.run(main())
    finally:
        server.stop(grace=None).wait(5)


def test_operations_plane(daemon: str, fake: FakeDaemon) -> None:
    async def body(client: AsyncDaemonClient) -> None:
        states = [p.state async for p in client.load("t2", "packages/tiny")]
        assert states[0] == common_pb2.MODEL_STATE_VALIDATING and states[-1] == common_pb2.MODEL_STATE_READY
        final = await client.load_and_wait("t3", "packages/tiny")
        assert final.done and final.state == common_pb2.MODEL_STATE_READY
        with pytest.raises(FailedPrecondition, match="hash mismatch"):
            await client.load_and_wait("bad", "packages/broken")
        with pytest.raises(FailedPrecondition, match="use replace"):
            await client.load_and_wait("tiny", "packages/tiny")
        assert (await client.unload("t2", drain_timeout_ms=5000)).generation == 4
        fake.remaining_jobs = 1
        assert (await client.drain(timeout_ms=0)).remaining_jobs == 1
        assert (await client.resume()).was_draining
        result = await client.reset("device", "operator test")
        assert result.ok and {g.alias for g in result.generations} == {"tiny", "t3"}
        assert (await client.inject_fault("nan_logits", job_index=30)).planned_faults == 1
        assert (await client.inject_fault("nan_logits")).planned_faults == 2  # the next attempt
        with pytest.raises(InvalidArgument, match="at most one"):
            await client.inject_fault("nan_logits", job_index=1, probability=0.5)

    with_client(daemon, body)


def test_a_closed_client_refuses_calls_and_unreachable_is_unavailable(daemon: str, tmp_path: Path) -> None:
    async def main() -> None:
        client = AsyncDaemonClient(daemon)
        await client.close()
        await client.close()
        with pytest.raises(FailedPrecondition, match="closed"):
            await client.health()
        async with AsyncDaemonClient(str(tmp_path / "nobody.sock"), timeout=5.0) as gone:
            with pytest.raises(Unavailable):
                await gone.status()

    asyncio.run(main())
