"""Board-state change notices for the server's streams (WatchLoad), on the asyncio loop only.

Data flow: `DaemonServicer.sync_health` takes a `StateSignature` of the board (overall serving and
draining, every alias with its generation and lifecycle state) after each operation it runs and on
every Health call; when the signature differs from the last one, `StateChanges.notify` wakes every
stream blocked in `wait`, so a WatchLoad subscriber hears of a Load, Unload, Drain, Resume or Reset
at once instead of an interval later. Changes the engine makes on its own (a device lost, a reset
budget exhausted) come through `DeviceCore.on_health_change`, which the servicer turns into a sync.
A finished request (a lane parked or freed) notifies too, through `load_notices.LoadNotices`, at most
once per 50 ms, so a router hears of a parked conversation before its next turn.
"""

from __future__ import annotations

import asyncio
import contextlib

from calculet.daemon.core.observe.status import HealthView

StateSignature = tuple[bool, bool, tuple[tuple[str, int, str], ...]]


def signature(view: HealthView) -> StateSignature:
    """What a router cares about changing: serving/draining and each alias's generation and state."""
    return view.serving, view.draining, tuple((m.alias, m.generation, m.state.name) for m in view.models)


class StateChanges:
    """A broadcast "something changed" for coroutines on one event loop (not thread-safe).

    `version` counts notices. A stream reads it before it takes a snapshot and passes it to `wait`,
    which returns at once if a notice came meanwhile, so no change between snapshot and wait is
    missed. Nothing is queued per waiter, so a slow stream never holds memory.
    """

    def __init__(self) -> None:
        self.version = 0
        self._round = asyncio.Event()
        self._last: StateSignature | None = None

    def observe(self, state: StateSignature) -> bool:
        """Record the board's state; notify and return True if it differs from the last one seen."""
        if state == self._last:
            return False
        first = self._last is None
        self._last = state
        if not first:
            self.notify()
        return not first

    def notify(self) -> None:
        self.version += 1
        self._round.set()
        self._round = asyncio.Event()

    async def wait(self, seen_version: int, timeout_s: float) -> None:
        """Return once `version` passed `seen_version`, or after `timeout_s` seconds."""
        if self.version > seen_version:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._round.wait(), timeout_s)
