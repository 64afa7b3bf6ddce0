"""Checks of a parsed manifest against a board: chips, memory figures, capacity, compatibility.

This module owns the question "can this package run on this device?". `DeviceRules.run` reads a
`PackageManifest` and a `DeviceLimits` and appends findings to the caller's `Findings`. Memory
arithmetic comes from `capacity` (the same functions `calctl capacity` prints). Checks that
would only repeat an earlier defect are skipped: capacity is not computed over negative figures,
unknown KV layouts or a chip topology that does not add up.
"""

from __future__ import annotations

import posixpath

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.capacity import DeviceLimits, MemoryModel, chip_dram_need, kv_bytes
from calculet.daemon.package.compat import matrix_rows, versions_text
from calculet.daemon.package.manifest import PackageManifest
from calculet.daemon.package.report import Findings
from calculet.daemon.package.versions import in_range, parse_range

GIB = float(1 << 30)


def _gib(n: int) -> str:
    return f"{n:,} B ({n / GIB:.3f} GiB)"


class DeviceRules:
    """Checks one manifest against one device.

    Args:
        manifest: the parsed manifest.
        device: the board's limits.
        findings: collector owned by the caller (already holding the model findings).
    """

    def __init__(self, manifest: PackageManifest, device: DeviceLimits, findings: Findings) -> None:
        self.m = manifest
        self.d = device
        self.f = findings

    def run(self) -> None:
        kinds = self.d.kernel_kinds
        if kinds and self.m.kernel and self.m.kernel not in kinds:
            self.f.add(
                "kernel.unknown",
                "manifest.kernel",
                f"{self.m.kernel!r} is not a kernel this device's driver configures ({', '.join(kinds)})",
            )
        self.compatibility()
        if self.m.topology.chips > self.d.chips:
            self.f.add(
                "device.chips",
                "manifest.topology.chips",
                f"the package needs {self.m.topology.chips} chips, the device has {self.d.chips}",
            )
        self.memory_negatives()
        need = self._board_need() if self._sums_meaningful() else None
        self.required_figure(need)
        if need is not None:
            self.params_files()
            self.capacity()

    def _sums_meaningful(self) -> bool:
        """Capacity over negative figures, an unknown KV layout or a broken topology would only
        restate those defects."""
        kv = self.m.kv
        positive = min(kv.lanes, kv.lane_context, kv.bytes_per_token, self.m.topology.chips) > 0
        return (
            positive and bool(self.m.memory.chips) and not self.f.has("memory.negative", "topology.", "device.", "kv.")
        )

    def compatibility(self) -> None:
        c = self.m.compatibility
        for field, device_version in (("runtime", self.d.runtime_version), ("driver", self.d.driver_version)):
            spec = getattr(c, field)
            where = f"manifest.compatibility.{field}"
            try:
                parse_range(spec)
            except InvalidArgument as exc:
                self.f.add("compat.syntax", where, str(exc))
                continue
            if device_version is not None and not in_range(device_version, spec):
                self.f.add(f"compat.{field}", where, f"device {field} {device_version} is outside {spec!r}")
        self.matrix()

    def matrix(self) -> None:
        """Every row's ranges parse; a package with a matrix has a row for the device's versions."""
        rows = self.m.compatibility.matrix
        malformed = False
        for i, row in enumerate(rows):
            for name in ("runtime", "driver", "firmware"):
                try:
                    parse_range(getattr(row, name))
                except InvalidArgument as exc:
                    malformed = True
                    self.f.add("compat.syntax", f"manifest.compatibility.matrix[{i}].{name}", str(exc))
        if rows and not malformed and not matrix_rows(self.m, self.d):
            self.f.add(
                "compat.matrix",
                "manifest.compatibility.matrix",
                f"no row of the compatibility matrix covers this device ({versions_text(self.d)})",
            )

    def memory_negatives(self) -> None:
        mem = self.m.memory
        for i, c in enumerate(mem.chips):
            for name in ("param_dram_bytes", "param_sram_bytes", "workspace_bytes"):
                if getattr(c, name) < 0:
                    self.f.add("memory.negative", f"manifest.memory.chips[{i}].{name}", f"{getattr(c, name):,} B")
        if mem.device_memory_required_bytes < 0:
            self.f.add(
                "memory.negative",
                "manifest.memory.device_memory_required_bytes",
                f"{mem.device_memory_required_bytes:,} B",
            )

    def _board_need(self) -> int:
        """Sum over chips of params DRAM + workspace + KV share for the declared lanes x lane context."""
        m = self.m
        per_token = MemoryModel.from_manifest(m).kv_bytes_per_token_per_chip
        return sum(chip_dram_need(c, per_token, m.kv.lanes, m.kv.lane_context) for c in m.memory.chips)

    def required_figure(self, need: int | None) -> None:
        """The vendor's board-wide figure must cover the per-chip parts (`need`, None when they are
        broken) and, unless the parts explain it, fit the board: a figure above both is a unit error
        (docs/sources.md 003 §7: `16777216 MB`). Parts that overflow a chip are `capacity.dram`."""
        m, req, board = self.m, self.m.memory.device_memory_required_bytes, self.d.board_dram_bytes
        if req < 0:
            return
        if need is not None and req < need:
            self.f.add(
                "memory.inconsistent",
                "manifest.memory.device_memory_required_bytes",
                f"{_gib(req)} is less than the per-chip figures add up to: params DRAM + workspace + KV for"
                f" {m.kv.lanes} lane(s) x {m.kv.lane_context:,} tokens = {_gib(need)}",
            )
        elif req > board and (need is None or req > need):
            self.f.add(
                "memory.required_impossible",
                "manifest.memory.device_memory_required_bytes",
                f"{_gib(req)} exceeds the whole board's DRAM {_gib(board)} ({self.d.chips} chips)"
                + ("" if need is None else f" and the per-chip figures' sum {_gib(need)}")
                + "; a unit error?",
            )

    def params_files(self) -> None:
        """A `params` file `param_blk{N}.bin` holds chip N's DRAM and SRAM params, exactly."""
        m = self.m
        sizes = {posixpath.basename(e.path): e.size for e in m.files if e.role == "params"}
        for i, c in enumerate(m.memory.chips):
            size = sizes.get(f"param_blk{c.chip}.bin")
            if size is not None and size != c.param_dram_bytes + c.param_sram_bytes:
                self.f.add(
                    "memory.inconsistent",
                    f"manifest.memory.chips[{i}]",
                    f"param_blk{c.chip}.bin is {size:,} B but params DRAM {c.param_dram_bytes:,} + SRAM"
                    f" {c.param_sram_bytes:,} = {c.param_dram_bytes + c.param_sram_bytes:,} B",
                )

    def capacity(self) -> None:
        m, d = self.m, self.d
        per_token = MemoryModel.from_manifest(m).kv_bytes_per_token_per_chip
        for i, c in enumerate(m.memory.chips):
            where = f"manifest.memory.chips[{i}]"
            kv = kv_bytes(per_token, m.kv.lanes, m.kv.lane_context)
            need = chip_dram_need(c, per_token, m.kv.lanes, m.kv.lane_context)
            if need > d.dram_bytes_per_chip:
                self.f.add(
                    "capacity.dram",
                    where,
                    f"chip {c.chip}: params {_gib(c.param_dram_bytes)} + KV {m.kv.lanes} x"
                    f" {m.kv.lane_context:,} tokens {_gib(kv)} + workspace {_gib(c.workspace_bytes)}"
                    f" = {_gib(need)} exceeds"
                    f" DRAM {_gib(d.dram_bytes_per_chip)}",
                )
            if c.param_sram_bytes > d.sram_bytes_per_chip:
                self.f.add(
                    "capacity.sram",
                    where,
                    f"chip {c.chip}: params SRAM {c.param_sram_bytes:,} B exceeds SRAM {d.sram_bytes_per_chip:,} B",
                )
