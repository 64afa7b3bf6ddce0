"""The result of `generate`: a job's tokens as they stream, re-attaching when the stream breaks.

Data flow: the client submits, then hands this module the job's SubmitResult and two callables:
`open_stream(from_index)` (a Wait stream of `WaitEvent` messages whose failures are already typed
`CalculetError`s) and `wait_ready()` (blocks until the channel can carry a call again, or raises
`Unavailable`). `WaitCursor` is the plain bookkeeping both the sync `Generation` and the async
`AsyncGeneration` drive: it checks that event indexes and token positions are contiguous, collects
tokens, keeps the Final, and decides whether a broken stream may be re-attached.

Re-attach rule: a Wait stream that fails with UNAVAILABLE (daemon restarting, connection lost) is
reopened with `from_event_index` = the next index, after the channel is ready again, at most
`max_reattach` times in a row without receiving an event. On a re-attach a NOT_FOUND answer means
the daemon lost the job (it restarted): that is reported as `Unavailable`, i.e. "resubmit with
resume_tokens elsewhere", not as an unknown job.

Ownership: a generation object owns its open Wait stream (closing it stops the stream, never the
job; `cancel()` cancels the job). It is consumed by one reader; it is not thread-safe.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from enum import Enum
from typing import NoReturn

from calculet.client.messages import SubmitResult
from calculet.daemon.core.events import FinalEvent, TokenChunk
from calculet.daemon.errors import CalculetError, ErrorKind, NotFound, Unavailable
from calculet.daemon.lifecycle import Lifecycle, table
from calculet.daemon.wire import event_from_pb, final_error
from calculet.v1 import inference_pb2

DEFAULT_MAX_REATTACH = 3


class StreamState(Enum):
    ATTACHING = "attaching"  # no stream open yet: the first Wait is about to open
    STREAMING = "streaming"  # a Wait stream is open
    REATTACHING = "reattaching"  # the stream broke; the next Wait resumes from next_index
    DONE = "done"  # the Final arrived (whatever its reason)
    LOST = "lost"  # the stream could not be re-established or broke the protocol
    CLOSED = "closed"  # the reader closed it before the Final


STREAM_TRANSITIONS = table(
    [
        (StreamState.ATTACHING, [StreamState.STREAMING, StreamState.CLOSED]),
        (StreamState.STREAMING, [StreamState.REATTACHING, StreamState.DONE, StreamState.LOST, StreamState.CLOSED]),
        (StreamState.REATTACHING, [StreamState.STREAMING, StreamState.LOST, StreamState.CLOSED]),
    ]
)
_TERMINAL = frozenset({StreamState.DONE, StreamState.LOST, StreamState.CLOSED})


class WaitCursor:
    """Bookkeeping of one job's Wait stream(s); no I/O.

    Args:
        submitted: the job's Submit answer.
        resume_tokens: how many completion tokens the job starts after (its first chunk's
            first_index).
        max_reattach: re-attaches allowed in a row without an event arriving in between.
    """

    def __init__(self, submitted: SubmitResult, resume_tokens: int, max_reattach: int) -> None:
        self.submitted = submitted
        self.next_index = 0
        self.tokens: list[int] = []
        self.final: FinalEvent | None = None
        self.final_pb: inference_pb2.Final | None = None
        self._resume_tokens = resume_tokens
        self._max_reattach = max_reattach
        self._failures = 0
        self._reattached = False
        self._error: CalculetError | None = None
        self.life = Lifecycle(f"Wait stream of job {submitted.job_id}", StreamState.ATTACHING, STREAM_TRANSITIONS)

    @property
    def state(self) -> StreamState:
        return self.life.state

    @property
    def finished(self) -> bool:
        """No more events will be read (Final received, stream lost or closed)."""
        return self.life.state in _TERMINAL

    @property
    def error(self) -> CalculetError | None:
        """The typed error the generation ended with (from the Final, or the lost stream)."""
        return self._error

    def attached(self) -> None:
        """A Wait stream from `next_index` was opened."""
        self.life.move(StreamState.STREAMING)

    def accept(self, pb: inference_pb2.WaitEvent) -> tuple[int, ...]:
        """Take one event; return its new tokens (empty for the Final).

        Raises:
            CalculetError: (INTERNAL) the event's index or token position is not the next one.
        """
        if pb.index != self.next_index:
            self._lose(self._protocol(f"sent event index {pb.index}, expected {self.next_index}"))
        event = event_from_pb(pb)
        self.next_index += 1
        self._failures = 0
        if isinstance(event, TokenChunk):
            expected = self._resume_tokens + len(self.tokens)
            if event.first_index != expected:
                self._lose(self._protocol(f"sent tokens from position {event.first_index}, expected {expected}"))
            self.tokens.extend(event.tokens)
            return event.tokens
        self.final, self.final_pb = event, pb.final
        self._error = final_error(pb.final)
        self.life.move(StreamState.DONE)
        return ()

    def broke(self, err: CalculetError) -> None:
        """The open stream failed with `err`; return if it may be re-attached, else raise.

        Raises:
            CalculetError: `err` itself when it is not UNAVAILABLE or the budget is spent;
                `Unavailable` when a re-attach found the job gone (NOT_FOUND).
        """
        if self._reattached and isinstance(err, NotFound):
            lost = Unavailable(
                f"job {self.submitted.job_id} is gone from the daemon after its Wait stream broke "
                f"({len(self.tokens)} tokens received); resubmit with resume_tokens"
            )
            lost.__cause__ = err
            self._lose(lost)
        if err.kind is not ErrorKind.UNAVAILABLE or self._failures >= self._max_reattach:
            self._lose(err)
        self._failures += 1
        self._reattached = True
        self.life.move(StreamState.REATTACHING)

    def give_up(self, err: CalculetError) -> NoReturn:
        """Re-attaching failed before a stream opened (channel not ready in time).

        Raises:
            CalculetError: `err`, which also becomes the generation's error.
        """
        self._lose(err)

    def ended_early(self) -> NoReturn:
        """The stream ended OK before the Final: a protocol violation.

        Raises:
            CalculetError: always (INTERNAL).
        """
        self._lose(self._protocol("ended without a final event"))

    def close(self) -> None:
        if not self.finished:
            self.life.move(StreamState.CLOSED)

    def _lose(self, err: CalculetError) -> NoReturn:
        self._error = err
        if not self.finished:
            self.life.move(StreamState.LOST)
        raise err

    def _protocol(self, what: str) -> CalculetError:
        return CalculetError(f"Wait stream of job {self.submitted.job_id} {what}", kind=ErrorKind.INTERNAL)


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
        final = self._cursor.final_pb
        return final.generation if final is not None else self._cursor.submitted.generation

    @property
    def recoveries(self) -> int:
        """Transparent KV rebuilds of the job (0 until the Final arrived)."""
        return self._cursor.final_pb.recoveries if self._cursor.final_pb is not None else 0

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


class Generation(_GenerationView):
    """A streaming generation (sync): iterate to get token ids as they arrive.

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
        self._pending: deque[int] = deque()

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> int:
        while not self._pending:
            if self._cursor.finished:
                self._stop()
                if self._cursor.error is not None and self._cursor.state is not StreamState.CLOSED:
                    raise self._cursor.error
                raise StopIteration
            self._pull()
        return self._pending.popleft()

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
        self._pending.extend(self._cursor.accept(pb))

    def _stop(self) -> None:
        stream, self._stream = self._stream, None
        close = getattr(stream, "close", None)
        if close is not None:
            close()


class AsyncGeneration(_GenerationView):
    """A streaming generation (asyncio): `async for token in gen`. Same semantics as `Generation`.

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
        self._pending: deque[int] = deque()

    def __aiter__(self) -> AsyncGeneration:
        return self

    async def __anext__(self) -> int:
        while not self._pending:
            if self._cursor.finished:
                await self._stop()
                if self._cursor.error is not None and self._cursor.state is not StreamState.CLOSED:
                    raise self._cursor.error
                raise StopAsyncIteration
            await self._pull()
        return self._pending.popleft()

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
        self._pending.extend(self._cursor.accept(pb))

    async def _stop(self) -> None:
        stream, self._stream = self._stream, None
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
