"""Prompt WatchLoad reports when a request finishes, so a router sees a parked lane before the next turn.

A finished request changes what a router scores the board by: a lane is free or parked again, and a
parked lane holds the conversation's prompt and answer (`PrefixBlocks` tips). WatchLoad reports come
every interval (1 s by default) or on a board-state change; a chat client's next turn often comes
sooner than that after the answer, and a router that has not heard of the parked lane prefills the
whole conversation cold on another board.

Data flow: the engine's observer hub thread calls `request_finished` -> `call_soon_threadsafe` ->
on the server's loop, `StateChanges.notify` (which wakes every WatchLoad stream), at most once per
`min_gap_s`: a burst of finishes costs one report, sent `min_gap_s` after the previous one at most.
"""

from __future__ import annotations

import asyncio
import contextlib

from calculet.daemon.core.observe.observer import EngineObserver, RequestFinished
from calculet.daemon.server.changes import StateChanges

# Reports a finish triggers come at most this often per board (each costs the daemon one load report,
# a few hundred microseconds with 4,096 advertised blocks).
LOAD_NOTICE_MIN_GAP_S = 0.05


class LoadNotices(EngineObserver):
    """Wakes WatchLoad streams after client requests finish, coalesced to one per `min_gap_s`.

    Args:
        loop: the server's event loop (`StateChanges` lives on it).
        changes: the WatchLoad streams' change broadcast.
        min_gap_s: the least time between two notices this observer sends.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, changes: StateChanges, min_gap_s: float = LOAD_NOTICE_MIN_GAP_S
    ) -> None:
        self._loop = loop
        self._changes = changes
        self._min_gap_s = min_gap_s
        self._last = float("-inf")  # loop time of the last notice
        self._pending: asyncio.TimerHandle | None = None
        self._closed = False

    def request_finished(self, event: RequestFinished) -> None:
        """On the observer hub's thread: schedule a notice (warm-up probes change nothing a router sees)."""
        if event.internal or self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            self._loop.call_soon_threadsafe(self._finished_on_loop)

    def close(self) -> None:
        """On the loop: send no more notices."""
        self._closed = True
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def _finished_on_loop(self) -> None:
        if self._closed or self._pending is not None:
            return  # a notice is already due: it reports this finish too
        wait = self._last + self._min_gap_s - self._loop.time()
        if wait <= 0:
            self._notify()
        else:
            self._pending = self._loop.call_later(wait, self._notify)

    def _notify(self) -> None:
        self._pending = None
        self._last = self._loop.time()
        self._changes.notify()
