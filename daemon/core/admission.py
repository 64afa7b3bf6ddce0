"""Requests waiting for capacity: a bounded priority queue with deadlines (docs/daemon.md).

The scheduler first asks "can allocate?"; a request that cannot start now is `enqueue`d with an
admission deadline, or refused with `Overloaded` when the queue is at its maximum depth (never a
busy wait). Whenever capacity may have changed (a lane freed, a job completed) the scheduler calls
`pop_ready(can_admit)`, which hands out the most urgent waiting item the predicate accepts. It
calls `expire(now)` to remove items whose deadline has passed and fails them with `Overloaded`
("admission deadline"), and sleeps on its own condition until `next_deadline()` or the next
capacity change: nothing here polls or sleeps.

Order: highest effective priority first, then arrival (FIFO). Larger `priority` means more urgent.
With `aging_s` set, an item's effective priority rises by 1 for every `aging_s` seconds it has
waited, so low-priority work is not starved forever by a stream of urgent work (cheap: each
priority level is a FIFO whose head has waited longest, so the levels merge lazily in order).
`pop_ready` skips items the predicate refuses, so a small request may pass a large one that does not
fit; a scheduler that must not let large requests starve makes its predicate refuse the others
while the large head waits (its policy, not this queue's).

Ownership: an enqueued item belongs to the queue until `pop_ready`, `expire`, `cancel` or `drain`
returns it. Lock: none of its own; its owner (the scheduler, under the engine lock) serialises every
call, and `can_admit` must not call back into the queue.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from calculet.common.errors import FailedPrecondition, InvalidArgument, NotFound, Overloaded

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry(Generic[T]):
    item_id: Hashable
    item: T
    deadline: float
    priority: int
    enqueued_at: float
    seq: int  # arrival order, unique per queue


class AdmissionQueue(Generic[T]):
    """Bounded queue of items waiting for admission.

    Args:
        max_depth: items the queue may hold (>= 1); one more raises `Overloaded`. None: no bound here
            (its owner bounds it, as the scheduler does by lanes).
        aging_s: seconds of waiting that add 1 to an item's effective priority; None disables aging.
        retry_after_s: the hint carried by `Overloaded` when the queue is full.
        clock: monotonic clock in seconds; deadlines passed to `enqueue` use the same clock.

    Raises:
        InvalidArgument: max_depth < 1, or aging_s / retry_after_s not a positive finite number.
    """

    def __init__(
        self,
        max_depth: int | None,
        *,
        aging_s: float | None = None,
        retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_depth is not None and max_depth < 1:
            raise InvalidArgument(f"admission queue max_depth must be >= 1, got {max_depth}")
        if aging_s is not None and not (math.isfinite(aging_s) and aging_s > 0):
            raise InvalidArgument(f"admission queue aging_s must be a positive number, got {aging_s}")
        if not (math.isfinite(retry_after_s) and retry_after_s > 0):
            raise InvalidArgument(f"admission queue retry_after_s must be positive, got {retry_after_s}")
        self.max_depth = max_depth
        self.aging_s = aging_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._seq = itertools.count()
        self._by_id: dict[Hashable, _Entry[T]] = {}
        # priority -> item_id -> entry, in arrival order (dicts keep insertion order).
        self._levels: dict[int, dict[Hashable, _Entry[T]]] = {}
        # (deadline, seq, item_id); entries removed otherwise stay until they reach the top (lazy).
        self._deadlines: list[tuple[float, int, Hashable]] = []

    def enqueue(self, item_id: Hashable, item: T, *, deadline: float, priority: int = 0) -> None:
        """Queue `item` until it is admitted or `deadline` (on the queue's clock) passes.

        Raises:
            InvalidArgument: deadline is NaN.
            FailedPrecondition: an item with this id is already queued.
            Overloaded: the queue is full, or the deadline has already passed.
        """
        if math.isnan(deadline):
            raise InvalidArgument(f"admission deadline of {item_id!r} is NaN")
        if item_id in self._by_id:
            raise FailedPrecondition(f"request {item_id!r} is already waiting for admission")
        if self.max_depth is not None and len(self._by_id) >= self.max_depth:
            raise Overloaded(f"admission queue full ({self.max_depth} waiting)", retry_after_s=self.retry_after_s)
        now = self._clock()
        if deadline <= now:
            raise Overloaded(f"admission deadline of {item_id!r} already passed")
        entry = _Entry(item_id, item, deadline, priority, now, next(self._seq))
        self._by_id[item_id] = entry
        self._levels.setdefault(priority, {})[item_id] = entry
        heapq.heappush(self._deadlines, (deadline, entry.seq, item_id))

    def pop_ready(self, can_admit: Callable[[T], bool]) -> T | None:
        """Remove and return the most urgent waiting item that `can_admit` accepts.

        Items whose deadline has passed are skipped (left for `expire`). `can_admit` is called in
        queue order until it returns True; an exception from it propagates and nothing changes.

        Returns:
            The item, or None when no waiting item is admissible.
        """
        now = self._clock()
        for entry in self._in_order(now):
            if entry.deadline > now and can_admit(entry.item):
                self._remove(entry)
                return entry.item
        return None

    def expire(self, now: float) -> list[T]:
        """Remove and return every item whose deadline is at or before `now`, earliest first.
        The caller fails them with `Overloaded` ("admission deadline")."""
        expired: list[T] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq, item_id = heapq.heappop(self._deadlines)
            entry = self._by_id.get(item_id)
            if entry is not None and entry.seq == seq:
                self._remove(entry)
                expired.append(entry.item)
        return expired

    def cancel(self, item_id: Hashable) -> T:
        """Remove a waiting item and return it.

        Raises:
            NotFound: no waiting item has this id (never queued, or already admitted/expired).
        """
        entry = self._by_id.get(item_id)
        if entry is None:
            raise NotFound(f"request {item_id!r} is not waiting for admission")
        self._remove(entry)
        return entry.item

    def drain(self) -> list[T]:
        """Remove and return every waiting item in queue order (model unload / drain)."""
        entries = list(self._in_order(self._clock()))
        for entry in entries:
            self._remove(entry)
        return [e.item for e in entries]

    def next_deadline(self) -> float | None:
        """The earliest deadline among waiting items, or None when the queue is empty."""
        self._drop_stale_deadlines()
        return self._deadlines[0][0] if self._deadlines else None

    def __contains__(self, item_id: Hashable) -> bool:
        return item_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def depth(self) -> int:
        """Items waiting."""
        return len(self)

    def depth_by_priority(self) -> dict[int, int]:
        """Items waiting per (base) priority; levels with no item are absent."""
        return {p: len(level) for p, level in self._levels.items() if level}

    # ---- internals -----------------------------------------------------------------------

    def _effective(self, entry: _Entry[T], now: float) -> int:
        if self.aging_s is None:
            return entry.priority
        return entry.priority + int(max(0.0, now - entry.enqueued_at) // self.aging_s)

    def _in_order(self, now: float) -> Iterator[_Entry[T]]:
        # Within one level, older entries come first and have aged at least as much, so each level
        # is already sorted by (-effective priority, seq); merging the levels gives the global order.
        def key(entry: _Entry[T]) -> tuple[int, int]:
            return (-self._effective(entry, now), entry.seq)

        return heapq.merge(*(level.values() for level in self._levels.values()), key=key)

    def _remove(self, entry: _Entry[T]) -> None:
        del self._by_id[entry.item_id]
        level = self._levels[entry.priority]
        del level[entry.item_id]
        if not level:
            del self._levels[entry.priority]
        if len(self._deadlines) > 2 * len(self._by_id) + 64:
            # Bound the lazily deleted deadline entries: rebuild from the live items.
            self._deadlines = [(e.deadline, e.seq, e.item_id) for e in self._by_id.values()]
            heapq.heapify(self._deadlines)

    def _drop_stale_deadlines(self) -> None:
        while self._deadlines:
            _, seq, item_id = self._deadlines[0]
            entry = self._by_id.get(item_id)
            if entry is not None and entry.seq == seq:
                return
            heapq.heappop(self._deadlines)
