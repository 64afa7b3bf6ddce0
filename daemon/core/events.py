"""Per-job event logs: what `Wait` streams and what a re-attaching client replays.

A job's output is an append-only list of events (token chunks, then exactly one final event).
The engine threads append; any number of readers follow it from an event index. Readers are
woken by callbacks (the gRPC layer turns them into `loop.call_soon_threadsafe`), so nobody polls.
Ownership: the job's `Sequence` owns its log; the log outlives the sequence for `retention` so a
client can re-attach after a disconnect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from calculet.daemon.errors import ErrorKind


class FinishReason(Enum):
    STOP = "stop"  # EOS or a stop token id
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    ERROR = "error"


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenChunk:
    """Tokens `first_index .. first_index + len(tokens) - 1` of the completion."""

    index: int  # event index in the log
    first_index: int
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    resumed_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    """Seconds (wall clock, monotonic) from submit to each milestone."""

    queue: float = 0.0
    prefill: float = 0.0
    ttft: float = 0.0
    decode: float = 0.0
    e2e: float = 0.0


@dataclass(frozen=True)
class FinalEvent:
    index: int
    reason: FinishReason
    usage: Usage
    timings: Timings
    error_kind: ErrorKind | None = None
    error_message: str = ""


Event = TokenChunk | FinalEvent
Listener = Callable[[], None]


@dataclass
class EventLog:
    """Append-only events of one job. Thread-safe."""

    job_id: str
    start_token_index: int = 0  # resumed requests continue numbering after the tokens the client has
    _events: list[Event] = field(default_factory=list)
    _listeners: list[Listener] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _tokens: int = 0
    _detached_since: float | None = None  # monotonic time since when no reader is subscribed

    def __post_init__(self) -> None:
        self._tokens = self.start_token_index
        self._detached_since = time.monotonic()

    def detached_for(self, now: float) -> float:
        """Seconds without any subscribed reader (0 while one is attached): the orphan clock."""
        with self._lock:
            return 0.0 if self._detached_since is None else now - self._detached_since

    @property
    def finished(self) -> bool:
        with self._lock:
            return bool(self._events) and isinstance(self._events[-1], FinalEvent)

    @property
    def token_count(self) -> int:
        """Index one past the last streamed completion token."""
        with self._lock:
            return self._tokens

    def append_tokens(self, tokens: tuple[int, ...], logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        with self._lock:
            self._check_open()
            self._events.append(TokenChunk(len(self._events), self._tokens, tokens, logprobs))
            self._tokens += len(tokens)
            listeners = list(self._listeners)
        _notify(listeners)

    def finish(
        self,
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
        error_kind: ErrorKind | None = None,
        error_message: str = "",
    ) -> bool:
        """Append the final event. Returns False when the log was already finished (first wins)."""
        with self._lock:
            if self._events and isinstance(self._events[-1], FinalEvent):
                return False
            self._events.append(FinalEvent(len(self._events), reason, usage, timings, error_kind, error_message))
            listeners = list(self._listeners)
        _notify(listeners)
        return True

    def read(self, from_index: int) -> list[Event]:
        """Events with index >= from_index available now (possibly empty)."""
        with self._lock:
            return self._events[max(0, from_index) :]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener()` after every append; returns an unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)
            self._detached_since = None

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
                    if not self._listeners:
                        self._detached_since = time.monotonic()

        return unsubscribe

    def _check_open(self) -> None:
        if self._events and isinstance(self._events[-1], FinalEvent):
            raise RuntimeError(f"job {self.job_id}: event log already finished")


def _notify(listeners: list[Listener]) -> None:
    for listener in listeners:
        listener()
