"""Package validation: every problem of a package directory, each with a stable code and one message.

This module owns the order of the checks and nothing else. Data flows: package root (a symlink
loop is reported, not raised) -> raw `calculet-package.json` (`manifest.read_manifest_json`:
kind, size, depth and text checked before anything trusts it; a symlinked manifest must resolve
inside the package) -> schema version -> timing form (the retired linear decode model stops here
like an unknown version) -> structural check against the schema v1 dataclasses
(`structure`) -> file checks on the listed files (`files`, runs whenever the `files` section
itself is well-formed; hashing reports its bytes through `on_bytes`, throttled by
`byte_progress.ByteThrottle`) -> `PackageManifest.from_dict` (skipped after a structural error or a
number no field can hold) -> checks of the package against itself (`rules_model`) -> checks
against the board (`rules_device`) -> `ValidationReport`.
The daemon runs it while a model is Validating (off the device thread); `calctl package validate`
prints it. Codes and their meaning: `report.CODES` and docs/package.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calculet.common.errors import InvalidArgument, NotFound
from calculet.daemon.package.byte_progress import BytesFn, ByteThrottle
from calculet.daemon.package.capacity import CALSIM_BOARD, DeviceLimits
from calculet.daemon.package.files import FileChecker, resolve_inside
from calculet.daemon.package.fs import is_symlink_loop
from calculet.daemon.package.manifest import (
    LEGACY_TIMING_FIELDS,
    LEGACY_TIMING_MESSAGE,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    FileEntry,
    ManifestError,
    PackageManifest,
    read_manifest_json,
)
from calculet.daemon.package.report import Findings, Severity, ValidationReport
from calculet.daemon.package.rules_device import DeviceRules
from calculet.daemon.package.rules_model import ModelRules
from calculet.daemon.package.structure import StructureChecker

__all__ = ["CALSIM_BOARD", "BytesFn", "DeviceLimits", "ValidationReport", "validate_package"]


def _read_raw(root: Path, findings: Findings) -> dict[str, Any] | None:
    """The manifest's JSON object, or None with its problem added to `findings`."""
    path = root / MANIFEST_NAME
    if path.is_symlink() and not is_symlink_loop(path) and resolve_inside(root, MANIFEST_NAME) is None:
        findings.add(
            "file.path_escape", MANIFEST_NAME, f"{MANIFEST_NAME} is a symlink that resolves outside the package"
        )
        return None
    try:
        return read_manifest_json(root)
    except ManifestError as exc:
        findings.add(exc.code, MANIFEST_NAME, str(exc))
        return None


def _version_readable(raw: dict[str, Any], findings: Findings) -> bool:
    """False when the manifest declares a schema version this build cannot interpret."""
    version = raw.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        findings.add(
            "schema.version",
            "manifest.schema_version",
            f"version {version} is unknown; this build reads {SCHEMA_VERSION}",
        )
        return False
    return True


def _timing_form_readable(raw: dict[str, Any], findings: Findings) -> bool:
    """False when the timing section is the retired linear decode model (no `decode_curve`, some of
    `LEGACY_TIMING_FIELDS`): refused like an unknown schema version, one error and nothing else,
    since the package must be rebuilt anyway."""
    timing = raw.get("timing")
    if isinstance(timing, dict) and "decode_curve" not in timing and any(k in timing for k in LEGACY_TIMING_FIELDS):
        findings.add("timing.legacy_line", "manifest.timing", LEGACY_TIMING_MESSAGE)
        return False
    return True


def _section_ok(findings: Findings, where: str) -> bool:
    return not any(
        p.severity is Severity.ERROR and (p.where == where or p.where.startswith((f"{where}.", f"{where}[")))
        for p in findings.problems
    )


def validate_package(
    package_dir: str | Path,
    device: DeviceLimits | None = None,
    *,
    verify_hashes: bool = True,
    on_bytes: BytesFn | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ValidationReport:
    """Check a package directory and report every problem found.

    Args:
        package_dir: the package directory (holding `calculet-package.json`).
        device: the board to check against; default the calsim board (2 chips x 16 GiB DRAM,
            18 MiB SRAM, runtime 0.7.6).
        verify_hashes: SHA-256 every listed file (default); False checks sizes only.
        on_bytes: called with `(bytes hashed, bytes to hash)` while hashing: first `(0, total)`, then
            at most once per 1 % of the total and per 0.25 s of `clock` (whichever comes later),
            last `(total, total)`; total is the manifest sizes of the files that pass the path,
            kind and size checks. Never called when nothing is hashed (or `verify_hashes` is False).
        clock: monotonic seconds for that throttle (tests pass their own).

    Returns:
        The report; `report.ok` is False when any error was found. Package defects never raise;
        a `package_dir` that is a symlink loop is one (file.symlink_loop).

    Raises:
        NotFound: `package_dir` does not exist.
        InvalidArgument: `package_dir` is not a directory.
    """
    given = Path(package_dir)
    findings = Findings()
    if is_symlink_loop(given):
        findings.add("file.symlink_loop", ".", f"the package path {given.name} is a symlink loop")
        return ValidationReport(package_dir=str(given), problems=tuple(findings.problems))
    if not given.exists():
        raise NotFound(f"package directory {given} does not exist")
    if not given.is_dir():
        raise InvalidArgument(f"package path {given} is not a directory")
    root = given.resolve()
    device = device or CALSIM_BOARD
    manifest: PackageManifest | None = None
    raw = _read_raw(root, findings)
    if raw is not None and _version_readable(raw, findings) and _timing_form_readable(raw, findings):
        structure = StructureChecker(findings)
        structure.check_manifest(raw)
        if _section_ok(findings, "manifest.files"):
            entries = [FileEntry(e["path"], e["size"], e["sha256"], e["role"]) for e in raw["files"]]
            throttle = ByteThrottle(on_bytes, clock=clock) if on_bytes is not None else None
            FileChecker(root, findings, verify_hashes, throttle).check(entries)
        if not findings.has("schema.") and not structure.unrepresentable:
            manifest = _parse(raw, findings)
        if manifest is not None:
            ModelRules(manifest, findings, root).run()
            DeviceRules(manifest, device, findings).run()
    return ValidationReport(package_dir=str(given), problems=tuple(findings.problems), manifest=manifest)


def _parse(raw: dict[str, Any], findings: Findings) -> PackageManifest | None:
    try:
        return PackageManifest.from_dict(raw)
    except ManifestError as exc:  # the structural walk should have caught it; report, do not hide
        findings.add("schema.wrong_type", "manifest", str(exc))
        return None
