"""Unload verification (seed 000 section 10.3 step 5): after a release, the memory the model took
at configure is free again and the device is healthy.

Owns the arithmetic over `MemoryUsage` snapshots, no device calls: `footprint` is what a configure
took (usage after minus before, per chip), `unload_problem` says what a release failed to give
back. The model manager takes the snapshots around each configure and release under one lock, so
no other configure or release lands between them; a reset that frees more memory meanwhile only
lowers `after`, which passes.
"""

from __future__ import annotations

from collections.abc import Mapping

from calculet.daemon.device.types import MemoryUsage

Footprint = Mapping[int, tuple[int, int]]  # chip -> (DRAM, SRAM) bytes a configured model took


def _used(usage: MemoryUsage) -> dict[int, tuple[int, int]]:
    return {c.chip: (c.dram_used, c.sram_used) for c in usage.chips}


def footprint(before: MemoryUsage, after: MemoryUsage) -> Footprint:
    """Bytes per chip a configure took: usage after minus before (chips whose usage did not change
    are left out)."""
    was = _used(before)
    taken = {}
    for chip, (dram, sram) in _used(after).items():
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
    was, now = _used(before), _used(after)
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
