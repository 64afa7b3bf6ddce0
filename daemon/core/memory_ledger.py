"""What the device's memory should hold, and what it holds beyond that (docs/daemon.md, "Device memory").

A chip's baseline is what it held when the device was opened plus the footprint of every
configuration the daemon holds (what each configure took, `unload_check.footprint`). Memory above
it is held by nothing the daemon knows of: a release that leaked, or something outside the daemon.
`MemoryLedger` keeps the baseline and the footprints, and the last measured excess, which Status
reports as a warning and the metric `calculet_device_memory_above_baseline_bytes`.

Not thread-safe: the model manager calls it under its device lock, so no configure or release lands
between a measure and the footprints it is compared with. `excess` is read without the lock (one
attribute, replaced whole).
"""

from __future__ import annotations

from calculet.daemon.core.unload_check import ChipExcess, Footprint, above_baseline, used_by_chip
from calculet.daemon.device.types import MemoryUsage


class MemoryLedger:
    """The baseline of one device's memory.

    Args:
        opened: the device's usage when it was opened, before the daemon configured anything.
    """

    def __init__(self, opened: MemoryUsage) -> None:
        self._opened = used_by_chip(opened)
        self._footprints: dict[int, Footprint] = {}  # config id -> what its configure took
        self.excess: tuple[ChipExcess, ...] = above_baseline(self._opened, (), opened)  # last measured

    def configured(self, config_id: int, taken: Footprint) -> None:
        """A configure took `taken`; the baseline grows by it."""
        self._footprints[config_id] = taken

    def released(self, config_id: int) -> Footprint:
        """A configuration is released (or dropped): the baseline shrinks by what it took.

        Returns:
            Its footprint ({} when it has none here).
        """
        return self._footprints.pop(config_id, {})

    def footprint(self, config_id: int) -> Footprint | None:
        """What the configure of `config_id` took, as measured (None: not configured here). Read
        without the lock by Status: one lookup of an entry that is set once and popped whole."""
        return self._footprints.get(config_id)

    def dropped_all(self) -> None:
        """A configuration reset dropped every configuration with its memory (the device contract)."""
        self._footprints.clear()

    def measure(self, usage: MemoryUsage) -> tuple[ChipExcess, ...]:
        """Compare `usage` with the baseline and keep the result as `excess`.

        Returns:
            What each chip holds above its baseline, in chip order.
        """
        self.excess = above_baseline(self._opened, self._footprints.values(), usage)
        return self.excess
