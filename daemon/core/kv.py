"""KV lanes of one model generation, changed only through transactions (docs/daemon.md, docs/sources.md 000 §7).

The `KVManager` owns the bookkeeping of every KV lane of one configured model generation: which
sequence owns a lane and how many KV tokens in it are committed (trusted). The device does not
track lane lengths (it trusts `past_kv_len` in each job's row), so this is the single source of
truth for what a lane holds.

Data flow for one device job that extends a lane:

    take(owner, tokens, min_tokens)    FREE|PARKED -> ACTIVE (scheduler: a new sequence gets a lane; a
                                       parked lane sharing its prefix keeps that much KV, `prefix_match`)
    assign(owner)                      FREE|PARKED -> ACTIVE, empty (take without matching)
    reserve(lane, owner, target, job)  ACTIVE -> RESERVED  (before submit; the Reservation goes with the job)
    commit(reservation)                RESERVED -> ACTIVE  (valid completion: length = target)
    rollback(reservation)              RESERVED -> ACTIVE  (submit error or cancel: length unchanged)
    mark_unknown(lane)                 RESERVED|ACTIVE -> UNKNOWN (CCU exception, configuration reset)
    rebuild(lane, owner)               UNKNOWN -> ACTIVE   (same owner, length 0: it re-prefills)
    release(lane, owner)               ACTIVE|UNKNOWN -> FREE
    park(lane, owner, tokens)          ACTIVE -> PARKED    (a finished sequence leaves its KV warm, owned by
                                       no one; `tokens` is what the KV holds)
    drop_parked()                      PARKED -> FREE      (a reset or a fault anywhere on the board: never
                                       trust a parked lane after an anomaly)

Parked lanes count as free for admission (`free_count`). A parked lane that another sequence takes
without a match (eviction) or that is dropped must be closed on the device (KV Free) before it is
opened again (KV Apply): the manager queues it in `take_device_closes`, which the engine drains
before it opens any lane.

The device side of a lane (CalRT KV Apply / Free) is recorded here too: `needs_open` says whether
the device must open the lane before a job uses it, `opened` records that it did, and `release`
returns whether it must be closed there. The engine makes those device calls outside its lock.

Ownership: a lane in ACTIVE/RESERVED/UNKNOWN belongs to exactly one sequence; while RESERVED it is
also held by exactly one device job (the Reservation's `device_job_id`) and the device may write KV
positions `past_len .. target_len - 1`. A RESERVED lane cannot be released (the device may still
write it): a cancelled sequence calls `release_when_idle`, and the lane is freed by the commit,
rollback or mark_unknown that ends the reservation.

Fault rule: call `mark_unknown` only once the device no longer writes the lane (its job finished,
e.g. as CCU_EXCEPTION, or the device was reset). After a wait timeout with no reset the whole
generation is retired instead, and with it this manager.

Generation fencing: a manager belongs to exactly one generation; Reservations and handles carry it,
and a Reservation of another generation raises `StaleGeneration`. Capacity is a return value:
`assign` returns None when no lane is free and changes nothing.

Lock: none of its own. Its owner (the scheduler, under the engine lock) serialises every call; the
executor reserves, commits and rolls back under that same lock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum

import numpy as np

from calculet.common.errors import FailedPrecondition, IllegalTransition, InvalidArgument
from calculet.common.lifecycle import Lifecycle, table
from calculet.common.prefix import BLOCK_TOKENS
from calculet.daemon.core.errors import StaleGeneration
from calculet.daemon.core.ids import DeviceJobId, SequenceId
from calculet.daemon.core.prefix_match import LaneSource, ParkedView, choose_lane
from calculet.daemon.device.types import RowSpec


class LaneState(Enum):
    """State of one KV lane (see the module docstring for the edges)."""

    FREE = "free"  # no owner, length 0
    ACTIVE = "active"  # owned; `length` committed tokens; no job in flight
    RESERVED = "reserved"  # owned; one in-flight job extends it from `length` to the reservation target
    UNKNOWN = "unknown"  # owned; KV untrusted after a fault; never read; reset to 0 before reuse
    PARKED = "parked"  # no owner; holds a finished sequence's KV for `tokens`; counts as free


LANE_TRANSITIONS = table(
    [
        (LaneState.FREE, [LaneState.ACTIVE]),
        (LaneState.ACTIVE, [LaneState.RESERVED, LaneState.UNKNOWN, LaneState.FREE, LaneState.PARKED]),
        (LaneState.RESERVED, [LaneState.ACTIVE, LaneState.UNKNOWN]),
        (LaneState.UNKNOWN, [LaneState.ACTIVE, LaneState.FREE]),
        (LaneState.PARKED, [LaneState.ACTIVE, LaneState.FREE]),
    ]
)


class LaneNotOwned(FailedPrecondition):
    """The lane is free or belongs to another sequence."""


class OwnerHasLane(FailedPrecondition):
    """The sequence already owns a lane (a sequence holds at most one)."""


class StaleReservation(FailedPrecondition):
    """The reservation no longer describes the lane: it was already committed or rolled back, or
    a fault (mark_unknown) ended it. Its job's result must not touch the lane."""


@dataclass(frozen=True)
class LaneHandle:
    """A lane just given to (or rebuilt for) `owner`, with committed length `kept`.

    Attributes:
        source: how it was found (a parked lane's prefix kept, a FREE lane, an evicted parked one).
        kept: KV tokens of the lane kept for the owner (0 unless a prefix hit): its tokens
            [0, kept) equal the owner's, and it prefills from there.
        kept_hashes: the parked history's block hashes covering the kept tokens (full blocks only),
            so the owner's advertisement starts from them.
    """

    lane: int
    owner: SequenceId
    generation: int
    source: LaneSource = LaneSource.FREE
    kept: int = 0
    kept_hashes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reservation:
    """One in-flight job's right to extend `lane` from `past_len` to `target_len` KV tokens.

    Created by `KVManager.reserve`; the executor keeps it with the job and ends it exactly once
    with `commit` or `rollback` (or a fault ends it through `mark_unknown`).

    Attributes:
        token: unique per reservation of a manager; tells a stale copy from the live one.
    """

    lane: int
    owner: SequenceId
    device_job_id: DeviceJobId
    generation: int
    past_len: int
    target_len: int
    token: int

    @property
    def new_tokens(self) -> int:
        """Tokens the job feeds into the lane (`cur_seq_len`)."""
        return self.target_len - self.past_len

    def row(self) -> RowSpec:
        """The device row registers for this reservation."""
        return RowSpec(lane=self.lane, past_kv_len=self.past_len, cur_seq_len=self.new_tokens)


@dataclass(frozen=True)
class LaneSnapshot:
    """Status view of one lane.

    Attributes:
        length: committed KV tokens (0 unless ACTIVE, RESERVED or PARKED).
        device_job_id / target_len: the in-flight reservation, when RESERVED.
        release_pending: the owner cancelled; the lane is freed when its job ends.
        parked_at: PARKED: when it was parked or last matched (monotonic seconds); else None.
    """

    lane: int
    state: LaneState
    owner: SequenceId | None
    length: int
    device_job_id: DeviceJobId | None
    target_len: int | None
    release_pending: bool
    parked_at: float | None = None


@dataclass(frozen=True)
class Parked:
    """What a parked lane holds: the tokens its KV encodes (int32, position order), their block
    hashes (`calculet.common.prefix`, full blocks), when it was parked (tick for LRU order,
    monotonic seconds for Status), and how many of its tokens were its job's prompt (the matcher's
    continuation rule, `prefix_match.py`)."""

    tokens: np.ndarray
    hashes: tuple[int, ...]
    tick: int
    at: float
    prompt_len: int

    def view(self, lane: int) -> ParkedView:
        """What the matcher sees of it."""
        return ParkedView(lane, self.tokens, self.tick, self.prompt_len)


class _Lane:
    """Mutable record of one lane; only `KVManager` touches it."""

    def __init__(self, index: int, generation: int) -> None:
        self.index = index
        self.life: Lifecycle[LaneState] = Lifecycle(
            f"KV lane {index} gen {generation}", LaneState.FREE, LANE_TRANSITIONS
        )
        self.owner: SequenceId | None = None
        self.length = 0
        self.reservation: Reservation | None = None
        self.release_pending = False
        self.on_device = False  # opened on the device (KV Apply) and not closed since
        self.parked: Parked | None = None  # set exactly while PARKED

    def snapshot(self) -> LaneSnapshot:
        r = self.reservation
        return LaneSnapshot(
            lane=self.index,
            state=self.life.state,
            owner=self.owner,
            length=self.length,
            device_job_id=r.device_job_id if r else None,
            target_len=r.target_len if r else None,
            release_pending=self.release_pending,
            parked_at=self.parked.at if self.parked else None,
        )


class KVManager:
    """Transactional KV lanes of one model generation.

    Args:
        lanes: number of KV lanes of the configured model (>= 1).
        lane_context: maximum KV tokens per lane (>= 1).
        generation: the model generation this manager belongs to.
        fixed_slots: the device has no lane selection: a lane is a hardware slot, and a lane taken
            without a continuation is the lowest FREE or PARKED one (`prefix_match.choose_lane`).

    Raises:
        InvalidArgument: lanes or lane_context < 1.
    """

    def __init__(self, lanes: int, lane_context: int, generation: int, *, fixed_slots: bool = False) -> None:
        if lanes < 1:
            raise InvalidArgument(f"KV lanes must be >= 1, got {lanes}")
        if lane_context < 1:
            raise InvalidArgument(f"KV lane context must be >= 1, got {lane_context}")
        self.lanes = lanes
        self.lane_context = lane_context
        self.generation = generation
        self.fixed_slots = fixed_slots
        self._lanes = [_Lane(i, generation) for i in range(lanes)]
        self._free: set[int] = set(range(lanes))
        self._parked: dict[int, _Lane] = {}
        self._by_owner: dict[SequenceId, int] = {}
        self._tokens = itertools.count(1)
        self._ticks = itertools.count(1)  # LRU order of parked lanes
        self._device_closes: list[int] = []  # lanes the device must close (KV Free) before reuse

    # ---- queries -------------------------------------------------------------------------

    def free_count(self) -> int:
        """Lanes in FREE or PARKED (what admission compares a request's need against: a parked lane
        costs admission nothing)."""
        return len(self._free) + len(self._parked)

    def parked_count(self) -> int:
        """Lanes in PARKED."""
        return len(self._parked)

    def used_count(self) -> int:
        """Lanes held by a sequence (ACTIVE, RESERVED or UNKNOWN)."""
        return self.lanes - self.free_count()

    def all_idle(self) -> bool:
        """True when every lane is FREE or PARKED (leak check: nothing owned, nothing in flight)."""
        return self.free_count() == self.lanes

    def parked(self) -> list[tuple[int, Parked]]:
        """Every parked lane and what it holds, in lane order."""
        return [(i, rec.parked) for i, rec in sorted(self._parked.items()) if rec.parked is not None]

    def lane_of(self, owner: SequenceId) -> int | None:
        """The lane `owner` holds, or None."""
        return self._by_owner.get(owner)

    def snapshot(self) -> tuple[LaneSnapshot, ...]:
        """Every lane's state, owner, committed length and in-flight job, in lane order."""
        return tuple(lane.snapshot() for lane in self._lanes)

    def lane(self, lane: int) -> LaneSnapshot:
        """One lane's snapshot.

        Raises:
            InvalidArgument: lane index out of range.
        """
        return self._get(lane).snapshot()

    # ---- transactions --------------------------------------------------------------------

    def assign(self, owner: SequenceId) -> LaneHandle | None:
        """Give `owner` an empty lane: the lowest-numbered FREE one, else the least recently used
        PARKED one emptied (-> ACTIVE, length 0). `take` without matching.

        Returns:
            The handle, or None when no lane is FREE or PARKED (nothing changes).

        Raises:
            OwnerHasLane: `owner` already holds a lane.
        """
        return self.take(owner, None, 0)

    def take(
        self, owner: SequenceId, tokens: np.ndarray | None, min_tokens: int, max_keep: int | None = None
    ) -> LaneHandle | None:
        """Give `owner` a lane chosen by `prefix_match.choose_lane`: a parked lane it continues
        (PARKED -> ACTIVE, length = the tokens kept: a tail deletion), a FREE lane, or the least
        recently used parked lane, truncated to the prefix they share or emptied (its device lane
        queued for KV Free, `take_device_closes`).

        Args:
            tokens: the owner's prefill tokens (int32), or None to take a lane without matching.
            min_tokens: the shortest prefix worth a parked lane.
            max_keep: keep at most this many tokens of a matched lane (None: all it shares).

        Returns:
            The handle, or None when no lane is FREE or PARKED (nothing changes).

        Raises:
            OwnerHasLane: `owner` already holds a lane.
        """
        held = self._by_owner.get(owner)
        if held is not None:
            raise OwnerHasLane(f"sequence {owner!r} already holds KV lane {held}")
        views = [rec.parked.view(i) for i, rec in self._parked.items() if rec.parked]
        choice = choose_lane(tokens, views, self._free, min_tokens, max_keep, lowest_slot=self.fixed_slots)
        if choice is None:
            return None
        rec = self._lanes[choice.lane]
        kept_hashes: tuple[int, ...] = ()
        if choice.source is LaneSource.FREE:
            self._free.remove(rec.index)
        else:
            parked = self._unpark(rec)
            if choice.keep:  # its shared prefix stays: a tail deletion
                kept_hashes = parked.hashes[: choice.keep // BLOCK_TOKENS]
            elif rec.on_device:  # emptied: KV Free then KV Apply, so nothing of the old KV survives
                rec.on_device = False
                self._device_closes.append(rec.index)
        rec.life.move(LaneState.ACTIVE)
        rec.owner, rec.length = owner, choice.keep
        self._by_owner[owner] = rec.index
        return LaneHandle(rec.index, owner, self.generation, choice.source, choice.keep, kept_hashes)

    def expected_keep(self, tokens: np.ndarray, min_tokens: int) -> int:
        """The KV tokens `take(owner, tokens, min_tokens)` would keep now (0 unless a parked lane's
        prefix would be taken). Changes nothing: the scheduler classifies a request by what it would
        have to prefill."""
        views = [rec.parked.view(i) for i, rec in self._parked.items() if rec.parked]
        choice = choose_lane(tokens, views, self._free, min_tokens, lowest_slot=self.fixed_slots)
        return choice.keep if choice is not None else 0

    def park(
        self, lane: int, owner: SequenceId, tokens: np.ndarray, hashes: tuple[int, ...], now: float, *, prompt_len: int
    ) -> None:
        """The owner finished with trusted KV: keep it warm (ACTIVE -> PARKED, owned by no one).

        Args:
            tokens: exactly what the lane's committed KV holds (int32, `length` tokens).
            hashes: block hashes of `tokens` (full blocks; fewer is allowed, none are invented).
            now: monotonic seconds (Status shows how long it has been parked).
            prompt_len: how many of `tokens` were the owner's prompt (0..length; the rest is its
                reply): a later sequence continues the lane only if it resends all of them.

        Raises:
            LaneNotOwned: the lane is free or held by another sequence.
            IllegalTransition: the lane is not ACTIVE (RESERVED: the device may write it; UNKNOWN: its
                KV is untrusted).
            FailedPrecondition: the lane is empty, closed on the device, or being released.
            InvalidArgument: `tokens` is not as long as the committed KV, or `prompt_len` is outside
                0..its length.
        """
        rec = self._owned(lane, owner)
        if not rec.life.can_move(LaneState.PARKED):
            raise IllegalTransition(f"KV lane {lane} is {rec.life.state.name}, only an ACTIVE lane can be parked")
        if rec.length == 0 or not rec.on_device or rec.release_pending:
            raise FailedPrecondition(f"KV lane {lane}: nothing trusted to park (length {rec.length})")
        if len(tokens) != rec.length:
            raise InvalidArgument(f"KV lane {lane}: {len(tokens)} tokens do not describe its {rec.length} KV tokens")
        if not 0 <= prompt_len <= rec.length:
            raise InvalidArgument(f"KV lane {lane}: prompt length {prompt_len} outside 0..{rec.length}")
        rec.life.move(LaneState.PARKED)
        del self._by_owner[owner]
        rec.owner, rec.reservation = None, None
        rec.parked = Parked(tokens, hashes[: rec.length // BLOCK_TOKENS], next(self._ticks), now, prompt_len)
        self._parked[lane] = rec

    def drop_parked(self) -> list[int]:
        """Every PARKED lane -> FREE: its KV is no longer trusted (a reset, or a fault with unknown
        KV effect anywhere on the board). Lanes still open on the device are queued for KV Free.

        Returns:
            The lanes dropped.
        """
        dropped = sorted(self._parked)
        for index in dropped:
            rec = self._lanes[index]
            self._unpark(rec)
            rec.life.move(LaneState.FREE)
            rec.length = 0
            if rec.on_device:
                rec.on_device = False
                self._device_closes.append(index)
            self._free.add(index)
        return dropped

    def take_device_closes(self) -> list[int]:
        """Lanes evicted or dropped while open on the device, to close there (KV Free) before any
        lane is opened again; each is returned once."""
        closes, self._device_closes = self._device_closes, []
        return closes

    def reserve(self, lane: int, owner: SequenceId, target_len: int, device_job_id: DeviceJobId) -> Reservation:
        """Reserve `lane` for one job extending it from its committed length to `target_len`.

        Every check runs before anything changes.

        Raises:
            InvalidArgument: lane out of range; `target_len` beyond `lane_context`, or not
                greater than the committed length.
            LaneNotOwned: the lane is free or held by another sequence.
            FailedPrecondition: the owner cancelled (release pending).
            IllegalTransition: the lane is not ACTIVE (already RESERVED, or UNKNOWN).
        """
        rec = self._owned(lane, owner)
        if rec.release_pending:
            raise FailedPrecondition(f"KV lane {lane}: sequence {owner!r} is being released")
        if not rec.life.can_move(LaneState.RESERVED):
            raise IllegalTransition(f"KV lane {lane} is {rec.life.state.name}, only an ACTIVE lane can be reserved")
        if target_len > self.lane_context:
            raise InvalidArgument(
                f"KV lane {lane}: target length {target_len} exceeds lane context {self.lane_context}"
            )
        if target_len <= rec.length:
            raise InvalidArgument(
                f"KV lane {lane}: target length {target_len} must exceed committed length {rec.length}"
            )
        token = next(self._tokens)
        res = Reservation(lane, owner, device_job_id, self.generation, rec.length, target_len, token)
        rec.life.move(LaneState.RESERVED)
        rec.reservation = res
        return res

    def commit(self, reservation: Reservation) -> LaneSnapshot:
        """The job finished with valid output: its KV positions are trusted (length = target).

        If the owner cancelled meanwhile (`release_when_idle`), the lane is then freed.

        Returns:
            The lane after the commit (FREE if it was released).

        Raises:
            StaleGeneration: the reservation belongs to another generation.
            StaleReservation: it was already ended (commit, rollback or mark_unknown).
            InvalidArgument: lane out of range.
        """
        rec = self._live(reservation)
        rec.life.move(LaneState.ACTIVE)
        rec.length = reservation.target_len
        return self._end_reservation(rec)

    def rollback(self, reservation: Reservation) -> LaneSnapshot:
        """The job did not run or its result is discarded and its KV writes (if any) lie beyond
        the committed length, where nothing reads them: length stays as before the reserve.

        Returns:
            The lane after the rollback (FREE if it was released).

        Raises:
            StaleGeneration: the reservation belongs to another generation.
            StaleReservation: it was already ended.
            InvalidArgument: lane out of range.
        """
        rec = self._live(reservation)
        rec.life.move(LaneState.ACTIVE)
        return self._end_reservation(rec)

    def mark_unknown(self, lane: int) -> LaneSnapshot:
        """A fault left the lane's KV untrusted (ACTIVE or RESERVED -> UNKNOWN, length 0).

        Any reservation on the lane becomes stale. Call only once the device no longer writes the
        lane. If the owner cancelled, the lane is freed at once.

        Returns:
            The lane afterwards (UNKNOWN, or FREE if it was released).

        Raises:
            InvalidArgument: lane out of range.
            IllegalTransition: the lane is FREE or already UNKNOWN.
        """
        return self._mark_unknown(self._get(lane))

    def mark_all_unknown(self) -> list[int]:
        """Mark every ACTIVE or RESERVED lane UNKNOWN (e.g. after `reset_configuration`, which
        clears all lanes). Returns the lanes marked."""
        hit = [
            rec
            for rec in self._lanes
            if rec.life.state in (LaneState.ACTIVE, LaneState.RESERVED)  # FREE/UNKNOWN: nothing to lose
        ]
        for rec in hit:
            self._mark_unknown(rec)
        return [rec.index for rec in hit]

    def rebuild(self, lane: int, owner: SequenceId) -> LaneHandle:
        """Give an UNKNOWN lane back to its owner empty (UNKNOWN -> ACTIVE, length 0); the owner
        re-prefills its prompt and generated tokens.

        Raises:
            InvalidArgument: lane out of range.
            LaneNotOwned: the lane is free or held by another sequence.
            IllegalTransition: the lane is not UNKNOWN.
        """
        rec = self._owned(lane, owner)
        if rec.life.state is not LaneState.UNKNOWN:
            # RESERVED -> ACTIVE is a legal edge (commit/rollback) but not a rebuild.
            raise IllegalTransition(f"KV lane {lane} is {rec.life.state.name}, only UNKNOWN is rebuilt")
        rec.life.move(LaneState.ACTIVE)
        rec.length = 0
        return LaneHandle(lane, owner, self.generation)

    def release(self, lane: int, owner: SequenceId) -> bool:
        """Free an ACTIVE or UNKNOWN lane (-> FREE, length 0).

        Returns:
            Whether the lane was open on the device: the caller closes it there (KV Free).

        Raises:
            InvalidArgument: lane out of range.
            LaneNotOwned: the lane is free or held by another sequence.
            IllegalTransition: the lane is RESERVED (the device may still write it; use
                `release_when_idle`).
        """
        rec = self._owned(lane, owner)
        if rec.life.state is LaneState.RESERVED:
            raise IllegalTransition(
                f"KV lane {lane} is RESERVED by device job {rec.reservation and rec.reservation.device_job_id}: "
                "it cannot be released while the device may write it (use release_when_idle)"
            )
        was_open, rec.on_device = rec.on_device, False
        self._free_lane(rec)
        return was_open

    # ---- the lanes' device side (KV Apply / Free) -----------------------------------------------

    def needs_open(self, lane: int) -> bool:
        """The lane must be opened on the device before a job uses it (it never was, or was closed).

        Raises:
            InvalidArgument: lane out of range.
        """
        return not self._get(lane).on_device

    def opened(self, lane: int, owner: SequenceId) -> None:
        """The device opened the lane for `owner` (KV Apply succeeded).

        Raises:
            InvalidArgument: lane out of range.
            LaneNotOwned: the lane is free or held by another sequence.
        """
        self._owned(lane, owner).on_device = True

    def forget_device_lanes(self) -> None:
        """The device dropped every lane (its configuration was reset): none is open any more, and
        none needs closing."""
        for rec in self._lanes:
            rec.on_device = False
        self._device_closes.clear()

    def release_when_idle(self, lane: int, owner: SequenceId) -> bool:
        """Release now if no job is in flight on the lane; otherwise mark it so the commit,
        rollback or mark_unknown that ends the reservation frees it (cancel path).

        Returns:
            True if the lane was freed now, False if the release is pending.

        Raises:
            InvalidArgument: lane out of range.
            LaneNotOwned: the lane is free or held by another sequence.
        """
        rec = self._owned(lane, owner)
        if rec.life.state is LaneState.RESERVED:
            rec.release_pending = True
            return False
        self._free_lane(rec)
        return True

    # ---- internals -----------------------------------------------------------------------

    def _get(self, lane: int) -> _Lane:
        if not 0 <= lane < self.lanes:
            raise InvalidArgument(f"KV lane {lane} out of range 0..{self.lanes - 1}")
        return self._lanes[lane]

    def _owned(self, lane: int, owner: SequenceId) -> _Lane:
        rec = self._get(lane)
        if rec.owner != owner:
            held = "free" if rec.owner is None else f"held by {rec.owner!r}"
            raise LaneNotOwned(f"KV lane {lane} is {held}, not by {owner!r}")
        return rec

    def _live(self, reservation: Reservation) -> _Lane:
        if reservation.generation != self.generation:
            raise StaleGeneration(
                f"reservation of device job {reservation.device_job_id} is for generation {reservation.generation}, "
                f"KV manager is generation {self.generation}"
            )
        rec = self._get(reservation.lane)
        if rec.reservation != reservation:
            raise StaleReservation(
                f"KV lane {reservation.lane}: reservation of device job {reservation.device_job_id} was already ended "
                f"(lane is {rec.life.state.name})"
            )
        return rec

    def _unpark(self, rec: _Lane) -> Parked:
        """Take a PARKED lane out of the parked set (the caller moves its state)."""
        parked = rec.parked
        assert parked is not None, "a PARKED lane always has its record"
        rec.parked = None
        del self._parked[rec.index]
        return parked

    def _end_reservation(self, rec: _Lane) -> LaneSnapshot:
        rec.reservation = None
        if rec.release_pending:
            self._free_lane(rec)
        return rec.snapshot()

    def _mark_unknown(self, rec: _Lane) -> LaneSnapshot:
        rec.life.move(LaneState.UNKNOWN)
        rec.length = 0  # nothing in the lane is trusted; rebuild starts from 0
        rec.reservation = None
        if rec.release_pending:
            self._free_lane(rec)
        return rec.snapshot()

    def _free_lane(self, rec: _Lane) -> None:
        rec.life.move(LaneState.FREE)
        assert rec.owner is not None  # every non-FREE lane has an owner
        del self._by_owner[rec.owner]
        rec.owner, rec.length, rec.reservation, rec.release_pending = None, 0, None, False
        self._free.add(rec.index)
