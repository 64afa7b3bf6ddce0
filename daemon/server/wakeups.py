"""`LoopWakeups`: asyncio events set from engine threads with one loop wake-up per burst.

A finished decode job appends a token to each of its sequences' event logs in one burst (under the
engine lock), and every log calls its Wait streams' listeners. Waking the event loop once per
listener with `call_soon_threadsafe` costs a self-pipe write on the engine thread and a read plus a
loop iteration on the loop per token (~20-40 us of CPU each on our 2-core boards). Here a listener
only queues its `asyncio.Event`; the first one queued since the loop last drained schedules a
single drain, which sets them all. Data flow: engine thread -> `wake(event)` -> (once per burst)
`call_soon_threadsafe(_drain)` -> on the loop, every queued event is set -> the Wait streams run.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LoopWakeups:
    """Sets `asyncio.Event`s of one loop from any thread, coalescing the loop wake-ups.

    Args:
        loop: the event loop the events belong to.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[asyncio.Event] = []  # non-empty: a drain is scheduled and has not run

    def wake(self, event: asyncio.Event) -> None:
        """Have `event` set on the loop soon (any thread; never blocks beyond a short lock)."""
        with self._lock:
            self._pending.append(event)
            if len(self._pending) > 1:
                return  # the drain scheduled by the first one has not run yet: it sets this one too
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for event in pending:
            event.set()
