"""Timing figures against the measurements of docs/sources.md 001 §10, and the builder's capacity arithmetic."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.common.errors import FailedPrecondition
from calculet.daemon.calsim import timing
from calculet.daemon.package.capacity import DeviceLimits, MemoryModel
from calculet.daemon.package.manifest import ChipMemoryDecl
from calculet.ops.sim_packages import capacity
from calculet.ops.sim_packages.timing import sim_timing


def test_timing_reproduces_the_seed_measurements() -> None:
    t = sim_timing()
    short = timing.decode_batch1_ms(t, 273)  # the measured request: 27-token prompt + 246 decoded tokens
    assert 1000.0 / short == pytest.approx(58.25, rel=1e-3)  # docs/sources.md 001 §10 decode tok/s
    prefill_27 = timing.prefill_ms(t, 27, 0)  # the modelled prefill, KV reads included
    assert 27_000.0 / prefill_27 == pytest.approx(184.27, rel=1e-3)  # docs/sources.md 001 §10 prefill tok/s
    assert t.prefill_fixed_ms == t.decode_curve[0].ms_per_token  # stated assumption: one pass over the weights
    assert t.decode_curve[-1].context == 40_960  # the calbin context (docs/sources.md 001 §5)
    assert (t.batch_alpha, t.h2d_gbps, t.d2h_gbps) == (0.1, 8.0, 8.0)
    # Every figure and every curve point has a written source; assumptions are labelled as such.
    figures = {f.name for f in dataclasses.fields(t) if f.name not in ("sources", "decode_curve")}
    points = {f"decode_curve[{i}]" for i in range(len(t.decode_curve))}
    assert set(t.sources) == figures | points | {"decode_curve"}
    for name in ("batch_alpha", "h2d_gbps", "d2h_gbps", "prefill_fixed_ms", "decode_curve", "decode_curve[0]"):
        assert "ASSUMPTION" in t.sources[name]
    for name in points:
        assert "docs/sources.md 001 §10 table" in t.sources[name]


def _model(chips: tuple[ChipMemoryDecl, ...], bpt: int, max_context: int = 40_960) -> MemoryModel:
    return capacity.memory_model("m", chips, bpt, max_context, 1, max_context)


def _chips(params: int, workspace: int) -> tuple[ChipMemoryDecl, ...]:
    return tuple(ChipMemoryDecl(c, 1 << c, params, 0, workspace) for c in (0, 1))


BOARD = DeviceLimits(dram_bytes_per_chip=2 << 30)


@given(
    params=st.integers(0, 1 << 30),
    lanes=st.integers(1, 32),
    bpt=st.integers(1, 1 << 17).map(lambda x: x * 2),
    limit=st.integers(256, 65_536),
)
def test_max_lane_context_is_the_largest_fitting_granule(params: int, lanes: int, bpt: int, limit: int) -> None:
    model = _model(_chips(params, 1 << 20), bpt, limit)
    try:
        ctx = capacity.max_lane_context(model, lanes, BOARD)
    except FailedPrecondition:
        with pytest.raises(FailedPrecondition):
            capacity.check_fits(model, lanes, 256, BOARD)
        return
    assert ctx % 256 == 0 and 256 <= ctx <= limit
    capacity.check_fits(model, lanes, ctx, BOARD)  # fits
    # Fits by hand: params + workspace + this chip's half of the KV.
    assert params + (1 << 20) + lanes * ctx * bpt // 2 <= 2 << 30
    if ctx + 256 <= limit:
        assert params + (1 << 20) + lanes * (ctx + 256) * bpt // 2 > 2 << 30
        with pytest.raises(FailedPrecondition, match="DRAM over"):
            capacity.check_fits(model, lanes, ctx + 256, BOARD)


def test_memory_decl_sums_params_workspace_and_kv_share() -> None:
    chips = (ChipMemoryDecl(0, 1, 100, 0, 10), ChipMemoryDecl(1, 2, 50, 0, 20))
    decl = capacity.memory_decl(_model(chips, 6), lanes=3, lane_context=4)
    kv_share = 3 * 4 * 6 // 2
    assert decl.device_memory_required_bytes == (100 + 10 + kv_share) + (50 + 20 + kv_share)
    assert decl.chips == chips


def test_check_fits_names_the_chip_that_does_not_fit() -> None:
    chips = (ChipMemoryDecl(0, 1, 100, 0, 0), ChipMemoryDecl(1, 2, 900, 0, 0))
    board = DeviceLimits(dram_bytes_per_chip=1000)
    capacity.check_fits(_model(chips, 20), 1, 10, board)  # 900 + 10 x 10 = 1000
    with pytest.raises(FailedPrecondition, match="chip 1") as info:
        capacity.check_fits(_model(chips, 20), 1, 11, board)
    assert "chip 0" not in str(info.value)


def test_check_fits_refuses_context_beyond_the_calbin() -> None:
    with pytest.raises(FailedPrecondition, match="calbin context"):
        capacity.check_fits(_model(_chips(0, 0), 2, max_context=512), 1, 513, BOARD)
