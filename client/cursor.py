"""Bookkeeping of one job's Wait stream(s), with no I/O: the state both generation flavours drive.

`WaitCursor` converts each `WaitEvent` to the client types (`calculet.client.convert`), checks
that event indexes and token positions are contiguous (a violation is an INTERNAL error), collects
the tokens, keeps the Final and its error, and decides whether a broken stream may be re-attached
(rule in `calculet.client.generation`). `PendingChunks` is the queue of chunks received but not yet
handed out, readable token by token or chunk by chunk. Lifecycle: `StreamState`, moved only by
the cursor.
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import NoReturn

from calculet.client.convert import event_from_pb
from calculet.client.messages import SubmitResult
from calculet.client.types import FinalEvent, TokenChunk
from calculet.common.errors import CalculetError, ErrorKind, NotFound, Unavailable
from calculet.common.lifecycle import Lifecycle, table
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

    def accept(self, pb: inference_pb2.WaitEvent) -> TokenChunk | None:
        """Take one event; return its chunk (None for the Final).

        Raises:
            CalculetError: (INTERNAL) the event's index or token position is not the next one, a
                chunk without tokens, or logprobs that do not match the tokens one to one.
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
            if not event.tokens:
                self._lose(self._protocol(f"sent event {event.index} without tokens"))
            if event.logprobs and len(event.logprobs) != len(event.tokens):
                what = f"{len(event.logprobs)} logprobs for {len(event.tokens)} tokens"
                self._lose(self._protocol(f"sent {what} in event {event.index}"))
            self.tokens.extend(event.tokens)
            return event
        self.final = event
        self._error = event.error
        self.life.move(StreamState.DONE)
        return None

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


class PendingChunks:
    """Chunks received but not handed out yet; a chunk may be taken apart token by token.

    After some of a chunk's tokens were taken one by one, `chunk()` returns the rest of it (same
    event index, `first_index` and logprobs advanced), so token and chunk reads can be mixed.
    """

    def __init__(self) -> None:
        self._chunks: deque[TokenChunk] = deque()
        self._offset = 0  # tokens of the head chunk already taken

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def push(self, chunk: TokenChunk) -> None:
        self._chunks.append(chunk)

    def token(self) -> int:
        """Take the next token. Raises IndexError when empty."""
        head = self._chunks[0]
        token = head.tokens[self._offset]
        self._offset += 1
        if self._offset == len(head.tokens):
            self._chunks.popleft()
            self._offset = 0
        return token

    def chunk(self) -> TokenChunk:
        """Take the rest of the head chunk. Raises IndexError when empty."""
        head = self._chunks.popleft()
        offset, self._offset = self._offset, 0
        if offset == 0:
            return head
        return TokenChunk(head.index, head.first_index + offset, head.tokens[offset:], head.logprobs[offset:])
