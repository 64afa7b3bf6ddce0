"""Package validation: every problem of a package directory, each with a stable code and one message.

This module owns the order of the checks and nothing else. Data flows:
raw `calculet-package.json` -> schema version -> structural check against the schema v1
dataclasses (`structure`) -> file checks on the listed files (`files`, runs whenever the
`files` section itself is well-formed) -> `PackageManifest.from_dict` -> checks of the package
against itself (`rules_model`) -> checks against the board (`rules_device`) -> `ValidationReport`.
The daemon runs it while a model is Validating (off the device thread); `calctl package validate`
prints it. Codes and their meaning: `report.CODES` and docs/package.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calculet.daemon.errors import InvalidArgument, NotFound
from calculet.daemon.package.capacity import CALSIM_BOARD, DeviceLimits
from calculet.daemon.package.files import FileChecker
from calculet.daemon.package.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    FileEntry,
    ManifestError,
    PackageManifest,
)
from calculet.daemon.package.report import Findings, Severity, ValidationReport
from calculet.daemon.package.rules_device import DeviceRules
from calculet.daemon.package.rules_model import ModelRules
from calculet.daemon.package.structure import StructureChecker

__all__ = ["CALSIM_BOARD", "DeviceLimits", "ValidationReport", "validate_package"]


def _read_raw(root: Path, findings: Findings) -> dict[str, Any] | None:
    path = root / MANIFEST_NAME
    if not path.is_file():
        findings.add("manifest.missing", MANIFEST_NAME, f"{MANIFEST_NAME} not found in {root}")
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        findings.add("manifest.unreadable", MANIFEST_NAME, f"cannot read: {exc}")
        return None
    except json.JSONDecodeError as exc:
        findings.add("manifest.unreadable", MANIFEST_NAME, f"not valid JSON: {exc.msg} at line {exc.lineno}")
        return None
    if not isinstance(raw, dict):
        findings.add("manifest.unreadable", MANIFEST_NAME, "the top level must be a JSON object")
        return None
    return raw


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


def _section_ok(findings: Findings, where: str) -> bool:
    return not any(
        p.severity is Severity.ERROR and (p.where == where or p.where.startswith((f"{where}.", f"{where}[")))
        for p in findings.problems
    )


def validate_package(
    package_dir: str | Path, device: DeviceLimits | None = None, *, verify_hashes: bool = True
) -> ValidationReport:
    """Check a package directory and report every problem found.

    Args:
        package_dir: the package directory (holding `calculet-package.json`).
        device: the board to check against; default the calsim board (2 chips x 16 GiB DRAM,
            18 MiB SRAM, runtime 0.7.6).
        verify_hashes: SHA-256 every listed file (default); False checks sizes only.

    Returns:
        The report; `report.ok` is False when any error was found. Package defects never raise.

    Raises:
        NotFound: `package_dir` does not exist.
        InvalidArgument: `package_dir` is not a directory.
    """
    given = Path(package_dir)
    if not given.exists():
        raise NotFound(f"package directory {given} does not exist")
    if not given.is_dir():
        raise InvalidArgument(f"package path {given} is not a directory")
    root = given.resolve()
    device = device or CALSIM_BOARD
    findings = Findings()
    manifest: PackageManifest | None = None
    raw = _read_raw(root, findings)
    if raw is not None and _version_readable(raw, findings):
        StructureChecker(findings).check_manifest(raw)
        if _section_ok(findings, "manifest.files"):
            entries = [FileEntry(e["path"], e["size"], e["sha256"], e["role"]) for e in raw["files"]]
            FileChecker(root, findings, verify_hashes).check(entries)
        if not findings.has("schema."):
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
