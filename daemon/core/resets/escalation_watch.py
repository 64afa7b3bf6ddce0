"""Which device faults escalate (docs/sources.md 000 §14): counts of CCU exceptions and non-finite outputs
in a sliding window, decided as device jobs settle.

The first response to each fault is the settlement's (`completion.py`: the job's sequences
re-prefill). When faults repeat, the board escalates:

- `ccu_limit` CCU exceptions the device raised on its own (a reset's deliberate ones never count)
  within `window_s` -> an automatic ResetCCU; if they repeat within `window_s` after that reset,
  the next escalation is a ResetConfiguration with a re-warm instead (`Escalation.reset_kind`);
- `nan_limit` device jobs of one Ready generation with non-finite logits within `window_s` ->
  that generation is quarantined and its golden check re-run (`ModelManager.recheck`).

A limit of 0 never escalates. Data flow: the engine's completion thread calls `saw` under the engine
lock for every settlement; an `Escalation` it returns is handed, outside the lock, to the
`Escalator` (`escalations.py`), which acts on it. Owner: the engine, under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from calculet.daemon.core.completion import DeviceFault

CCU_ESCALATION = 3  # default `--ccu-escalation`: CCU exceptions within the window that reset the CCU
NAN_ESCALATION = 2  # default `--nan-escalation`: non-finite outputs within the window that quarantine
ESCALATION_WINDOW_S = 60.0  # default `--escalation-window`


class EscalationKind(Enum):
    CCU = "ccu"  # repeated CCU exceptions: an automatic reset
    QUARANTINE = "quarantine"  # repeated non-finite outputs: quarantine the generation, golden check
    UNHEALTHY = "unhealthy"  # the device is lost or unrecoverable: reset it, else restart the process


@dataclass(frozen=True)
class Escalation:
    """One escalation to act on.

    Attributes:
        kind: what to do.
        reason: why, for the audit and the log.
        generation: the generation a quarantine is for (0 otherwise).
        reset_kind: "ccu" or "configuration" for a CCU escalation ("" otherwise).
    """

    kind: EscalationKind
    reason: str
    generation: int = 0
    reset_kind: str = ""


@dataclass
class FaultWindow:
    """Events in the last `window_s` seconds, against `limit` (0 = never)."""

    limit: int
    window_s: float
    _times: deque[float] = field(default_factory=deque)

    def note(self, now: float) -> bool:
        """Count one event at `now`. Returns True when this one reaches the limit (the count starts
        afresh then)."""
        if self.limit <= 0:
            return False
        self._times.append(now)
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()
        if len(self._times) < self.limit:
            return False
        self._times.clear()
        return True

    @property
    def count(self) -> int:
        return len(self._times)


class EscalationWatch:
    """Counts the device faults settlements report and decides escalations (module docstring).

    Args:
        ccu_limit: CCU exceptions within the window that escalate (0 = never).
        nan_limit: non-finite outputs of one generation within the window that quarantine it (0 = never).
        window_s: the window, and how long after a CCU escalation a repeat escalates further.
    """

    def __init__(self, ccu_limit: int, nan_limit: int, window_s: float) -> None:
        self._ccu = FaultWindow(ccu_limit, window_s)
        self._nan_limit = nan_limit
        self._nan: dict[int, FaultWindow] = {}
        self._window_s = window_s
        self._last_ccu_escalation: float | None = None

    def saw(self, fault: DeviceFault, generation: int, ready: bool, now: float) -> Escalation | None:
        """A settlement of `generation` saw `fault` at `now`; `ready`: that generation is Ready (a
        generation warming up or already quarantined is not quarantined again). Returns the escalation
        it completes, or None."""
        if fault is DeviceFault.CCU_EXCEPTION and self._ccu.note(now):
            repeat = self._last_ccu_escalation is not None and now - self._last_ccu_escalation < self._window_s
            self._last_ccu_escalation = now
            kind = "configuration" if repeat else "ccu"
            reason = f"{self._ccu.limit} CCU exceptions within {self._window_s:g}s" + (
                " again after a CCU reset" if repeat else ""
            )
            return Escalation(EscalationKind.CCU, reason, reset_kind=kind)
        if fault is DeviceFault.NONFINITE and ready:
            window = self._nan.setdefault(generation, FaultWindow(self._nan_limit, self._window_s))
            if window.note(now):
                reason = f"{self._nan_limit} device jobs with non-finite logits within {self._window_s:g}s"
                return Escalation(EscalationKind.QUARANTINE, reason, generation=generation)
        return None

    def forget(self, generation: int) -> None:
        """A generation left (unloaded, or quarantined and decided): drop its count."""
        self._nan.pop(generation, None)
