"""Package validator: a valid package is clean; each defect class yields exactly its own code.

Every case starts from the factory's valid package and breaks one thing, so a check that fires
on the wrong input, misses its defect or cascades into other codes fails here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.common.errors import ErrorKind, InvalidArgument, NotFound
from calculet.daemon.package.capacity import CALSIM_BOARD, DeviceLimits, chip_dram_need
from calculet.daemon.package.logits_output import LogitsOutput
from calculet.daemon.package.manifest import (
    MANIFEST_NAME,
    MAX_DECODE_CURVE_POINTS,
    MAX_MANIFEST_BYTES,
    CompatRow,
    D2DDecl,
    DecodePoint,
    PackageManifest,
    TensorDecl,
)
from calculet.daemon.package.presets import QWEN3_30B_A3B
from calculet.daemon.package.report import CODES, PackageInvalid, Severity
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages.timing import sim_timing

from .conftest import CONTEXT, FILES, VOCAB, PackageFactory, submodel, valid_manifest, with_required

GIB = 1 << 30
DOCS = Path(__file__).resolve().parents[3] / "docs" / "package.md"


# ---------------------------------------------------------------- helpers building one defect


def _m(**changes: Any) -> PackageManifest:
    return replace(valid_manifest(), **changes)


def _sub(i: int, **changes: Any) -> PackageManifest:
    m = valid_manifest()
    subs = list(m.submodels)
    subs[i] = replace(subs[i], **changes)
    return replace(m, submodels=tuple(subs))


def _tensor(i: int, side: str, j: int, **changes: Any) -> PackageManifest:
    m = valid_manifest()
    s = m.submodels[i]
    tensors = list(getattr(s, side))
    tensors[j] = replace(tensors[j], **changes)
    return _sub(i, **{side: tuple(tensors)})


def _kv(**changes: Any) -> PackageManifest:
    m = valid_manifest()
    return with_required(replace(m, kv=replace(m.kv, **changes)))


def _chip(i: int, **changes: Any) -> PackageManifest:
    m = valid_manifest()
    chips = list(m.memory.chips)
    chips[i] = replace(chips[i], **changes)
    return replace(m, memory=replace(m.memory, chips=tuple(chips)))


def _required(value: int) -> PackageManifest:
    m = valid_manifest()
    return replace(m, memory=replace(m.memory, device_memory_required_bytes=value))


def _section(name: str, **changes: Any) -> PackageManifest:
    m = valid_manifest()
    return replace(m, **{name: replace(getattr(m, name), **changes)})


def _one_chip(**topology: Any) -> PackageManifest:
    """The valid package cut to chip 0 alone (parallelism `none`), its topology then changed."""
    m = valid_manifest()
    one = replace(m.topology, chips=1, chip_masks=(1,), parallelism="none")
    return with_required(
        replace(m, topology=replace(one, **topology), memory=replace(m.memory, chips=m.memory.chips[:1]))
    )


def _add_file_entry(root: Path, entry: dict[str, Any]) -> None:
    PackageFactory.edit(root, lambda raw: raw["files"].append(entry))


def _entry_for(path: str, data: bytes, role: str = "metadata") -> dict[str, Any]:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "role": role}


def _outside_file(root: Path) -> tuple[Path, bytes]:
    data = b"secret outside the package\n"
    out = root.parent / f"{root.name}-outside.bin"
    out.write_bytes(data)
    return out, data


Build = Callable[[PackageFactory], Path]


def manifest_defect(make: Callable[[], PackageManifest]) -> Build:
    return lambda f: f.write(make())


def raw_defect(mutate: Callable[[dict[str, Any]], Any]) -> Build:
    def build(f: PackageFactory) -> Path:
        root = f.write()
        f.edit(root, mutate)
        return root

    return build


def fs_defect(change: Callable[[Path], Any]) -> Build:
    def build(f: PackageFactory) -> Path:
        root = f.write()
        change(root)
        return root

    return build


def _flip_byte(root: Path) -> None:
    path = root / "param_blk0.bin"
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))


def _dotdot(root: Path) -> None:
    out, data = _outside_file(root)
    _add_file_entry(root, _entry_for(f"../{out.name}", data))


def _absolute(root: Path) -> None:
    out, data = _outside_file(root)
    _add_file_entry(root, _entry_for(str(out), data))


def _symlink_out(root: Path) -> None:
    out, data = _outside_file(root)
    os.symlink(out, root / "link.bin")
    _add_file_entry(root, _entry_for("link.bin", data))


def _template_file(text: bytes) -> Callable[[Path], None]:
    """Put the chat template in a listed file and point `tokenizer.chat_template` at it."""

    def change(root: Path) -> None:
        (root / "tokenizer" / "chat.jinja").write_bytes(text)

        def mutate(raw: dict[str, Any]) -> None:
            raw["files"].append(_entry_for("tokenizer/chat.jinja", text, "tokenizer"))
            raw["tokenizer"]["chat_template"] = "tokenizer/chat.jinja"

        PackageFactory.edit(root, mutate)

    return change


def _dangle(path: Path) -> None:
    """Replace a listed file by a symlink to nothing."""
    path.unlink()
    os.symlink(path.parent / "gone.yaml", path)


def _del(*path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        node = raw
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


def _set(value: Any, *path: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        node = raw
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _drop_decode() -> PackageManifest:
    m = valid_manifest()
    return replace(m, submodels=tuple(s for s in m.submodels if s.role != "decode"))


def _extra_submodel(sub: Any) -> PackageManifest:
    m = valid_manifest()
    return replace(m, submodels=(*m.submodels, sub))


def _curve(*points: tuple[int, float]) -> PackageManifest:
    """The valid manifest with `timing.decode_curve` set to `points` ((context, ms) pairs)."""
    return _section("timing", decode_curve=tuple(DecodePoint(c, ms) for c, ms in points))


# The timing section as schema v1 wrote it before the decode curve (the linear model).
LEGACY_TIMING = {
    "decode_ms_short": 17.2,
    "decode_ms_long": 80.0,
    "long_context": CONTEXT,
    "prefill_fixed_ms": 1.0,
    "prefill_ms_per_token": 0.1,
    "batch_alpha": 0.1,
    "h2d_gbps": 10.0,
    "d2h_gbps": 10.0,
}


def _tight_dram() -> DeviceLimits:
    """A board whose chip 0 is one byte short for the valid package, yet whose total covers its figure."""
    m = valid_manifest()
    per_chip = m.kv.bytes_per_token // m.topology.chips
    need0 = chip_dram_need(m.memory.chips[0], per_chip, m.kv.lanes, m.kv.lane_context)
    return replace(CALSIM_BOARD, dram_bytes_per_chip=need0 - 1)


@dataclass(frozen=True)
class Defect:
    code: str
    build: Build
    device: Callable[[], DeviceLimits] | None = None
    expect_in_message: str = ""
    patch: Callable[[pytest.MonkeyPatch], None] | None = None


def _unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading file contents fails as on an I/O error (root ignores chmod, so simulate it)."""

    def fail(path: Path, chunk: int = 0, on_chunk: object = None) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("calculet.daemon.package.files.sha256_file", fail)


DEFECTS: dict[str, Defect] = {
    # manifest and schema
    "manifest-missing": Defect("manifest.missing", fs_defect(lambda r: (r / MANIFEST_NAME).unlink())),
    "manifest-not-json": Defect("manifest.unreadable", fs_defect(lambda r: (r / MANIFEST_NAME).write_text("{oops"))),
    "manifest-array": Defect("manifest.unreadable", fs_defect(lambda r: (r / MANIFEST_NAME).write_text("[]"))),
    "manifest-directory": Defect(
        "manifest.not_regular", fs_defect(lambda r: ((r / MANIFEST_NAME).unlink(), (r / MANIFEST_NAME).mkdir()))
    ),
    "manifest-too-deep": Defect(
        "manifest.too_deep", fs_defect(lambda r: (r / MANIFEST_NAME).write_text("[" * 100_000 + "]" * 100_000))
    ),
    "manifest-too-large": Defect(
        "manifest.too_large", fs_defect(lambda r: (r / MANIFEST_NAME).write_text(" " * (MAX_MANIFEST_BYTES + 1)))
    ),
    "schema-version": Defect("schema.version", raw_defect(_set(2, "schema_version")), expect_in_message="2"),
    "missing-field": Defect("schema.missing_field", raw_defect(_del("kv", "lanes"))),
    "wrong-type": Defect("schema.wrong_type", raw_defect(_set("4", "kv", "lanes"))),
    "bool-not-int": Defect("schema.wrong_type", raw_defect(_set(True, "topology", "chips"))),
    "unknown-field": Defect("schema.unknown_field", raw_defect(_set(4, "kv", "lanse")), expect_in_message="lanse"),
    # files
    "file-missing": Defect("file.missing", fs_defect(lambda r: (r / "param_blk1.bin").unlink()), None, "param_blk1"),
    "file-dangling-link": Defect(
        "file.missing",
        fs_defect(lambda r: _dangle(r / "hparam.yaml")),
    ),
    "file-not-regular": Defect("file.not_regular", fs_defect(lambda r: _add_file_entry(r, _entry_for("prefill", b"")))),
    "file-extra": Defect("file.extra", fs_defect(lambda r: (r / "notes.txt").write_text("x")), None, "notes.txt"),
    "file-oversized": Defect(
        "file.size",
        fs_defect(lambda r: (r / "param_blk0.bin").write_bytes(FILES["param_blk0.bin"][1] + b"!")),
        None,
        "oversized by 1 B",
    ),
    "file-truncated": Defect("file.size", fs_defect(lambda r: (r / "hparam.yaml").write_bytes(b"x")), None, "short by"),
    "file-hash": Defect("file.hash", fs_defect(_flip_byte), None, "param_blk0.bin"),
    "file-hash-malformed": Defect("file.hash", raw_defect(_set("XYZ", "files", 5, "sha256"))),
    "path-dotdot": Defect("file.path_escape", fs_defect(_dotdot)),
    "path-absolute": Defect("file.path_escape", fs_defect(_absolute)),
    "path-symlink-out": Defect("file.path_escape", fs_defect(_symlink_out), None, "link.bin"),
    "file-unreadable": Defect("file.unreadable", fs_defect(lambda r: None), None, "Permission denied", _unreadable),
    "file-symlink-loop": Defect(
        "file.symlink_loop",
        fs_defect(lambda r: ((r / "hparam.yaml").unlink(), os.symlink("hparam.yaml", r / "hparam.yaml"))),
    ),
    "path-nul": Defect("file.path_escape", fs_defect(lambda r: _add_file_entry(r, _entry_for("a\x00b", b"")))),
    "file-duplicate": Defect("file.duplicate", raw_defect(lambda raw: raw["files"].append(dict(raw["files"][0])))),
    "file-duplicate-normalized": Defect(
        "file.duplicate",
        raw_defect(lambda raw: raw["files"].append({**raw["files"][0], "path": "./" + raw["files"][0]["path"]})),
    ),
    # values and architecture
    "value-range-lanes": Defect("value.range", manifest_defect(lambda: _kv(lanes=0))),
    "value-range-nan": Defect("value.range", manifest_defect(lambda: _section("golden", logit_atol=float("nan")))),
    "value-range-timing": Defect("value.range", manifest_defect(lambda: _section("timing", h2d_gbps=0.0))),
    "arch-heads": Defect(
        "arch.invalid", manifest_defect(lambda: _section("architecture", q_heads=5)), None, "5 Q heads"
    ),
    "arch-dense-without-ffn": Defect(
        "arch.invalid",
        manifest_defect(lambda: _section("architecture", experts=0, experts_per_token=0, expert_intermediate=0)),
        None,
        "needs its FFN width",
    ),
    "arch-dense-with-expert-fields": Defect(
        "arch.invalid",
        manifest_defect(lambda: _section("architecture", experts=0, intermediate_size=96)),
        None,
        "a dense model (experts 0) has none",
    ),
    "arch-moe-without-experts-per-token": Defect(
        "arch.invalid", manifest_defect(lambda: _section("architecture", experts_per_token=0)), None, "must be positive"
    ),
    "kernel-unknown": Defect("kernel.unknown", manifest_defect(lambda: _m(kernel="cuda")), None, "cuda"),
    "logits-output-mode": Defect(
        "logits.output", manifest_defect(lambda: _m(logits_output=LogitsOutput("sparse"))), None, "sparse"
    ),
    "logits-output-k": Defect(
        "logits.output", manifest_defect(lambda: _m(logits_output=LogitsOutput("topk", VOCAB + 1))), None, "topk needs"
    ),
    "logits-output-topk-without-its-tensors": Defect(
        "submodel.io", manifest_defect(lambda: _m(logits_output=LogitsOutput("topk", 8))), None, "topk_ids"
    ),
    # submodels
    "submodel-duplicate-name": Defect(
        "submodel.duplicate_name", manifest_defect(lambda: _extra_submodel(submodel("prefill_128", "decode", 2, 1)))
    ),
    "submodel-role-unknown": Defect(
        "submodel.role_unknown",
        manifest_defect(lambda: _extra_submodel(replace(submodel("embed", "decode", 2, 1), role="embed"))),
    ),
    "submodel-no-decode": Defect("submodel.role_missing", manifest_defect(_drop_decode), None, "no decode"),
    "submodel-ambiguous-prefill": Defect(
        "submodel.ambiguous", manifest_defect(lambda: _extra_submodel(submodel("prefill_128_b", "prefill", 1, 128)))
    ),
    "submodel-mislabelled": Defect(
        # A one-token prefill labelled llm_decode: its I/O is a decode's, so nothing settles its role.
        "submodel.mislabelled",
        manifest_defect(
            lambda: _extra_submodel(replace(submodel("prefill_1", "prefill", 1, 1), smodel_type="llm_decode"))
        ),
        None,
        "do not settle",
    ),
    "submodel-label-ignored": Defect(
        "submodel.label_ignored", manifest_defect(lambda: _sub(0, smodel_type="llm_decode")), None, "a prefill"
    ),
    "submodel-decode-label-ignored": Defect(
        "submodel.label_ignored", manifest_defect(lambda: _sub(1, smodel_type="llm_prefill")), None, "a decode"
    ),
    "submodel-offset-on-decode": Defect(
        "submodel.offset_role", manifest_defect(lambda: _sub(1, prefill_at_offset=True)), None, "only a prefill"
    ),
    "submodel-offset-not-bool": Defect(
        "schema.wrong_type", raw_defect(_set("yes", "submodels", 0, "prefill_at_offset"))
    ),
    "submodel-label-unknown": Defect(
        "submodel.smodel_type_unknown", manifest_defect(lambda: _sub(1, smodel_type="llm_mystery"))
    ),
    "prefill-tokens-shape": Defect("submodel.shape", manifest_defect(lambda: _tensor(0, "inputs", 0, shape=(1, 64)))),
    "decode-positions-shape": Defect("submodel.shape", manifest_defect(lambda: _tensor(1, "inputs", 1, shape=(1, 4)))),
    "decode-two-tokens": Defect(
        "submodel.shape",
        manifest_defect(
            lambda: _sub(
                1,
                max_tokens=2,
                inputs=(TensorDecl("tokens", (4, 2), "int32"), TensorDecl("positions", (4, 2), "int32")),
            )
        ),
    ),
    "logits-shape": Defect(
        "submodel.shape", manifest_defect(lambda: _tensor(1, "outputs", 0, shape=(4, VOCAB - 1))), None, "[4, 512]"
    ),
    "tokens-dtype": Defect("submodel.dtype", manifest_defect(lambda: _tensor(0, "inputs", 0, dtype="fp32"))),
    "logits-dtype": Defect("submodel.dtype", manifest_defect(lambda: _tensor(1, "outputs", 0, dtype="fp32"))),
    "dtype-unknown": Defect("submodel.dtype", manifest_defect(lambda: _tensor(1, "outputs", 0, dtype="bf17"))),
    "io-missing": Defect(
        "submodel.io",
        manifest_defect(lambda: _sub(1, inputs=valid_manifest().submodels[1].inputs[:1])),
        None,
        "positions",
    ),
    # contexts
    "context-bucket": Defect(
        "context.bucket",
        manifest_defect(
            lambda: _sub(
                0,
                max_tokens=CONTEXT * 2,
                inputs=(
                    TensorDecl("tokens", (1, CONTEXT * 2), "int32"),
                    TensorDecl("positions", (1, CONTEXT * 2), "int32"),
                ),
            )
        ),
    ),
    "context-lane": Defect(
        "context.lane", manifest_defect(lambda: _kv(lane_context=CONTEXT * 2)), None, f"{CONTEXT:,}"
    ),
    "context-mismatch": Defect("context.mismatch", manifest_defect(lambda: _sub(1, context=CONTEXT * 2))),
    # KV
    "kv-dtype": Defect("kv.dtype", manifest_defect(lambda: _kv(dtype="bf17"))),
    "kv-split": Defect("kv.split", manifest_defect(lambda: _kv(split="rows"))),
    "kv-bytes": Defect("kv.bytes_per_token", manifest_defect(lambda: _kv(bytes_per_token=255)), None, "= 256 B"),
    "kv-lanes-below-batch": Defect("kv.lanes_below_batch", manifest_defect(lambda: _kv(lanes=2))),
    # tokenizer
    "tokenizer-clamped": Defect(
        "tokenizer.max_length_clamped",
        manifest_defect(lambda: _section("tokenizer", model_max_length=131_072)),
        None,
        f"clamped to {CONTEXT}",
    ),
    "eos-range": Defect(
        "tokenizer.token_range", manifest_defect(lambda: _section("tokenizer", eos_token_ids=(2, VOCAB))), None, "512"
    ),
    "bos-negative": Defect("tokenizer.token_range", manifest_defect(lambda: _section("tokenizer", bos_token_id=-1))),
    "eos-missing": Defect("tokenizer.eos_missing", manifest_defect(lambda: _section("tokenizer", eos_token_ids=()))),
    "tokenizer-path": Defect(
        "tokenizer.path", manifest_defect(lambda: _section("tokenizer", path="tokenizer/other.json"))
    ),
    "chat-template": Defect(
        "tokenizer.chat_template", manifest_defect(lambda: _section("tokenizer", chat_template="{% for %}"))
    ),
    "chat-template-file": Defect("tokenizer.chat_template", fs_defect(_template_file(b"{% if %}")), None, "line 1"),
    "chat-template-file-not-utf8": Defect("tokenizer.chat_template", fs_defect(_template_file(b"\xff\xfe{{ x }}"))),
    # golden
    "golden-range": Defect(
        "golden.token_range", manifest_defect(lambda: _section("golden", decode_tokens=(9, VOCAB + 88)))
    ),
    "golden-first-token": Defect(
        "golden.inconsistent", manifest_defect(lambda: _section("golden", decode_tokens=(4, 10))), None, "4"
    ),
    "golden-order": Defect(
        "golden.inconsistent", manifest_defect(lambda: _section("golden", prefill_top=((9, 3.5), (4, 4.0))))
    ),
    "golden-prompt-long": Defect(
        "golden.inconsistent", manifest_defect(lambda: _section("golden", prompt_tokens=tuple(range(129))))
    ),
    # topology, memory, capacity, device
    "topology-masks": Defect("topology.mismatch", manifest_defect(lambda: _section("topology", chip_masks=(1, 4)))),
    "topology-parallelism-unknown": Defect(
        "topology.parallelism", manifest_defect(lambda: _section("topology", parallelism="dp")), None, "'dp'"
    ),
    "topology-parallelism-none-on-two-chips": Defect(
        "topology.parallelism", manifest_defect(lambda: _section("topology", parallelism="none")), None, "tp, ep"
    ),
    "topology-parallelism-on-one-chip": Defect(
        "topology.parallelism", manifest_defect(lambda: _one_chip(parallelism="tp")), None, "expected 'none'"
    ),
    "topology-parallelism-tensor": Defect(
        "topology.parallelism_legacy", manifest_defect(lambda: _section("topology", parallelism="tensor")), None, "'tp'"
    ),
    "topology-d2d-on-one-chip": Defect(
        "topology.d2d", manifest_defect(lambda: _one_chip(d2d=D2DDecl(1024))), None, "one chip"
    ),
    "value-range-d2d-link": Defect(
        "value.range",
        manifest_defect(lambda: _section("topology", d2d=D2DDecl(1024, link_gbps=0.0))),
        None,
        "must be positive",
    ),
    "value-range-d2d-bytes": Defect(
        "value.range", manifest_defect(lambda: _section("topology", d2d=D2DDecl(-1))), None, "non-negative"
    ),
    "topology-chip-index-huge": Defect("topology.mismatch", manifest_defect(lambda: _chip(1, chip=2**40))),
    "topology-chip-mask": Defect("topology.mismatch", manifest_defect(lambda: _chip(1, chip_mask=1))),
    "device-chips": Defect("device.chips", manifest_defect(valid_manifest), lambda: replace(CALSIM_BOARD, chips=1)),
    "memory-negative": Defect("memory.negative", manifest_defect(lambda: _chip(0, workspace_bytes=-1))),
    "memory-16777216-MB": Defect(
        "memory.required_impossible", manifest_defect(lambda: _required(16_777_216 * (1 << 20))), None, "unit"
    ),
    "memory-required-small": Defect("memory.inconsistent", manifest_defect(lambda: _required(1))),
    "memory-params-file": Defect(
        "memory.inconsistent",
        manifest_defect(lambda: with_required(_chip(0, param_dram_bytes=3071))),
        None,
        "param_blk0.bin",
    ),
    "capacity-dram": Defect("capacity.dram", manifest_defect(valid_manifest), _tight_dram, "chip 0"),
    "capacity-sram": Defect(
        "capacity.sram", manifest_defect(valid_manifest), lambda: replace(CALSIM_BOARD, sram_bytes_per_chip=600)
    ),
    # timing: the decode curve
    "timing-legacy-line": Defect(
        "timing.legacy_line", raw_defect(_set(LEGACY_TIMING, "timing")), None, "rebuild the package"
    ),
    "timing-curve-one-point": Defect(
        "timing.curve_points", manifest_defect(lambda: _curve((CONTEXT, 1.0))), None, "1 point(s)"
    ),
    "timing-curve-empty": Defect("timing.curve_points", manifest_defect(lambda: _curve()), None, "0 point(s)"),
    "timing-curve-too-many": Defect(
        "timing.curve_points",
        manifest_defect(lambda: _curve(*((c, 1.0) for c in range(MAX_DECODE_CURVE_POINTS + 1)))),
    ),
    "timing-curve-unsorted": Defect(
        "timing.curve_order", manifest_defect(lambda: _curve((CONTEXT, 2.0), (0, 1.0))), None, "strictly increase"
    ),
    "timing-curve-repeated-context": Defect(
        "timing.curve_order", manifest_defect(lambda: _curve((0, 1.0), (128, 1.5), (128, 1.5), (CONTEXT, 2.0)))
    ),
    "timing-curve-speeds-up": Defect(
        "timing.curve_monotonic",
        manifest_defect(lambda: _curve((0, 1.0), (128, 3.0), (CONTEXT, 2.0))),
        None,
        "3.0 ms at 128 -> 2.0 ms at 256",
    ),
    "timing-curve-short-of-context": Defect(
        "timing.curve_coverage", manifest_defect(lambda: _curve((0, 1.0), (CONTEXT - 1, 2.0))), None, f"{CONTEXT:,}"
    ),
    "timing-curve-zero-ms": Defect("value.range", manifest_defect(lambda: _curve((0, 0.0), (CONTEXT, 2.0)))),
    "timing-curve-infinite-ms": Defect("value.range", manifest_defect(lambda: _curve((0, 1.0), (CONTEXT, math.inf)))),
    "timing-curve-nan-ms": Defect("value.range", manifest_defect(lambda: _curve((0, math.nan), (CONTEXT, 2.0)))),
    "timing-curve-negative-context": Defect("value.range", manifest_defect(lambda: _curve((-1, 1.0), (CONTEXT, 2.0)))),
    "timing-curve-pairs": Defect(
        "schema.wrong_type", raw_defect(_set([[0, 1.0], [CONTEXT, 2.0]], "timing", "decode_curve"))
    ),
    # compatibility
    "runtime-range": Defect(
        "compat.runtime", manifest_defect(lambda: _section("compatibility", runtime=">=0.8,<0.9")), None, "0.7.6"
    ),
    "runtime-device": Defect(
        "compat.runtime", manifest_defect(valid_manifest), lambda: replace(CALSIM_BOARD, runtime_version="0.8.0")
    ),
    "runtime-syntax": Defect(
        "compat.syntax", manifest_defect(lambda: _section("compatibility", runtime="0.7.6 or newer"))
    ),
    "driver-range": Defect(
        "compat.driver",
        manifest_defect(lambda: _section("compatibility", driver=">=2.0")),
        lambda: replace(CALSIM_BOARD, driver_version="1.4.2"),
    ),
    "matrix-no-row": Defect(
        "compat.matrix",
        manifest_defect(
            lambda: _section("compatibility", matrix=(CompatRow(">=0.7.6,<0.8", ">=1.0.0,<1.1", "*", True),))
        ),
        lambda: replace(CALSIM_BOARD, driver_version="0.7.6"),
        "runtime 0.7.6, driver 0.7.6, firmware unknown",
    ),
    "matrix-syntax": Defect(
        "compat.syntax",
        manifest_defect(lambda: _section("compatibility", matrix=(CompatRow(">=0.7.6,<0.8", "*", "1.x"),))),
        None,
        "1.x",
    ),
}


def _validate(factory: PackageFactory, defect: Defect) -> tuple[Path, Any]:
    root = defect.build(factory)
    device = defect.device() if defect.device else None
    return root, validate_package(root, device)


# ---------------------------------------------------------------- tests


def test_valid_package_has_no_problems(factory: PackageFactory) -> None:
    report = validate_package(factory.write())
    assert report.problems == ()
    assert report.ok
    assert report.manifest == valid_manifest()


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_each_defect_reports_exactly_its_code(
    factory: PackageFactory, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    defect = DEFECTS[name]
    if defect.patch:
        defect.patch(monkeypatch)
    _, report = _validate(factory, defect)
    assert set(report.codes) == {defect.code}, report.render_text()
    severity = CODES[defect.code][0]
    assert report.ok is (severity is Severity.WARNING)
    if defect.expect_in_message:
        assert any(defect.expect_in_message in p.message for p in report.problems), report.render_text()


def test_every_code_has_a_defect_case() -> None:
    assert {d.code for d in DEFECTS.values()} == set(CODES)


def test_docs_list_every_code() -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert not missing


def test_all_problems_are_reported_not_only_the_first(factory: PackageFactory) -> None:
    m = _section("tokenizer", eos_token_ids=(VOCAB + 1,))
    m = replace(m, compatibility=replace(m.compatibility, runtime=">=0.9"))
    root = factory.write(m)
    (root / "param_blk1.bin").unlink()
    _flip_byte(root)
    (root / "stray.bin").write_bytes(b"1")
    report = validate_package(root)
    assert sorted(report.codes) == sorted(
        ["tokenizer.token_range", "compat.runtime", "file.missing", "file.hash", "file.extra"]
    )


def test_structure_lists_every_missing_field(factory: PackageFactory) -> None:
    root = factory.write()

    def mutate(raw: dict[str, Any]) -> None:
        del raw["kv"]["lanes"]
        del raw["tokenizer"]["path"]
        del raw["submodels"][1]["inputs"][0]["dtype"]
        del raw["golden"]

    factory.edit(root, mutate)
    report = validate_package(root)
    assert set(report.codes) == {"schema.missing_field"}
    assert sorted(p.where for p in report.problems) == [
        "manifest.golden",
        "manifest.kv.lanes",
        "manifest.submodels[1].inputs[0].dtype",
        "manifest.tokenizer.path",
    ]
    assert report.manifest is None


def test_optional_fields_may_be_absent(factory: PackageFactory) -> None:
    root = factory.write()

    def mutate(raw: dict[str, Any]) -> None:
        del raw["synthetic_seed"]
        del raw["tokenizer"]["bos_token_id"]
        raw["tokenizer"]["pad_token_id"] = None
        del raw["submodels"][0]["csr"]
        del raw["submodels"][0]["inputs"][0]["layout"]

    factory.edit(root, mutate)
    assert validate_package(root).problems == ()


def test_structural_defect_still_checks_files(factory: PackageFactory) -> None:
    root = factory.write()
    factory.edit(root, _del("kernel"))
    (root / "hparam.yaml").unlink()
    assert sorted(validate_package(root).codes) == ["file.missing", "schema.missing_field"]


def test_seed_tokenizer_131072_vs_40960_is_a_warning_that_names_the_clamp(factory: PackageFactory) -> None:
    report = validate_package(factory.write(_section("tokenizer", model_max_length=131_072)))
    (warning,) = report.warnings
    assert report.ok
    assert "131,072" in warning.message and f"clamped to {CONTEXT}" in warning.message


def test_symlink_inside_the_package_is_allowed(factory: PackageFactory) -> None:
    root = factory.write()
    data = FILES["hparam.yaml"][1]
    os.symlink("hparam.yaml", root / "alias.yaml")
    _add_file_entry(root, _entry_for("alias.yaml", data))
    assert validate_package(root).problems == ()


def test_chat_template_from_a_listed_file(factory: PackageFactory) -> None:
    root = factory.write()
    _template_file(b"{% for m in messages %}{{ m.content }}{% if loop.index > 8 %}{% break %}{% endif %}{% endfor %}")(
        root
    )
    assert validate_package(root).problems == ()


def test_a_folder_that_cannot_be_listed_is_reported(factory: PackageFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    root = factory.write()
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path).name == "decode":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    report = validate_package(root.resolve())
    assert [(p.code, p.where) for p in report.problems] == [("file.unreadable", "decode")]


def test_escaping_file_is_never_read(factory: PackageFactory) -> None:
    """An escaping path is refused before it is opened: a wrong hash for it must not show up."""
    root = factory.write()
    out, data = _outside_file(root)
    _add_file_entry(root, {**_entry_for(f"../{out.name}", data), "sha256": "0" * 64})
    assert validate_package(root).codes == ["file.path_escape"]


def test_skip_hashes_checks_sizes_only(factory: PackageFactory) -> None:
    root = factory.write()
    _flip_byte(root)
    assert validate_package(root, verify_hashes=False).ok
    assert validate_package(root).codes == ["file.hash"]


def test_the_seed_prefill_mislabel_is_a_warning_and_the_submodel_stays_a_prefill(factory: PackageFactory) -> None:
    """docs/sources.md 003 §12: the prefill submodel's memory file says smodel_type=llm_decode. Its
    128 tokens per row make it a prefill: the package loads, the label is reported, the role kept."""
    report = validate_package(factory.write(_sub(0, smodel_type="llm_decode")))
    assert report.ok and not report.errors
    (problem,) = report.problems
    assert (problem.code, problem.severity) == ("submodel.label_ignored", Severity.WARNING)
    assert problem.where == "manifest.submodels[0].smodel_type"
    assert "'llm_decode'" in problem.message and "a prefill" in problem.message
    assert report.manifest is not None and report.manifest.submodels[0].role == "prefill"


def test_report_renders_one_line_per_problem_then_a_summary(factory: PackageFactory) -> None:
    m = _section("tokenizer", eos_token_ids=(VOCAB,), model_max_length=10 * CONTEXT)
    report = validate_package(factory.write(m))
    lines = report.render_text().splitlines()
    assert len(lines) == len(report.problems) + 1
    assert lines[0].startswith("error") and "tokenizer.token_range" in lines[0]
    assert lines[1].startswith("warning") and "tokenizer.max_length_clamped" in lines[1]
    assert "INVALID" in lines[-1] and "1 error" in lines[-1] and "1 warning" in lines[-1]
    data = json.loads(report.to_json())
    assert data["ok"] is False
    assert [p["code"] for p in data["problems"]] == report.codes


def test_raise_if_invalid_is_a_failed_precondition(factory: PackageFactory) -> None:
    report = validate_package(factory.write(_m(kernel="cuda")))
    with pytest.raises(PackageInvalid) as info:
        report.raise_if_invalid()
    assert info.value.kind is ErrorKind.FAILED_PRECONDITION
    assert info.value.report is report
    validate_package(factory.write()).raise_if_invalid()  # valid: no error


def test_missing_directory_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        validate_package(tmp_path / "nope")


def test_a_file_is_not_a_package_directory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(InvalidArgument):
        validate_package(path)


def test_defect_helpers_keep_the_valid_package_valid_when_unchanged(factory: PackageFactory) -> None:
    """The builders used above only break what they are told to (sanity for the table)."""
    m = valid_manifest()
    assert _kv() == m and _section("tokenizer") == m and _chip(0) == m
    assert dataclasses.asdict(with_required(m)) == dataclasses.asdict(m)


# ---------------------------------------------------------------- fuzzed manifests

_JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=8)
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return PackageFactory(tmp_path_factory.mktemp("fuzz")).write()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_manifests_never_crash_and_use_catalogued_codes(fuzz_root: Path, data: st.DataObject) -> None:
    raw = valid_manifest().to_dict()
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(raw)
        path = data.draw(st.sampled_from(paths))
        parent = raw
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(_JSON)
    (fuzz_root / MANIFEST_NAME).write_text(json.dumps(raw))
    report = validate_package(fuzz_root, verify_hashes=False)
    assert set(report.codes) <= set(CODES)
    if report.ok:  # no error means the daemon can load it: it must parse
        assert PackageManifest.from_dict(raw) == report.manifest
    if any(p.code.startswith("schema.") and p.severity is Severity.ERROR for p in report.problems):
        assert report.manifest is None and not report.ok


def _same_type_value(old: Any) -> st.SearchStrategy[Any]:
    if isinstance(old, bool):
        return st.booleans()
    if isinstance(old, int):
        return st.integers(-(2**62), 2**62) | st.integers(-2, 70)
    if isinstance(old, float):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(old, str):
        return st.text(max_size=12) | st.sampled_from(["prefill", "decode", "llm_decode", "bf16", "int32", ".."])
    return st.just(old)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_type_preserving_fuzz_reaches_semantic_checks_without_crashing(fuzz_root: Path, data: st.DataObject) -> None:
    """Structurally valid manifests with arbitrary values: only semantic codes, never an exception."""
    raw = valid_manifest().to_dict()
    leaves = [p for p in _paths(raw) if not isinstance(_get(raw, p), dict | list)]
    for path in data.draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=4)):
        parent = _get(raw, path[:-1])
        parent[path[-1]] = data.draw(_same_type_value(parent[path[-1]]))
    (fuzz_root / MANIFEST_NAME).write_text(json.dumps(raw))
    report = validate_package(fuzz_root, verify_hashes=False)
    assert set(report.codes) <= set(CODES)
    assert not any(c.startswith(("schema.missing", "manifest.")) for c in report.codes)


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


# ---------------------------------------------- docs/sources.md 003's model through the validator


def _qwen_manifest(lanes: int, lane_context: int = 40_960) -> PackageManifest:
    """The valid package's files with Qwen3-30B-A3B's geometry, memory and tokenizer limit (docs/sources.md 003)
    and the calsim packages' timing (its decode curve reaches the 40,960 context)."""
    p = QWEN3_30B_A3B
    vocab, ctx = p.architecture.vocab_size, p.calbin_context

    def qwen_sub(name: str, role: str, batch: int, tokens: int) -> Any:
        s = submodel(name, role, batch, tokens, ctx)
        return replace(s, outputs=(TensorDecl("logits", (batch, vocab), "bf16"),))

    m = valid_manifest()
    return replace(
        m,
        kernel="synthetic",
        architecture=p.architecture,
        topology=p.topology,
        kv=p.kv_decl(lanes, lane_context),
        memory=p.memory_decl(lanes, lane_context),
        submodels=(qwen_sub("prefill", "prefill", 1, ctx), qwen_sub("decode_b1", "decode", 1, 1)),
        tokenizer=replace(m.tokenizer, model_max_length=131_072, eos_token_ids=(151_645, 151_643)),
        # The small blobs stand in for the 17 GB blocks, so they must not claim the `params` role.
        files=tuple(replace(f, role="params-standin") if f.role == "params" else f for f in m.files),
        timing=sim_timing(),
    )


def test_qwen3_one_full_lane_is_valid_with_the_seed_tokenizer_warning(factory: PackageFactory) -> None:
    report = validate_package(factory.write(_qwen_manifest(1)))
    assert report.codes == ["tokenizer.max_length_clamped"]
    assert "clamped to 40960" in report.problems[0].message


def test_qwen3_three_full_lanes_exceed_dram_on_both_chips(factory: PackageFactory) -> None:
    report = validate_package(factory.write(_qwen_manifest(3)))
    assert sorted(p.code for p in report.errors) == ["capacity.dram", "capacity.dram"]


def test_qwen3_four_full_lanes_do_not_fit_beside_the_weights(factory: PackageFactory) -> None:
    """docs/sources.md 003 §13. The board-wide figure (consistent with the parts) is over the board too,
    but that is the capacity problem, not a unit error: one code per chip, no `memory.*`."""
    report = validate_package(factory.write(_qwen_manifest(4)))
    assert [p.code for p in report.errors] == ["capacity.dram", "capacity.dram"]
    assert [p.message.split(":")[0] for p in report.errors] == ["chip 0", "chip 1"]


def test_qwen3_sixteen_short_lanes_fit(factory: PackageFactory) -> None:
    assert validate_package(factory.write(_qwen_manifest(16, 5120))).ok


@pytest.mark.parametrize("declared", [True, False, None])
def test_prefill_at_offset_round_trips_and_is_absent_when_undeclared(declared: bool | None) -> None:
    m = _sub(0, prefill_at_offset=declared)
    raw = m.to_dict()
    assert ("prefill_at_offset" in raw["submodels"][0]) is (declared is not None)
    assert all("prefill_at_offset" not in s for s in raw["submodels"][1:])
    assert PackageManifest.from_dict(raw).submodels[0].prefill_at_offset is declared
