"""AdmissionQueue: priority then FIFO order, admissibility, depth limit, deadlines, cancel, aging."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind, FailedPrecondition, InvalidArgument, NotFound, Overloaded
from calculet.daemon.core.admission import AdmissionQueue


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Req:
    rid: str
    need: int = 1


def make_queue(max_depth: int = 8, aging_s: float | None = None) -> tuple[AdmissionQueue[Req], FakeClock]:
    clock = FakeClock()
    return AdmissionQueue(max_depth, aging_s=aging_s, clock=clock), clock


def put(q: AdmissionQueue[Req], clock: FakeClock, rid: str, prio: int = 0, ttl: float = 60.0, need: int = 1) -> Req:
    req = Req(rid, need)
    q.enqueue(rid, req, deadline=clock.now + ttl, priority=prio)
    return req


def always(_: Req) -> bool:
    return True


def needs_at_most(limit: int, r: Req) -> bool:
    return r.need <= limit


def test_highest_priority_first_then_fifo() -> None:
    q, clock = make_queue()
    for rid, prio in [("a", 0), ("b", 2), ("c", 1), ("d", 2), ("e", 0)]:
        put(q, clock, rid, prio)
    order = []
    while (r := q.pop_ready(always)) is not None:
        order.append(r.rid)
    assert order == ["b", "d", "c", "a", "e"]
    assert len(q) == 0 and q.next_deadline() is None


def test_pop_ready_skips_inadmissible_items_and_keeps_them() -> None:
    q, clock = make_queue()
    put(q, clock, "big", prio=5, need=4)
    put(q, clock, "small", prio=0, need=1)
    seen: list[str] = []

    def fits(r: Req) -> bool:
        seen.append(r.rid)
        return r.need <= 2

    assert q.pop_ready(fits) == Req("small", 1)
    assert seen == ["big", "small"]  # asked in queue order
    assert "big" in q and q.pop_ready(fits) is None
    assert q.pop_ready(always) == Req("big", 4)


def test_pop_ready_predicate_error_propagates_and_changes_nothing() -> None:
    q, clock = make_queue()
    put(q, clock, "a")

    def boom(_: Req) -> bool:
        raise InvalidArgument("predicate failed")

    with pytest.raises(InvalidArgument):
        q.pop_ready(boom)
    assert "a" in q and len(q) == 1


def test_full_queue_raises_overloaded_and_keeps_contents() -> None:
    q, clock = make_queue(max_depth=2)
    put(q, clock, "a")
    put(q, clock, "b")
    with pytest.raises(Overloaded) as info:
        put(q, clock, "c", prio=9)
    assert info.value.kind is ErrorKind.OVERLOADED
    assert info.value.retry_after_s > 0
    assert len(q) == 2 and "c" not in q
    q.pop_ready(always)
    put(q, clock, "c")  # room again after an admission


def test_expire_removes_only_passed_deadlines_in_deadline_order() -> None:
    q, clock = make_queue()
    put(q, clock, "late", ttl=30)
    put(q, clock, "soon", ttl=10)
    put(q, clock, "sooner", ttl=5)
    assert q.next_deadline() == clock.now + 5
    assert q.expire(clock.now + 4.99) == []
    expired = q.expire(clock.now + 10)  # a deadline equal to now has passed
    assert [r.rid for r in expired] == ["sooner", "soon"]
    assert q.next_deadline() == clock.now + 30
    assert [r.rid for r in q.drain()] == ["late"]


def test_pop_ready_never_admits_an_expired_item() -> None:
    q, clock = make_queue()
    put(q, clock, "old", prio=5, ttl=1)
    put(q, clock, "new", prio=0, ttl=100)
    clock.now += 2
    assert q.pop_ready(always) == Req("new")
    assert [r.rid for r in q.expire(clock.now)] == ["old"]


def test_cancel_removes_item_and_its_deadline() -> None:
    q, clock = make_queue()
    put(q, clock, "a", ttl=5)
    put(q, clock, "b", ttl=50)
    assert q.cancel("a") == Req("a")
    assert "a" not in q
    assert q.next_deadline() == clock.now + 50  # the cancelled deadline no longer wakes anyone
    assert q.expire(clock.now + 10) == []
    with pytest.raises(NotFound):
        q.cancel("a")


def test_an_id_can_be_queued_again_after_it_left() -> None:
    q, clock = make_queue()
    put(q, clock, "a", ttl=5)
    q.cancel("a")
    put(q, clock, "a", ttl=50)
    # The first entry's deadline must not expire the second one.
    assert q.expire(clock.now + 10) == []
    assert q.pop_ready(always) == Req("a")


def test_depth_by_priority_counts_base_priorities() -> None:
    q, clock = make_queue(aging_s=1.0)
    for rid, prio in [("a", 0), ("b", 0), ("c", 3)]:
        put(q, clock, rid, prio)
    clock.now += 10  # aging does not move items between levels
    assert q.depth_by_priority() == {0: 2, 3: 1}
    assert q.depth() == 3
    q.cancel("c")
    assert q.depth_by_priority() == {0: 2}


def test_aging_lets_an_old_low_priority_item_overtake() -> None:
    q, clock = make_queue(aging_s=2.0)
    put(q, clock, "old-low", prio=0, ttl=1000)
    clock.now += 7  # waited 3 aging periods: effective priority 3
    put(q, clock, "new-high", prio=2, ttl=1000)
    assert q.pop_ready(always) == Req("old-low")


def test_without_aging_priority_is_absolute() -> None:
    q, clock = make_queue(aging_s=None)
    put(q, clock, "old-low", prio=0, ttl=1000)
    clock.now += 500
    put(q, clock, "new-high", prio=1, ttl=1000)
    assert q.pop_ready(always) == Req("new-high")


def test_drain_returns_everything_in_queue_order() -> None:
    q, clock = make_queue()
    for rid, prio in [("a", 0), ("b", 1), ("c", 0)]:
        put(q, clock, rid, prio)
    assert [r.rid for r in q.drain()] == ["b", "a", "c"]
    assert len(q) == 0 and q.next_deadline() is None


# ---- bad inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_depth": 0},
        {"max_depth": -3},
        {"max_depth": 4, "aging_s": 0.0},
        {"max_depth": 4, "aging_s": -1.0},
        {"max_depth": 4, "aging_s": math.inf},
        {"max_depth": 4, "aging_s": math.nan},
        {"max_depth": 4, "retry_after_s": 0.0},
        {"max_depth": 4, "retry_after_s": math.nan},
    ],
)
def test_bad_configuration_is_invalid_argument(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        AdmissionQueue(**kwargs)  # type: ignore[arg-type]


def test_nan_deadline_is_invalid_argument() -> None:
    q, _ = make_queue()
    with pytest.raises(InvalidArgument):
        q.enqueue("a", Req("a"), deadline=math.nan)
    assert len(q) == 0


def test_deadline_already_passed_is_overloaded() -> None:
    q, clock = make_queue()
    for deadline in (clock.now, clock.now - 1, -math.inf):
        with pytest.raises(Overloaded):
            q.enqueue("a", Req("a"), deadline=deadline)
    assert len(q) == 0


def test_duplicate_id_is_failed_precondition() -> None:
    q, clock = make_queue()
    put(q, clock, "a")
    with pytest.raises(FailedPrecondition):
        put(q, clock, "a", prio=3)
    assert q.depth_by_priority() == {0: 1}


def test_infinite_deadline_never_expires() -> None:
    q, _ = make_queue()
    q.enqueue("a", Req("a"), deadline=math.inf)
    assert q.expire(1e300) == []
    assert q.next_deadline() == math.inf


# ---- properties --------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(-2, 2), st.integers(1, 50)),
        st.tuples(st.just("pop"), st.integers(0, 4), st.just(0)),
        st.tuples(st.just("cancel"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("tick"), st.integers(0, 20), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_matches_a_sorted_list_model(script: list[tuple[str, int, int]]) -> None:
    """Without aging, every pop equals the first admissible live item of a list sorted by
    (-priority, arrival); expire returns exactly the items whose deadline passed; depth matches."""
    q, clock = make_queue(max_depth=10)
    model: list[tuple[int, int, float, Req]] = []  # (priority, seq, deadline, req)
    seq = 0
    for op, a, b in script:
        if op == "put":
            req = Req(f"r{seq}", need=seq % 5)
            if len(model) >= 10:
                with pytest.raises(Overloaded):
                    q.enqueue(req.rid, req, deadline=clock.now + b, priority=a)
            else:
                q.enqueue(req.rid, req, deadline=clock.now + b, priority=a)
                model.append((a, seq, clock.now + b, req))
            seq += 1
        elif op == "pop":
            live = sorted((e for e in model if e[2] > clock.now), key=lambda e: (-e[0], e[1]))
            want = next((e for e in live if e[3].need <= a), None)
            got = q.pop_ready(functools.partial(needs_at_most, a))
            assert got == (want[3] if want else None)
            if want:
                model.remove(want)
        elif op == "cancel":
            target = next((e for e in model if e[1] == a), None)
            if target is None:
                with pytest.raises(NotFound):
                    q.cancel(f"r{a}")
            else:
                assert q.cancel(f"r{a}") == target[3]
                model.remove(target)
        else:
            clock.now += a
            gone = sorted((e for e in model if e[2] <= clock.now), key=lambda e: (e[2], e[1]))
            assert q.expire(clock.now) == [e[3] for e in gone]
            for e in gone:
                model.remove(e)
        assert len(q) == len(model)
        assert q.next_deadline() == (min(e[2] for e in model) if model else None)
        levels: dict[int, int] = {}
        for e in model:
            levels[e[0]] = levels.get(e[0], 0) + 1
        assert q.depth_by_priority() == levels


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 10)), min_size=1, max_size=20))
def test_aging_order_is_effective_priority_then_arrival(arrivals: list[tuple[int, float]]) -> None:
    aging = 1.5
    q, clock = make_queue(max_depth=32, aging_s=aging)
    entries = []
    for i, (prio, gap) in enumerate(arrivals):
        clock.now += gap
        put(q, clock, f"r{i}", prio=prio, ttl=1e6)
        entries.append((prio, clock.now, i))
    clock.now += 1.0
    want = sorted(entries, key=lambda e: (-(e[0] + int((clock.now - e[1]) // aging)), e[2]))
    got = [q.pop_ready(always) for _ in entries]
    assert [r.rid for r in got if r] == [f"r{e[2]}" for e in want]
