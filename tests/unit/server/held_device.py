"""`HeldSubmitDevice`: calsim whose next `submit`, once armed, blocks until the test lets it go: the
engine thread is then stuck inside a device call, deterministically (no timing)."""

from __future__ import annotations

import threading

from calculet.daemon.calsim.device import CalsimDevice
from calculet.daemon.calsim.handles import CalsimSubmission
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec

HELD_S = 60.0  # the longest a submit is held: far beyond any deadline of the calls around it


class HeldSubmitDevice(CalsimDevice):
    """calsim (time scale 0), except that once `hold()` is called, the next `submit` blocks until
    `let_go()`; `entered` is set when it is held."""

    def __init__(self) -> None:
        super().__init__(0, parse_options({"time_scale": 0.0}))
        self._armed = False
        self.entered = threading.Event()
        self.released = threading.Event()

    def hold(self) -> None:
        self._armed = True

    def let_go(self) -> None:
        self.released.set()

    def submit(
        self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO
    ) -> CalsimSubmission:
        if self._armed:
            self._armed = False
            self.entered.set()
            assert self.released.wait(HELD_S), "the test never released the held submit"
        return super().submit(model, job, engine_slot)
