"""What each board process said about itself: its reset audit trail and counters, as read.

`AuditBook.observe(board, pid, status, t_s)` keeps, per process, the last `StatusResponse` figures
(resets, the automatic-reset budget, job and device counters) and every audit entry
(`status.resets.history`) seen in any read, deduplicated: the trail is bounded on the daemon, and
a killed process can no longer be asked, so the supervisor reads it every few seconds and once
more before each restart it causes. Entries are reported with board, pid and kind (`ccu`,
`configuration`, `drain`, `quarantine`, `restart`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calculet.v1 import common_pb2, observe_pb2


def kind_name(kind: int) -> str:
    """`ccu` for RESET_KIND_CCU; the number for a kind this client does not know."""
    try:
        return str(common_pb2.ResetKind.Name(kind)).removeprefix("RESET_KIND_").lower()
    except ValueError:
        return str(kind)


@dataclass
class ProcessAudit:
    """The last figures one daemon process reported, and the entries of its trail seen so far."""

    board: str
    pid: int
    last_read_s: float = 0.0
    resets: int = 0
    budget: dict[str, Any] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)
    device_jobs: dict[str, int] = field(default_factory=dict)
    entries: dict[tuple[int, int, int, str], dict[str, Any]] = field(default_factory=dict)
    failed_reads: int = 0
    last_error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "failed_reads": self.failed_reads,
            "last_error": self.last_error,
            "board": self.board,
            "pid": self.pid,
            "last_read_s": round(self.last_read_s, 3),
            "resets": self.resets,
            "budget": self.budget,
            "jobs": self.jobs,
            "device_jobs": self.device_jobs,
            "audit_entries": len(self.entries),
        }


class AuditBook:
    """Per board process, its audit (module docstring). Used from one thread (the event loop)."""

    def __init__(self) -> None:
        self._by_pid: dict[int, ProcessAudit] = {}

    def observe(self, board: str, pid: int, status: observe_pb2.StatusResponse, t_s: float) -> None:
        audit = self._by_pid.setdefault(pid, ProcessAudit(board, pid))
        audit.last_read_s = t_s
        resets = status.resets
        audit.resets = resets.count
        budget = resets.budget
        audit.budget = {"used": budget.used, "limit": budget.limit, "window_s": budget.window_s}
        audit.budget["exhausted"] = budget.exhausted
        jc = status.job_counters
        audit.jobs = {
            "accepted": jc.accepted, "rejected": jc.rejected, "completed": jc.completed,
            "cancelled": jc.cancelled, "failed": jc.failed, "recoveries": jc.recoveries,
        }  # fmt: skip
        dc = status.device_counters
        audit.device_jobs = {"submitted": dc.submitted, "finished": dc.finished, "left": dc.left}
        for entry in resets.history:
            key = (entry.at.seconds, entry.at.nanos, entry.kind, entry.reason)
            if key not in audit.entries:
                audit.entries[key] = {
                    "board": board,
                    "pid": pid,
                    "at": entry.at.ToJsonString() if entry.HasField("at") else None,
                    "seen_s": round(t_s, 3),
                    "kind": kind_name(entry.kind),
                    "automatic": entry.automatic,
                    "fault": entry.fault,
                    "reason": entry.reason,
                    "inflight_jobs": entry.inflight_jobs,
                    "recovered": entry.recovered,
                    "failed": entry.failed,
                    "ok": entry.ok,
                    "message": entry.message,
                }

    def failed_read(self, board: str, pid: int, error: str) -> None:
        """A Status read that failed (a process going away, or a daemon's bug: reported)."""
        audit = self._by_pid.setdefault(pid, ProcessAudit(board, pid))
        audit.failed_reads += 1
        audit.last_error = error[:300]

    def processes(self) -> list[ProcessAudit]:
        return list(self._by_pid.values())

    def entries(self) -> list[dict[str, Any]]:
        """Every entry seen, by time; an entry a restarted process carries over from its predecessor
        (a `restart` record names the exit before it) is listed once, with the first pid seen."""
        seen: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for audit in self._by_pid.values():
            for e in audit.entries.values():
                seen.setdefault((e["board"], e["at"] or "", e["kind"], e["reason"]), e)
        return sorted(seen.values(), key=lambda e: (e["at"] or "", e["board"]))

    def kinds(self) -> dict[str, int]:
        """Entries seen by kind (automatic and operator together)."""
        counts: dict[str, int] = {}
        for e in self.entries():
            counts[e["kind"]] = counts.get(e["kind"], 0) + 1
        return counts
