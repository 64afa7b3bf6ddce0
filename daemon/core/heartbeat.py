"""The engine thread's heartbeat: listeners (a service watchdog, the liveness probe) called from the
engine thread's own loop at least every `interval_s` seconds, so a wedged engine thread stops calling
them. Owned by the engine and guarded by its lock; the engine thread calls `beat` each time round its
loop and sleeps no longer than `interval_s`, so an idle engine still beats.
"""

from __future__ import annotations

from collections.abc import Callable

from calculet.common.errors import InvalidArgument


class Heartbeat:
    """The heartbeat listeners and the shortest interval any of them asked for (None: no listener)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []
        self.interval_s: float | None = None
        self._last = 0.0

    def add(self, listener: Callable[[], None], interval_s: float) -> None:
        """Call `listener()` at least every `interval_s` seconds; it must not block.

        Raises:
            InvalidArgument: `interval_s` is not a positive number of seconds (nothing changed).
        """
        if not (interval_s > 0 and interval_s < float("inf")):
            raise InvalidArgument(f"heartbeat interval: must be a positive number of seconds, got {interval_s}")
        self._listeners.append(listener)
        self.interval_s = min(interval_s, self.interval_s or interval_s)

    def beat(self, now: float) -> None:
        """Tell the listeners the engine thread is alive (at most once per half interval)."""
        if self.interval_s is None:
            return
        if now - self._last >= self.interval_s / 2:
            self._last = now
            for listener in self._listeners:  # non-blocking by contract
                listener()
