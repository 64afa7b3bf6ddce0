"""Per-job event logs: what `Wait` streams and what a re-attaching client replays.

A job's output is an append-only list of events (token chunks, then exactly one final event).
The engine threads append; any number of readers follow it from an event index. Readers are
woken by callbacks (the gRPC layer turns them into `loop.call_soon_threadsafe`), so nobody polls.
Ownership: the job's `ClientJob` owns its log; after the Final, a `Retention` keeps the finished job
(and so its log) for a while so a client can re-attach after a disconnect or retry its Submit.
`Retention` bounds what it keeps by an estimate of the bytes each finished job holds
(`job_bytes`) and by age, evicting the oldest first; an evicted job's id answers NOT_FOUND.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from calculet.common.errors import ErrorKind, InvalidArgument


class FinishReason(Enum):
    STOP = "stop"  # EOS, a stop token id, or a token that completed the request's constraint
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
    """Token counts of a job; `cached_tokens`: prompt (+ resumed) tokens served from a parked lane's KV."""

    prompt_tokens: int
    completion_tokens: int
    resumed_tokens: int = 0
    cached_tokens: int = 0


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
    # OVERLOADED only: seconds after which a retry may succeed (the in-band form of the
    # RESOURCE_EXHAUSTED trailing metadata).
    retry_after_s: float | None = None


Event = TokenChunk | FinalEvent
Listener = Callable[[], None]

# What a finished job holds, estimated from tracemalloc measurements of finished calsim jobs (its
# inputs released: `ClientJob.release_inputs`; tests/unit/core/test_dedup_retention.py checks the
# estimate against a measurement). Each figure is rounded up: the estimate is a bound, not an average.
JOB_BYTES = 6 * 1024  # ClientJob, EventLog, lifecycle, request, Final, table slots, with headroom
TOKEN_BYTES = 224  # streamed token: its TokenChunk event, tuple, int, `generated` slot (~184 B)
LOGPROB_BYTES = 192  # its TokenLogprob (~176 B)
TOP_LOGPROB_BYTES = 128  # each top alternative: a (token, logprob) tuple (~113 B)


@dataclass
class EventLog:
    """Append-only events of one job. Thread-safe."""

    job_id: str
    start_token_index: int = 0  # resumed requests continue numbering after the tokens the client has
    _events: list[Event] = field(default_factory=list)
    _listeners: list[Listener] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _tokens: int = 0
    _bytes: int = 0  # estimated bytes of the events (see `approx_bytes`)
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

    @property
    def approx_bytes(self) -> int:
        """Estimated memory of the events so far (tokens, logprobs and their top alternatives)."""
        with self._lock:
            return self._bytes

    def append_tokens(self, tokens: tuple[int, ...], logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        with self._lock:
            self._check_open()
            self._events.append(TokenChunk(len(self._events), self._tokens, tokens, logprobs))
            self._tokens += len(tokens)
            self._bytes += TOKEN_BYTES * len(tokens) + sum(
                LOGPROB_BYTES + TOP_LOGPROB_BYTES * len(lp.top) for lp in logprobs
            )
            listeners = list(self._listeners)
        _notify(listeners)

    def finish(
        self,
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
        error_kind: ErrorKind | None = None,
        error_message: str = "",
        retry_after_s: float | None = None,
    ) -> bool:
        """Append the final event. Returns False when the log was already finished (first wins)."""
        with self._lock:
            if self._events and isinstance(self._events[-1], FinalEvent):
                return False
            self._events.append(
                FinalEvent(len(self._events), reason, usage, timings, error_kind, error_message, retry_after_s)
            )
            listeners = list(self._listeners)
        _notify(listeners)
        return True

    def produced(self) -> int:
        """Events appended so far (O(1): Wait checks from_event_index against it)."""
        with self._lock:
            return len(self._events)

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


def job_bytes(log: EventLog) -> int:
    """Estimated memory a finished job holds while it is retained (its inputs released:
    `ClientJob.release_inputs`).

    Args:
        log: its event log.

    Returns:
        Bytes: a fixed cost per job plus its events.
    """
    return JOB_BYTES + log.approx_bytes


T = TypeVar("T")


@dataclass
class _Retained(Generic[T]):
    item: T
    nbytes: int
    finished_at: float


class Retention(Generic[T]):
    """Finished jobs kept for re-attaching Wait calls and idempotent Submit retries.

    Bounded two ways, the oldest evicted first: the estimated bytes of all kept jobs stay at or below
    `max_bytes` (a job larger than the whole budget is not kept at all), and no job is kept longer
    than `max_age_s` after it finished. An evicted job is simply gone: its id answers NOT_FOUND.
    Age is enforced whenever the table is used (`add`, `expire`), so the caller calls `expire`
    before a lookup.

    Not thread-safe: the engine calls it under its lock. Ownership: the retention owns the items it
    holds until it returns them as evicted.

    Args:
        max_bytes: estimated bytes kept at most (>= 0; 0 keeps nothing).
        max_age_s: seconds after its finish a job is kept at most (> 0, finite).
        clock: monotonic clock in seconds.

    Raises:
        InvalidArgument: a bound out of range.
    """

    def __init__(self, max_bytes: int, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0:
            raise InvalidArgument(f"retention max_bytes must be >= 0, got {max_bytes}")
        if not (math.isfinite(max_age_s) and max_age_s > 0):
            raise InvalidArgument(f"retention max_age_s must be a positive number, got {max_age_s}")
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._items: OrderedDict[str, _Retained[T]] = OrderedDict()  # oldest finish first
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Estimated bytes of the jobs kept now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> T | None:
        """The kept item, or None (never kept, or evicted). Call `expire` first to enforce age."""
        kept = self._items.get(key)
        return None if kept is None else kept.item

    def add(self, key: str, item: T, nbytes: int) -> list[T]:
        """Keep a job that just finished.

        Args:
            key: its job id (not kept already).
            item: what to return from `get`.
            nbytes: its estimated size (`job_bytes`).

        Returns:
            The items evicted to stay within the bounds, oldest first (possibly `item` itself, when
            it alone exceeds `max_bytes`).
        """
        assert key not in self._items, f"job {key} retained twice"
        self._items[key] = _Retained(item, nbytes, self._clock())
        self._bytes += nbytes
        evicted = self.expire()
        while self._bytes > self.max_bytes:
            evicted.append(self._pop_oldest())
        return evicted

    def expire(self) -> list[T]:
        """Evict every job older than `max_age_s`. Returns them, oldest first."""
        cutoff = self._clock() - self.max_age_s
        evicted: list[T] = []
        while self._items and next(iter(self._items.values())).finished_at <= cutoff:
            evicted.append(self._pop_oldest())
        return evicted

    def _pop_oldest(self) -> T:
        _, kept = self._items.popitem(last=False)
        self._bytes -= kept.nbytes
        return kept.item


_deferring = threading.local()  # `.woken`: the listeners collected on this thread, while deferring


@contextmanager
def deferred_listeners() -> Iterator[list[Listener]]:
    """Collect, instead of calling, the listeners of the appends made on this thread inside the block.

    The engine settles a finished device job inside such a block and has the listeners (the Wait
    streams' wake-ups) called after the next device job is submitted, so streaming the tokens does
    not compete with that submit for the GIL (`Engine._complete`). Blocks do not nest.

    Yields:
        The list the listeners are collected into; the caller must call each of them.
    """
    if getattr(_deferring, "woken", None) is not None:
        raise RuntimeError("deferred_listeners blocks do not nest")
    woken: list[Listener] = []
    _deferring.woken = woken
    try:
        yield woken
    finally:
        _deferring.woken = None


def call_listeners(listeners: Iterable[Listener]) -> None:
    """Call each listener (non-blocking by contract)."""
    for listener in listeners:
        listener()


def _notify(listeners: list[Listener]) -> None:
    woken = getattr(_deferring, "woken", None)
    if woken is not None:
        woken.extend(listeners)
        return
    call_listeners(listeners)


def wait_finished(log: EventLog, timeout: float) -> bool:
    """Block until the log has its final event or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    changed = threading.Event()
    unsubscribe = log.subscribe(changed.set)
    try:
        while not log.finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            changed.wait(remaining)
            changed.clear()
        return True
    finally:
        unsubscribe()
