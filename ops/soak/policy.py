"""The failure policy: which failed requests a soak tolerates, and how many.

A request that got an error is `failed`. It is *allowed* when a rule of `ALLOWED_FAILURES`
matches it, else *disallowed*, and any disallowed failure fails the run. Allowed failures fail it
too when they exceed `MAX_ALLOWED_RATE` of the requests. Lost and crossed requests are never
allowed (`classify`, `verdict`).

| rule | matches | expected when |
| --- | --- | --- |
| `overloaded` | HTTP 429, or in-band code `overloaded` | every board is full while a fault takes one out |
| `model-switch` | HTTP 503, or in-band `unavailable`, saying `got no board` | outwaited placement in a `model_switch` |
| `unavailable` | HTTP 503, or in-band code `unavailable` | no board can serve for a moment |
| `recovery-budget` | a message saying `recovery budget exhausted` | a job hit more faults than it may recover from |

Pure data and one function; docs/reliability.md has the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ALLOWED_RATE = 0.02  # allowed failures over all requests, above which the run fails
RECOVERY_BUDGET_TEXT = "recovery budget exhausted"
PLACEMENT_WAIT_TEXT = "got no board within"  # the gateway's ModelWaitExpired


@dataclass(frozen=True)
class FailureRule:
    """One kind of failure the soak tolerates.

    Attributes:
        name: its name in the report.
        statuses: HTTP statuses it matches.
        codes: OpenAI error codes (in-band stream errors carry no status) it matches.
        message: a text the error message must contain (None: any message); with `statuses` and
            `codes` both empty it matches on the message alone.
        why: when it is expected.
    """

    name: str
    statuses: frozenset[int]
    codes: frozenset[str]
    message: str | None
    why: str

    def matches(self, status: int | None, code: str | None, message: str) -> bool:
        if self.message is not None and self.message not in message:
            return False
        if not self.statuses and not self.codes:
            return True
        return status in self.statuses or (code is not None and code in self.codes)


ALLOWED_FAILURES: tuple[FailureRule, ...] = (
    FailureRule("overloaded", frozenset({429}), frozenset({"overloaded"}), None, "every board full while one is out"),
    # Before `unavailable`, which would match it too: the report counts it under its own name.
    FailureRule(
        "model-switch",
        frozenset({503}),
        frozenset({"unavailable"}),
        PLACEMENT_WAIT_TEXT,
        "a catalog model's request waited past the placement wait while boards switched",
    ),
    FailureRule("unavailable", frozenset({503}), frozenset({"unavailable"}), None, "no board can serve for a moment"),
    FailureRule(
        "recovery-budget", frozenset(), frozenset(), RECOVERY_BUDGET_TEXT, "a job hit more faults than it may recover"
    ),
)


def allowed_rule(status: int | None, code: str | None, message: str) -> str | None:
    """The name of the first rule that allows this failure, or None (disallowed)."""
    return next((r.name for r in ALLOWED_FAILURES if r.matches(status, code, message)), None)


def describe_policy() -> dict[str, object]:
    """The policy for the report."""
    return {
        "max_allowed_rate": MAX_ALLOWED_RATE,
        "allowed": [
            {"name": r.name, "statuses": sorted(r.statuses), "codes": sorted(r.codes), "message": r.message}
            | {"why": r.why}
            for r in ALLOWED_FAILURES
        ],
    }
