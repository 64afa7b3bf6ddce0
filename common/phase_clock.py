"""How long each phase of a model switch took, read from the load's progress stream.

The daemon times its own switches (`daemon/core/models.py`, for the audit entry) and the gateway
times the switches it asks for (`gateway/fleet/connection.py`, from the client's `LoadReport`s):
both feed the same `PhaseClock`, each with its own side's `ModelState`. The two enums take their
values from common.proto's `ModelState` names, so the clock keys on the value and needs neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

PHASES = ("validate", "drain", "unload", "configure", "warm", "publish")

# (is the replaced generation, state value) -> the phase that begins when a generation enters it.
_BOUNDARIES = {
    (True, "draining"): "drain",
    (True, "unloading"): "unload",
    (True, "unloaded"): "configure",
    (False, "warming"): "warm",
    (False, "ready"): "publish",
}


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

    def seen(self, generation: int, state: Enum) -> None:
        """Note a progress message, `state` a `ModelState` of the daemon or of the client (only the
        first entry into each boundary state counts; a state this clock does not know counts for none)."""
        key = _BOUNDARIES.get((generation == self._old, state.value))
        if key is not None:
            self._marks.setdefault(key, self._clock())

    def seconds(self) -> dict[str, float]:
        """Seconds of each phase that began, in `PHASES` order; the last one runs until now."""
        order = ["start", *PHASES[1:]]
        marks = [(name, self._marks[name]) for name in order if name in self._marks]
        ends = [t for _, t in marks[1:]] + [self._clock()]
        names = ["validate" if name == "start" else name for name, _ in marks]
        return {name: end - start for name, (_, start), end in zip(names, marks, ends, strict=True)}
