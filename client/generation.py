"""The result of `generate`: a job's tokens as they stream, re-attaching when the stream breaks.

Data flow: the client submits, then hands this module the job's SubmitResult (inside a
`WaitCursor`, `calculet.client.cursor`) and two callables: `open_stream(from_index)` (a Wait stream
of `WaitEvent` messages whose failures are already typed `CalculetError`s) and `wait_ready()`
(blocks until the channel can carry a call again, or raises `Unavailable`). The cursor converts
and checks every event; the generation objects queue the chunks that arrived (`PendingChunks`)
and hand them out token by token (iterating the generation) or chunk by chunk (`chunks()`, with
logprobs and the tokens that arrived together); both read the same queue, so they can be mixed.

Re-attach rule: a Wait stream that fails with UNAVAILABLE (daemon restarting, connection lost) is
reopened with `from_event_index` = the next index, after the channel is ready again, at most
`max_reattach` times in a row without receiving an event (0: a broken stream raises its
`Unavailable` at once, without waiting for the channel, so a caller can fail over). On a re-attach
a NOT_FOUND answer means the daemon lost the job (it restarted): that is reported as
`Unavailable`, i.e. "resubmit with resume_tokens elsewhere", not as an unknown job.

Ownership: a generation object owns its open Wait stream (closing it stops the stream, never the
job; `cancel()` cancels the job). It is consumed by one reader; it is not thread-safe.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from calculet.client.cursor import DEFAULT_MAX_REATTACH, PendingChunks, StreamState, WaitCursor
from calculet.client.types import FinalEvent, TokenChunk
from calculet.common.errors import CalculetError
from calculet.v1 import inference_pb2

__all__ = ["DEFAULT_MAX_REATTACH", "AsyncGeneration", "Generation", "StreamState", "WaitCursor"]


class _GenerationView:
    """Read-only accessors shared by the sync and async generation objects."""

    _cursor: WaitCursor

    @property
    def job_id(self) -> str:
        return self._cursor.submitted.job_id

    @property
    def seed(self) -> int:
        """The seed the job samples with (the daemon's pick when none was given)."""
        return self._cursor.submitted.seed

    @property
    def deduplicated(self) -> bool:
        return self._cursor.submitted.deduplicated

    @property
    def generation(self) -> int:
        """Model generation: the one the job was admitted on, then the one of its last token."""
        final = self._cursor.final
        return final.generation if final is not None else self._cursor.submitted.generation

    @property
    def recoveries(self) -> int:
        """Transparent KV rebuilds of the job (0 until the Final arrived)."""
        return self._cursor.final.recoveries if self._cursor.final is not None else 0

    @property
    def tokens(self) -> list[int]:
        """Tokens received so far (a copy), excluding the request's resume_tokens."""
        return list(self._cursor.tokens)

    @property
    def final(self) -> FinalEvent | None:
        """The Final event once it arrived."""
        return self._cursor.final

    @property
    def done(self) -> bool:
        return self._cursor.finished

    @property
    def state(self) -> StreamState:
        return self._cursor.state

    def _raise_if_failed(self) -> None:
        """Called when the stream is over and nothing is pending.

        Raises:
            CalculetError: the generation's error (from the Final or the lost stream), unless
                the reader closed it.
        """
        if self._cursor.error is not None and self._cursor.state is not StreamState.CLOSED:
            raise self._cursor.error


class Generation(_GenerationView):
    """A streaming generation (sync): iterate to get token ids as they arrive, or `chunks()`.

    Iterating to the end raises the job's typed error when the Final carries one (Overloaded,
    Aborted, Unavailable, DeadlineExceeded ...), or the stream's when it could not be kept.
    A CANCELLED job ends the iteration normally; `final.reason` says so.

    Args:
        cursor: the bookkeeping for this job.
        open_stream: opens Wait from an event index; raises typed errors while iterating.
        wait_ready: blocks until the channel is ready; raises Unavailable on timeout.
        cancel: cancels the job on the daemon; returns True if it was still running.
    """

    def __init__(
        self,
        cursor: WaitCursor,
        open_stream: Callable[[int], Iterator[inference_pb2.WaitEvent]],
        wait_ready: Callable[[], None],
        cancel: Callable[[str], bool],
    ) -> None:
        self._cursor = cursor
        self._open_stream = open_stream
        self._wait_ready = wait_ready
        self._cancel = cancel
        self._stream: Iterator[inference_pb2.WaitEvent] | None = None
        self._pending = PendingChunks()

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> int:
        if not self._fill():
            raise StopIteration
        return self._pending.token()

    def chunks(self) -> Iterator[TokenChunk]:
        """The job's token chunks as they arrive (tokens that arrived together, with logprobs).

        Same re-attach and error semantics as iterating the tokens; `final` is set afterwards.
        A chunk partly read token by token is handed out as its remaining tokens.

        Raises (while iterating):
            CalculetError: as iterating the tokens does.
        """
        while self._fill():
            yield self._pending.chunk()

    def result(self) -> list[int]:
        """Read to the end and return every token; raises like iteration does."""
        for _ in self:
            pass
        return self.tokens

    def cancel(self) -> bool:
        """Cancel the job on the daemon (the stream then ends with a CANCELLED Final).

        Returns: True if the job was still running.
        """
        return self._cancel(self.job_id)

    def close(self) -> None:
        """Stop reading: close the Wait stream (the job keeps running; see `cancel`)."""
        self._cursor.close()
        self._stop()

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fill(self) -> bool:
        """Read until a chunk is pending (True) or the stream is over (False); raises its error."""
        while not self._pending:
            if self._cursor.finished:
                self._stop()
                self._raise_if_failed()
                return False
            self._pull()
        return True

    def _pull(self) -> None:
        if self._stream is None:
            if self._cursor.state is StreamState.REATTACHING:
                try:
                    self._wait_ready()
                except CalculetError as err:
                    self._cursor.give_up(err)
            self._stream = self._open_stream(self._cursor.next_index)
            self._cursor.attached()
        try:
            pb = next(self._stream)
        except StopIteration:
            self._stream = None
            self._cursor.ended_early()
            return
        except CalculetError as err:
            self._stream = None
            self._cursor.broke(err)
            return
        chunk = self._cursor.accept(pb)
        if chunk is not None:
            self._pending.push(chunk)

    def _stop(self) -> None:
        stream, self._stream = self._stream, None
        close = getattr(stream, "close", None)
        if close is not None:
            close()


class AsyncGeneration(_GenerationView):
    """A streaming generation (asyncio): `async for token in gen` or `async for chunk in gen.chunks()`.

    Same semantics as `Generation`.

    Args:
        cursor: the bookkeeping for this job.
        open_stream: opens Wait from an event index; raises typed errors while iterating.
        wait_ready: waits until the channel is ready; raises Unavailable on timeout.
        cancel: cancels the job on the daemon; returns True if it was still running.
    """

    def __init__(
        self,
        cursor: WaitCursor,
        open_stream: Callable[[int], AsyncIterator[inference_pb2.WaitEvent]],
        wait_ready: Callable[[], Awaitable[None]],
        cancel: Callable[[str], Awaitable[bool]],
    ) -> None:
        self._cursor = cursor
        self._open_stream = open_stream
        self._wait_ready = wait_ready
        self._cancel = cancel
        self._stream: AsyncIterator[inference_pb2.WaitEvent] | None = None
        self._pending = PendingChunks()

    def __aiter__(self) -> AsyncGeneration:
        return self

    async def __anext__(self) -> int:
        if not await self._fill():
            raise StopAsyncIteration
        return self._pending.token()

    async def chunks(self) -> AsyncIterator[TokenChunk]:
        """See `Generation.chunks` (an async iterator)."""
        while await self._fill():
            yield self._pending.chunk()

    async def result(self) -> list[int]:
        """Read to the end and return every token; raises like iteration does."""
        async for _ in self:
            pass
        return self.tokens

    async def cancel(self) -> bool:
        """Cancel the job on the daemon. Returns: True if the job was still running."""
        return await self._cancel(self.job_id)

    async def aclose(self) -> None:
        """Stop reading: close the Wait stream (the job keeps running; see `cancel`)."""
        self._cursor.close()
        await self._stop()

    async def __aenter__(self) -> AsyncGeneration:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _fill(self) -> bool:
        """See `Generation._fill`."""
        while not self._pending:
            if self._cursor.finished:
                await self._stop()
                self._raise_if_failed()
                return False
            await self._pull()
        return True

    async def _pull(self) -> None:
        if self._stream is None:
            if self._cursor.state is StreamState.REATTACHING:
                try:
                    await self._wait_ready()
                except CalculetError as err:
                    self._cursor.give_up(err)
            self._stream = self._open_stream(self._cursor.next_index)
            self._cursor.attached()
        try:
            pb = await anext(self._stream)
        except StopAsyncIteration:
            self._stream = None
            self._cursor.ended_early()
            return
        except CalculetError as err:
            self._stream = None
            self._cursor.broke(err)
            return
        chunk = self._cursor.accept(pb)
        if chunk is not None:
            self._pending.push(chunk)

    async def _stop(self) -> None:
        stream, self._stream = self._stream, None
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
