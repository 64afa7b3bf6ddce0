"""The board's audit trail: one entry per event that changed what the board serves or how, whoever
caused it (docs/daemon.md "Resets"; docs/sources.md 000 §14: "every reset records its reason, the
jobs in flight, the versions and health before and after, and the result"):

- resets, automatic or operator (`resets/automatic.py`, `resets/operator.py`), and escalations that
  reset nothing: a self-drain, a quarantine, a restart (`resets/controller.py`,
  `resets/escalation_actions.py`);
- model switches (`models.py`);
- operator drains and resumes (`device_core.py`);
- leaks: an unload that did not give its memory back (`device_core.py`).

Owner: `DeviceCore` makes the one `BoardAudit` of its board and hands it to the engine (whose reset
controller records and reads it), the model manager and the escalation actions; each records
through `record`. It has its own lock, taken for no longer than a list append (and a journal line),
so a caller may hold the engine lock or not. Listeners (`on_record`: the engine emits a
`ResetRecorded` event for metrics and logs) are told after each entry and must not block. Bounded:
the newest `capacity` entries are kept, and `total` counts every entry since start.

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
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOURNAL_LINES = 1024  # the journal is cut back to the newest `capacity` entries past this many lines


@dataclass(frozen=True)
class AuditEntry:
    """One audited event.

    Attributes:
        at: unix time it ended.
        kind: a reset ("ccu", "configuration"), an escalation that reset nothing ("drain",
            "quarantine", "restart"), "switch", an operator's "drain" or "resume", or "unload" (a
            leak).
        automatic: the board's own doing (a hung job, an escalation), not an operator's or a
            gateway's.
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


class BoardAudit:
    """The newest `capacity` entries, oldest first, and the `journal` file that keeps them across
    restarts (None: this process's only). Thread-safe (its own lock)."""

    def __init__(self, capacity: int = 64, journal: Path | None = None) -> None:
        self.capacity = capacity
        self.journal = journal
        self.total = 0  # entries recorded by this process
        self._lock = threading.Lock()  # guards the entries, the journal and the listeners
        self._entries: deque[AuditEntry] = deque()
        self._lines = 0
        self._listeners: list[Callable[[AuditEntry], None]] = []
        if journal is not None:
            earlier = _read_journal(journal)
            self._lines = len(earlier)
            self._entries.extend(earlier[-capacity:])

    def on_record(self, listener: Callable[[AuditEntry], None]) -> None:
        """Call `listener(entry)` after each entry is recorded (on the recorder's thread, perhaps
        under the engine lock: it must not block)."""
        with self._lock:
            self._listeners.append(listener)

    def record(self, entry: AuditEntry) -> None:
        """Add `entry` to the trail (and its journal), then tell the listeners."""
        with self._lock:
            self.total += 1
            self._entries.append(entry)
            while len(self._entries) > self.capacity:
                self._entries.popleft()
            if self.journal is not None:
                self._write(entry)
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener(entry)

    def entries(self) -> tuple[AuditEntry, ...]:
        """The trail, oldest first (bounded)."""
        with self._lock:
            return tuple(self._entries)

    def _write(self, entry: AuditEntry) -> None:
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
            log.error("audit journal %s not written (%s): the trail is this process's only", self.journal, exc)
            self.journal = None


def _line(entry: AuditEntry) -> str:
    return json.dumps(dataclasses.asdict(entry)) + "\n"


def _read_journal(path: Path) -> list[AuditEntry]:
    """The entries an earlier process wrote, oldest first; lines that do not read are skipped."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("audit journal %s not read: %s", path, exc)
        return []
    entries = []
    for line in text.splitlines():
        try:
            entries.append(_entry(json.loads(line)))
        except (ValueError, TypeError, KeyError):
            continue
    return entries


def _entry(raw: Any) -> AuditEntry:
    """One journal line back into an entry.

    Raises:
        TypeError / KeyError / ValueError: not an entry.
    """
    if not isinstance(raw, dict):
        raise TypeError("not an object")
    fields = {f.name for f in dataclasses.fields(AuditEntry)}
    values = {k: v for k, v in raw.items() if k in fields}
    values["generations_before"] = tuple(str(g) for g in values["generations_before"])
    values["generations_after"] = tuple(str(g) for g in values["generations_after"])
    return AuditEntry(**values)


AuditPoint = tuple[bool, tuple[str, ...]]  # (serving, the serving models) before or after an event


def entry_around(
    before: AuditPoint,
    after: AuditPoint,
    *,
    kind: str,
    automatic: bool,
    reason: str,
    fault: str,
    inflight_jobs: int,
    recovered: int,
    failed: int,
    ok: bool,
    message: str,
) -> AuditEntry:
    """An entry that ends now, with the board's health and serving models `before` and `after` it."""
    return AuditEntry(
        at=now(),
        kind=kind,
        automatic=automatic,
        reason=reason,
        fault=fault,
        inflight_jobs=inflight_jobs,
        recovered=recovered,
        failed=failed,
        generations_before=before[1],
        generations_after=after[1],
        serving_before=before[0],
        serving_after=after[0],
        ok=ok,
        message=message,
    )


def escalation_entry(
    kind: str, reason: str, fault: str, jobs: int, before: AuditPoint, after: AuditPoint, ok: bool, message: str
) -> AuditEntry:
    """The entry of an escalation that is not an operator's reset: automatic, and the `jobs` it hit
    all ended (resumed elsewhere: none recovered here)."""
    return entry_around(
        before, after, kind=kind, automatic=True, reason=reason, fault=fault,
        inflight_jobs=jobs, recovered=0, failed=jobs, ok=ok, message=message,
    )  # fmt: skip


OPERATOR_DRAIN = "operator drain"  # the reason of a drain an operator asked for (Drain, `calctl drain`)


def operator_entry(
    kind: str, reason: str, before: AuditPoint, after: AuditPoint, message: str, *, jobs: int = 0, ended: int = 0
) -> AuditEntry:
    """The entry of an operator's (or a shutdown's) drain or resume: not automatic, nothing reset;
    `jobs`: the jobs running when it acted; `ended`: those it ended (an interrupted drain's)."""
    return entry_around(
        before, after, kind=kind, automatic=False, reason=reason, fault="operator",
        inflight_jobs=jobs, recovered=0, failed=ended, ok=True, message=message,
    )  # fmt: skip


def now() -> float:
    """Unix time, for `AuditEntry.at`."""
    return time.time()
