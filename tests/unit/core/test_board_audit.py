"""The board's audit trail and its journal (issues 21, 32): a trail bounded in memory that, with a
journal file, survives a restart (the entry of a daemon that exited for a restart is shown by the next
one), skips lines that do not read, cuts the file back, gives up on a journal it cannot write, and
tells its listeners of each entry, from any thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.core import audit as board_audit
from calculet.daemon.core.audit import AuditEntry, BoardAudit


def entry(n: int, kind: str = "ccu") -> AuditEntry:
    return AuditEntry(
        at=1000.0 + n,
        kind=kind,
        automatic=True,
        reason=f"reason {n}",
        fault="hang",
        inflight_jobs=n,
        recovered=0,
        failed=n,
        generations_before=(f"tiny@{n} (tiny)",),
        generations_after=(),
        serving_before=True,
        serving_after=False,
        ok=n % 2 == 0,
        message="m",
    )


@given(st.integers(0, 30), st.integers(1, 8))
def test_the_trail_keeps_the_newest_entries_oldest_first_and_counts_all(count: int, capacity: int) -> None:
    audit = BoardAudit(capacity)
    for n in range(count):
        audit.record(entry(n))
    assert audit.entries() == tuple(entry(n) for n in range(max(0, count - capacity), count))
    assert audit.total == count


def test_a_new_process_starts_with_the_entries_the_journal_holds(tmp_path: Path) -> None:
    journal = tmp_path / "board0-resets.jsonl"
    first = BoardAudit(4, journal)
    for n in range(6):
        first.record(entry(n, "restart" if n == 5 else "ccu"))
    second = BoardAudit(4, journal)
    assert second.entries() == tuple(entry(n, "restart" if n == 5 else "ccu") for n in range(2, 6))
    assert second.total == 0, "total counts this process's resets"
    second.record(entry(9))
    assert BoardAudit(8, journal).entries()[-1] == entry(9)


def test_lines_that_do_not_read_are_skipped(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    BoardAudit(4, journal).record(entry(1))
    with journal.open("a") as f:
        f.write('not json\n{"kind": "ccu"}\n[1, 2]\n')
    BoardAudit(4, journal).record(entry(2))
    assert BoardAudit(4, journal).entries() == (entry(1), entry(2))


def test_the_journal_is_cut_back_to_the_newest_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(board_audit, "JOURNAL_LINES", 10)
    journal = tmp_path / "j.jsonl"
    audit = BoardAudit(3, journal)
    for n in range(25):
        audit.record(entry(n))
    lines = journal.read_text().splitlines()
    assert len(lines) <= 10
    assert BoardAudit(3, journal).entries() == tuple(entry(n) for n in range(22, 25))


def test_a_journal_that_cannot_be_written_is_dropped_and_the_trail_goes_on(tmp_path: Path) -> None:
    audit = BoardAudit(4, tmp_path / "missing-dir" / "j.jsonl")
    audit.record(entry(1))
    audit.record(entry(2))
    assert audit.journal is None and audit.entries() == (entry(1), entry(2))


def test_listeners_hear_every_entry_once_whatever_thread_records_it() -> None:
    audit = BoardAudit(8)
    heard: list[AuditEntry] = []
    audit.on_record(heard.append)
    workers = [
        threading.Thread(target=lambda k=k: [audit.record(entry(10 * k + n)) for n in range(10)]) for k in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(e.inflight_jobs for e in heard) == list(range(40)) and audit.total == 40
    assert len(audit.entries()) == 8 and set(audit.entries()) <= set(heard)
