"""A model switch on a board: what it expects, how long each phase took, and its audit entry.

The switch itself is `ModelManager.load` with a `SwitchSpec` (docs/sources.md 000 §9.3, issue 20):
validate the new package, stop admitting and drain the generation it replaces, unload it and verify
its memory came back, configure and warm the new one, publish it. This module owns the pieces
around it that are not lifecycle: the compare-and-swap expectation (`SwitchSpec`) and the audit entry
(`switch_entry`, with the phases `calculet.common.phase_clock.PhaseClock` timed).
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.audit import AuditEntry, now

MAX_NOTE_CHARS = 256


@dataclass(frozen=True)
class SwitchSpec:
    """What a switch replaces and why.

    Attributes:
        alias / generation: the generation it expects the board to serve (compare-and-swap).
        force: switch even within the minimum residency.
        reason / requester: why and who asked, for the audit trail.

    Raises (on construction):
        InvalidArgument: a reason or requester over MAX_NOTE_CHARS characters.
    """

    alias: str
    generation: int
    force: bool = False
    reason: str = ""
    requester: str = ""

    def __post_init__(self) -> None:
        for name in ("reason", "requester"):
            if len(getattr(self, name)) > MAX_NOTE_CHARS:
                raise InvalidArgument(f"{name}: at most {MAX_NOTE_CHARS} characters")

    @property
    def target(self) -> str:
        return f"{self.alias}@{self.generation}"


def phases_text(seconds: dict[str, float]) -> str:
    """`validate 0.01 s, drain 1.20 s, ...`."""
    return ", ".join(f"{name} {value:.2f} s" for name, value in seconds.items())


def switch_entry(
    spec: SwitchSpec,
    new: str,
    before: tuple[str, ...],
    after: tuple[str, ...],
    jobs: tuple[int, int],
    ok: bool,
    message: str,
) -> AuditEntry:
    """The audit entry of a switch from `spec.target` to `new`.

    Args:
        before / after: "alias@generation (package)" of every serving model around it.
        jobs: (drained, interrupted) jobs of the replaced generation.
    """
    drained, interrupted = jobs
    who = spec.requester or "unnamed requester"
    return AuditEntry(
        at=now(),
        kind="switch",
        automatic=False,
        reason=f"{spec.reason or 'switch'} (asked by {who}): {spec.target} -> {new}",
        fault="switch",
        inflight_jobs=drained + interrupted,
        recovered=drained,
        failed=interrupted,
        generations_before=before,
        generations_after=after,
        serving_before=bool(before),
        serving_after=bool(after),
        ok=ok,
        message=message,
    )
