"""The submit-error escalation (docs/sources.md 000 §14): a streak of failed submits drains the board.

A device that refuses one submit gets the job's sequences re-prefilled (`bookkeeping.launch_failed`).
One that refuses `limit` submits in a row is not serving: the engine then stops admitting with the
reason, ends every unfinished job with ERROR / UNAVAILABLE (a gateway resumes each on another board
with its resume tokens), tells its health listeners and audits the escalation. An operator's
`resume` brings it back.

Owner: the engine, under its lock. Capacity refusals (OutOfKV) and a lost device are not counted:
the first is not a fault, the second halts the board by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

SUBMIT_ERROR_STREAK = 5  # default `--submit-error-streak`: consecutive submit errors that drain a board


@dataclass
class SubmitErrorStreak:
    """Consecutive failed submits, against `limit` (0 = never escalate).

    Attributes:
        limit: failures in a row that escalate.
        run: failures since the last accepted submit (or the last `clear`).
    """

    limit: int = SUBMIT_ERROR_STREAK
    run: int = 0

    def failed(self) -> bool:
        """Count a failed submit. Returns True exactly when this one completes the streak."""
        self.run += 1
        return self.limit > 0 and self.run == self.limit

    def succeeded(self) -> None:
        """The device took a job: the streak is broken."""
        self.run = 0

    def clear(self) -> None:
        """An operator resumed the board: count afresh."""
        self.run = 0


def escalation_reason(limit: int, last_error: str) -> str:
    """Why the board drained itself (Health's reason, the audit entry and the jobs' Finals)."""
    return f"{limit} consecutive submit errors (last: {last_error}): board drained; resume elsewhere"
