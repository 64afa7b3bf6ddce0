"""`FollowMux` against the in-process fake daemon: concurrent generations share one Follow call,
an early close detaches, a refusal is typed per job, and a daemon without Follow falls back to
Wait streams (test_async_client.py runs every generation test on both paths)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from calculet.client import AsyncDaemonClient
from calculet.client.follow_mux import FollowMux
from calculet.common.errors import NotFound
from calculet.v1 import inference_pb2

from .conftest import MetadataRecorder, serve
from .fake_daemon import FakeDaemon, completion_tokens


@pytest.fixture
def recorded(tmp_path: Path, fake: FakeDaemon) -> Iterator[tuple[str, MetadataRecorder]]:
    recorder = MetadataRecorder()
    server, _ = serve(fake, f"unix://{tmp_path / 'f.sock'}", interceptors=[recorder])
    try:
        yield f"unix://{tmp_path / 'f.sock'}", recorder
    finally:
        fake.open_all_gates()
        server.stop(grace=None).wait(5)


def test_concurrent_generations_share_one_follow_call(recorded: tuple[str, MetadataRecorder], fake: FakeDaemon) -> None:
    target, recorder = recorded

    async def main() -> list[list[int]]:
        async with AsyncDaemonClient(target, timeout=10.0) as client:
            gens = [await client.generate("tiny", [i, i + 1], max_tokens=5) for i in range(4)]
            return await asyncio.gather(*(g.result() for g in gens))

    assert asyncio.run(main()) == [completion_tokens([i, i + 1], 0, 5) for i in range(4)]
    assert recorder.methods().count("Follow") == 1 and "Wait" not in recorder.methods()
    assert len(fake.calls_of("Wait")) == 4  # the fake serves each attachment as a Wait


def test_closing_a_generation_early_detaches_it_and_others_go_on(
    recorded: tuple[str, MetadataRecorder], fake: FakeDaemon
) -> None:
    target, _ = recorded
    gate = threading.Event()
    fake.next_gates = {1: gate}

    async def main() -> list[int]:
        async with AsyncDaemonClient(target, timeout=10.0) as client:
            held = await client.generate("tiny", [2], max_tokens=4)
            await anext(held)
            await held.aclose()  # the job keeps running; only this reader leaves
            other = await client.generate("tiny", [3], max_tokens=3)
            tokens = await other.result()
            gate.set()
            return tokens

    assert asyncio.run(main()) == completion_tokens([3], 0, 3)


def test_a_refused_attachment_raises_its_typed_error(recorded: tuple[str, MetadataRecorder], fake: FakeDaemon) -> None:
    target, _ = recorded

    async def main() -> None:
        async with AsyncDaemonClient(target, timeout=10.0) as client:
            gen = await client.generate("tiny", [1], max_tokens=2)
            with fake.lock:
                fake.jobs.clear()  # the job is gone before its attach arrives
            with pytest.raises(NotFound):
                await gen.result()
            again = await client.generate("tiny", [5], max_tokens=2)  # the stream itself is fine
            assert await again.result() == completion_tokens([5], 0, 2)

    asyncio.run(main())


class WithoutFollow(grpc.ServerInterceptor):
    """Serves as a daemon from before Follow: the method is not there, so gRPC answers UNIMPLEMENTED
    itself (a handler that aborts instead races the client's first write, and may end INTERNAL)."""

    def intercept_service(self, continuation: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return None if handler_call_details.method.endswith("/Follow") else continuation(handler_call_details)


def test_a_daemon_without_follow_is_waited_on_stream_by_stream(tmp_path: Path) -> None:
    fake = FakeDaemon()
    recorder = MetadataRecorder()
    server, _ = serve(fake, f"unix://{tmp_path / 'o.sock'}", interceptors=[recorder, WithoutFollow()])
    try:

        async def main() -> list[list[int]]:
            async with AsyncDaemonClient(f"unix://{tmp_path / 'o.sock'}", timeout=10.0) as client:
                first = await (await client.generate("tiny", [4], max_tokens=3)).result()
                second = await (await client.generate("tiny", [6], max_tokens=3)).result()
                return [first, second]

        assert asyncio.run(main()) == [completion_tokens([4], 0, 3), completion_tokens([6], 0, 3)]
    finally:
        server.stop(grace=None).wait(5)
    methods = recorder.methods()
    assert methods.count("Follow") == 1 and methods.count("Wait") == 2  # tried once, then Wait for good


class BrokenAfterFinal:
    """A Follow call (the aio call's surface the mux uses) whose one reply carries a job's token and
    Final, and which then breaks with UNAVAILABLE before the reader has taken them."""

    def __init__(self) -> None:
        self.attach = asyncio.Event()
        self.written: list[inference_pb2.FollowRequest] = []

    async def write(self, request: inference_pb2.FollowRequest) -> None:
        self.written.append(request)
        self.attach.set()

    def cancel(self) -> bool:
        return True

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()  # the daemon's headers, sent as the call starts

    def done(self) -> bool:
        return False

    async def __aiter__(self) -> Any:
        await self.attach.wait()  # the mux's writer task sends the attach first
        follow_id = self.written[0].attach.follow_id
        token = inference_pb2.WaitEvent(index=0, tokens=inference_pb2.TokenChunk(first_index=0, tokens=[9]))
        length = inference_pb2.Final(finish_reason=inference_pb2.FINISH_REASON_LENGTH)
        update = inference_pb2.FollowedEvents(
            follow_id=follow_id, events=[token, inference_pb2.WaitEvent(index=1, final=length)]
        )
        yield inference_pb2.FollowReply(updates=[update])
        empty = grpc.aio.Metadata()
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "Socket closed")


def test_a_stream_that_breaks_after_a_final_still_ends_that_job_cleanly() -> None:
    async def main() -> list[inference_pb2.WaitEvent]:
        async def no_wait(job_id: str, index: int) -> Any:
            raise AssertionError("no fallback expected")
            yield  # pragma: no cover

        mux = FollowMux(BrokenAfterFinal, no_wait)
        return [event async for event in mux.open("job-1", 0)]

    events = asyncio.run(main())
    assert [e.HasField("final") for e in events] == [False, True]
