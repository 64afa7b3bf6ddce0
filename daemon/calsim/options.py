"""calsim driver options: parse the `options` mapping of `DeviceDriver.open` into `CalsimOptions`.

Data flow: `CalsimDriver.open(board, options)` -> `parse_options(options)` -> `CalsimDevice`.
Every option is checked here; an unknown key or a malformed value raises `InvalidJob` (kind
INVALID_ARGUMENT, as the `DeviceDriver.open` contract says) before any device state exists.

Options:
    profile (str, default "calrt-0.7.6"): the board calsim models (`PROFILES`): "calrt-0.7.6" holds one
        configured calbin at a time, as CalRT 0.7.6 does; "calsim-dev" holds two, for tests of a
        side-by-side reload. The options below override the profile's figures.
    time_scale (float >= 0, default 1.0): wall seconds per modelled second; 0 never sleeps.
    fault_plan (path | dict | None): see `calculet.daemon.calsim.faults`.
    dram_bytes (int > 0) / sram_bytes (int > 0): per chip (default: the profile's, 16 GiB / 18 MiB).
    max_resident_configurations (int >= 1, default: the profile's).
    kernel_factory (callable like `make_kernel`, default `make_kernel`).
    checks (bool, default True): refuse a busy bank, a held buffer or a busy lane, which a real
        runtime does not (False lets tests show `GuardedDevice` alone catches such a daemon bug).
    state_dir (path, default $CALSIM_STATE_DIR, else `calsim/` in the default runtime directory):
        where the per-board device locks live (`calculet.daemon.calsim.device_lock`).
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
class DeviceProfile:
    """The capabilities of one board model (what `info().capabilities` and the memory map declare).

    Attributes:
        max_resident_configurations: configured models (calbins) held at once.
        max_inflight: jobs in flight at once (2: ping/pong banks).
        chips / dram_bytes / sram_bytes: chips of the board and memory per chip.
    """

    name: str
    max_resident_configurations: int
    max_inflight: int = 2
    chips: int = CHIPS
    dram_bytes: int = DEFAULT_DRAM_BYTES
    sram_bytes: int = DEFAULT_SRAM_BYTES


PROFILES = {
    # Seed 001 sections 4 and 8: one calbin configured at a time, ping/pong banks, 2 chips.
    "calrt-0.7.6": DeviceProfile("calrt-0.7.6", max_resident_configurations=1),
    # Not a real board: two resident models, so tests can load a new generation beside the old one.
    "calsim-dev": DeviceProfile("calsim-dev", max_resident_configurations=2),
}
DEFAULT_PROFILE = "calrt-0.7.6"


@dataclass(frozen=True)
class CalsimOptions:
    profile: str = DEFAULT_PROFILE
    time_scale: float = 1.0
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    dram_bytes: int = DEFAULT_DRAM_BYTES
    sram_bytes: int = DEFAULT_SRAM_BYTES
    max_resident_configurations: int = PROFILES[DEFAULT_PROFILE].max_resident_configurations
    kernel_factory: KernelFactory = make_kernel
    chips: int = CHIPS
    checks: bool = True
    state_dir: Path | None = None


_KNOWN = (
    "profile",
    "time_scale",
    "fault_plan",
    "dram_bytes",
    "sram_bytes",
    "max_resident_configurations",
    "kernel_factory",
    "checks",
    "state_dir",
)


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
    name = options.get("profile", DEFAULT_PROFILE)
    if name not in PROFILES:
        raise InvalidJob(f"calsim option profile: expected one of {', '.join(PROFILES)}, got {name!r}")
    profile = PROFILES[name]
    checks = options.get("checks", True)
    if not isinstance(checks, bool):
        raise InvalidJob(f"calsim option checks: expected true or false, got {checks!r}")
    state_dir = options.get("state_dir")
    if state_dir is not None and (not isinstance(state_dir, str | Path) or not str(state_dir)):
        raise InvalidJob(f"calsim option state_dir: expected a directory path, got {state_dir!r}")
    return CalsimOptions(
        profile=name,
        time_scale=float(scale),
        fault_plan=FaultPlan.load(options.get("fault_plan")),
        dram_bytes=_positive_int(options, "dram_bytes", profile.dram_bytes, 1),
        sram_bytes=_positive_int(options, "sram_bytes", profile.sram_bytes, 1),
        max_resident_configurations=_positive_int(
            options, "max_resident_configurations", profile.max_resident_configurations, 1
        ),
        kernel_factory=factory,
        chips=profile.chips,
        checks=checks,
        state_dir=Path(state_dir) if state_dir is not None else None,
    )
