"""KV lanes waiting to be closed on the device (KV Free, `VirtualDevice.close_lane`).

A sequence that leaves its lane, and a KV manager that evicts or drops one, queue the close under the
engine lock in the engine's `LaneCloses` (guarded by that lock); the thread that launches the next
device job (the engine or the completion thread, one launch at a time) takes the queue and closes
the lanes outside the lock (`close_lanes`) before it opens any lane again, so no lane is
reopened while its old KV is still open on the device. A configuration reset forgets the queued
closes of a model it dropped: the lanes went with its configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.device.api import ConfiguredModel, VirtualDevice
from calculet.daemon.device.errors import DeviceError, DeviceLost, ModelReleased

log = logging.getLogger(__name__)

LaneClose = tuple[ConfiguredModel, int]  # (the model's handle, the lane)


class LaneCloses:
    """The lanes to close on the device, in the order they were left (engine lock held)."""

    def __init__(self) -> None:
        self._pending: list[LaneClose] = []

    def add(self, model: ConfiguredModel, lane: int) -> None:
        self._pending.append((model, lane))

    def collect(self, generations: Iterable[ModelRuntime]) -> None:
        """Queue the closes of lanes the generations' KV managers evicted or dropped."""
        for rt in generations:
            if rt.kv is not None and rt.model is not None:
                self._pending += [(rt.model, lane) for lane in rt.kv.take_device_closes()]

    def forget_model(self, model: ConfiguredModel | None) -> None:
        """The device dropped this model's configuration, and its lanes with it."""
        self._pending = [(m, lane) for m, lane in self._pending if m is not model]

    def take(self) -> list[LaneClose]:
        """Every queued close, oldest first; the queue is empty afterwards."""
        taken, self._pending = self._pending, []
        return taken


def close_lanes(device: VirtualDevice, closes: list[LaneClose]) -> None:
    """Close lanes whose sequences left them (KV Free), without the engine lock. A stale handle means
    the lane went with its configuration; a lost device is the completion path's to report."""
    for model, lane in closes:
        try:
            device.close_lane(model, lane)
        except (ModelReleased, DeviceLost):
            pass
        except DeviceError as exc:
            log.warning("closing KV lane %d on the device failed: %s", lane, exc)
