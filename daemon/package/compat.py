"""The compatibility matrix: which Runtime x driver x firmware combinations a package runs on, and
whether it may share the board with a second configured calbin there.

Owns two questions over a `PackageManifest` and a `DeviceLimits` (pure functions, no device):
`matrix_rows` (the rows covering the device's versions; the validator's `compat.matrix` check
refuses a package with a matrix and no such row) and `co_residency_refusal` (why two resident
calbins are not allowed, or None). docs/sources.md 000 §9, §17: on CalRT 0.7.6 one calbin is
configured at a time; two resident calbins need driver 1.0.0 or later AND a matrix row for the
device's versions that says `co_resident`. A package without a matrix states nothing, so it never
shares a board.
"""

from __future__ import annotations

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.capacity import DeviceLimits
from calculet.daemon.package.manifest import CompatRow, PackageManifest
from calculet.daemon.package.versions import in_range, parse_range, parse_version

CO_RESIDENT_DRIVER = "1.0.0"  # docs/sources.md 000 §9, §17: the driver whose contract may hold two calbins


def _covers(spec: str, version: str | None) -> bool:
    """`version` is inside `spec`; a version the device does not report is not checked (as for
    `compatibility.driver`). Raises InvalidArgument for a malformed spec."""
    parse_range(spec)
    return version is None or in_range(version, spec)


def matrix_rows(manifest: PackageManifest, device: DeviceLimits) -> list[CompatRow]:
    """The matrix rows whose three ranges hold the device's versions (malformed rows never match).

    Raises:
        InvalidArgument: never for a malformed row (the validator reports those as compat.syntax).
    """
    rows = []
    for row in manifest.compatibility.matrix:
        try:
            covered = (
                _covers(row.runtime, device.runtime_version)
                and _covers(row.driver, device.driver_version)
                and _covers(row.firmware, device.firmware_version)
            )
        except InvalidArgument:
            continue
        if covered:
            rows.append(row)
    return rows


def versions_text(device: DeviceLimits) -> str:
    return (
        f"runtime {device.runtime_version}, driver {device.driver_version or 'unknown'}, "
        f"firmware {device.firmware_version or 'unknown'}"
    )


def driver_refusal(device: DeviceLimits) -> str | None:
    """Why `device`'s driver holds one configured calbin (before 1.0.0, or unknown); None if it may hold two."""
    driver = device.driver_version
    if driver is None or parse_version(driver) < parse_version(CO_RESIDENT_DRIVER):
        return f"driver {driver or 'unknown'} holds one configured calbin (two need driver >= {CO_RESIDENT_DRIVER})"
    return None


def co_residency_refusal(manifest: PackageManifest, device: DeviceLimits) -> str | None:
    """Why `manifest` may not be configured beside another calbin on `device`; None if it may.

    Returns:
        The reason, naming the version or the package's matrix that forbids it.
    """
    driver = driver_refusal(device)
    if driver is not None:
        return driver
    if not manifest.compatibility.matrix:
        return f"package {manifest.name} declares no compatibility matrix, so it never shares a board"
    if not any(row.co_resident for row in matrix_rows(manifest, device)):
        return f"package {manifest.name}'s compatibility matrix allows no co-residency on {versions_text(device)}"
    return None
