"""The failure policy: which failed requests a soak tolerates, and how many.

A request that got an error is `failed`. It is *allowed* when a rule of `ALLOWED_FAILURES`
matches it, else *disallowed*, and any disallowed failure fails the run. Allowed failures fail it
too when they exceed `MAX_ALLOWED_RATE` of the requests. Lost and crossed requests are never
allowed (`classify`, `verdict`).

| rule | matches | expected when |
| --- | --- | --- |
| `overloaded` | HTTP 429, or in-band code `overloaded` | every board is full while a fault takes one out |
| `model-switch` | 503 or in-band `unavailable` saying `got no board` or `unloaded` | a `model_switch` |
| `unavailable` | HTTP 503, or in-band code `unavailable` | no board can serve for a moment |
| `recovery-budget` | a message saying `recovery budget exhausted` | a job hit more faults than it may recover from |

Pure data and one function; docs/reliability.md has the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ALLOWED_RATE = 0.02  # allowed failures over all requests, above which the run fails
RECOVERY_BUDGET_TEXT = "recovery budget exhausted"
# The gateway's ModelWaitExpired, and a request the switch's unload cut that no other board took
# within the gateway's --failover-wait.
SWITCH_TEXTS = ("got no board within", "unloaded")


@dataclass(frozen=True)
class FailureRule:
    """One kind of failure the soak tolerates.

    Attributes:
        name: its name in the report.
        statuses: HTTP statuses it matches.
        codes: OpenAI error codes (in-band stream errors carry no status) it matches.
        message: a text the error message must contain (None: any message), or several of which it
            must contain one; with `statuses` and `codes` both empty it matches on the message alone.
        why: when it is expected.
    """

    name: str
    statuses: frozenset[int]
    codes: frozenset[str]
    message: str | tuple[str, ...] | None
    why: str

    def matches(self, status: int | None, code: str | None, message: str) -> bool:
        texts = (self.message,) if isinstance(self.message, str) else self.message
        if texts is not None and not any(text in message for text in texts):
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
        SWITCH_TEXTS,
        "a model switch unloaded the request's model, or its model waited past the placement wait",
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
