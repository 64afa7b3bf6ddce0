"""The model lifecycle (docs/daemon.md, docs/sources.md 000 §10) as one transition table.

Unloaded -> Validating -> Configuring -> Warming -> Ready -> Draining -> Unloading -> Unloaded;
Validating, Configuring and Warming may fail (-> Failed -> Unloaded after cleanup). A load that
is refused before Validating never creates a generation. A configuration reset drops a Ready
generation's calbin: it goes back to Configuring -> Warming (the golden check again) -> Ready, or
fails. Repeated non-finite outputs quarantine a Ready generation: Quarantined -> Ready when its golden
re-check passes or device faults leave it inconclusive, -> Failed -> Unloaded when it reproduces a
mismatch (`ModelManager.recheck`, `golden.py`).
"""

from __future__ import annotations

from enum import Enum

from calculet.common.lifecycle import table


class ModelState(Enum):
    UNLOADED = "unloaded"
    VALIDATING = "validating"
    CONFIGURING = "configuring"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    UNLOADING = "unloading"
    FAILED = "failed"
    QUARANTINED = "quarantined"

    @property
    def serving(self) -> bool:
        return self is ModelState.READY


MODEL_TRANSITIONS = table(
    [
        (ModelState.UNLOADED, [ModelState.VALIDATING]),
        (ModelState.VALIDATING, [ModelState.CONFIGURING, ModelState.FAILED]),
        (ModelState.CONFIGURING, [ModelState.WARMING, ModelState.FAILED]),
        (ModelState.WARMING, [ModelState.READY, ModelState.FAILED]),
        (ModelState.READY, [ModelState.DRAINING, ModelState.CONFIGURING, ModelState.QUARANTINED]),
        (ModelState.QUARANTINED, [ModelState.READY, ModelState.FAILED]),
        (ModelState.DRAINING, [ModelState.UNLOADING]),
        (ModelState.UNLOADING, [ModelState.UNLOADED]),
        (ModelState.FAILED, [ModelState.UNLOADED]),
    ]
)
