"""Unload verification (docs/sources.md 000 §10.3 step 5): after a release, the memory the model took
at configure is free again and the device is healthy.

Owns the arithmetic over `MemoryUsage` snapshots, no device calls: `footprint` is what a configure
took (usage after minus before, per chip), `unload_problem` says what a release failed to give
back, and `above_baseline` what a chip holds beyond its baseline (what it held when the device was
opened plus the footprint of every configuration the daemon holds). The model manager takes the
snapshots around each configure and release under one lock, so no other configure or release lands
between them; a reset that frees more memory meanwhile only lowers `after`, which passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from calculet.daemon.device.types import MemoryUsage

Footprint = Mapping[int, tuple[int, int]]  # chip -> (DRAM, SRAM) bytes a configured model took


@dataclass(frozen=True)
class ChipExcess:
    """Bytes one chip holds above its baseline (0 when it holds no more)."""

    chip: int
    dram: int
    sram: int

    @property
    def held(self) -> bool:
        return self.dram > 0 or self.sram > 0


def used_by_chip(usage: MemoryUsage) -> dict[int, tuple[int, int]]:
    """(DRAM, SRAM) bytes in use per chip."""
    return {c.chip: (c.dram_used, c.sram_used) for c in usage.chips}


def footprint(before: MemoryUsage, after: MemoryUsage) -> Footprint:
    """Bytes per chip a configure took: usage after minus before (chips whose usage did not change
    are left out)."""
    was = used_by_chip(before)
    taken = {}
    for chip, (dram, sram) in used_by_chip(after).items():
        d0, s0 = was.get(chip, (0, 0))
        if (dram - d0, sram - s0) != (0, 0):
            taken[chip] = (dram - d0, sram - s0)
    return taken


def unload_problem(taken: Footprint, before: MemoryUsage, after: MemoryUsage, healthy: bool) -> str | None:
    """What a release around which `before` and `after` were measured failed to do; None if it
    gave back at least `taken` on every chip and the device is healthy.

    Args:
        taken: the model's footprint, measured at its configure.
        before / after: device memory usage just before and just after the release.
        healthy: the device's answer after the release.
    """
    problems = []
    was, now = used_by_chip(before), used_by_chip(after)
    for chip, (dram, sram) in sorted(taken.items()):
        d0, s0 = was.get(chip, (0, 0))
        d1, s1 = now.get(chip, (0, 0))
        kept_dram, kept_sram = d1 - (d0 - dram), s1 - (s0 - sram)
        if kept_dram > 0 or kept_sram > 0:
            problems.append(
                f"chip {chip} still holds {max(kept_dram, 0):,} B DRAM and {max(kept_sram, 0):,} B SRAM "
                f"of the {dram:,} B / {sram:,} B it took"
            )
    if not healthy:
        problems.append("the device reports unhealthy")
    return "; ".join(problems) or None


def above_baseline(opened: Footprint, footprints: Iterable[Footprint], usage: MemoryUsage) -> tuple[ChipExcess, ...]:
    """What each chip of `usage` holds above its baseline: `opened` (its usage when the device was
    opened) plus every footprint. Less than the baseline counts as 0 (a reset freed more).

    Args:
        opened: usage per chip when the device was opened, before any configure.
        footprints: the footprint of every configuration the daemon holds.
        usage: the usage now.

    Returns:
        One entry per chip of `usage`, in chip order.
    """
    expected = dict(opened)
    for taken in footprints:
        for chip, (dram, sram) in taken.items():
            d, s = expected.get(chip, (0, 0))
            expected[chip] = (d + dram, s + sram)
    chips = []
    for chip, (dram, sram) in sorted(used_by_chip(usage).items()):
        d, s = expected.get(chip, (0, 0))
        chips.append(ChipExcess(chip, max(dram - d, 0), max(sram - s, 0)))
    return tuple(chips)


def excess_text(excess: Iterable[ChipExcess]) -> str:
    """`chip 0 holds 4,096 B DRAM and 0 B SRAM above its baseline; chip 1 ...` for the chips that
    hold more ("" when none does)."""
    return "; ".join(
        f"chip {c.chip} holds {c.dram:,} B DRAM and {c.sram:,} B SRAM above its baseline" for c in excess if c.held
    )
