"""The reset controller's audit trail: one entry per reset, automatic or operator (docs/daemon.md,
docs/sources.md 000 §14: "every reset records its reason, the jobs in flight, the versions and health
before and after, and the result").

Owner: the `ResetController` (guarded by the engine lock), which records its automatic resets as
they end and operator resets through `ResetController.record` (`operator.py`). Bounded: the
newest `capacity` entries are kept, and `total` counts every reset since start.

Across restarts: with a `journal` file (the daemon's `<runtime dir>/board<N>-resets.jsonl`), every
entry is also appended to it as one JSON object a line, and a new process starts its trail with the
newest `capacity` entries found there, so the entry of a daemon that exited for a restart (a device
the reset could not restore) is still shown by `calctl resets` once systemd has restarted it. The
file is rewritten with the newest entries when it grows past `JOURNAL_LINES`; a line that does not
read is skipped, and a journal that cannot be written is logged once and no longer used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOURNAL_LINES = 1024  # the journal is cut back to the newest `capacity` entries past this many lines


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
        generations_before / generations_after: "alias@generation (package directory)" of every serving model.
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
    """The newest `capacity` reset entries, oldest first; `journal`: the file that keeps them across
    restarts (None: this process's only)."""

    capacity: int = 64
    journal: Path | None = None
    total: int = 0
    _entries: deque[ResetEntry] = field(default_factory=deque)
    _lines: int = 0

    def __post_init__(self) -> None:
        if self.journal is not None:
            earlier = _read_journal(self.journal)
            self._lines = len(earlier)
            self._entries.extend(earlier[-self.capacity :])

    def record(self, entry: ResetEntry) -> None:
        self.total += 1
        self._entries.append(entry)
        while len(self._entries) > self.capacity:
            self._entries.popleft()
        if self.journal is not None:
            self._write(entry)

    def entries(self) -> tuple[ResetEntry, ...]:
        return tuple(self._entries)

    def _write(self, entry: ResetEntry) -> None:
        assert self.journal is not None
        try:
            if self._lines >= JOURNAL_LINES:  # cut back: write the newest entries to a new file
                tmp = self.journal.with_suffix(".tmp")
                tmp.write_text("".join(_line(e) for e in self._entries))
                os.replace(tmp, self.journal)
                self._lines = len(self._entries)
                return
            with self.journal.open("a") as f:
                f.write(_line(entry))
            self._lines += 1
        except OSError as exc:
            log.error("reset audit journal %s not written (%s): the trail is this process's only", self.journal, exc)
            self.journal = None


def _line(entry: ResetEntry) -> str:
    return json.dumps(dataclasses.asdict(entry)) + "\n"


def _read_journal(path: Path) -> list[ResetEntry]:
    """The entries an earlier process wrote, oldest first; lines that do not read are skipped."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("reset audit journal %s not read: %s", path, exc)
        return []
    entries = []
    for line in text.splitlines():
        try:
            entries.append(_entry(json.loads(line)))
        except (ValueError, TypeError, KeyError):
            continue
    return entries


def _entry(raw: Any) -> ResetEntry:
    """One journal line back into an entry.

    Raises:
        TypeError / KeyError / ValueError: not an entry.
    """
    if not isinstance(raw, dict):
        raise TypeError("not an object")
    fields = {f.name for f in dataclasses.fields(ResetEntry)}
    values = {k: v for k, v in raw.items() if k in fields}
    values["generations_before"] = tuple(str(g) for g in values["generations_before"])
    values["generations_after"] = tuple(str(g) for g in values["generations_after"])
    return ResetEntry(**values)


AuditPoint = tuple[bool, tuple[str, ...]]  # (serving, the serving models) before or after an event


def escalation_entry(
    kind: str, reason: str, fault: str, jobs: int, before: AuditPoint, after: AuditPoint, ok: bool, message: str
) -> ResetEntry:
    """The entry of an escalation that is not an operator's reset: automatic, and the `jobs` it hit
    all ended (resumed elsewhere: none recovered here)."""
    return ResetEntry(
        at=now(),
        kind=kind,
        automatic=True,
        reason=reason,
        fault=fault,
        inflight_jobs=jobs,
        recovered=0,
        failed=jobs,
        generations_before=before[1],
        generations_after=after[1],
        serving_before=before[0],
        serving_after=after[0],
        ok=ok,
        message=message,
    )


def now() -> float:
    """Unix time, for `ResetEntry.at`."""
    return time.time()
