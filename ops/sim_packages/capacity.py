"""The builder's capacity step: choose the default lane context and refuse a plan that does not fit.

Owns only the build-time decisions; the arithmetic is `calculet.daemon.package.capacity` (the
same functions the validator and `calctl capacity` use), so a package this builder accepts is
one the validator accepts. Per chip: params DRAM + workspace + this chip's KV share (lanes x
lane_context x bytes_per_token / chips) must fit the chip's DRAM, and params SRAM its SRAM.
Everything is computed before a single file is written (compute need, compare, act or refuse).
"""

from __future__ import annotations

from collections.abc import Sequence

from calculet.common.errors import FailedPrecondition
from calculet.daemon.package import capacity as planner
from calculet.daemon.package.capacity import DeviceLimits, MemoryModel
from calculet.daemon.package.manifest import ChipMemoryDecl, MemoryDecl

CONTEXT_GRANULE = 256  # default lane contexts are multiples of this
KV_SPLIT = "kv_heads"


def memory_model(
    name: str,
    chips: Sequence[ChipMemoryDecl],
    bytes_per_token: int,
    max_context: int,
    lanes: int,
    lane_context: int,
) -> MemoryModel:
    """The planner's view of a package being built (KV split over chips by KV head)."""
    return MemoryModel(name, tuple(chips), bytes_per_token, KV_SPLIT, max_context, lanes, lane_context)


def max_lane_context(model: MemoryModel, lanes: int, device: DeviceLimits) -> int:
    """The largest multiple of `CONTEXT_GRANULE`, at most the calbin context, whose KV for `lanes`
    lanes fits every chip beside its params and workspace.

    Raises:
        FailedPrecondition: not even `CONTEXT_GRANULE` tokens per lane fit.
    """
    best = planner.max_context_for(model, lanes, device) // CONTEXT_GRANULE * CONTEXT_GRANULE
    if best < CONTEXT_GRANULE:
        row = planner.evaluate(model, lanes, CONTEXT_GRANULE, device)
        raise FailedPrecondition(
            f"{model.name}: {lanes} lanes do not fit even {CONTEXT_GRANULE} tokens each: {row.reason}"
        )
    return best


def check_fits(model: MemoryModel, lanes: int, lane_context: int, device: DeviceLimits) -> None:
    """Refuse a plan that some chip cannot hold.

    Raises:
        FailedPrecondition: names each chip that does not fit and by how much, with its totals.
    """
    row = planner.evaluate(model, lanes, lane_context, device)
    if not row.fits:
        detail = "; ".join(
            f"chip {c.chip}: params {c.params_dram:,} + workspace {c.workspace:,} + KV {c.kv:,} = "
            f"{c.dram_total:,} B of {c.dram_limit:,} B DRAM"
            for c in row.chips
            if not c.fits
        )
        raise FailedPrecondition(f"{model.name}: {lanes} lanes x {lane_context} tokens: {row.reason} ({detail})")


def memory_decl(model: MemoryModel, lanes: int, lane_context: int) -> MemoryDecl:
    """The manifest `memory` section; `device_memory_required_bytes` is the board-wide DRAM need,
    the sum over chips of params DRAM + workspace + KV share (what the validator checks it against)."""
    per_token = model.kv_bytes_per_token_per_chip
    required = sum(planner.chip_dram_need(c, per_token, lanes, lane_context) for c in model.chips)
    return MemoryDecl(chips=model.chips, device_memory_required_bytes=required)
