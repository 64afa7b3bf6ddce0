"""The reset controller's audit trail: one entry per reset, automatic or operator (DESIGN.md section 3,
seed 000 section 14: "every reset records its reason, the jobs in flight, the versions and health
before and after, and the result").

Owner: the `ResetController` (guarded by the engine lock), which records its automatic resets as
they end and operator resets through `ResetController.record` (`operator_reset.py`). Bounded: the
newest `capacity` entries are kept, and `total` counts every reset since start.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ResetEntry:
    """One reset.

    Attributes:
        at: unix time it ended.
        kind: "ccu" or "configuration".
        automatic: the reset controller's (a hung job), not an operator's.
        reason: why (the operator's reason, or the hang).
        fault: what fault it answered ("hang", "operator"), or why it was not attempted
            ("budget exhausted").
        inflight_jobs / recovered / failed: client jobs it hit and their fate (as far as known when
            the entry was written).
        generations_before / generations_after: "alias@generation" of every serving model.
        serving_before / serving_after: the board's health (serving or not) around it.
        ok: the reset succeeded and the board is no longer halted by it.
        message: what happened.
    """

    at: float
    kind: str
    automatic: bool
    reason: str
    fault: str
    inflight_jobs: int
    recovered: int
    failed: int
    generations_before: tuple[str, ...]
    generations_after: tuple[str, ...]
    serving_before: bool
    serving_after: bool
    ok: bool
    message: str = ""


@dataclass
class ResetAudit:
    """The newest `capacity` reset entries, oldest first."""

    capacity: int = 64
    total: int = 0
    _entries: deque[ResetEntry] = field(default_factory=deque)

    def record(self, entry: ResetEntry) -> None:
        self.total += 1
        self._entries.append(entry)
        while len(self._entries) > self.capacity:
            self._entries.popleft()

    def entries(self) -> tuple[ResetEntry, ...]:
        return tuple(self._entries)


def now() -> float:
    """Unix time, for `ResetEntry.at`."""
    return time.time()
