"""Timing model: the pure formulas, and device timestamps that follow them on the modelled clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.calsim import timing
from calculet.daemon.calsim.clock import DeviceClock, Pacer
from calculet.daemon.calsim.device import CalsimDevice, CalsimModel
from calculet.daemon.calsim.timing import JobDurations
from calculet.daemon.device.types import EngineSlot, JobTimestamps, RowSpec, TaskType
from calculet.daemon.package.manifest import TimingDecl

from .factories import DECODE1, DECODE4, PREFILL, TIMING, VOCAB, decode_spec, make_bufs, prefill_spec

SEED_TIMING = TimingDecl(17.2, 80.0, 40960, 40.0, 4.0, 0.1, 16.0, 16.0)  # seed 001 figures


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-12, abs=1e-15)


# ---------------------------------------------------------------- pure formulas


def test_decode_line_hits_both_calibration_points() -> None:
    assert timing.decode_batch1_ms(SEED_TIMING, 0) == approx(17.2)
    assert timing.decode_batch1_ms(SEED_TIMING, 40960) == approx(80.0)


@given(st.integers(0, 40960), st.integers(0, 40960))
def test_decode_is_linear_and_monotone_in_kv_length(a: int, b: int) -> None:
    ta, tb = timing.decode_batch1_ms(SEED_TIMING, a), timing.decode_batch1_ms(SEED_TIMING, b)
    if a <= b:
        assert ta <= tb
    slope = (80.0 - 17.2) / 40960
    assert tb - ta == pytest.approx(slope * (b - a), abs=1e-9)


@given(st.integers(1, 16), st.integers(0, 40960))
def test_batch_b_decode_is_t1_times_alpha_factor(batch: int, kv: int) -> None:
    t1 = timing.decode_batch1_ms(SEED_TIMING, kv)
    assert timing.decode_ms(SEED_TIMING, batch, kv) == approx(t1 * (1 + 0.1 * (batch - 1)))


def test_decode_job_uses_the_longest_active_row_and_the_compiled_batch() -> None:
    rows = [RowSpec(0, 10, 1), RowSpec(1, 300, 1), RowSpec(2, 5, 1)]
    got = timing.compute_ms(SEED_TIMING, TaskType.DECODE, 8, rows)
    assert got == approx(timing.decode_ms(SEED_TIMING, 8, 301))
    # fewer active rows on the same compiled batch cost the same (static graph)
    assert timing.compute_ms(SEED_TIMING, TaskType.DECODE, 8, rows[1:2]) == approx(got)


@given(st.integers(0, 40000))
def test_prefill_of_one_token_grows_like_one_decode_token(past: int) -> None:
    # the attention-read term of a 1-token prefill equals the decode line's growth at the same KV length
    growth = timing.prefill_ms(SEED_TIMING, 1, past) - timing.prefill_ms(SEED_TIMING, 1, 0)
    decode_growth = timing.decode_batch1_ms(SEED_TIMING, past + 1) - timing.decode_batch1_ms(SEED_TIMING, 1)
    assert growth == pytest.approx(decode_growth, abs=1e-9)


@given(st.integers(1, 512), st.integers(0, 4096))
def test_prefill_is_fixed_plus_per_token_plus_kv_reads(n: int, past: int) -> None:
    slope = (80.0 - 17.2) / 40960
    reads = sum(past + i for i in range(1, n + 1))
    want = 40.0 + 4.0 * n + slope * reads
    assert timing.prefill_ms(SEED_TIMING, n, past) == pytest.approx(want, rel=1e-9)


@given(st.integers(0, 10**9), st.floats(0.001, 100.0))
def test_copy_time_is_bytes_over_bandwidth(nbytes: int, gbps: float) -> None:
    assert timing.copy_s(nbytes, gbps) == pytest.approx(nbytes / (gbps * 1e9), rel=1e-12)


def test_job_durations_are_seconds_of_each_phase() -> None:
    rows = [RowSpec(0, 0, 12)]
    d = timing.job_durations(SEED_TIMING, TaskType.PREFILL, 1, rows, 4096, 303872)
    assert d.compute == approx(timing.prefill_ms(SEED_TIMING, 12, 0) / 1000)
    assert d.h2d == approx(4096 / 16e9)
    assert d.d2h == approx(303872 / 16e9)


def test_multi_row_prefill_pays_fixed_once() -> None:
    rows = [RowSpec(0, 0, 4), RowSpec(1, 8, 2)]
    want = 40.0 + timing.prefill_row_ms(SEED_TIMING, 4, 0) + timing.prefill_row_ms(SEED_TIMING, 2, 8)
    assert timing.compute_ms(SEED_TIMING, TaskType.PREFILL, 2, rows) == approx(want)


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
    h2d = timing.copy_s(_bytes(1, 16 * 4, 16 * 4), TIMING.h2d_gbps)
    d2h = timing.copy_s(_bytes(1, VOCAB * 2), TIMING.d2h_gbps)
    compute = timing.prefill_ms(TIMING, 5, 0) / 1000
    assert ts.queued == 0.0 and ts.h2d_start == 0.0
    assert ts.h2d == approx(h2d)
    assert ts.compute_start == ts.h2d_end
    assert ts.compute == approx(compute)
    assert ts.d2h_start == ts.compute_end
    assert ts.d2h == approx(d2h)


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
