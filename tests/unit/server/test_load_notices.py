"""LoadNotices: a finished client request wakes WatchLoad streams at once, bursts coalesce."""

from __future__ import annotations

import asyncio
import threading

from calculet.daemon.core.events import FinishReason, Timings, Usage
from calculet.daemon.core.observe.observer import RequestFinished
from calculet.daemon.server.changes import StateChanges
from calculet.daemon.server.load_notices import LoadNotices


def finished(job_id: str, internal: bool = False) -> RequestFinished:
    return RequestFinished(job_id, "m", 1, FinishReason.STOP, None, Usage(3, 2), Timings(), internal, 1.0)


def from_hub_thread(notices: LoadNotices, *events: RequestFinished) -> None:
    """Deliver events as the observer hub does: from another thread."""
    worker = threading.Thread(target=lambda: [notices.request_finished(e) for e in events])
    worker.start()
    worker.join()


def test_a_finish_notifies_at_once_and_one_within_the_gap_is_sent_when_the_gap_ends() -> None:
    async def scenario() -> None:
        changes = StateChanges()
        notices = LoadNotices(asyncio.get_running_loop(), changes, min_gap_s=0.01)
        from_hub_thread(notices, finished("a"))
        await changes.wait(0, timeout_s=30)
        assert changes.version == 1, "the first finish is reported at once"
        from_hub_thread(notices, finished("b"))
        await changes.wait(1, timeout_s=30)
        assert changes.version == 2, "the next finish is reported too, once the gap has passed"
        notices.close()

    asyncio.run(scenario())


def test_a_burst_within_the_gap_is_one_due_notice() -> None:
    async def scenario() -> None:
        changes = StateChanges()
        notices = LoadNotices(asyncio.get_running_loop(), changes, min_gap_s=3600)
        from_hub_thread(notices, finished("a"))
        await changes.wait(0, timeout_s=30)
        from_hub_thread(notices, *(finished(f"b{i}") for i in range(5)))
        for _ in range(3):
            await asyncio.sleep(0)  # the callbacks run
        assert changes.version == 1, "no second notice within the gap: one is due at its end"
        notices.close()

    asyncio.run(scenario())


def test_warm_up_probes_and_a_closed_observer_send_nothing() -> None:
    async def scenario() -> None:
        changes = StateChanges()
        notices = LoadNotices(asyncio.get_running_loop(), changes, min_gap_s=3600)
        from_hub_thread(notices, finished("probe", internal=True))
        from_hub_thread(notices, finished("a"))
        await changes.wait(0, timeout_s=30)
        assert changes.version == 1, "the probe was not reported, the client request was"
        from_hub_thread(notices, finished("b"))  # within the gap: due in an hour
        await asyncio.sleep(0)
        notices.close()  # cancels the due notice
        from_hub_thread(notices, finished("c"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert changes.version == 1

    asyncio.run(scenario())
