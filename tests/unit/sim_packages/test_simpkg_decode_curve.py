"""The calsim packages' decode curve against docs/sources.md 001 §10's decode table.

Every figure is modelled device time from the timing functions (`calculet.daemon.calsim.timing`)
applied to the timing section of a BUILT package's manifest, never a wall clock. The ranges are
those of docs/sources.md 001 §10's decode table (decode tokens/s by context, batch 1):

    short context 58-64 | ~2K 38-46 | ~4K 28-40 | ~8K-16K mostly 20-30 | ~33K about 12 | ~40K 10-16

"K" is 1,024 tokens; "about 12" is read as 11-13 tok/s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.daemon.calsim import timing
from calculet.daemon.package.manifest import TimingDecl, load_manifest
from calculet.ops.sim_packages.timing import SEED_DECODE_POINTS, sim_timing

# (context in tokens, lowest tok/s, highest tok/s, the seed row it checks)
SEED_RANGES = [
    (0, 58.0, 64.0, "short context: 58-64"),
    (273, 58.0, 64.0, "short context: 58-64 (the measured request's longest KV, 27 + 246)"),
    (512, 58.0, 64.0, "short context: 58-64"),
    (2_048, 38.0, 46.0, "~2K: 38-46"),
    (4_096, 28.0, 40.0, "~4K: 28-40"),
    (8_192, 20.0, 30.0, "~8K-16K: 20-30"),
    (12_288, 20.0, 30.0, "~8K-16K: 20-30"),
    (16_384, 20.0, 30.0, "~8K-16K: 20-30"),
    (33_792, 11.0, 13.0, "~33K: about 12"),
    (40_960, 10.0, 16.0, "~40K: 10-16"),
]


def _tok_per_s(t: TimingDecl, context: int) -> float:
    return 1000.0 / timing.decode_batch1_ms(t, context)


@pytest.mark.parametrize(("context", "low", "high", "row"), SEED_RANGES, ids=[f"{r[0]}" for r in SEED_RANGES])
def test_qwen_decode_speed_is_inside_the_seed_range(
    qwen_pkg: Path, context: int, low: float, high: float, row: str
) -> None:
    t = load_manifest(qwen_pkg).timing
    assert low <= _tok_per_s(t, context) <= high, row


def test_every_context_of_a_seed_row_stays_inside_its_range() -> None:
    t = sim_timing()
    for context in range(8_192, 16_385, 64):  # the whole "~8K-16K" row
        assert 20.0 <= _tok_per_s(t, context) <= 30.0, context
    for context in range(0, 513):  # "short context"
        assert 58.0 <= _tok_per_s(t, context) <= 64.0, context


def test_the_curve_points_are_the_seed_rows_figures() -> None:
    t = sim_timing()
    assert [p.context for p in t.decode_curve] == [512, 2_048, 4_096, 12_288, 33_792, 40_960]
    for row, point in zip(SEED_DECODE_POINTS, t.decode_curve, strict=True):
        assert row.low <= row.tok_per_s <= row.high, row.label
        assert point.ms_per_token == pytest.approx(1000.0 / row.tok_per_s, abs=5e-4)
    assert [r.tok_per_s for r in SEED_DECODE_POINTS] == [58.25, 42.0, 34.0, 25.0, 12.0, 11.0]


def test_decode_slows_monotonically_up_to_the_context() -> None:
    t = sim_timing()
    speeds = [_tok_per_s(t, c) for c in range(0, 40_961, 128)]
    assert speeds == sorted(speeds, reverse=True)
    assert speeds[0] > speeds[-1] * 5  # 58.25 -> 11 tok/s


def test_both_presets_run_at_the_same_pace(qwen_pkg: Path, tiny_pkg: Path) -> None:
    # The tiny model stands in for the real board: the same curve, checked up to its 256 tokens.
    assert load_manifest(tiny_pkg).timing == load_manifest(qwen_pkg).timing == sim_timing()


def test_short_prompt_prefill_keeps_the_measured_pace(qwen_pkg: Path) -> None:
    t = load_manifest(qwen_pkg).timing
    # docs/sources.md 001 §10: a 27-token prefill at 184.27 tok/s
    assert 27_000.0 / timing.prefill_ms(t, 27, 0) == pytest.approx(184.27, rel=1e-3)
    # longer prompts add the KV reads the curve implies, so they are slower per token
    assert 2_048_000.0 / timing.prefill_ms(t, 2_048, 0) < 184.27
