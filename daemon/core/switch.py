"""A model switch on a board: what it expects, how long each phase took, and its audit entry.

The switch itself is `ModelManager.load` with a `SwitchSpec` (seed 000 section 9.3, issue 20):
validate the new package, stop admitting and drain the generation it replaces, unload it and verify
its memory came back, configure and warm the new one, publish it. This module owns the pieces
around it that are not lifecycle: the compare-and-swap expectation (`SwitchSpec`), the phase
clock fed by the load's progress stream (`PhaseClock`), and the audit entry (`switch_entry`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from calculet.common.errors import InvalidArgument
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.reset_audit import ResetEntry, now

MAX_NOTE_CHARS = 256
PHASES = ("validate", "drain", "unload", "configure", "warm", "publish")


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


class PhaseClock:
    """Seconds per switch phase, read from the load's progress: the phase boundaries are the old
    generation entering DRAINING, UNLOADING and UNLOADED, and the new one entering WARMING and READY.

    Args:
        old_generation: the generation being replaced.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, old_generation: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._old = old_generation
        self._clock = clock
        self._marks: dict[str, float] = {"start": clock()}

    def seen(self, generation: int, state: ModelState) -> None:
        """Note a progress message (only the first entry into each boundary state counts)."""
        key = {
            (True, ModelState.DRAINING): "drain",
            (True, ModelState.UNLOADING): "unload",
            (True, ModelState.UNLOADED): "configure",
            (False, ModelState.WARMING): "warm",
            (False, ModelState.READY): "publish",
        }.get((generation == self._old, state))
        if key is not None:
            self._marks.setdefault(key, self._clock())

    def seconds(self) -> dict[str, float]:
        """Seconds of each phase that began, in `PHASES` order; the last one runs until now."""
        order = ["start", *PHASES[1:]]
        marks = [(name, self._marks[name]) for name in order if name in self._marks]
        ends = [t for _, t in marks[1:]] + [self._clock()]
        names = ["validate" if name == "start" else name for name, _ in marks]
        return {name: end - start for name, (_, start), end in zip(names, marks, ends, strict=True)}


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
) -> ResetEntry:
    """The audit entry of a switch from `spec.target` to `new`.

    Args:
        before / after: "alias@generation (package)" of every serving model around it.
        jobs: (drained, interrupted) jobs of the replaced generation.
    """
    drained, interrupted = jobs
    who = spec.requester or "unnamed requester"
    return ResetEntry(
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
