"""calsim device memory: per-chip DRAM/SRAM accounting of configured models.

Data flow: `configure` asks `chip_needs(manifest, chips)` what a package needs on each chip,
then `MemoryMap.reserve(owner, needs)` compares every chip's need with what is free and either
records the whole reservation or raises `OutOfDeviceMemory` having changed nothing; `release`
gives an owner's bytes back; `usage()` feeds `VirtualDevice.memory_usage()`.

Need per chip c (docs/package.md, docs/sources.md 003 §6-8): DRAM = param_dram_bytes[c] + workspace_bytes[c]
+ ceil(kv.bytes_per_token * lanes * lane_context / chips) (KV is split evenly over the chips,
by kv heads); SRAM = param_sram_bytes[c]. Not thread-safe: the device calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.daemon.device.errors import ConfigurationError, OutOfDeviceMemory
from calculet.daemon.device.types import ChipMemory, MemoryUsage
from calculet.daemon.package.manifest import PackageManifest

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class ChipNeed:
    """Bytes one configured model occupies on one chip."""

    chip: int
    dram: int
    sram: int
    param_dram: int = 0
    workspace: int = 0
    kv: int = 0


def chip_needs(manifest: PackageManifest, chips: int) -> tuple[ChipNeed, ...]:
    """What `manifest` needs on each chip it runs on, in chip order.

    A package built for fewer chips than the board has (a single-chip model) runs on the chips its
    masks name (`topology.chip_masks`, one bit each, as `memory.chips[].chip` says) and needs
    nothing on the others, which stay free for another model.

    Raises:
        ConfigurationError: the package needs more chips than the board has, names a chip the board
            lacks, lists a chip twice, disagrees with its own masks, or declares negative sizes.
    """
    topology = manifest.topology
    if topology.chips > chips:
        raise ConfigurationError(
            f"package {manifest.name!r} is built for {topology.chips} chips; this board has {chips}"
        )
    decls = {c.chip: c for c in manifest.memory.chips}
    masks = sorted(1 << c for c in decls)
    if (
        len(decls) != len(manifest.memory.chips)
        or len(decls) != topology.chips
        or not all(0 <= c < chips for c in decls)
        or masks != sorted(topology.chip_masks)
    ):
        listed = [c.chip for c in manifest.memory.chips]
        raise ConfigurationError(
            f"package {manifest.name!r}: memory plan lists chips {listed} for masks "
            f"{[hex(m) for m in topology.chip_masks]}; expected {topology.chips} distinct chip(s) of 0..{chips - 1}"
            " matching the masks"
        )
    kv = manifest.kv
    kv_total = kv.bytes_per_token * kv.lanes * kv.lane_context
    # kv_heads: each chip holds its share of the heads (ceil: whole bytes); none: each holds all of it
    kv_share = -(-kv_total // topology.chips) if kv.split == "kv_heads" else kv_total
    needs = []
    for c in sorted(decls):
        d = decls[c]
        sizes = (d.param_dram_bytes, d.workspace_bytes, d.param_sram_bytes, kv_total)
        if min(sizes) < 0:
            raise ConfigurationError(f"package {manifest.name!r}: chip {c} declares negative memory sizes")
        dram = d.param_dram_bytes + d.workspace_bytes + kv_share
        needs.append(ChipNeed(c, dram, d.param_sram_bytes, d.param_dram_bytes, d.workspace_bytes, kv_share))
    return tuple(needs)


class MemoryMap:
    """Per-chip totals and the reservations of every owner (a configured model's config_id).

    Args:
        chips: number of chips.
        dram_bytes / sram_bytes: capacity of each chip.
    """

    def __init__(self, chips: int, dram_bytes: int, sram_bytes: int) -> None:
        self.chips = chips
        self.dram_total = dram_bytes
        self.sram_total = sram_bytes
        self._owners: dict[int, tuple[ChipNeed, ...]] = {}
        self._leaked: list[ChipNeed] = []  # bytes a faulty release left held (option release_leak_bytes)

    def used(self, chip: int) -> tuple[int, int]:
        """(DRAM, SRAM) bytes in use on `chip`, leaked bytes included."""
        on_chip = [need for needs in self._owners.values() for need in needs if need.chip == chip]
        leaked = [need for need in self._leaked if need.chip == chip]
        dram = sum(need.dram for need in on_chip + leaked)
        sram = sum(need.sram for need in on_chip + leaked)
        return dram, sram

    def check(self, needs: tuple[ChipNeed, ...], what: str) -> None:
        """Raise if `needs` does not fit next to the current reservations; changes nothing.

        Raises:
            OutOfDeviceMemory: naming the first chip that is short, with the numbers.
        """
        for need in needs:
            dram_used, sram_used = self.used(need.chip)
            dram_free = self.dram_total - dram_used
            sram_free = self.sram_total - sram_used
            if need.dram > dram_free:
                raise OutOfDeviceMemory(
                    f"{what}: chip {need.chip} needs {need.dram} B DRAM (params {need.param_dram} + "
                    f"workspace {need.workspace} + KV {need.kv}) but has {dram_free} B free of {self.dram_total} B"
                )
            if need.sram > sram_free:
                raise OutOfDeviceMemory(
                    f"{what}: chip {need.chip} needs {need.sram} B SRAM "
                    f"but has {sram_free} B free of {self.sram_total} B"
                )

    def reserve(self, owner: int, needs: tuple[ChipNeed, ...], what: str) -> None:
        """Check, then record `needs` under `owner` (all chips or none).

        Raises:
            OutOfDeviceMemory: see `check`; nothing is recorded.
        """
        if owner in self._owners:
            raise ValueError(f"memory owner {owner} already holds a reservation")
        self.check(needs, what)
        self._owners[owner] = needs

    def release(self, owner: int, leak_bytes: int = 0) -> None:
        """Give back `owner`'s bytes (no-op if it holds none), except `leak_bytes` of DRAM on each of
        its chips (a fault: at most what it held there), kept until `clear_leaks`."""
        needs = self._owners.pop(owner, ())
        if leak_bytes > 0:
            self._leaked.extend(ChipNeed(n.chip, min(leak_bytes, n.dram), 0) for n in needs)

    def clear_leaks(self) -> None:
        """A configuration reset frees every allocation, leaked ones included."""
        self._leaked.clear()

    def usage(self) -> MemoryUsage:
        chips = []
        for c in range(self.chips):
            dram, sram = self.used(c)
            chips.append(ChipMemory(c, dram, self.dram_total, sram, self.sram_total))
        return MemoryUsage(tuple(chips))
