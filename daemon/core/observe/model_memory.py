"""Each resident model's memory per chip, for Status and the metrics (docs/sources.md 000 §15:
per-model and per-chip memory): the capacity planner's figure beside the device's measured one.

Planned: `package/capacity.chip_plans` over the generation's manifest, for the lanes and lane context
it was configured with (the manifest's own before it is configured): params DRAM + KV share +
workspace in DRAM, params in SRAM, the same arithmetic as the validator and `calctl capacity`.
Measured: what its configure took on each chip, usage after minus before
(`unload_check.footprint`, kept by the model manager's ledger); a chip the configure did not change
measures 0. Pure: no lock, no device call.
"""

from __future__ import annotations

from calculet.daemon.core.observe.status import ModelChipMemoryView
from calculet.daemon.core.unload_check import Footprint
from calculet.daemon.package.capacity import MemoryModel, chip_plans
from calculet.daemon.package.manifest import PackageManifest


def model_memory(
    manifest: PackageManifest, lanes: int, lane_context: int, taken: Footprint | None
) -> tuple[ModelChipMemoryView, ...]:
    """Per chip of the manifest's plan, planned and measured bytes.

    Args:
        manifest: the generation's package.
        lanes / lane_context: its KV layout as configured.
        taken: what its configure took per chip (None: not measured, e.g. not configured yet).

    Returns:
        One view per planned chip, in the manifest's order.

    Raises:
        InvalidArgument: an unknown KV split or no chips (the validator refuses such a package
            before it is loaded).
    """
    plans = chip_plans(MemoryModel.from_manifest(manifest), lanes, lane_context)
    measured = taken is not None
    used = taken or {}
    return tuple(ModelChipMemoryView(p.chip, p.dram, p.sram, *used.get(p.chip, (0, 0)), measured) for p in plans)
