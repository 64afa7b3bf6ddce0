"""calsim driver options: parse the `options` mapping of `DeviceDriver.open` into `CalsimOptions`.

Data flow: `CalsimDriver.open(board, options)` -> `parse_options(options)` -> `CalsimDevice`.
Every option is checked here; an unknown key or a malformed value raises `InvalidJob` (kind
INVALID_ARGUMENT, as the `DeviceDriver.open` contract says) before any device state exists.

Options:
    time_scale (float >= 0, default 1.0): wall seconds per modelled second; 0 never sleeps.
    fault_plan (path | dict | None): see `calculet.daemon.calsim.faults`.
    dram_bytes (int > 0, default 16 GiB) / sram_bytes (int > 0, default 18 MiB): per chip.
    max_resident_configurations (int >= 1, default 2).
    kernel_factory (callable like `make_kernel`, default `make_kernel`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calculet.daemon.calsim.faults import FaultPlan
from calculet.daemon.calsim.kernel import Kernel, make_kernel
from calculet.daemon.calsim.memory import GiB, MiB
from calculet.daemon.device.errors import InvalidJob
from calculet.daemon.package.manifest import PackageManifest

KernelFactory = Callable[[PackageManifest, Path, int, int], Kernel]

CHIPS = 2
DEFAULT_DRAM_BYTES = 16 * GiB
DEFAULT_SRAM_BYTES = 18 * MiB


@dataclass(frozen=True)
class CalsimOptions:
    time_scale: float = 1.0
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    dram_bytes: int = DEFAULT_DRAM_BYTES
    sram_bytes: int = DEFAULT_SRAM_BYTES
    max_resident_configurations: int = 2
    kernel_factory: KernelFactory = make_kernel
    chips: int = CHIPS


_KNOWN = ("time_scale", "fault_plan", "dram_bytes", "sram_bytes", "max_resident_configurations", "kernel_factory")


def _positive_int(options: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidJob(f"calsim option {key}: expected an integer >= {minimum}, got {value!r}")
    return value


def parse_options(options: Mapping[str, Any]) -> CalsimOptions:
    """Validate and convert driver options.

    Raises:
        InvalidJob: unknown option, or a value of the wrong type or range (including a malformed
            or unreadable fault plan).
    """
    unknown = sorted(set(options) - set(_KNOWN))
    if unknown:
        raise InvalidJob(f"unknown calsim options {unknown}; known: {', '.join(_KNOWN)}")
    scale = options.get("time_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale < 0:
        raise InvalidJob(f"calsim option time_scale: expected a finite number >= 0, got {scale!r}")
    factory = options.get("kernel_factory", make_kernel)
    if not callable(factory):
        raise InvalidJob(f"calsim option kernel_factory: expected a callable, got {factory!r}")
    return CalsimOptions(
        time_scale=float(scale),
        fault_plan=FaultPlan.load(options.get("fault_plan")),
        dram_bytes=_positive_int(options, "dram_bytes", DEFAULT_DRAM_BYTES, 1),
        sram_bytes=_positive_int(options, "sram_bytes", DEFAULT_SRAM_BYTES, 1),
        max_resident_configurations=_positive_int(options, "max_resident_configurations", 2, 1),
        kernel_factory=factory,
    )
