"""`FollowSession` and its reply (`wire.follow_reply_to_pb`) on real `EventLog`s, no gRPC: each
attachment gets exactly what a Wait from its index would, in order, and ends with its Final, its
refusal or its empty end; detaching or closing unsubscribes (the orphan clock runs again)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.client.convert import error_from_status, event_from_pb
from calculet.common.errors import Cancelled, InvalidArgument, NotFound
from calculet.daemon.core.events import EventLog, FinalEvent, FinishReason, Timings, TokenChunk, TokenLogprob, Usage
from calculet.daemon.server.follow import FollowSession, FollowUpdate, event_weight
from calculet.daemon.wire import event_to_pb, follow_reply_to_pb


class Logs:
    """Event logs by job id, opened as `DeviceCore.event_log` would (NotFound otherwise)."""

    def __init__(self, *job_ids: str) -> None:
        self.logs = {job: EventLog(job) for job in job_ids}
        self.wakes = 0

    def open(self, job_id: str) -> EventLog:
        if job_id == "cancelled":
            raise Cancelled("job cancelled was cancelled before this Wait attached")
        if job_id not in self.logs:
            raise NotFound(f"unknown job {job_id}")
        return self.logs[job_id]

    def wake(self) -> None:
        self.wakes += 1

    def session(self) -> FollowSession:
        return FollowSession(self.open, self.wake)


def finish(log: EventLog) -> None:
    log.finish(FinishReason.LENGTH, Usage(1, 2), Timings())


def tokens(updates: list[FollowUpdate], follow_id: int) -> list[int]:
    return [
        t for u in updates if u.follow_id == follow_id for e in u.events if isinstance(e, TokenChunk) for t in e.tokens
    ]


def test_one_collect_carries_every_attachments_new_events() -> None:
    logs = Logs("a", "b")
    session = logs.session()
    session.attach(1, "a", 0)
    session.attach(2, "b", 0)
    assert session.collect() == []
    logs.logs["a"].append_tokens((5,))
    logs.logs["b"].append_tokens((7,))
    updates = session.collect()
    assert [(u.follow_id, tokens([u], u.follow_id)) for u in updates] == [(1, [5]), (2, [7])]
    assert session.collect() == []  # nothing new: nothing sent twice
    assert logs.wakes >= 4  # each attach, then each append


def test_an_attachment_ends_with_its_final_and_is_dropped() -> None:
    logs = Logs("a")
    session = logs.session()
    session.attach(1, "a", 0)
    logs.logs["a"].append_tokens((5, 6))
    finish(logs.logs["a"])
    (update,) = session.collect()
    assert isinstance(update.events[-1], FinalEvent) and update.ends
    assert session.attached == 0
    assert logs.logs["a"].detached_for(0.0) != 0.0  # unsubscribed: the orphan clock runs


def test_attaching_from_an_index_skips_the_earlier_events() -> None:
    logs = Logs("a")
    logs.logs["a"].append_tokens((1,))
    logs.logs["a"].append_tokens((2,))
    session = logs.session()
    session.attach(1, "a", 1)
    assert tokens(session.collect(), 1) == [2]


def test_attaching_past_the_final_ends_without_events() -> None:
    logs = Logs("a")
    logs.logs["a"].append_tokens((1,))
    finish(logs.logs["a"])
    session = logs.session()
    session.attach(1, "a", 2)
    (update,) = session.collect()
    assert update.events == [] and update.error is None and update.ends
    assert session.attached == 0


@pytest.mark.parametrize(
    ("job", "index", "error"),
    [("nope", 0, NotFound), ("a", 5, InvalidArgument), ("cancelled", 0, Cancelled)],
)
def test_a_refused_attach_is_answered_in_band(job: str, index: int, error: type[Exception]) -> None:
    logs = Logs("a")
    session = logs.session()
    session.attach(1, job, index)
    session.attach(2, "a", 0)
    logs.logs["a"].append_tokens((9,))
    updates = session.collect()
    refused = [u for u in updates if u.follow_id == 1]
    assert len(refused) == 1 and isinstance(refused[0].error, error) and refused[0].ends
    assert tokens(updates, 2) == [9]  # the stream and its other attachments go on
    reply = follow_reply_to_pb(updates, lambda *_: (0, 0, None))
    assert isinstance(error_from_status(reply.updates[0].error), error)


def test_a_live_follow_id_cannot_be_reused() -> None:
    logs = Logs("a")
    session = logs.session()
    session.attach(1, "a", 0)
    with pytest.raises(InvalidArgument):
        session.attach(1, "a", 0)


def test_detach_and_close_unsubscribe() -> None:
    logs = Logs("a", "b")
    session = logs.session()
    session.attach(1, "a", 0)
    session.attach(2, "b", 0)
    assert logs.logs["a"].detached_for(1e9) == 0.0
    session.detach(1)
    session.detach(99)  # unknown: ignored
    assert logs.logs["a"].detached_for(1e9) != 0.0 and logs.logs["b"].detached_for(1e9) == 0.0
    logs.logs["a"].append_tokens((1,))
    assert session.collect() == []
    session.close()
    assert logs.logs["b"].detached_for(1e9) != 0.0 and session.attached == 0


def test_a_reply_stays_within_its_budget_and_the_rest_follows() -> None:
    logs = Logs("a", "b")
    for _ in range(30):
        logs.logs["a"].append_tokens((1, 2, 3))
    logs.logs["b"].append_tokens((4,))
    session = logs.session()
    session.attach(1, "a", 0)
    session.attach(2, "b", 0)
    got: list[int] = []
    replies = 0
    while updates := session.collect(budget=20):
        assert sum(event_weight(e) for u in updates for e in u.events) <= 20 + 4  # one event may overshoot
        got += tokens(updates, 1)
        replies += 1
    assert got == [1, 2, 3] * 30 and replies > 1
    assert session.collect() == []


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), max_size=40))
def test_collected_events_equal_each_logs_events(appends: list[tuple[int, int]]) -> None:
    """Whatever the interleaving of appends and collects, each attachment receives its log's
    events exactly once and in order (the Wait oracle)."""
    logs = Logs("j0", "j1", "j2")
    session = logs.session()
    for i in range(3):
        session.attach(i, f"j{i}", 0)
    received: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for step, (job, n) in enumerate(appends):
        logs.logs[f"j{job}"].append_tokens(tuple(range(step, step + n)))
        if step % 3 == 0:
            for u in session.collect(budget=5):
                received[u.follow_id] += [e.index for e in u.events]
    while updates := session.collect(budget=5):
        for u in updates:
            received[u.follow_id] += [e.index for e in u.events]
    for i in range(3):
        assert received[i] == list(range(logs.logs[f"j{i}"].produced()))


def test_the_reply_converts_like_wait_events() -> None:
    logs = Logs("a")
    log = logs.logs["a"]
    log.append_tokens((5, 6))
    log.append_tokens((7,), (TokenLogprob(7, -0.5, ((7, -0.5), (3, -1.0))),))
    log.finish(FinishReason.STOP, Usage(2, 3), Timings(ttft=0.1))
    session = logs.session()
    session.attach(4, "a", 0)
    updates = session.collect()
    reply = follow_reply_to_pb(updates, lambda job, _log, final: (7, 1, 7))
    (item,) = reply.updates
    assert item.follow_id == 4
    expected = [event_to_pb(e) for e in log.read(0)[:2]] + [event_to_pb(log.read(0)[2], 7, 1, 7)]
    assert list(item.events) == expected
    assert [event_from_pb(pb) for pb in item.events][:2] == [event_from_pb(pb) for pb in expected][:2]


def test_collect_reads_only_the_attachments_whose_logs_changed() -> None:
    """A stream holding many queued jobs costs a step the jobs that step advanced, not all of them."""
    logs = Logs(*(f"j{i}" for i in range(200)))
    session = logs.session()
    for i in range(200):
        session.attach(i, f"j{i}", 0)
    assert session.collect() == []
    reads: list[str] = []
    for log in logs.logs.values():
        original = log.read

        def counting(from_index: int, log: EventLog = log, original: Any = original) -> list[Any]:
            reads.append(log.job_id)
            return original(from_index)

        log.read = counting  # type: ignore[method-assign]
    logs.logs["j7"].append_tokens((1,))
    logs.logs["j150"].append_tokens((2,))
    updates = session.collect()
    assert sorted(u.follow_id for u in updates) == [7, 150]
    assert sorted(reads) == ["j150", "j7"]
    assert session.collect() == [] and sorted(reads) == ["j150", "j7"]  # nothing changed: nothing read
