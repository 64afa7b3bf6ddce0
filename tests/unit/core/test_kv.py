"""KVManager: lane transactions, parked lanes (prefix reuse), typed refusals, generation fencing, and a
stateful model check."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from calculet.common.errors import ErrorKind, FailedPrecondition, IllegalTransition, InvalidArgument
from calculet.daemon.core.errors import StaleGeneration
from calculet.daemon.core.kv import (
    KVManager,
    LaneNotOwned,
    LaneState,
    OwnerHasLane,
    Reservation,
    StaleReservation,
)
from calculet.daemon.core.prefix_match import LaneSource, ParkedView, choose_lane
from calculet.daemon.device.types import RowSpec

CONTEXT = 16


def make_kv(lanes: int = 2, lane_context: int = CONTEXT, generation: int = 1) -> KVManager:
    return KVManager(lanes, lane_context, generation)


def active(kv: KVManager, owner: str, length: int = 0, job: int = 100) -> int:
    """Assign a lane to `owner` and commit `length` tokens into it."""
    handle = kv.assign(owner)
    assert handle is not None
    if length:
        kv.commit(kv.reserve(handle.lane, owner, length, job))
    return handle.lane


# ---- happy paths -------------------------------------------------------------------------


def test_assign_reserve_commit_grows_committed_length() -> None:
    kv = make_kv()
    lane = active(kv, "a")
    res = kv.reserve(lane, "a", 5, device_job_id=7)
    assert (res.past_len, res.target_len, res.new_tokens, res.device_job_id) == (0, 5, 5, 7)
    assert res.row() == RowSpec(lane=lane, past_kv_len=0, cur_seq_len=5)
    snap = kv.lane(lane)
    assert (snap.state, snap.length, snap.device_job_id, snap.target_len) == (LaneState.RESERVED, 0, 7, 5)
    after = kv.commit(res)
    assert (after.state, after.length, after.device_job_id) == (LaneState.ACTIVE, 5, None)
    res2 = kv.reserve(lane, "a", 6, device_job_id=8)
    assert (res2.past_len, res2.new_tokens) == (5, 1)


def test_rollback_keeps_committed_length() -> None:
    kv = make_kv()
    lane = active(kv, "a", 4)
    after = kv.rollback(kv.reserve(lane, "a", 9, device_job_id=1))
    assert (after.state, after.length) == (LaneState.ACTIVE, 4)


def test_assign_returns_none_when_full_and_changes_nothing() -> None:
    kv = make_kv(lanes=2)
    active(kv, "a")
    active(kv, "b")
    before = kv.snapshot()
    assert kv.assign("c") is None
    assert kv.snapshot() == before
    assert kv.free_count() == 0
    assert kv.lane_of("c") is None


def test_release_frees_lane_for_another_owner() -> None:
    kv = make_kv(lanes=1)
    lane = active(kv, "a", 3)
    kv.release(lane, "a")
    assert kv.all_idle()
    handle = kv.assign("b")
    assert handle is not None and handle.lane == lane
    assert kv.lane(lane).length == 0  # the old owner's tokens are not inherited


def test_unknown_lane_rebuilds_empty_for_same_owner() -> None:
    kv = make_kv()
    lane = active(kv, "a", 6)
    res = kv.reserve(lane, "a", 7, device_job_id=3)
    snap = kv.mark_unknown(lane)
    assert (snap.state, snap.length, snap.device_job_id) == (LaneState.UNKNOWN, 0, None)
    # The in-flight job's result must not land in the lane.
    with pytest.raises(StaleReservation):
        kv.commit(res)
    with pytest.raises(StaleReservation):
        kv.rollback(res)
    handle = kv.rebuild(lane, "a")
    assert handle.lane == lane and kv.lane(lane).state is LaneState.ACTIVE and kv.lane(lane).length == 0
    kv.commit(kv.reserve(lane, "a", 7, device_job_id=4))  # the owner re-prefills everything
    assert kv.lane(lane).length == 7


def test_unknown_lane_can_be_released() -> None:
    kv = make_kv()
    lane = active(kv, "a", 2)
    kv.mark_unknown(lane)
    kv.release(lane, "a")
    assert kv.all_idle()


def test_mark_all_unknown_hits_only_owned_trusted_lanes() -> None:
    kv = make_kv(lanes=4)
    a = active(kv, "a", 2)
    b = active(kv, "b", 2)
    kv.reserve(b, "b", 3, device_job_id=1)
    c = active(kv, "c", 1)
    kv.mark_unknown(c)
    assert sorted(kv.mark_all_unknown()) == sorted([a, b])
    states = {s.lane: s.state for s in kv.snapshot()}
    assert states[a] is states[b] is states[c] is LaneState.UNKNOWN
    assert kv.free_count() == 1


# ---- cancel while a job is in flight -----------------------------------------------------


@pytest.mark.parametrize("end", ["commit", "rollback", "mark_unknown"])
def test_release_when_idle_defers_until_reservation_ends(end: str) -> None:
    kv = make_kv(lanes=1)
    lane = active(kv, "a", 2)
    res = kv.reserve(lane, "a", 3, device_job_id=1)
    assert kv.release_when_idle(lane, "a") is False
    assert kv.lane(lane).state is LaneState.RESERVED and kv.lane(lane).release_pending
    assert kv.free_count() == 0
    with pytest.raises(FailedPrecondition):  # no new work for a cancelled sequence
        kv.reserve(lane, "a", 4, device_job_id=2)
    if end == "commit":
        snap = kv.commit(res)
    elif end == "rollback":
        snap = kv.rollback(res)
    else:
        snap = kv.mark_unknown(lane)
    assert snap.state is LaneState.FREE and snap.owner is None
    assert kv.all_idle() and kv.lane_of("a") is None


def test_release_when_idle_releases_at_once_when_not_reserved() -> None:
    kv = make_kv()
    lane = active(kv, "a", 2)
    assert kv.release_when_idle(lane, "a") is True
    assert kv.all_idle()


# ---- typed refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(("lanes", "context"), [(0, 8), (-1, 8), (2, 0)])
def test_bad_geometry_is_invalid_argument(lanes: int, context: int) -> None:
    with pytest.raises(InvalidArgument):
        KVManager(lanes, context, generation=1)


def test_owner_holds_at_most_one_lane() -> None:
    kv = make_kv()
    active(kv, "a")
    with pytest.raises(OwnerHasLane) as info:
        kv.assign("a")
    assert info.value.kind is ErrorKind.FAILED_PRECONDITION
    assert kv.free_count() == 1


def test_reserve_by_wrong_owner_or_on_free_lane_is_refused() -> None:
    kv = make_kv()
    lane = active(kv, "a", 1)
    with pytest.raises(LaneNotOwned):
        kv.reserve(lane, "b", 2, device_job_id=1)
    with pytest.raises(LaneNotOwned):
        kv.reserve(1 - lane, "a", 2, device_job_id=1)  # the other lane is free
    assert kv.lane(lane).state is LaneState.ACTIVE


@pytest.mark.parametrize("target", [CONTEXT + 1, 10**9])
def test_reserve_beyond_lane_context_is_invalid_argument(target: int) -> None:
    kv = make_kv()
    lane = active(kv, "a", 2)
    with pytest.raises(InvalidArgument):
        kv.reserve(lane, "a", target, device_job_id=1)
    assert kv.lane(lane).state is LaneState.ACTIVE


def test_reserve_up_to_exactly_lane_context_is_allowed() -> None:
    kv = make_kv()
    lane = active(kv, "a", 2)
    kv.commit(kv.reserve(lane, "a", CONTEXT, device_job_id=1))
    assert kv.lane(lane).length == CONTEXT


@pytest.mark.parametrize("target", [0, 1, 3, -5])
def test_reserve_not_beyond_committed_is_invalid_argument(target: int) -> None:
    kv = make_kv()
    lane = active(kv, "a", 3)
    with pytest.raises(InvalidArgument):
        kv.reserve(lane, "a", target, device_job_id=1)
    assert kv.lane(lane).length == 3


def test_reserve_twice_or_on_unknown_lane_is_illegal() -> None:
    kv = make_kv()
    lane = active(kv, "a", 1)
    kv.reserve(lane, "a", 2, device_job_id=1)
    with pytest.raises(IllegalTransition):
        kv.reserve(lane, "a", 3, device_job_id=2)
    kv.mark_unknown(lane)
    with pytest.raises(IllegalTransition):
        kv.reserve(lane, "a", 3, device_job_id=2)


@pytest.mark.parametrize("lane", [-1, 2, 99])
def test_lane_out_of_range_is_invalid_argument(lane: int) -> None:
    kv = make_kv(lanes=2)
    active(kv, "a")
    for call in (
        lambda: kv.reserve(lane, "a", 1, device_job_id=1),
        lambda: kv.release(lane, "a"),
        lambda: kv.release_when_idle(lane, "a"),
        lambda: kv.mark_unknown(lane),
        lambda: kv.rebuild(lane, "a"),
        lambda: kv.lane(lane),
    ):
        with pytest.raises(InvalidArgument):
            call()


def test_releasing_a_reserved_lane_is_illegal() -> None:
    kv = make_kv()
    lane = active(kv, "a", 1)
    res = kv.reserve(lane, "a", 2, device_job_id=1)
    with pytest.raises(IllegalTransition):
        kv.release(lane, "a")
    assert kv.lane(lane).state is LaneState.RESERVED
    kv.commit(res)


def test_release_by_wrong_owner_is_refused() -> None:
    kv = make_kv()
    lane = active(kv, "a")
    with pytest.raises(LaneNotOwned):
        kv.release(lane, "b")
    with pytest.raises(LaneNotOwned):
        kv.release_when_idle(lane, "b")
    with pytest.raises(LaneNotOwned):
        kv.release(1 - lane, "a")
    assert kv.lane_of("a") == lane


def test_commit_or_rollback_twice_is_stale() -> None:
    kv = make_kv()
    lane = active(kv, "a")
    res = kv.reserve(lane, "a", 2, device_job_id=1)
    kv.commit(res)
    with pytest.raises(StaleReservation):
        kv.commit(res)
    with pytest.raises(StaleReservation):
        kv.rollback(res)
    assert kv.lane(lane).length == 2


def test_reservation_of_an_earlier_transaction_cannot_end_the_current_one() -> None:
    kv = make_kv()
    lane = active(kv, "a")
    old = kv.reserve(lane, "a", 2, device_job_id=1)
    kv.rollback(old)
    kv.reserve(lane, "a", 2, device_job_id=1)  # same lane, job and lengths: only the token differs
    with pytest.raises(StaleReservation):
        kv.commit(old)
    assert kv.lane(lane).state is LaneState.RESERVED


def test_reservation_from_another_generation_is_fenced() -> None:
    old_gen, new_gen = make_kv(generation=1), make_kv(generation=2)
    lane = active(old_gen, "a")
    res = old_gen.reserve(lane, "a", 3, device_job_id=1)
    active(new_gen, "a")
    new_gen.reserve(lane, "a", 3, device_job_id=1)
    for end in (new_gen.commit, new_gen.rollback):
        with pytest.raises(StaleGeneration) as info:
            end(res)
        assert info.value.kind is ErrorKind.FAILED_PRECONDITION
    assert new_gen.lane(lane).length == 0 and new_gen.lane(lane).state is LaneState.RESERVED


def test_forged_reservation_is_refused() -> None:
    kv = make_kv()
    lane = active(kv, "a")
    kv.reserve(lane, "a", 2, device_job_id=1)
    forged = Reservation(lane, "a", 1, 1, 0, CONTEXT, token=10**6)
    with pytest.raises(StaleReservation):
        kv.commit(forged)
    assert kv.lane(lane).length == 0


@pytest.mark.parametrize("setup", ["free", "unknown"])
def test_mark_unknown_on_free_or_unknown_lane_is_illegal(setup: str) -> None:
    kv = make_kv()
    lane = 0
    if setup == "unknown":
        lane = active(kv, "a")
        kv.mark_unknown(lane)
    with pytest.raises(IllegalTransition):
        kv.mark_unknown(lane)


@pytest.mark.parametrize("setup", ["active", "reserved"])
def test_rebuild_of_trusted_lane_is_illegal(setup: str) -> None:
    kv = make_kv()
    lane = active(kv, "a", 2)
    if setup == "reserved":
        kv.reserve(lane, "a", 3, device_job_id=1)
    with pytest.raises(IllegalTransition):
        kv.rebuild(lane, "a")
    assert kv.lane(lane).length == 2


def test_rebuild_by_another_owner_is_refused() -> None:
    kv = make_kv()
    lane = active(kv, "a", 2)
    kv.mark_unknown(lane)
    with pytest.raises(LaneNotOwned):
        kv.rebuild(lane, "b")


# ---- stateful model check ----------------------------------------------------------------

OWNERS = [f"s{i}" for i in range(6)]


class KVMachine(RuleBasedStateMachine):
    """Drives a KVManager with random operations against a plain model of what each lane holds.

    The model changes a lane's length only where the contract says so (commit sets the target,
    rebuild/release/mark_unknown reset it); the invariant compares every lane with the model, so
    a length changing any other way, an owner on a FREE lane, or a lane given twice fails.
    """

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVManager(3, 12, generation=5)
        self.owner: dict[int, str | None] = {i: None for i in range(3)}
        self.length = dict.fromkeys(range(3), 0)
        self.state = dict.fromkeys(range(3), LaneState.FREE)
        self.res: dict[int, Reservation] = {}
        self.pending: set[int] = set()
        self.stale: list[Reservation] = []
        self.jobs = 0
        # lane -> (tokens its KV holds, LRU tick, how many of them were its job's prompt)
        self.parked: dict[int, tuple[np.ndarray, int, int]] = {}
        self.ticks = 0
        self.on_device: set[int] = set()  # opened (KV Apply) and not closed
        self.closes: list[int] = []  # lanes the manager must hand out for KV Free

    @initialize()
    def start(self) -> None:
        assert self.kv.all_idle()

    def _free_model(self, lane: int) -> None:
        self.owner[lane], self.length[lane], self.state[lane] = None, 0, LaneState.FREE
        self.pending.discard(lane)

    def _owned(self) -> list[int]:
        return [i for i, o in self.owner.items() if o is not None]

    @rule(owner=st.sampled_from(OWNERS), tokens=st.none() | st.lists(st.integers(0, 2), max_size=12))
    def take(self, owner: str, tokens: list[int] | None) -> None:
        """A lane for `owner`, matched against the parked ones (tokens) or not (None: `assign`). The
        lane chosen is `choose_lane`'s (tested on its own); here the manager must carry it out."""
        arr = None if tokens is None else np.array(tokens, dtype=np.int32)
        if owner in self.owner.values():
            with pytest.raises(OwnerHasLane):
                self.kv.take(owner, arr, 2)
            return
        views = [ParkedView(lane, t, tick, prompt) for lane, (t, tick, prompt) in self.parked.items()]
        free = {i for i, s in self.state.items() if s is LaneState.FREE}
        want = choose_lane(arr, views, free, 2)
        handle = self.kv.take(owner, arr, 2) if arr is not None else self.kv.assign(owner)
        if want is None:
            assert handle is None
            return
        assert handle is not None and (handle.lane, handle.source, handle.kept) == (want.lane, want.source, want.keep)
        if want.source is not LaneSource.FREE:
            del self.parked[want.lane]
        if want.source is LaneSource.EVICTED and want.lane in self.on_device:
            self.on_device.discard(want.lane)
            self.closes.append(want.lane)
        self.owner[handle.lane], self.length[handle.lane] = owner, want.keep
        self.state[handle.lane] = LaneState.ACTIVE
        assert self.kv.needs_open(handle.lane) == (handle.lane not in self.on_device)
        if handle.lane not in self.on_device:
            self.kv.opened(handle.lane, owner)  # the device opened it (KV Apply)
            self.on_device.add(handle.lane)

    @rule(lane=st.integers(0, 2), data=st.data())
    def park(self, lane: int, data: st.DataObject) -> None:
        owner = self.owner[lane]
        tokens = np.array(data.draw(st.lists(st.integers(0, 2), min_size=self.length[lane],
                                             max_size=self.length[lane])), dtype=np.int32)  # fmt: skip
        prompt = data.draw(st.integers(0, self.length[lane]))
        if owner is None:
            with pytest.raises(LaneNotOwned):
                self.kv.park(lane, "s0", tokens, (), 0.0, prompt_len=prompt)
        elif self.state[lane] is not LaneState.ACTIVE:
            with pytest.raises(IllegalTransition):
                self.kv.park(lane, owner, tokens, (), 0.0, prompt_len=prompt)
        elif not self.length[lane] or lane not in self.on_device or lane in self.pending:
            with pytest.raises(FailedPrecondition):
                self.kv.park(lane, owner, tokens, (), 0.0, prompt_len=prompt)
        else:
            self.kv.park(lane, owner, tokens, (), 0.0, prompt_len=prompt)
            self.ticks += 1
            self.parked[lane] = (tokens, self.ticks, prompt)
            self.owner[lane], self.state[lane] = None, LaneState.PARKED

    @rule()
    def drop_parked(self) -> None:
        assert self.kv.drop_parked() == sorted(self.parked)
        for lane in sorted(self.parked):
            self._free_model(lane)
            if lane in self.on_device:
                self.on_device.discard(lane)
                self.closes.append(lane)
        self.parked.clear()

    @rule()
    def device_closes(self) -> None:
        assert self.kv.take_device_closes() == self.closes
        self.closes = []

    @rule(data=st.data(), extra=st.integers(-3, 14))
    def reserve(self, data: st.DataObject, extra: int) -> None:
        owned = self._owned()
        if not owned:
            return
        lane = data.draw(st.sampled_from(owned))
        owner = self.owner[lane]
        assert owner is not None
        target = self.length[lane] + extra
        self.jobs += 1
        if lane in self.pending:
            with pytest.raises(FailedPrecondition):
                self.kv.reserve(lane, owner, target, self.jobs)
        elif self.state[lane] is not LaneState.ACTIVE:
            with pytest.raises(IllegalTransition):
                self.kv.reserve(lane, owner, target, self.jobs)
        elif target > 12 or target <= self.length[lane]:
            with pytest.raises(InvalidArgument):
                self.kv.reserve(lane, owner, target, self.jobs)
        else:
            res = self.kv.reserve(lane, owner, target, self.jobs)
            assert res.past_len == self.length[lane] and res.generation == 5
            self.res[lane] = res
            self.state[lane] = LaneState.RESERVED

    @rule(data=st.data(), valid=st.booleans())
    def end_reservation(self, data: st.DataObject, valid: bool) -> None:
        if not self.res:
            return
        lane = data.draw(st.sampled_from(sorted(self.res)))
        res = self.res.pop(lane)
        self.stale.append(res)
        if valid:
            self.kv.commit(res)
            self.length[lane] = res.target_len
        else:
            self.kv.rollback(res)
        self.state[lane] = LaneState.ACTIVE
        if lane in self.pending:
            self._free_model(lane)

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def stale_reservation_is_refused(self, data: st.DataObject) -> None:
        res = data.draw(st.sampled_from(self.stale))
        with pytest.raises(StaleReservation):
            self.kv.commit(res)

    @rule(lane=st.integers(0, 2))
    def mark_unknown(self, lane: int) -> None:
        if self.state[lane] in (LaneState.FREE, LaneState.UNKNOWN, LaneState.PARKED):
            with pytest.raises(IllegalTransition):
                self.kv.mark_unknown(lane)
            return
        self.kv.mark_unknown(lane)
        if lane in self.res:
            self.stale.append(self.res.pop(lane))
        self.state[lane], self.length[lane] = LaneState.UNKNOWN, 0
        if lane in self.pending:
            self._free_model(lane)

    @rule(lane=st.integers(0, 2))
    def rebuild(self, lane: int) -> None:
        owner = self.owner[lane]
        if owner is None:
            with pytest.raises(LaneNotOwned):
                self.kv.rebuild(lane, "nobody")
            return
        if self.state[lane] is not LaneState.UNKNOWN:
            with pytest.raises(IllegalTransition):
                self.kv.rebuild(lane, owner)
            return
        self.kv.rebuild(lane, owner)
        self.state[lane], self.length[lane] = LaneState.ACTIVE, 0

    @rule(lane=st.integers(0, 2), deferred=st.booleans(), wrong_owner=st.booleans())
    def release(self, lane: int, deferred: bool, wrong_owner: bool) -> None:
        owner = self.owner[lane]
        if owner is None or wrong_owner:
            with pytest.raises(LaneNotOwned):
                self.kv.release(lane, "intruder" if owner else "s0")
            return
        if deferred:
            released = self.kv.release_when_idle(lane, owner)
            assert released == (self.state[lane] is not LaneState.RESERVED)
            if released:
                self._free_model(lane)
            else:
                self.pending.add(lane)
        elif self.state[lane] is LaneState.RESERVED:
            with pytest.raises(IllegalTransition):
                self.kv.release(lane, owner)
        else:
            assert self.kv.release(lane, owner) == (lane in self.on_device), "says whether to close it"
            self.on_device.discard(lane)
            self._free_model(lane)

    @invariant()
    def lanes_match_model(self) -> None:
        for snap in self.kv.snapshot():
            assert snap.state is self.state[snap.lane]
            assert snap.owner == self.owner[snap.lane]
            assert snap.length == self.length[snap.lane]  # grows only by commit
            assert 0 <= snap.length <= 12
            assert snap.release_pending == (snap.lane in self.pending)
            if snap.state is LaneState.FREE:
                assert snap.owner is None and snap.length == 0
            if snap.state is LaneState.PARKED:
                assert snap.owner is None and snap.length == len(self.parked[snap.lane][0])
            if snap.state is LaneState.RESERVED:
                assert snap.device_job_id == self.res[snap.lane].device_job_id
                assert snap.target_len is not None and snap.length < snap.target_len <= 12
            else:
                assert snap.device_job_id is None

    @invariant()
    def owners_unique_and_free_count_matches(self) -> None:
        snaps = self.kv.snapshot()
        owners = [s.owner for s in snaps if s.owner is not None]
        assert len(owners) == len(set(owners))
        for s in snaps:
            if s.owner is not None:
                assert self.kv.lane_of(s.owner) == s.lane
        free = sum(s.state in (LaneState.FREE, LaneState.PARKED) for s in snaps)
        assert self.kv.free_count() == free, "parked lanes count as free"
        assert self.kv.parked_count() == len(self.parked)
        assert self.kv.all_idle() == (free == 3)


KVMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKVMachine = KVMachine.TestCase
