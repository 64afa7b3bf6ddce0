"""`FollowMux`: every Wait of one asyncio client carried by one Follow stream (daemon.proto).

With one Wait stream per job, a decode step of N sequences costs N gRPC messages each way and N
reads here; with Follow it costs one. `open(job_id, from_index)` is a drop-in for a Wait stream
(`AsyncGeneration`'s `open_stream`): an async iterator of the job's `WaitEvent`s that ends after
the Final, raises the typed error Wait would raise, and raises `Unavailable` when the shared
stream breaks (the generation then re-attaches, as after a broken Wait).

Data flow: `open` registers an attachment under a fresh follow_id on the live `_FollowCall` (one
is opened on demand) and queues its attach request; the call's writer task sends queued requests
in order; its reader task demultiplexes each reply's updates into the attachments' queues and
wakes their readers. A daemon without Follow (UNIMPLEMENTED) makes the mux fall back to Wait
streams for good, including for the attachments open at that moment (from their next index).

Ownership: the mux owns its calls; each attachment belongs to the iterator `open` returned, and
closing that iterator detaches it (never cancelling the job). A call that fails fails all its
attachments and is dropped; the next `open` starts a new one. `aclose` (the client's close) half-closes
the live call and waits for the daemon to end it (cancelling it only if attachments keep it open),
so nothing of it is left for gRPC to run once the event loop is closed. Single event loop, no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import grpc

from calculet.client.convert import error_from_status
from calculet.client.errors import error_from_rpc
from calculet.common.errors import CalculetError, Unavailable
from calculet.v1 import inference_pb2

log = logging.getLogger(__name__)

OpenWait = Callable[[str, int], AsyncIterator[inference_pb2.WaitEvent]]
CLOSE_WAIT_S = 2.0  # how long a closing client waits for the daemon to end its Follow stream


class _FellBack(Exception):
    """The daemon has no Follow: read this attachment through Wait from its next index."""


class _Follower:
    """One job's events as they arrive, read by one iterator."""

    __slots__ = ("ended", "error", "events", "waiter")

    def __init__(self) -> None:
        self.events: deque[inference_pb2.WaitEvent] = deque()
        self.error: BaseException | None = None
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _FollowCall:
    """One live Follow call: its attachments, the requests waiting to be written, its tasks."""

    def __init__(self, call: Any, on_end: Callable[[_FollowCall, BaseException], None]) -> None:
        self.call = call
        self.attachments: dict[int, _Follower] = {}
        self.outbox: asyncio.Queue[inference_pb2.FollowRequest] = asyncio.Queue()
        self._on_end = on_end
        self._reader = asyncio.ensure_future(self._read())
        self._writer = asyncio.ensure_future(self._write())

    def send(self, request: inference_pb2.FollowRequest) -> None:
        self.outbox.put_nowait(request)

    async def _write(self) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):  # the reader reports the end
            # Nothing is written before the daemon answered the call (a daemon serving Follow sends its
            # headers at once): one without Follow answers UNIMPLEMENTED, and a write racing that answer
            # can turn the call's status into INTERNAL, which would hide that the mux must fall back.
            await self.call.initial_metadata()
            if self.call.done():
                return
            while True:
                await self.call.write(await self.outbox.get())

    async def _read(self) -> None:
        error: BaseException
        try:
            async for reply in self.call:
                self._dispatch(reply)
            error = Unavailable("the daemon ended the Follow stream")
        except grpc.RpcError as err:
            if isinstance(err, grpc.aio.AioRpcError) and err.code() is grpc.StatusCode.UNIMPLEMENTED:
                error = _FellBack()
            else:
                error = error_from_rpc(err, "Follow")
        except asyncio.CancelledError:
            error = Unavailable("the client closed")
        self._writer.cancel()
        self.call.cancel()
        self._on_end(self, error)
        for attachment in self.attachments.values():
            attachment.error = error
            attachment.wake()
        self.attachments.clear()

    def _dispatch(self, reply: inference_pb2.FollowReply) -> None:
        for update in reply.updates:
            attachment = self.attachments.get(update.follow_id)
            if attachment is None:
                continue  # detached meanwhile
            if update.HasField("error"):
                attachment.error = error_from_status(update.error)
            elif update.events:
                attachment.events.extend(update.events)
            else:
                attachment.ended = True
            attachment.wake()

    async def aclose(self) -> None:
        """End the call and wait for it, so nothing of it is left for gRPC to run once the loop is gone.

        The client half-closes, and the daemon ends the stream with OK once no attachment is live
        (gRPC then has no cancellation to complete after us); a call still carrying attachments
        after `CLOSE_WAIT_S` is cancelled.
        """
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)
        if not self._reader.done():
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self.call.done_writing()
            await asyncio.wait({self._reader}, timeout=CLOSE_WAIT_S)
        if not self._reader.done():
            self._reader.cancel()
            self.call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class FollowMux:
    """Multiplexes one client's Waits over Follow streams.

    Args:
        open_call: starts a Follow call (`stub.Follow(metadata=...)`).
        open_wait: a plain Wait stream from an index (typed errors), for a daemon without Follow.
    """

    def __init__(self, open_call: Callable[[], Any], open_wait: OpenWait) -> None:
        self._open_call = open_call
        self._open_wait = open_wait
        self._call: _FollowCall | None = None
        self._ids = itertools.count(1)
        self._supported = True

    def open(self, job_id: str, from_index: int) -> AsyncIterator[inference_pb2.WaitEvent]:
        """The job's events from `from_index`, as a Wait stream would give them."""
        if not self._supported:
            return self._open_wait(job_id, from_index)
        return self._follow(job_id, from_index)

    async def aclose(self) -> None:
        """Stop the live call (its attachments fail with Unavailable) and wait until it is gone."""
        call, self._call = self._call, None
        if call is not None:
            await call.aclose()

    def _live_call(self) -> _FollowCall:
        if self._call is None:
            self._call = _FollowCall(self._open_call(), self._ended)
        return self._call

    def _ended(self, call: _FollowCall, error: BaseException) -> None:
        if self._call is call:
            self._call = None
        if isinstance(error, _FellBack):
            if self._supported:
                log.info("the daemon has no Follow: waiting on one Wait stream per job")
            self._supported = False

    async def _follow(self, job_id: str, from_index: int) -> AsyncGenerator[inference_pb2.WaitEvent, None]:
        call = self._live_call()
        follow_id = next(self._ids)
        attachment = _Follower()
        call.attachments[follow_id] = attachment
        wait = inference_pb2.WaitRequest(job_id=job_id, from_event_index=from_index)
        call.send(inference_pb2.FollowRequest(attach=inference_pb2.FollowAttach(follow_id=follow_id, wait=wait)))
        next_index = from_index
        try:
            while True:
                while attachment.events:
                    event = attachment.events.popleft()
                    next_index = event.index + 1
                    if event.HasField("final"):
                        attachment.ended = True  # the daemon dropped the attachment with its Final
                    yield event
                if attachment.error is not None or attachment.ended:
                    break
                attachment.waiter = asyncio.get_running_loop().create_future()
                await attachment.waiter
        finally:
            # A reader that stops early detaches; an attachment that ended is already gone on the daemon.
            if call.attachments.pop(follow_id, None) is not None and not attachment.ended:
                call.send(inference_pb2.FollowRequest(detach=follow_id))
        if attachment.ended or attachment.error is None:
            return  # its Final (or empty end) came before any failure of the stream
        if isinstance(attachment.error, _FellBack):
            async for event in self._open_wait(job_id, next_index):
                yield event
            return
        assert isinstance(attachment.error, CalculetError)
        raise attachment.error
