"""Capacity planner: the figures of docs/sources.md 003 re-derived, plan boundaries, presets and version ranges.

The source figures (bytes) are written here as docs/sources.md states them, not as the code computes them:
KV 98,304 B/token; 4,026,531,840 B (3.75 GiB) for one 40,960-token lane; 1.875 GiB per chip;
params per chip 9,389,477,888 / 8,767,148,032 DRAM and 15,079,424 SRAM; param files
9,404,557,312 / 8,782,227,456; DRAM reservation 15,113,064,448 per chip; batch 4 at full
context needs 15 GiB of KV per board, which does not fit beside the weights.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument
from calculet.daemon.device.types import ChipInfo, DeviceCapabilities, DeviceInfo
from calculet.daemon.package.capacity import (
    CALSIM_BOARD,
    DeviceLimits,
    MemoryModel,
    chip_dram_need,
    evaluate,
    kv_bytes,
    kv_bytes_per_token,
    kv_bytes_per_token_per_chip,
    max_context_for,
    max_lanes_for,
    plan,
)
from calculet.daemon.package.presets import PRESETS, QWEN3_30B_A3B, TINY
from calculet.daemon.package.versions import in_range, parse_range, parse_version

from .conftest import valid_manifest

GIB = 1 << 30
MIB = 1 << 20
SEED_CONTEXT = 40_960
SEED_KV_PER_TOKEN = 98_304
SEED_KV_ONE_LANE = 4_026_531_840
SEED_PARAMS_DRAM = (9_389_477_888, 8_767_148_032)
SEED_PARAMS_SRAM = 15_079_424
SEED_PARAM_FILES = (9_404_557_312, 8_782_227_456)
SEED_DRAM_RESERVED = 15_113_064_448
QWEN = MemoryModel.from_preset(QWEN3_30B_A3B)


# ------------------------------------------------------ docs/sources.md 003 figures


def test_kv_bytes_per_token_from_the_architecture_is_the_seed_figure() -> None:
    assert kv_bytes_per_token(QWEN3_30B_A3B.architecture, "bf16") == SEED_KV_PER_TOKEN
    assert QWEN3_30B_A3B.kv_bytes_per_token == SEED_KV_PER_TOKEN


def test_one_full_lane_is_3_75_gib_and_1_875_gib_per_chip() -> None:
    per_chip = kv_bytes_per_token_per_chip(SEED_KV_PER_TOKEN, 2, "kv_heads")
    assert kv_bytes(SEED_KV_PER_TOKEN, 1, SEED_CONTEXT) == SEED_KV_ONE_LANE == 3.75 * GIB
    assert kv_bytes(per_chip, 1, SEED_CONTEXT) == 2_013_265_920 == 1.875 * GIB
    # docs/sources.md 003 §13: batch 4 at full context needs 15 GiB of KV per board.
    assert kv_bytes(SEED_KV_PER_TOKEN, 4, SEED_CONTEXT) == 15 * GIB


def test_preset_params_are_the_seed_figures_and_close_with_the_param_files() -> None:
    chips = QWEN3_30B_A3B.chips
    assert tuple(c.param_dram_bytes for c in chips) == SEED_PARAMS_DRAM
    assert all(c.param_sram_bytes == SEED_PARAMS_SRAM for c in chips)
    assert QWEN3_30B_A3B.param_file_bytes == SEED_PARAM_FILES
    for c, size in zip(chips, SEED_PARAM_FILES, strict=True):
        assert c.param_dram_bytes + c.param_sram_bytes == size
        assert c.chip_mask == 1 << c.chip


def test_preset_workspace_fills_the_dram_reservation_beside_params_and_one_lane() -> None:
    for c in QWEN3_30B_A3B.chips:
        assert chip_dram_need(c, QWEN.kv_bytes_per_token_per_chip, 1, SEED_CONTEXT) == SEED_DRAM_RESERVED
    # docs/sources.md 003 §9: about 3.456 GiB of prefill activation/workspace besides KV on chip 0.
    assert round(QWEN3_30B_A3B.chips[0].workspace_bytes / GIB, 3) == 3.456


def test_preset_memory_decl_required_is_the_sum_of_the_per_chip_needs() -> None:
    for lanes, ctx in ((1, SEED_CONTEXT), (4, 8192), (16, 2048)):
        per_chip = QWEN.kv_bytes_per_token_per_chip
        want = sum(chip_dram_need(c, per_chip, lanes, ctx) for c in QWEN3_30B_A3B.chips)
        assert QWEN3_30B_A3B.memory_decl(lanes, ctx).device_memory_required_bytes == want
    assert QWEN3_30B_A3B.memory_decl().device_memory_required_bytes == 2 * SEED_DRAM_RESERVED
    assert QWEN3_30B_A3B.kv_decl().lane_context == SEED_CONTEXT


def test_four_full_context_lanes_do_not_fit_beside_the_weights() -> None:
    row = evaluate(QWEN, 4, SEED_CONTEXT)
    assert not row.fits
    # Even with no workspace at all: params + 4 lanes' KV share exceed a 16 GiB chip.
    chip0 = QWEN3_30B_A3B.chips[0]
    assert chip0.param_dram_bytes + 4 * SEED_KV_ONE_LANE // 2 > 16 * GIB
    assert "chip 0 DRAM over" in row.reason and "chip 1 DRAM over" in row.reason


def test_one_full_context_lane_fits_the_calsim_board_with_the_seed_headroom() -> None:
    row = evaluate(QWEN, 1, SEED_CONTEXT)
    assert row.fits and row.reason == ""
    assert row.headroom == 16 * GIB - SEED_DRAM_RESERVED
    assert [c.dram_total for c in row.chips] == [SEED_DRAM_RESERVED, SEED_DRAM_RESERVED]


def test_max_lanes_and_context_on_the_calsim_board_follow_from_the_seed_figures() -> None:
    free = 16 * GIB - (SEED_DRAM_RESERVED - SEED_KV_ONE_LANE // 2)  # chip 0 and chip 1 leave the same
    assert max_lanes_for(QWEN, SEED_CONTEXT) == free // (SEED_KV_ONE_LANE // 2)
    assert max_context_for(QWEN, 4) == free // (4 * SEED_KV_PER_TOKEN // 2)
    assert max_context_for(QWEN, 1) == SEED_CONTEXT  # capped at the calbin context


def test_plan_rows_cover_every_choice_lanes_outer() -> None:
    p = plan(QWEN3_30B_A3B, [1, 4], [2048, SEED_CONTEXT])
    assert [(r.lanes, r.context) for r in p.rows] == [(1, 2048), (1, SEED_CONTEXT), (4, 2048), (4, SEED_CONTEXT)]
    assert [r.fits for r in p.rows] == [True, True, True, False]
    assert not p.fits
    d = p.to_dict()
    assert d["fits"] is False and len(d["rows"]) == 4 and d["rows"][3]["headroom_bytes"] < 0


def test_context_beyond_the_calbin_does_not_fit_whatever_the_memory() -> None:
    big = replace(CALSIM_BOARD, dram_bytes_per_chip=1 << 50)
    row = evaluate(QWEN, 1, SEED_CONTEXT + 1, big)
    assert not row.fits and "calbin context" in row.reason
    assert max_lanes_for(QWEN, SEED_CONTEXT + 1, big) == 0


def test_smaller_dram_shrinks_the_plan() -> None:
    small = replace(CALSIM_BOARD, dram_bytes_per_chip=12 * GIB)
    assert not evaluate(QWEN, 1, SEED_CONTEXT, small).fits
    assert max_context_for(QWEN, 1, small) < SEED_CONTEXT


def test_sram_shortage_is_reported_and_leaves_no_room() -> None:
    tiny_sram = replace(CALSIM_BOARD, sram_bytes_per_chip=MIB)
    row = evaluate(QWEN, 1, 1024, tiny_sram)
    assert not row.fits and "SRAM" in row.reason
    assert max_lanes_for(QWEN, 1024, tiny_sram) == 0


def test_plan_accepts_a_manifest() -> None:
    m = valid_manifest()
    row = plan(m, [m.kv.lanes], [m.kv.lane_context]).rows[0]
    assert row.fits
    assert [c.kv for c in row.chips] == [m.kv.lanes * m.kv.lane_context * m.kv.bytes_per_token // 2] * 2


@given(lanes=st.integers(1, 64), dram_gib=st.integers(14, 64))
def test_max_context_is_the_fitting_boundary(lanes: int, dram_gib: int) -> None:
    device = replace(CALSIM_BOARD, dram_bytes_per_chip=dram_gib * GIB)
    ctx = max_context_for(QWEN, lanes, device)
    if ctx > 0:
        assert evaluate(QWEN, lanes, ctx, device).fits
    if ctx < QWEN.max_context:
        assert not evaluate(QWEN, lanes, ctx + 1, device).fits


@given(context=st.integers(1, SEED_CONTEXT), dram_gib=st.integers(14, 64))
def test_max_lanes_is_the_fitting_boundary(context: int, dram_gib: int) -> None:
    device = replace(CALSIM_BOARD, dram_bytes_per_chip=dram_gib * GIB)
    n = max_lanes_for(QWEN, context, device)
    if n > 0:
        assert evaluate(QWEN, n, context, device).fits
    assert not evaluate(QWEN, n + 1, context, device).fits


def test_replicated_kv_costs_every_chip_the_whole_token() -> None:
    assert kv_bytes_per_token_per_chip(SEED_KV_PER_TOKEN, 2, "none") == SEED_KV_PER_TOKEN
    assert kv_bytes_per_token_per_chip(7, 2, "kv_heads") == 4  # the chip with the extra head binds


def test_presets_are_registered_by_name() -> None:
    assert PRESETS["qwen3-30b-a3b"] is QWEN3_30B_A3B and PRESETS["tiny"] is TINY
    assert kv_bytes_per_token(TINY.architecture, TINY.kv_dtype) == TINY.kv_bytes_per_token
    assert evaluate(MemoryModel.from_preset(TINY), TINY.lanes, TINY.calbin_context).fits


# ---------------------------------------------------------------- devices and bad inputs


def test_device_limits_from_device_info_use_the_smallest_chip() -> None:
    info = DeviceInfo(
        name="calsim0",
        board_index=0,
        chips=(ChipInfo(0, 16 * GIB, 18 * MIB), ChipInfo(1, 15 * GIB, 17 * MIB)),
        runtime_version="0.7.6",
        driver_version="",
        firmware_version="1",
        capabilities=DeviceCapabilities(
            max_inflight=2, ping_pong=True, max_resident_configurations=1, lane_selection=True
        ),
    )
    limits = DeviceLimits.from_device_info(info)
    assert (limits.chips, limits.dram_bytes_per_chip, limits.sram_bytes_per_chip) == (2, 15 * GIB, 17 * MIB)
    assert limits.driver_version is None and limits.runtime_version == "0.7.6"
    calsim = DeviceLimits.from_device_info(replace(info, runtime_version="0.7.6-calsim", driver_version="1.2+b7"))
    assert (calsim.runtime_version, calsim.driver_version) == ("0.7.6", "1.2")
    with pytest.raises(InvalidArgument):
        DeviceLimits.from_device_info(replace(info, chips=()))
    with pytest.raises(InvalidArgument):
        DeviceLimits.from_device_info(replace(info, runtime_version="calrt-0.7.6"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chips": 0},
        {"dram_bytes_per_chip": 0},
        {"sram_bytes_per_chip": -1},
        {"runtime_version": "0.7.x"},
        {"driver_version": "v1"},
    ],
)
def test_bad_device_limits_are_invalid_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        DeviceLimits(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda: plan(QWEN, [], [1024]),
        lambda: plan(QWEN, [1], []),
        lambda: plan(QWEN, [0], [1024]),
        lambda: plan(QWEN, [1], [-5]),
        lambda: evaluate(QWEN, 1, 0),
        lambda: max_context_for(QWEN, 0),
        lambda: max_lanes_for(QWEN, 0),
        lambda: evaluate(QWEN, 1, 1024, replace(CALSIM_BOARD, chips=1)),
        lambda: evaluate(replace(QWEN, chips=()), 1, 1024),
        lambda: evaluate(replace(QWEN, kv_bytes_per_token=0), 1, 1024),
        lambda: kv_bytes_per_token(QWEN3_30B_A3B.architecture, "bf17"),
        lambda: kv_bytes_per_token_per_chip(SEED_KV_PER_TOKEN, 2, "rows"),
        lambda: kv_bytes_per_token_per_chip(SEED_KV_PER_TOKEN, 0, "kv_heads"),
    ],
)
def test_bad_planner_inputs_are_invalid_arguments(call: object) -> None:
    with pytest.raises(InvalidArgument):
        call()  # type: ignore[operator]


# ---------------------------------------------------------------- version ranges


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.7.6", ">=0.7.6,<0.8", True),
        ("0.7.9", ">=0.7.6,<0.8", True),
        ("0.8", ">=0.7.6,<0.8", False),
        ("0.8.0", ">=0.7.6,<0.8", False),
        ("0.7.5", ">=0.7.6,<0.8", False),
        ("0.10.0", ">=0.9", True),  # integer comparison, not string
        ("1.0", "==1.0.0", True),
        ("1.0.1", "!=1.0.1", False),
        ("3.2.1", "*", True),
        ("0.7.6", "> 0.7.5, <= 0.7.6", True),
    ],
)
def test_version_ranges(version: str, spec: str, ok: bool) -> None:
    assert in_range(version, spec) is ok


@pytest.mark.parametrize("spec", ["", "0.7.6", ">=0.7.6,", "~=0.7", ">=a.b", ">=0.7.6,,<0.8"])
def test_bad_version_ranges_are_invalid_arguments(spec: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_range(spec)


def test_parse_version() -> None:
    assert parse_version(" 0.7.6 ") == (0, 7, 6)
    with pytest.raises(InvalidArgument):
        parse_version("0.7.6-rc1")
