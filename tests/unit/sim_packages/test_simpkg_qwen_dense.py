"""The qwen3-4b package: Qwen3-4B's published shape, BF16 on one chip, timing derived from A3B's.

Expected shape numbers are typed in from Qwen3-4B's config.json and its published parameter
count (4,022,468,096), not taken from the code under test; the memory and timing checks re-derive
each figure from its stated rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.daemon.calsim.device import CalsimDriver
from calculet.daemon.package.capacity import CALSIM_BOARD, MemoryModel, max_context_for
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages import build_sim_package
from calculet.ops.sim_packages.timing import sim_timing

GIB = 1 << 30
QWEN3_4B_WEIGHTS = 4_022_468_096  # Qwen3-4B's safetensors total
KV_PER_TOKEN = 36 * 8 * 2 * 128 * 2  # layers x kv heads x (K,V) x head_dim x bf16
A3B_WORKSPACE_CHIP0 = 15_113_064_448 - 9_389_477_888 - 2_013_265_920  # docs/sources.md 003 §6-8


def test_geometry_is_qwen3_4b(dense_pkg: Path) -> None:
    m = load_manifest(dense_pkg)
    a = m.architecture
    assert (a.layers, a.hidden_size, a.intermediate_size, a.q_heads, a.kv_heads, a.head_dim) == (
        36, 2560, 9728, 32, 8, 128,
    )  # fmt: skip
    assert (a.experts, a.experts_per_token, a.expert_intermediate) == (0, 0, 0) and a.dense
    assert a.tied_embeddings and a.vocab_size == 151_936
    assert (m.kernel, m.quantization, m.synthetic_seed) == ("synthetic", "bf16", 4_004)
    assert (m.topology.chips, m.topology.chip_masks) == (1, (1,))


def test_memory_holds_bf16_weights_on_chip_0_only(dense_pkg: Path) -> None:
    m = load_manifest(dense_pkg)
    (chip,) = m.memory.chips
    assert (chip.chip, chip.chip_mask) == (0, 1)
    assert chip.param_dram_bytes + chip.param_sram_bytes == 2 * QWEN3_4B_WEIGHTS
    assert chip.workspace_bytes == A3B_WORKSPACE_CHIP0 * 2560 // 2048
    assert m.kv.bytes_per_token == KV_PER_TOKEN
    kv = m.kv.lanes * m.kv.lane_context * KV_PER_TOKEN  # the whole KV: one chip holds every head
    assert m.memory.device_memory_required_bytes == chip.param_dram_bytes + chip.workspace_bytes + kv


def test_lanes_and_context_are_what_fits_one_chip(dense_pkg: Path) -> None:
    m = load_manifest(dense_pkg)
    (chip,) = m.memory.chips
    free = 16 * GIB - chip.param_dram_bytes - chip.workspace_bytes
    assert m.kv.lanes == 8
    assert m.kv.lanes * m.kv.lane_context * KV_PER_TOKEN <= free < m.kv.lanes * (m.kv.lane_context + 256) * KV_PER_TOKEN
    # The full 40,960-token context does not fit even one lane: the planner says how much does.
    model = MemoryModel.from_manifest(m)
    assert max_context_for(model, 1, CALSIM_BOARD) == free // KV_PER_TOKEN < 40_960


def test_timing_is_derived_from_a3b_and_says_how(dense_pkg: Path) -> None:
    t, a3b = load_manifest(dense_pkg).timing, sim_timing()
    ms = [p.ms_per_token for p in t.decode_curve]
    assert ms == sorted(ms) and [p.context for p in t.decode_curve] == [p.context for p in a3b.decode_curve]
    # every weight read (8 GB BF16) on one chip is slower per token than A3B's 3 B active over two
    assert ms[0] > 5 * a3b.decode_curve[0].ms_per_token
    # the attention growth is A3B's x 3 (147,456 B per token on one chip vs 98,304 B over two)
    growth, a3b_growth = ms[-1] - ms[0], a3b.decode_curve[-1].ms_per_token - a3b.decode_curve[0].ms_per_token
    assert growth == pytest.approx(3 * a3b_growth, abs=0.01)
    assert t.prefill_fixed_ms == ms[0]
    for name in ("decode_curve[0]", "kv_ratio", "prefill_ms_per_token", "batch_alpha"):
        assert "ASSUMPTION" in t.sources[name]


def test_validates_and_configures_on_chip_0_leaving_chip_1_free(dense_pkg: Path, tmp_path: Path) -> None:
    report = validate_package(dense_pkg)
    assert report.ok, report.headline()
    m = report.manifest
    assert m is not None
    device = CalsimDriver().open(0, {"time_scale": 0.0, "state_dir": str(tmp_path)})
    try:
        device.configure(dense_pkg, m)
        used = [c.dram_used for c in device.memory_usage().chips]
        assert used[1] == 0 and used[0] == m.memory.device_memory_required_bytes
    finally:
        device.close()


def test_one_lane_gets_the_largest_context_one_chip_holds(tmp_path: Path) -> None:
    m = load_manifest(build_sim_package("qwen3-4b", tmp_path / "p", decode_batches=[1]))
    (chip,) = m.memory.chips
    free = 16 * GIB - chip.param_dram_bytes - chip.workspace_bytes
    assert m.kv.lanes == 1 and m.kv.lane_context == free // KV_PER_TOKEN // 256 * 256


def test_the_models_doc_gives_the_lane_context_the_builder_writes(dense_pkg: Path) -> None:
    m = load_manifest(dense_pkg)
    doc = (Path(__file__).parents[3] / "docs" / "models.md").read_text(encoding="utf-8")
    lanes, context = m.kv.lanes, f"{m.kv.lane_context:,}"
    assert f"{lanes} lanes of {context} tokens" in doc
    assert f"qwen3-4b ({lanes} × {context})" in doc
