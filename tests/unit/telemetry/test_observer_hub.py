"""`ObserverHub` (`core/observe/observer.py`): events reach every observer in emit order on the hub's own
thread, never the emitter's; nothing is queued without observers; a failing observer is logged and
the others still get every event; `close` delivers what was queued first."""

from __future__ import annotations

import logging
import threading

import pytest

from calculet.daemon.core.observe.observer import EngineObserver, FaultSeen, ObserverHub, RequestRejected

WAIT_S = 10.0  # a deadline, never a pace


class Recorder(EngineObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[str, float, str]] = []

    def request_rejected(self, event: RequestRejected) -> None:
        self.seen.append((event.reason, event.t, threading.current_thread().name))

    def fault_seen(self, event: FaultSeen) -> None:
        self.seen.append((event.kind, event.t, threading.current_thread().name))


def test_events_arrive_in_order_on_the_hubs_thread() -> None:
    hub, first, second = ObserverHub(), Recorder(), Recorder()
    hub.add(first)
    hub.add(second)
    for i in range(50):
        hub.emit(RequestRejected("m", f"r{i}", float(i)) if i % 2 else FaultSeen("hang", "", float(i)))
    assert hub.flush(WAIT_S)
    for rec in (first, second):
        assert [t for _, t, _ in rec.seen] == [float(i) for i in range(50)]
        assert {thread for _, _, thread in rec.seen} == {"calculet-observers"}
    hub.close()


def test_without_observers_nothing_is_queued() -> None:
    hub = ObserverHub()
    assert not hub.active
    hub.emit(FaultSeen("hang", "", 0.0))  # nobody listens: dropped, not kept for a later observer
    assert hub.flush(0.0)  # no thread: nothing to wait for
    rec = Recorder()
    hub.add(rec)
    assert hub.active
    hub.emit(FaultSeen("device_lost", "", 1.0))
    assert hub.flush(WAIT_S)
    assert [kind for kind, _, _ in rec.seen] == ["device_lost"]
    hub.close()


def test_a_failing_observer_is_logged_and_the_others_still_get_every_event(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(EngineObserver):
        def fault_seen(self, event: FaultSeen) -> None:
            raise RuntimeError("observer bug")

    hub, good = ObserverHub(), Recorder()
    hub.add(Broken())
    hub.add(good)
    with caplog.at_level(logging.ERROR, logger="calculet.daemon.core.observe.observer"):
        hub.emit(FaultSeen("hang", "", 1.0))
        hub.emit(FaultSeen("device_lost", "", 2.0))
        assert hub.flush(WAIT_S)
    assert [kind for kind, _, _ in good.seen] == ["hang", "device_lost"]
    failures = [r for r in caplog.records if "Broken failed on FaultSeen" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)
    hub.close()


def test_close_delivers_what_was_queued_then_drops_later_events() -> None:
    hub, rec = ObserverHub(), Recorder()
    hub.add(rec)
    for i in range(20):
        hub.emit(FaultSeen("hang", "", float(i)))
    hub.close(WAIT_S)
    assert len(rec.seen) == 20
    hub.emit(FaultSeen("hang", "", 99.0))
    assert not hub.active and len(rec.seen) == 20
