"""The reset audit trail and its journal (issue 21): a trail bounded in memory that, with a journal
file, survives a restart (the entry of a daemon that exited for a restart is shown by the next one),
skips lines that do not read, cuts the file back, and gives up on a journal it cannot write."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.core.resets import audit as reset_audit
from calculet.daemon.core.resets.audit import ResetAudit, ResetEntry


def entry(n: int, kind: str = "ccu") -> ResetEntry:
    return ResetEntry(
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
    audit = ResetAudit(capacity)
    for n in range(count):
        audit.record(entry(n))
    assert audit.entries() == tuple(entry(n) for n in range(max(0, count - capacity), count))
    assert audit.total == count


def test_a_new_process_starts_with_the_entries_the_journal_holds(tmp_path: Path) -> None:
    journal = tmp_path / "board0-resets.jsonl"
    first = ResetAudit(4, journal)
    for n in range(6):
        first.record(entry(n, "restart" if n == 5 else "ccu"))
    second = ResetAudit(4, journal)
    assert second.entries() == tuple(entry(n, "restart" if n == 5 else "ccu") for n in range(2, 6))
    assert second.total == 0, "total counts this process's resets"
    second.record(entry(9))
    assert ResetAudit(8, journal).entries()[-1] == entry(9)


def test_lines_that_do_not_read_are_skipped(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    ResetAudit(4, journal).record(entry(1))
    with journal.open("a") as f:
        f.write('not json\n{"kind": "ccu"}\n[1, 2]\n')
    ResetAudit(4, journal).record(entry(2))
    assert ResetAudit(4, journal).entries() == (entry(1), entry(2))


def test_the_journal_is_cut_back_to_the_newest_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reset_audit, "JOURNAL_LINES", 10)
    journal = tmp_path / "j.jsonl"
    audit = ResetAudit(3, journal)
    for n in range(25):
        audit.record(entry(n))
    lines = journal.read_text().splitlines()
    assert len(lines) <= 10
    assert ResetAudit(3, journal).entries() == tuple(entry(n) for n in range(22, 25))


def test_a_journal_that_cannot_be_written_is_dropped_and_the_trail_goes_on(tmp_path: Path) -> None:
    audit = ResetAudit(4, tmp_path / "missing-dir" / "j.jsonl")
    audit.record(entry(1))
    audit.record(entry(2))
    assert audit.journal is None and audit.entries() == (entry(1), entry(2))
