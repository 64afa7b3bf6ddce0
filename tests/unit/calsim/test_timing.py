"""Timing model: the pure formulas, and device timestamps that follow them on the modelled clock."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.calsim import timing
from calculet.daemon.calsim.clock import DeviceClock, Pacer
from calculet.daemon.calsim.device import CalsimDevice, CalsimModel
from calculet.daemon.calsim.model_check import check_timing
from calculet.daemon.calsim.timing import JobDurations
from calculet.daemon.device.errors import ConfigurationError
from calculet.daemon.device.types import EngineSlot, JobTimestamps, RowSpec, TaskType
from calculet.daemon.package.manifest import DecodePoint, TimingDecl

from .factories import (
    DECODE1,
    DECODE4,
    LANE_CONTEXT,
    PREFILL,
    TIMING,
    VOCAB,
    decode_spec,
    make_bufs,
    make_manifest,
    prefill_spec,
)

# The former linear model as a two-point curve: the curve formulas must reduce to it exactly.
LINE = TimingDecl((DecodePoint(0, 17.2), DecodePoint(40960, 80.0)), 40.0, 4.0, 0.1, 16.0, 16.0)
# A curve shaped like docs/sources.md 001 §10's (flat start, uneven slopes) for the interpolation properties.
CURVE = (
    DecodePoint(512, 17.167),
    DecodePoint(2048, 23.81),
    DecodePoint(4096, 29.412),
    DecodePoint(12288, 40.0),
    DecodePoint(33792, 83.333),
    DecodePoint(40960, 90.909),
)
CURVED = TimingDecl(CURVE, 17.167, 4.791, 0.1, 8.0, 8.0)


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-12, abs=1e-15)


@st.composite
def curves(draw: st.DrawFn) -> tuple[DecodePoint, ...]:
    """Valid curves: 2-6 points, contexts strictly increasing from >= 0, ms non-decreasing."""
    gaps = draw(st.lists(st.integers(1, 3000), min_size=1, max_size=5))
    rises = draw(st.lists(st.floats(0.0, 50.0), min_size=len(gaps), max_size=len(gaps)))
    context, ms = draw(st.integers(0, 600)), draw(st.floats(0.5, 40.0))
    points = [DecodePoint(context, ms)]
    for gap, rise in zip(gaps, rises, strict=True):
        context, ms = context + gap, ms + rise
        points.append(DecodePoint(context, ms))
    return tuple(points)


# ---------------------------------------------------------------- decode: the curve


def test_curve_is_exact_at_every_point() -> None:
    for p in CURVE:
        assert timing.decode_batch1_ms(CURVED, p.context) == p.ms_per_token  # exactly, not approximately


def test_curve_is_linear_between_points() -> None:
    for a, b in pairwise(CURVE):
        for frac in (0.25, 0.5, 0.75):
            x = a.context + frac * (b.context - a.context)
            want = a.ms_per_token + frac * (b.ms_per_token - a.ms_per_token)
            assert timing.curve_ms(CURVE, x) == pytest.approx(want, rel=1e-12)


@given(curves(), st.data())
def test_any_curve_interpolates_linearly_inside_each_segment(
    curve: tuple[DecodePoint, ...], data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(curve) - 2))
    a, b = curve[i], curve[i + 1]
    x = data.draw(st.integers(a.context, b.context))
    slope = (b.ms_per_token - a.ms_per_token) / (b.context - a.context)
    assert timing.curve_ms(curve, x) == pytest.approx(a.ms_per_token + slope * (x - a.context), rel=1e-9, abs=1e-9)


def test_curve_is_flat_outside_its_points() -> None:
    assert timing.curve_ms(CURVE, 0) == timing.curve_ms(CURVE, 511) == 17.167  # below the first point
    assert timing.curve_ms(CURVE, 50_000) == 90.909  # above the last (never asked by a valid package)


@given(curves(), st.integers(0, 20_000), st.integers(0, 20_000))
def test_decode_never_gets_faster_with_a_longer_context(curve: tuple[DecodePoint, ...], a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert timing.curve_ms(curve, lo) <= timing.curve_ms(curve, hi)


def test_two_point_curve_is_the_former_line() -> None:
    assert timing.decode_batch1_ms(LINE, 0) == approx(17.2)
    assert timing.decode_batch1_ms(LINE, 40960) == approx(80.0)
    slope = (80.0 - 17.2) / 40960
    for kv in (1, 300, 2048, 33_000):
        assert timing.decode_batch1_ms(LINE, kv) == pytest.approx(17.2 + slope * kv, rel=1e-12)


@given(st.integers(1, 16), st.integers(0, 40960))
def test_batch_b_decode_is_t1_times_alpha_factor(batch: int, kv: int) -> None:
    t1 = timing.decode_batch1_ms(CURVED, kv)
    assert timing.decode_ms(CURVED, batch, kv) == approx(t1 * (1 + 0.1 * (batch - 1)))


def test_decode_job_uses_the_longest_active_row_and_the_compiled_batch() -> None:
    rows = [RowSpec(0, 10, 1), RowSpec(1, 3000, 1), RowSpec(2, 5, 1)]
    got = timing.compute_ms(CURVED, TaskType.DECODE, 8, rows)
    assert got == approx(timing.decode_ms(CURVED, 8, 3001))
    # fewer active rows on the same compiled batch cost the same (static graph)
    assert timing.compute_ms(CURVED, TaskType.DECODE, 8, rows[1:2]) == approx(got)


# ---------------------------------------------------------------- prefill: KV reads from the curve


@given(curves(), st.integers(1, 600), st.integers(0, 6000))
def test_prefill_attention_is_the_curves_growth_per_new_token(
    curve: tuple[DecodePoint, ...], n: int, past: int
) -> None:
    t = TimingDecl(curve, 40.0, 4.0, 0.1, 16.0, 16.0)
    base = timing.curve_ms(curve, 0)
    reads = math.fsum(timing.curve_ms(curve, past + i) - base for i in range(1, n + 1))
    assert timing.attention_ms(t, n, past) == pytest.approx(reads, rel=1e-9, abs=1e-6)
    assert timing.prefill_ms(t, n, past) == pytest.approx(40.0 + 4.0 * n + reads, rel=1e-9, abs=1e-6)


@given(st.integers(0, 40000))
def test_prefill_of_one_token_grows_like_one_decode_token(past: int) -> None:
    growth = timing.prefill_ms(CURVED, 1, past) - timing.prefill_ms(CURVED, 1, 0)
    decode_growth = timing.decode_batch1_ms(CURVED, past + 1) - timing.decode_batch1_ms(CURVED, 1)
    assert growth == pytest.approx(decode_growth, abs=1e-6)


@given(st.integers(1, 512), st.integers(0, 4096))
def test_two_point_curve_prefill_is_the_former_formula(n: int, past: int) -> None:
    slope = (80.0 - 17.2) / 40960
    reads = sum(past + i for i in range(1, n + 1))
    want = 40.0 + 4.0 * n + slope * reads
    assert timing.prefill_ms(LINE, n, past) == pytest.approx(want, rel=1e-9)


def test_prefill_below_the_first_point_reads_nothing() -> None:
    # flat up to 512 tokens: a short prompt pays fixed + per-token only (001 §10's 27-token prefill)
    assert timing.attention_ms(CURVED, 27, 0) == 0.0
    assert timing.prefill_ms(CURVED, 27, 0) == approx(17.167 + 27 * 4.791)


def test_multi_row_prefill_pays_fixed_once() -> None:
    rows = [RowSpec(0, 0, 4), RowSpec(1, 800, 2)]
    want = 17.167 + timing.prefill_row_ms(CURVED, 4, 0) + timing.prefill_row_ms(CURVED, 2, 800)
    assert timing.compute_ms(CURVED, TaskType.PREFILL, 2, rows) == approx(want)


# ---------------------------------------------------------------- copies: real rows and tokens only


@given(st.integers(0, 10**9), st.floats(0.001, 100.0))
def test_copy_time_is_bytes_over_bandwidth(nbytes: int, gbps: float) -> None:
    assert timing.copy_s(nbytes, gbps) == pytest.approx(nbytes / (gbps * 1e9), rel=1e-12)


QWEN_BUCKET = 40_960
QWEN_INPUTS = (QWEN_BUCKET * 4, QWEN_BUCKET * 4)  # tokens and positions, int32 [1, 40960]


@given(st.integers(1, QWEN_BUCKET))
def test_h2d_of_a_prefill_is_proportional_to_its_tokens_not_the_bucket(n: int) -> None:
    moved = timing.h2d_bytes(QWEN_INPUTS, 1, QWEN_BUCKET, [RowSpec(0, 0, n)])
    assert moved == n * (4 + 4)  # n int32 tokens + n int32 positions
    assert timing.copy_s(moved, 8.0) == pytest.approx(n * timing.copy_s(8, 8.0), rel=1e-12)


def test_h2d_of_a_27_token_prompt_on_the_qwen_bucket() -> None:
    moved = timing.h2d_bytes(QWEN_INPUTS, 1, QWEN_BUCKET, [RowSpec(0, 0, 27)])
    assert moved == 216  # not the 327,680 B of the whole bucket
    assert timing.copy_s(moved, 8.0) == pytest.approx(27e-9, rel=1e-12)


def test_copies_count_active_rows_only() -> None:
    rows = [RowSpec(0, 10, 1), RowSpec(3, 40, 1)]
    assert timing.h2d_bytes((16 * 4, 16 * 4), 16, 1, rows) == 2 * (4 + 4)  # decode b16, 2 active rows
    assert timing.d2h_bytes((16 * 151_936 * 2,), 16, rows) == 2 * 151_936 * 2  # bf16 logits rows
    multi = [RowSpec(0, 0, 5), RowSpec(1, 0, 3)]
    assert timing.h2d_bytes((2 * 64 * 4, 2 * 64 * 4), 2, 64, multi) == (5 + 3) * 8


def test_job_durations_are_seconds_of_each_phase() -> None:
    rows = [RowSpec(0, 0, 12)]
    d = timing.job_durations(CURVED, TaskType.PREFILL, 1, rows, 4096, 303872)
    assert d.compute == approx(timing.prefill_ms(CURVED, 12, 0) / 1000)
    assert d.h2d == approx(4096 / 8e9)
    assert d.d2h == approx(303872 / 8e9)


# ---------------------------------------------------------------- calsim refuses an unusable curve


BAD_CURVES = [
    ("one point", (DecodePoint(LANE_CONTEXT, 2.0),), "timing.curve_points"),
    ("unsorted", (DecodePoint(LANE_CONTEXT, 10.0), DecodePoint(0, 2.0)), "timing.curve_order"),
    ("repeated context", (DecodePoint(0, 2.0), DecodePoint(0, 3.0), DecodePoint(LANE_CONTEXT, 10.0)), "curve_order"),
    ("speeds up", (DecodePoint(0, 2.0), DecodePoint(32, 9.0), DecodePoint(LANE_CONTEXT, 5.0)), "curve_monotonic"),
    ("nan", (DecodePoint(0, math.nan), DecodePoint(LANE_CONTEXT, 10.0)), "decode_curve[0].ms_per_token"),
    ("infinite", (DecodePoint(0, 2.0), DecodePoint(LANE_CONTEXT, math.inf)), "decode_curve[1].ms_per_token"),
    ("zero", (DecodePoint(0, 0.0), DecodePoint(LANE_CONTEXT, 10.0)), "decode_curve[0].ms_per_token"),
    ("short of context", (DecodePoint(0, 2.0), DecodePoint(LANE_CONTEXT - 1, 10.0)), "timing.curve_coverage"),
]


@pytest.mark.parametrize(("name", "curve", "message"), BAD_CURVES, ids=[c[0] for c in BAD_CURVES])
def test_calsim_refuses_an_unusable_curve(name: str, curve: tuple[DecodePoint, ...], message: str) -> None:
    manifest = make_manifest(timing=replace(TIMING, decode_curve=curve))
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        check_timing(manifest)


def test_calsim_accepts_the_factory_curve() -> None:
    check_timing(make_manifest())


# ---------------------------------------------------------------- device clock


def test_clock_place_serialises_copies_and_compute() -> None:
    clock = DeviceClock()
    d = JobDurations(h2d=1.0, compute=5.0, d2h=0.5)
    a = clock.place(EngineSlot.PING, d, 0.0, hang=False)
    b = clock.place(EngineSlot.PONG, d, 2.0, hang=False)  # slow job: 2 s before its H2D
    assert (a.h2d_start, a.compute_start, a.d2h_start, a.d2h_end) == (0.0, 1.0, 6.0, 6.5)
    assert b.queued == 0.0 and b.h2d_start == 2.0  # delay dominates the free copy path
    assert b.compute_start == a.compute_end == 6.0


def test_clock_queues_on_a_bank_no_earlier_than_its_previous_job_ended() -> None:
    clock = DeviceClock()
    d = JobDurations(h2d=1.0, compute=5.0, d2h=0.5)
    a = clock.place(EngineSlot.PING, d, 0.0, hang=False)
    clock.release_bank(EngineSlot.PING, a.d2h_end)  # finished; the host has not waited it
    b = clock.place(EngineSlot.PING, d, 0.0, hang=False)
    assert b.queued == a.d2h_end and clock.host_now == a.d2h_end
    c = clock.place(EngineSlot.PONG, d, 0.0, hang=False)
    assert c.queued == clock.host_now  # the host is now known to be at least there


def test_clock_hang_blocks_later_computes_but_not_copies() -> None:
    clock = DeviceClock()
    d = JobDurations(h2d=1.0, compute=5.0, d2h=0.5)
    hung = clock.place(EngineSlot.PING, d, 0.0, hang=True)
    behind = clock.place(EngineSlot.PONG, d, 0.0, hang=False)
    assert math.isinf(hung.compute_end) and math.isinf(hung.d2h_end)
    assert behind.h2d_start == hung.h2d_end and math.isinf(behind.compute_start)


def test_clock_observe_only_moves_forward() -> None:
    clock = DeviceClock()
    clock.observe(3.0)
    clock.observe(1.0)
    clock.observe(math.inf)
    assert clock.host_now == 3.0


# ---------------------------------------------------------------- pacer (fake wall clock)


def test_pacer_maps_device_time_from_its_anchor() -> None:
    now = [100.0]
    pacer = Pacer(2.0, clock=lambda: now[0])
    pacer.anchor(1.0)
    assert pacer.delay(1.5) == approx(1.0)  # 0.5 device s * 2
    now[0] = 100.75
    assert pacer.delay(1.5) == approx(0.25)
    assert pacer.delay(1.0) < 0  # already due


def test_pacer_with_scale_zero_never_waits() -> None:
    pacer = Pacer(0.0, clock=lambda: 0.0)
    assert pacer.delay(1e9) == 0.0


# ---------------------------------------------------------------- device timestamps follow the model


def _bytes(rows: int, *row_bytes: int) -> int:
    return rows * sum(row_bytes)


def test_single_prefill_timestamps_follow_the_formulas(device: CalsimDevice, model: CalsimModel) -> None:
    bufs = make_bufs(device, model, PREFILL)
    sub = device.submit(model, prefill_spec(bufs, 1, [3, 4, 5, 6, 7], past=0))
    sub.wait(5)
    ts = sub.timestamps()
    assert ts is not None
    h2d = timing.copy_s(_bytes(1, 5 * 4, 5 * 4), TIMING.h2d_gbps)  # 5 tokens + 5 positions, not the bucket of 16
    d2h = timing.copy_s(_bytes(1, VOCAB * 2), TIMING.d2h_gbps)
    compute = timing.prefill_ms(TIMING, 5, 0) / 1000
    assert ts.queued == 0.0 and ts.h2d_start == 0.0
    assert ts.h2d == approx(h2d)
    assert ts.compute_start == ts.h2d_end
    assert ts.compute == approx(compute)
    assert ts.d2h_start == ts.compute_end
    assert ts.d2h == approx(d2h)


def test_prefill_h2d_on_the_device_clock_grows_with_tokens_not_the_bucket(
    device: CalsimDevice, model: CalsimModel
) -> None:
    bufs = make_bufs(device, model, PREFILL)
    h2d = {}
    for lane, n in ((0, 2), (1, 4), (2, 16)):
        sub = device.submit(model, prefill_spec(bufs, lane, list(range(3, 3 + n))))
        sub.wait(5)
        ts = sub.timestamps()
        assert ts is not None
        h2d[n] = ts.h2d
    assert h2d[4] == pytest.approx(2 * h2d[2], rel=1e-9)
    assert h2d[16] == pytest.approx(8 * h2d[2], rel=1e-9)  # the full bucket only when all 16 are fed
    assert h2d[2] == pytest.approx(timing.copy_s(2 * (4 + 4), TIMING.h2d_gbps), rel=1e-9)


def test_batched_decode_uses_active_row_bytes_and_longest_row(device: CalsimDevice, model: CalsimModel) -> None:
    pre = make_bufs(device, model, PREFILL)
    for lane, n in ((0, 3), (1, 9)):
        device.submit(model, prefill_spec(pre, lane, list(range(10, 10 + n)))).wait(5)
    dec = make_bufs(device, model, DECODE4)
    sub = device.submit(model, decode_spec(dec, [(0, 3, 1), (1, 9, 2)]))
    sub.wait(5)
    ts = sub.timestamps()
    assert ts is not None
    assert ts.h2d == approx(timing.copy_s(_bytes(2, 4, 4), TIMING.h2d_gbps))
    assert ts.d2h == approx(timing.copy_s(_bytes(2, VOCAB * 2), TIMING.d2h_gbps))
    assert ts.compute == approx(timing.decode_ms(TIMING, 4, 10) / 1000)


def _pingpong(device: CalsimDevice, model: CalsimModel) -> tuple[JobTimestamps, JobTimestamps]:
    a_bufs, b_bufs = make_bufs(device, model, PREFILL), make_bufs(device, model, PREFILL)
    a = device.submit(model, prefill_spec(a_bufs, 0, [1] * 16), EngineSlot.PING)
    b = device.submit(model, prefill_spec(b_bufs, 1, [2] * 2), EngineSlot.PONG)
    a.wait(5)
    b.wait(5)
    ta, tb = a.timestamps(), b.timestamps()
    assert ta is not None and tb is not None
    return ta, tb


def test_ping_pong_copies_overlap_the_other_banks_compute(device: CalsimDevice, model: CalsimModel) -> None:
    ta, tb = _pingpong(device, model)
    # both queued at once; one H2D path: B's copy starts when A's ends
    assert ta.queued == tb.queued == 0.0
    assert tb.h2d_start == ta.h2d_end
    # B's H2D runs while A computes (overlap), B computes after A (one compute unit)
    assert ta.compute_start <= tb.h2d_start and tb.h2d_end < ta.compute_end
    assert tb.compute_start == max(tb.h2d_end, ta.compute_end)
    # A's D2H runs while B computes
    assert ta.d2h_start == ta.compute_end == tb.compute_start
    assert ta.d2h_end > tb.compute_start


def test_serial_submit_wait_leaves_the_device_idle_between_jobs(device: CalsimDevice, model: CalsimModel) -> None:
    bufs = make_bufs(device, model, PREFILL)
    first = device.submit(model, prefill_spec(bufs, 0, [1] * 16))
    first.wait(5)
    second = device.submit(model, prefill_spec(bufs, 1, [2] * 2))
    second.wait(5)
    t1, t2 = first.timestamps(), second.timestamps()
    assert t1 is not None and t2 is not None
    assert t2.queued == t1.d2h_end  # the host submitted after seeing the first finish
    assert t2.h2d_start == t2.queued


def test_ping_pong_finishes_earlier_than_serial_on_the_device_clock(device: CalsimDevice, model: CalsimModel) -> None:
    ta, tb = _pingpong(device, model)
    overlapped_end = max(ta.d2h_end, tb.d2h_end)
    serial_end = (ta.d2h_end - ta.queued) + (tb.h2d + tb.compute + tb.d2h)
    assert overlapped_end < serial_end


def test_timestamps_are_ordered_and_finite(device: CalsimDevice, model: CalsimModel) -> None:
    bufs = make_bufs(device, model, DECODE1)
    sub = device.submit(model, decode_spec(bufs, [(0, 0, 5)]))
    sub.wait(5)
    ts = sub.timestamps()
    assert ts is not None
    seq = [ts.queued, ts.h2d_start, ts.h2d_end, ts.compute_start, ts.compute_end, ts.d2h_start, ts.d2h_end]
    assert seq == sorted(seq) and all(math.isfinite(x) for x in seq)
