"""Capacity planning: what fits on one chip of a board, as pure functions over byte counts.

This module owns the memory arithmetic of a package on a board (docs/sources.md 003 §6-8, §13):
per chip, resident params (DRAM and SRAM), KV (lanes x context x this chip's share of the
bytes per token), and workspace, against the chip's DRAM/SRAM. Data flows one way: a
`PackageManifest` or a `ModelPreset` becomes a `MemoryModel` (per-chip figures); `plan` turns a
`MemoryModel`, a `DeviceLimits` and the (lanes, context) choices into a `CapacityPlan`. The
validator (`capacity.dram` / `capacity.sram`) and `calctl capacity` both use these functions.

Assumptions: workspace is a fixed per-chip figure (it does not grow with lanes); KV split by
`kv_heads` divides bytes per token evenly over chips (rounded up when heads do not divide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.daemon.device.types import DeviceInfo
from calculet.daemon.package.manifest import KERNELS, Architecture, ChipMemoryDecl, PackageManifest
from calculet.daemon.package.presets import GIB, MIB, ModelPreset
from calculet.daemon.package.versions import parse_version, release_part

KV_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int8": 1, "uint8": 1}
KV_SPLITS = ("kv_heads", "none")


@dataclass(frozen=True)
class DeviceLimits:
    """What one board offers a package: chips, memory per chip, runtime (and driver) version.

    Raises (on construction):
        InvalidArgument: non-positive chips or memory, or a version that is not dotted integers.
    """

    chips: int = 2
    dram_bytes_per_chip: int = 16 * GIB
    sram_bytes_per_chip: int = 18 * MIB
    runtime_version: str = "0.7.6"
    driver_version: str | None = None
    kernel_kinds: tuple[str, ...] = KERNELS  # what the driver configures; () accepts any
    firmware_version: str | None = None

    def __post_init__(self) -> None:
        if self.chips <= 0:
            raise InvalidArgument(f"device chips must be positive, got {self.chips}")
        if self.dram_bytes_per_chip <= 0 or self.sram_bytes_per_chip < 0:
            raise InvalidArgument(
                f"device memory must be positive, got DRAM {self.dram_bytes_per_chip} B, "
                f"SRAM {self.sram_bytes_per_chip} B per chip"
            )
        parse_version(self.runtime_version)
        for version in (self.driver_version, self.firmware_version):
            if version is not None:
                parse_version(version)

    @property
    def board_dram_bytes(self) -> int:
        return self.chips * self.dram_bytes_per_chip

    @classmethod
    def from_device_info(cls, info: DeviceInfo) -> DeviceLimits:
        """Limits of an opened device; a board with unequal chips plans with its smallest chip.
        Versions keep their release part (`0.7.6-calsim` -> `0.7.6`); an empty driver is unknown, and
        so is a firmware version that does not start with dotted integers.

        Raises:
            InvalidArgument: no chips, or a version that does not start with dotted integers.
        """
        if not info.chips:
            raise InvalidArgument(f"device {info.name} reports no chips")
        return cls(
            chips=len(info.chips),
            dram_bytes_per_chip=min(c.dram_bytes for c in info.chips),
            sram_bytes_per_chip=min(c.sram_bytes for c in info.chips),
            runtime_version=release_part(info.runtime_version),
            driver_version=release_part(info.driver_version) if info.driver_version else None,
            kernel_kinds=info.capabilities.kernel_kinds,
            firmware_version=_release_or_none(info.firmware_version),
        )


def _release_or_none(version: str) -> str | None:
    """A firmware version's release part; None when it has none (firmware strings vary by vendor)."""
    try:
        return release_part(version)
    except InvalidArgument:
        return None


CALSIM_BOARD = DeviceLimits()


@dataclass(frozen=True)
class MemoryModel:
    """Per-chip memory figures of one model, the input of every plan.

    Attributes:
        name: package or preset name.
        chips: per-chip params DRAM/SRAM and workspace.
        kv_bytes_per_token: board-wide KV bytes per lane-token.
        kv_split: `kv_heads` (each chip holds its share) or `none` (every chip holds all of it).
        max_context: the calbin context; a longer lane cannot run whatever the memory.
        lanes / lane_context: the KV layout the package declares (its own choice).
    """

    name: str
    chips: tuple[ChipMemoryDecl, ...]
    kv_bytes_per_token: int
    kv_split: str
    max_context: int
    lanes: int
    lane_context: int

    @classmethod
    def from_manifest(cls, m: PackageManifest) -> MemoryModel:
        return cls(
            name=m.name,
            chips=m.memory.chips,
            kv_bytes_per_token=m.kv.bytes_per_token,
            kv_split=m.kv.split,
            max_context=min(s.context for s in m.submodels) if m.submodels else m.kv.lane_context,
            lanes=m.kv.lanes,
            lane_context=m.kv.lane_context,
        )

    @classmethod
    def from_preset(cls, p: ModelPreset) -> MemoryModel:
        return cls(
            name=p.name,
            chips=p.chips,
            kv_bytes_per_token=p.kv_bytes_per_token,
            kv_split=p.kv_split,
            max_context=p.calbin_context,
            lanes=p.lanes,
            lane_context=p.calbin_context,
        )

    @property
    def kv_bytes_per_token_per_chip(self) -> int:
        return kv_bytes_per_token_per_chip(self.kv_bytes_per_token, len(self.chips), self.kv_split)


# ---------------------------------------------------------------- pure arithmetic


def kv_bytes_per_token(arch: Architecture, dtype: str) -> int:
    """Board-wide KV bytes per lane-token: layers x kv_heads x (K + V) x head_dim x dtype bytes.

    Raises:
        InvalidArgument: unknown KV dtype.
    """
    if dtype not in KV_DTYPE_BYTES:
        raise InvalidArgument(f"unknown KV dtype {dtype!r}; known: {', '.join(KV_DTYPE_BYTES)}")
    return arch.layers * arch.kv_heads * 2 * arch.head_dim * KV_DTYPE_BYTES[dtype]


def kv_bytes_per_token_per_chip(bytes_per_token: int, chips: int, split: str) -> int:
    """One chip's share of a lane-token's KV: divided over chips when split by KV head
    (rounded up: the chip holding the extra head binds), whole when replicated.

    Raises:
        InvalidArgument: unknown split or non-positive chips.
    """
    if split not in KV_SPLITS:
        raise InvalidArgument(f"unknown KV split {split!r}; known: {', '.join(KV_SPLITS)}")
    if chips <= 0:
        raise InvalidArgument(f"chips must be positive, got {chips}")
    return -(-bytes_per_token // chips) if split == "kv_heads" else bytes_per_token


def kv_bytes(per_chip_token: int, lanes: int, context: int) -> int:
    """KV bytes one chip holds for `lanes` lanes of `context` tokens."""
    return per_chip_token * lanes * context


def chip_dram_need(chip: ChipMemoryDecl, per_chip_token: int, lanes: int, context: int) -> int:
    """DRAM one chip needs: params DRAM + KV share + workspace."""
    return chip.param_dram_bytes + kv_bytes(per_chip_token, lanes, context) + chip.workspace_bytes


@dataclass(frozen=True)
class ChipPlan:
    """What the plan expects one chip to hold for a model: DRAM (params + KV share + workspace) and
    SRAM (params)."""

    chip: int
    dram: int
    sram: int


def chip_plans(model: MemoryModel, lanes: int, context: int) -> tuple[ChipPlan, ...]:
    """Per chip, in the manifest's order, the bytes `model` occupies with `lanes` lanes of `context`
    tokens: the planner's figure Status sets beside the device's measured one.

    Raises:
        InvalidArgument: unknown KV split or no chips.
    """
    per_token = model.kv_bytes_per_token_per_chip
    return tuple(
        ChipPlan(c.chip, chip_dram_need(c, per_token, lanes, context), c.param_sram_bytes) for c in model.chips
    )


# ---------------------------------------------------------------- plans


@dataclass(frozen=True)
class ChipUsage:
    """One chip under one (lanes, context) choice; `dram_headroom` < 0 means over by that much."""

    chip: int
    params_dram: int
    params_sram: int
    kv: int
    workspace: int
    dram_total: int
    dram_limit: int
    sram_limit: int

    @property
    def dram_headroom(self) -> int:
        return self.dram_limit - self.dram_total

    @property
    def sram_headroom(self) -> int:
        return self.sram_limit - self.params_sram

    @property
    def fits(self) -> bool:
        return self.dram_headroom >= 0 and self.sram_headroom >= 0


@dataclass(frozen=True)
class CapacityRow:
    """One (lanes, context) choice on every chip. `reason` says why it does not fit ("" if it does)."""

    lanes: int
    context: int
    chips: tuple[ChipUsage, ...]
    reason: str

    @property
    def fits(self) -> bool:
        return not self.reason

    @property
    def headroom(self) -> int:
        """DRAM headroom of the tightest chip (negative: over)."""
        return min(c.dram_headroom for c in self.chips)


@dataclass(frozen=True)
class CapacityPlan:
    """Rows in the order asked (lanes outer, context inner)."""

    model: str
    device: DeviceLimits
    rows: tuple[CapacityRow, ...]

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": {
                "chips": self.device.chips,
                "dram_bytes_per_chip": self.device.dram_bytes_per_chip,
                "sram_bytes_per_chip": self.device.sram_bytes_per_chip,
            },
            "fits": self.fits,
            "rows": [
                {
                    "lanes": r.lanes,
                    "context": r.context,
                    "fits": r.fits,
                    "reason": r.reason,
                    "headroom_bytes": r.headroom,
                    "chips": [
                        {
                            "chip": c.chip,
                            "params_dram_bytes": c.params_dram,
                            "params_sram_bytes": c.params_sram,
                            "kv_bytes": c.kv,
                            "workspace_bytes": c.workspace,
                            "dram_total_bytes": c.dram_total,
                            "dram_limit_bytes": c.dram_limit,
                            "dram_headroom_bytes": c.dram_headroom,
                            "sram_headroom_bytes": c.sram_headroom,
                        }
                        for c in r.chips
                    ],
                }
                for r in self.rows
            ],
        }


def _as_model(source: MemoryModel | PackageManifest | ModelPreset) -> MemoryModel:
    if isinstance(source, PackageManifest):
        return MemoryModel.from_manifest(source)
    if isinstance(source, ModelPreset):
        return MemoryModel.from_preset(source)
    return source


def _check_model(model: MemoryModel, device: DeviceLimits) -> None:
    if not model.chips:
        raise InvalidArgument(f"{model.name}: no per-chip memory figures")
    if len(model.chips) > device.chips:
        raise InvalidArgument(f"{model.name} needs {len(model.chips)} chips, the device has {device.chips}")
    if model.kv_bytes_per_token <= 0:
        raise InvalidArgument(f"{model.name}: KV bytes per token must be positive, got {model.kv_bytes_per_token}")


def _positive(what: str, values: Sequence[int]) -> None:
    if not values:
        raise InvalidArgument(f"no {what} given")
    bad = [v for v in values if v <= 0]
    if bad:
        raise InvalidArgument(f"{what} must be positive, got {bad[0]}")


def evaluate(model: MemoryModel, lanes: int, context: int, device: DeviceLimits = CALSIM_BOARD) -> CapacityRow:
    """One (lanes, context) choice.

    Raises:
        InvalidArgument: lanes or context not positive; the model needs more chips than the device has.
    """
    _positive("lanes", [lanes])
    _positive("context", [context])
    _check_model(model, device)
    per_token = model.kv_bytes_per_token_per_chip
    usages = tuple(
        ChipUsage(
            chip=c.chip,
            params_dram=c.param_dram_bytes,
            params_sram=c.param_sram_bytes,
            kv=kv_bytes(per_token, lanes, context),
            workspace=c.workspace_bytes,
            dram_total=chip_dram_need(c, per_token, lanes, context),
            dram_limit=device.dram_bytes_per_chip,
            sram_limit=device.sram_bytes_per_chip,
        )
        for c in model.chips
    )
    reasons = []
    if context > model.max_context:
        reasons.append(f"context {context:,} exceeds the calbin context {model.max_context:,}")
    reasons += [f"chip {u.chip} DRAM over by {-u.dram_headroom:,} B" for u in usages if u.dram_headroom < 0]
    reasons += [f"chip {u.chip} SRAM over by {-u.sram_headroom:,} B" for u in usages if u.sram_headroom < 0]
    return CapacityRow(lanes=lanes, context=context, chips=usages, reason="; ".join(reasons))


def plan(
    source: MemoryModel | PackageManifest | ModelPreset,
    lanes: Sequence[int],
    contexts: Sequence[int],
    device: DeviceLimits = CALSIM_BOARD,
) -> CapacityPlan:
    """Every (lanes, context) combination, lanes outer.

    Raises:
        InvalidArgument: empty or non-positive lanes/contexts; the model needs more chips than the device.
    """
    model = _as_model(source)
    _positive("lanes", lanes)
    _positive("context", contexts)
    rows = tuple(evaluate(model, n, ctx, device) for n in lanes for ctx in contexts)
    return CapacityPlan(model=model.name, device=device, rows=rows)


def _free_for_kv(model: MemoryModel, device: DeviceLimits) -> int:
    """DRAM left for KV on the tightest chip (0 when params + workspace alone do not fit)."""
    _check_model(model, device)
    if any(c.param_sram_bytes > device.sram_bytes_per_chip for c in model.chips):
        return 0
    return max(0, min(device.dram_bytes_per_chip - c.param_dram_bytes - c.workspace_bytes for c in model.chips))


def max_context_for(
    source: MemoryModel | PackageManifest | ModelPreset, lanes: int, device: DeviceLimits = CALSIM_BOARD
) -> int:
    """Longest context every one of `lanes` lanes can hold, capped at the calbin context (0: none).

    Raises:
        InvalidArgument: lanes not positive; the model needs more chips than the device.
    """
    model = _as_model(source)
    _positive("lanes", [lanes])
    return min(model.max_context, _free_for_kv(model, device) // (lanes * model.kv_bytes_per_token_per_chip))


def max_lanes_for(
    source: MemoryModel | PackageManifest | ModelPreset, context: int, device: DeviceLimits = CALSIM_BOARD
) -> int:
    """Most lanes of `context` tokens that fit (0 when the context exceeds the calbin's or nothing fits).

    Raises:
        InvalidArgument: context not positive; the model needs more chips than the device.
    """
    model = _as_model(source)
    _positive("context", [context])
    if context > model.max_context:
        return 0
    return _free_for_kv(model, device) // (context * model.kv_bytes_per_token_per_chip)
