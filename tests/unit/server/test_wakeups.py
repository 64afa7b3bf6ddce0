"""`LoopWakeups`: Wait streams' events set from engine threads, one loop wake-up per burst."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, cast

from calculet.daemon.server.wakeups import LoopWakeups


class RecordingLoop:
    """Stands in for the event loop: records what `call_soon_threadsafe` schedules."""

    def __init__(self) -> None:
        self.scheduled: list[Callable[[], Any]] = []

    def call_soon_threadsafe(self, callback: Callable[[], Any]) -> None:
        self.scheduled.append(callback)

    def run_scheduled(self) -> None:
        callbacks, self.scheduled = self.scheduled, []
        for callback in callbacks:
            callback()


def make() -> tuple[LoopWakeups, RecordingLoop]:
    loop = RecordingLoop()
    return LoopWakeups(cast(asyncio.AbstractEventLoop, loop)), loop


def test_a_burst_of_wakes_schedules_one_drain_that_sets_every_event() -> None:
    wakeups, loop = make()
    events = [asyncio.Event() for _ in range(16)]
    for event in events:
        wakeups.wake(event)
    assert len(loop.scheduled) == 1
    assert not any(e.is_set() for e in events)
    loop.run_scheduled()
    assert all(e.is_set() for e in events)


def test_a_wake_after_the_drain_ran_schedules_another() -> None:
    wakeups, loop = make()
    first, second = asyncio.Event(), asyncio.Event()
    wakeups.wake(first)
    loop.run_scheduled()
    wakeups.wake(second)
    assert len(loop.scheduled) == 1
    loop.run_scheduled()
    assert first.is_set() and second.is_set()


def test_the_same_event_woken_twice_in_a_burst_is_set_once_and_stays_set() -> None:
    wakeups, loop = make()
    event = asyncio.Event()
    wakeups.wake(event)
    wakeups.wake(event)
    loop.run_scheduled()
    assert event.is_set() and not loop.scheduled


def test_wakes_from_another_thread_reach_waiters_on_a_real_loop() -> None:
    async def main() -> None:
        wakeups = LoopWakeups(asyncio.get_running_loop())
        events = [asyncio.Event() for _ in range(32)]
        thread = threading.Thread(target=lambda: [wakeups.wake(e) for e in events])
        thread.start()
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=30)  # a deadline only
        thread.join()

    asyncio.run(main())


def test_a_wake_after_the_loop_closed_is_ignored() -> None:
    loop = asyncio.new_event_loop()
    wakeups = LoopWakeups(loop)
    loop.close()
    wakeups.wake(asyncio.Event())  # the process is exiting: nothing to wake, nothing raised
