"""Validation findings: the code catalogue, `Problem`, the `Findings` collector and `ValidationReport`.

This module owns the vocabulary of package validation. Every check in `validate`, `files`,
`structure`, `rules_model` and `rules_device` adds findings through a `Findings` collector by
stable code; the code fixes the severity (catalogue `CODES`, documented in docs/package.md).
`validate_package` freezes the collector into a `ValidationReport`, which renders as text (one
line per problem, then a summary) or JSON, and converts into a typed `PackageInvalid` error for
callers that must refuse an invalid package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from calculet.common.errors import FailedPrecondition
from calculet.daemon.package.manifest import PackageManifest


class Severity(Enum):
    ERROR = "error"  # the package must not be loaded
    WARNING = "warning"  # loadable; something is adjusted or suspicious


E, W = Severity.ERROR, Severity.WARNING

# code -> (severity, what it means). Stable: tools and docs match on these strings.
CODES: dict[str, tuple[Severity, str]] = {
    "manifest.missing": (E, "calculet-package.json is absent"),
    "manifest.unreadable": (E, "the manifest cannot be read, is not UTF-8 JSON text, or is not a JSON object"),
    "manifest.not_regular": (E, "the manifest is a directory, FIFO, device node or socket"),
    "manifest.too_large": (E, "the manifest is over the size cap; refused before parsing"),
    "manifest.too_deep": (E, "the manifest's JSON nests deeper than the depth cap"),
    "schema.version": (E, "schema_version is not one this build reads"),
    "schema.missing_field": (E, "a required field is absent"),
    "schema.wrong_type": (E, "a field has the wrong JSON type"),
    "schema.unknown_field": (W, "a field schema v1 does not define (a typo?); ignored"),
    "file.missing": (E, "a listed file is not in the package"),
    "file.not_regular": (E, "a listed path is a directory or special file"),
    "file.unreadable": (E, "a listed file exists but cannot be read (permissions, I/O error)"),
    "file.extra": (E, "a file in the package directory is not listed in the manifest"),
    "file.size": (E, "a file's size differs from the manifest (oversized or truncated)"),
    "file.hash": (E, "a file's SHA-256 differs from the manifest, or the digest is malformed"),
    "file.path_escape": (E, "a path leaves the package: '..', absolute, or a symlink pointing outside"),
    "file.duplicate": (E, "two file entries name the same path"),
    "file.symlink_loop": (E, "a listed path, a folder on it, the manifest or the package root is a symlink loop"),
    "value.range": (E, "a count or figure outside its allowed range (non-positive size, ...)"),
    "arch.invalid": (E, "architecture figures contradict each other"),
    "kernel.unknown": (E, "kernel is not one calsim implements"),
    "submodel.duplicate_name": (E, "two submodels share a name"),
    "submodel.role_unknown": (E, "a submodel role is neither prefill nor decode"),
    "submodel.role_missing": (E, "no prefill or no decode submodel"),
    "submodel.ambiguous": (E, "two submodels of one role have the same batch and token bucket"),
    "submodel.mislabelled": (E, "the vendor smodel_type names the other role, and the I/O does not settle which"),
    "submodel.label_ignored": (W, "the vendor smodel_type names the other role; the I/O confirms the role, kept"),
    "submodel.smodel_type_unknown": (W, "the vendor smodel_type is not a known label"),
    "submodel.offset_role": (E, "prefill_at_offset is declared on a decode submodel (it describes a prefill)"),
    "submodel.io": (E, "a required tensor (tokens, positions, the logits output mode's) is missing or repeated"),
    "logits.output": (E, "logits_output: an unknown mode, or a top-k width outside 1..vocab"),
    "submodel.shape": (E, "a tensor shape does not match the role, batch, bucket or vocab"),
    "submodel.dtype": (E, "a tensor dtype is wrong for its role or unknown"),
    "context.bucket": (E, "a prefill bucket is longer than its submodel's context"),
    "context.lane": (E, "the KV lane context is longer than the calbin (submodel) context"),
    "context.mismatch": (W, "submodels disagree on context; the smallest one applies"),
    "kv.dtype": (E, "the KV dtype is unknown"),
    "kv.split": (E, "the KV split is unknown or KV heads do not divide over the chips"),
    "kv.bytes_per_token": (
        E,
        "KV bytes per token differ from layers x kv_heads x 2 x head_dim x dtype bytes",
    ),
    "kv.lanes_below_batch": (W, "a decode batch needs more lanes than the KV declares"),
    "timing.legacy_line": (E, "timing declares the retired linear decode model instead of decode_curve; rebuild"),
    "timing.curve_points": (E, "the decode curve has fewer than 2 points (or more than the cap)"),
    "timing.curve_order": (E, "decode curve contexts are not strictly increasing (unsorted or repeated)"),
    "timing.curve_monotonic": (E, "the decode curve gets faster as the context grows"),
    "timing.curve_coverage": (E, "the decode curve's last point is below the package context"),
    "tokenizer.max_length_clamped": (W, "tokenizer model_max_length exceeds the context; clamped"),
    "tokenizer.token_range": (E, "an EOS/BOS/PAD id is negative or not below the vocab size"),
    "tokenizer.eos_missing": (E, "no EOS token id"),
    "tokenizer.path": (E, "the tokenizer file is not one of the listed files"),
    "tokenizer.chat_template": (E, "the chat template is not valid Jinja2"),
    "golden.token_range": (E, "a golden token is negative or not below the vocab size"),
    "golden.inconsistent": (E, "golden prompt/top/decode contradict each other or the buckets"),
    "topology.mismatch": (E, "chip count, chip masks and per-chip memory entries disagree"),
    "topology.parallelism": (E, "parallelism is not tp, ep, pp or tp+ep on several chips, or none on one"),
    "topology.parallelism_legacy": (W, "parallelism is the old spelling 'tensor'; read as 'tp'"),
    "topology.d2d": (E, "cross-chip (D2D) traffic is declared for a package on one chip"),
    "device.chips": (E, "the package needs more chips than the device has"),
    "memory.negative": (E, "a memory figure is negative"),
    "memory.required_impossible": (
        E,
        "device_memory_required_bytes exceeds the whole board and the per-chip figures' sum (a unit error?)",
    ),
    "memory.inconsistent": (E, "per-chip figures do not add up (to the required figure or the params files)"),
    "capacity.dram": (E, "params + KV + workspace exceed a chip's DRAM"),
    "capacity.sram": (E, "params SRAM exceeds a chip's SRAM"),
    "compat.syntax": (E, "a compatibility range is not `>=A,<B` style over dotted integers"),
    "compat.runtime": (E, "the device runtime version is outside compatibility.runtime"),
    "compat.driver": (E, "the device driver version is outside compatibility.driver"),
    "compat.matrix": (E, "the compatibility matrix has no row for the device's runtime, driver and firmware"),
}


@dataclass(frozen=True)
class Problem:
    """One finding.

    Attributes:
        code: stable code from `CODES`.
        severity: fixed by the code.
        where: JSON path in the manifest (`manifest.submodels[0].inputs[1]`) or a package-relative path.
        message: one sentence an operator can act on.
    """

    code: str
    severity: Severity
    where: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "where": self.where,
            "message": self.message,
        }


class Findings:
    """Mutable collector the checks append to; owned by one `validate_package` call."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, code: str, where: str, message: str) -> None:
        """Record one problem; the severity comes from the catalogue.

        Raises:
            KeyError: `code` is not in `CODES` (a bug in a check, never a package defect).
        """
        severity, _ = CODES[code]
        self.problems.append(Problem(code, severity, where, message))

    def has(self, *prefixes: str) -> bool:
        """Whether an error whose code starts with one of `prefixes` was recorded."""
        return any(p.severity is E and p.code.startswith(prefixes) for p in self.problems)


class PackageInvalid(FailedPrecondition):
    """A package failed validation; `report` holds every problem."""

    def __init__(self, report: ValidationReport) -> None:
        super().__init__(f"package {report.package_dir} is invalid: {report.headline()}")
        self.report = report


@dataclass(frozen=True)
class ValidationReport:
    """Everything found in one package. `manifest` is the parsed manifest when it parsed, else None."""

    package_dir: str
    problems: tuple[Problem, ...]
    manifest: PackageManifest | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def codes(self) -> list[str]:
        return [p.code for p in self.problems]

    def raise_if_invalid(self) -> None:
        """Raises:
        PackageInvalid: the report has at least one error."""
        if not self.ok:
            raise PackageInvalid(self)

    def headline(self, count: int = 3, width: int = 300) -> str:
        """The first `count` errors as `code (where): message` (each cut to `width` characters), then
        how many more: bounded however many problems a package has, for error messages on the wire."""
        errors = self.errors
        head = "; ".join(_cut(f"{p.code} ({p.where}): {p.message}", width) for p in errors[:count])
        return head + (f" (+{len(errors) - count} more)" if len(errors) > count else "")

    def summary(self) -> str:
        verdict = "valid" if self.ok else "INVALID"
        return f"{self.package_dir}: {verdict} ({len(self.errors)} error(s), {len(self.warnings)} warning(s))"

    def render_text(self) -> str:
        """One line per problem (errors first), then the summary line."""
        ordered = self.errors + self.warnings
        lines = [f"{p.severity.value:<7} {p.code:<28} {p.where}: {p.message}" for p in ordered]
        return "\n".join([*lines, self.summary()])

    def to_dict(self) -> dict[str, Any]:
        return {
            "package": self.package_dir,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [p.to_dict() for p in self.problems],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
