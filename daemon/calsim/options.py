"""calsim driver options: parse the `options` mapping of `DeviceDriver.open` into `CalsimOptions`.

Data flow: `CalsimDriver.open(board, options)` -> `parse_options(options)` -> `CalsimDevice`.
Every option is checked here; an unknown key or a malformed value raises `InvalidJob` (kind
INVALID_ARGUMENT, as the `DeviceDriver.open` contract says) before any device state exists.

Options:
    profile (str, default "calrt-0.7.6"): the board calsim models (`PROFILES`): "calrt-0.7.6" holds one
        configured calbin at a time, as CalRT 0.7.6 does; "calrt-1.0.0" (driver 1.0.0) and
        "calsim-dev" (not a real board, for tests of a side-by-side reload) hold two. The options
        below override the profile's figures.
    release_leak_bytes (int >= 0, default 0): a fault: each release leaves this many DRAM bytes of
        every chip the model used held (at most what it held there) until a configuration reset,
        as a runtime that leaks on unload would (docs/sources.md 000 §10.3: unload must verify).
    driver_version / firmware_version (str, dotted integers, an optional `-suffix`; default: the
        profile's): what `info()` reports. A driver before 1.0.0 holds one configured calbin
        whatever the profile says (docs/sources.md 000 §9).
    time_scale (float >= 0, default 1.0): wall seconds per modelled second; 0 never sleeps.
    configure_time_scale (float >= 0, default: time_scale): the same for a configure's modelled
        switch cost (`switch_cost`), so a test may pace jobs slowly and still configure at once.
    fault_plan (path | dict | None): see `calculet.daemon.calsim.faults`.
    dram_bytes (int > 0) / sram_bytes (int > 0): per chip (default: the profile's, 16 GiB / 18 MiB).
    max_resident_configurations (int >= 1, default: the profile's).
    kernel_factory (callable like `make_kernel`, default `make_kernel`).
    checks (bool, default True): refuse a busy bank, a held buffer or a busy lane, which a real
        runtime does not (False lets tests show `GuardedDevice` alone catches such a daemon bug).
    lane_selection (bool, default True): a row may name any KV lane. False models a calbin with
        fixed slots (docs/sources.md 000 §6.2): row i of a decode job is slot i, calsim refuses any
        other row (`RowOffSlot`, `device/slots.py`) and a job moves all B rows of its compiled batch.
    inactive_rows ("only_valid" | "all", default "only_valid"): with fixed slots, how a job names its
        idle rows, modelled on the runtime's KV layouts `ONLY_VALID` / `ALL` (000 §6.3,
        `InactiveRows`).
    prefill_ignores_offset (bool, default False): a fault: every prefill runs as if its lane were
        empty (`past_kv_len` ignored, `offset_blind.py`), as a calbin without the incremental
        semantics would, silently; the load's offset check must catch it (docs/daemon.md, "Prefill
        at an offset").
    state_dir (path, default $CALSIM_STATE_DIR, else `calsim/` in the default runtime directory):
        where the per-board device locks live (`calculet.daemon.calsim.device_lock`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calculet.daemon.calsim.faults import FaultPlan
from calculet.daemon.calsim.kernel import Kernel, make_kernel
from calculet.daemon.calsim.memory import GiB, MiB
from calculet.daemon.device.errors import InvalidJob
from calculet.daemon.device.types import InactiveRows
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
    driver_version: str = "0.7.6-calsim"
    firmware_version: str = "0.7.6-calsim"


PROFILES = {
    # docs/sources.md 001 §4, §8: one calbin configured at a time, ping/pong banks, 2 chips.
    "calrt-0.7.6": DeviceProfile("calrt-0.7.6", max_resident_configurations=1),
    # docs/sources.md 000 §9, §17: the 1.0.0 driver whose contract may hold two calbins (chip 0 runs
    # A and chip 1 runs B, or two that fit in memory). Not released yet; calsim assumes its shape.
    "calrt-1.0.0": DeviceProfile(
        "calrt-1.0.0", max_resident_configurations=2, driver_version="1.0.0-calsim", firmware_version="1.0.0-calsim"
    ),
    # Not a real board: two resident models, so tests can load a new generation beside the old one.
    "calsim-dev": DeviceProfile(
        "calsim-dev", max_resident_configurations=2, driver_version="1.0.0-calsim", firmware_version="1.0.0-calsim"
    ),
}
CO_RESIDENT_DRIVER = (1, 0, 0)  # docs/sources.md 000 §9, §17: an older driver holds one calbin
DEFAULT_PROFILE = "calrt-0.7.6"


@dataclass(frozen=True)
class CalsimOptions:
    profile: str = DEFAULT_PROFILE
    time_scale: float = 1.0
    configure_time_scale: float = 1.0
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    dram_bytes: int = DEFAULT_DRAM_BYTES
    sram_bytes: int = DEFAULT_SRAM_BYTES
    max_resident_configurations: int = PROFILES[DEFAULT_PROFILE].max_resident_configurations
    kernel_factory: KernelFactory = make_kernel
    chips: int = CHIPS
    checks: bool = True
    state_dir: Path | None = None
    driver_version: str = PROFILES[DEFAULT_PROFILE].driver_version
    firmware_version: str = PROFILES[DEFAULT_PROFILE].firmware_version
    release_leak_bytes: int = 0
    lane_selection: bool = True
    inactive_rows: InactiveRows = InactiveRows.ONLY_VALID
    prefill_ignores_offset: bool = False


_KNOWN = (
    "profile",
    "time_scale",
    "configure_time_scale",
    "fault_plan",
    "dram_bytes",
    "sram_bytes",
    "max_resident_configurations",
    "kernel_factory",
    "checks",
    "state_dir",
    "driver_version",
    "firmware_version",
    "release_leak_bytes",
    "lane_selection",
    "inactive_rows",
    "prefill_ignores_offset",
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
    scale = _scale(options, "time_scale", 1.0)
    configure_scale = _scale(options, "configure_time_scale", scale)
    factory = options.get("kernel_factory", make_kernel)
    if not callable(factory):
        raise InvalidJob(f"calsim option kernel_factory: expected a callable, got {factory!r}")
    name = options.get("profile", DEFAULT_PROFILE)
    if name not in PROFILES:
        raise InvalidJob(f"calsim option profile: expected one of {', '.join(PROFILES)}, got {name!r}")
    profile = PROFILES[name]
    checks = _switch(options, "checks", True)
    ignores_offset = _switch(options, "prefill_ignores_offset", False)
    lane_selection = _switch(options, "lane_selection", True)
    inactive = options.get("inactive_rows", InactiveRows.ONLY_VALID.value)
    if not isinstance(inactive, str) or inactive.lower() not in {r.value for r in InactiveRows}:
        raise InvalidJob(f"calsim option inactive_rows: expected only_valid or all, got {inactive!r:.80}")
    state_dir = options.get("state_dir")
    if state_dir is not None and (not isinstance(state_dir, str | Path) or not str(state_dir)):
        raise InvalidJob(f"calsim option state_dir: expected a directory path, got {state_dir!r}")
    driver = _version(options, "driver_version", profile.driver_version)
    firmware = _version(options, "firmware_version", profile.firmware_version)
    resident = _positive_int(options, "max_resident_configurations", profile.max_resident_configurations, 1)
    if release_part(driver) < CO_RESIDENT_DRIVER:
        resident = 1
    return CalsimOptions(
        profile=name,
        time_scale=scale,
        configure_time_scale=configure_scale,
        fault_plan=FaultPlan.load(options.get("fault_plan")),
        dram_bytes=_positive_int(options, "dram_bytes", profile.dram_bytes, 1),
        sram_bytes=_positive_int(options, "sram_bytes", profile.sram_bytes, 1),
        max_resident_configurations=resident,
        kernel_factory=factory,
        chips=profile.chips,
        checks=checks,
        state_dir=Path(state_dir) if state_dir is not None else None,
        driver_version=driver,
        firmware_version=firmware,
        release_leak_bytes=_positive_int(options, "release_leak_bytes", 0, 0),
        prefill_ignores_offset=ignores_offset,
        lane_selection=lane_selection,
        inactive_rows=InactiveRows(inactive.lower()),
    )


def _switch(options: Mapping[str, Any], key: str, default: bool) -> bool:
    """Raises: InvalidJob unless the value is true or false."""
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise InvalidJob(f"calsim option {key}: expected true or false, got {value!r}")
    return value


def _scale(options: Mapping[str, Any], key: str, default: float) -> float:
    """Raises: InvalidJob unless the value is a finite number >= 0."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidJob(f"calsim option {key}: expected a finite number >= 0, got {value!r}")
    return float(value)


_VERSION = re.compile(r"(\d+(?:\.\d+){0,3})(?:[-+][A-Za-z0-9.+-]{1,64})?")


def _version(options: Mapping[str, Any], key: str, default: str) -> str:
    """Raises: InvalidJob unless the value is a version like `1.0.0` or `1.0.0-calsim`."""
    value = options.get(key, default)
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise InvalidJob(f"calsim option {key}: expected a version like 1.0.0 or 1.0.0-calsim, got {value!r:.80}")
    return value


def release_part(version: str) -> tuple[int, ...]:
    """`"1.0.0-calsim"` -> `(1, 0, 0)` (the version was checked by `_version`)."""
    return tuple(int(p) for p in re.split(r"[-+]", version, maxsplit=1)[0].split("."))
