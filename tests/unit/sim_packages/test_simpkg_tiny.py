"""The tiny package: geometry, weights and their memory figures; both presets pass the validator."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.package.report import Severity
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages import build_sim_package


def test_geometry_and_layout(tiny_pkg: Path) -> None:
    m = load_manifest(tiny_pkg)
    a = m.architecture
    assert (a.layers, a.hidden_size, a.q_heads, a.kv_heads, a.head_dim) == (2, 64, 4, 2, 16)
    assert (a.experts, a.experts_per_token, a.expert_intermediate) == (8, 2, 32)
    assert (a.rope_theta, a.rms_norm_eps) == (1e6, 1e-6)
    assert (m.kernel, m.quantization) == ("numeric", "fp32")
    assert (m.kv.lanes, m.kv.lane_context) == (4, 256)
    assert m.kv.bytes_per_token == 2 * 2 * 2 * 16 * 2  # layers x kv heads x (K,V) x head_dim x bf16
    assert [s.name for s in m.submodels] == ["prefill", "decode_b1", "decode_b4"]
    pre = m.submodel("prefill")
    assert [t.shape for t in pre.inputs] == [(1, 256), (1, 256)]
    assert [(t.shape, t.dtype) for t in pre.outputs] == [((1, a.vocab_size), "bf16")]
    assert m.tokenizer.model_max_length == m.context == 256


def test_memory_figures_are_the_weights_byte_counts(tiny_pkg: Path) -> None:
    m = load_manifest(tiny_pkg)
    for chip in m.memory.chips:
        with np.load(tiny_pkg / f"param_blk{chip.chip}.bin") as block:
            assert chip.param_dram_bytes == sum(block[name].nbytes for name in block.files)
            assert all(block[name].dtype == np.float32 for name in block.files)
        assert chip.param_sram_bytes == 0
        assert 0 < chip.workspace_bytes <= 16 << 20
    # Chip 0 alone holds the embedding, so the chips differ (a real split, not a copy).
    assert m.memory.chips[0].param_dram_bytes > m.memory.chips[1].param_dram_bytes


def test_lanes_follow_the_largest_decode_batch(tmp_path: Path) -> None:
    m = load_manifest(build_sim_package("tiny", tmp_path / "p", decode_batches=[2, 8]))
    assert m.kv.lanes == 8
    assert [s.name for s in m.submodels] == ["prefill", "decode_b2", "decode_b8"]


def test_both_presets_validate_without_errors(any_pkg: Path) -> None:
    report = validate_package(any_pkg)
    errors = [p for p in report.problems if p.severity is Severity.ERROR]
    assert errors == []
    warnings = {p.code for p in report.problems}
    # Only the vendor tokenizer's length (131072 > calbin context, docs/sources.md 003 §12) is expected to be clamped.
    expected = {"tokenizer.max_length_clamped"} if load_manifest(any_pkg).kernel == "synthetic" else set()
    assert warnings == expected


def test_overridden_packages_validate(tmp_path: Path) -> None:
    tiny = build_sim_package("tiny", tmp_path / "tiny", [1, 2, 16], lane_context=100)
    qwen = build_sim_package("qwen3-30b-a3b", tmp_path / "qwen", [1], lanes=3, lane_context=12_000)
    for out in (tiny, qwen):
        errors = [p for p in validate_package(out).problems if p.severity is Severity.ERROR]
        assert errors == [], out
