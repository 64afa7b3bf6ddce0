"""calsim jobs: outputs, lanes, statuses, counters, H2D/D2H data semantics, banks, determinism."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimModel, CalsimSubmission
from calculet.daemon.device.errors import BufferInUse, DeviceLost, EngineBusy, LaneBusy
from calculet.daemon.device.types import EngineSlot, JobCounters, JobStatus, RowSpec

from .conftest import OpenDevice
from .factories import (
    DECODE1,
    DECODE4,
    PREFILL,
    VOCAB,
    Gate,
    bitwise_equal,
    decode_spec,
    expected_row,
    is_poison,
    kernel_of,
    make_bufs,
    make_manifest,
    prefill_spec,
)

SENTINEL = np.array(-3.5, dtype=ml_dtypes.bfloat16)


def test_prefill_then_decode_outputs_are_the_kernels_logits_as_bf16(device: CalsimDevice, model: CalsimModel) -> None:
    pre, dec = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE1)
    assert device.submit(model, prefill_spec(pre, 2, [5, 6, 7])).wait(5) is JobStatus.DONE
    assert pre.logits.array.dtype == ml_dtypes.bfloat16
    assert bitwise_equal(pre.out(0), expected_row([5, 6, 7], [0, 1, 2]))
    assert device.submit(model, decode_spec(dec, [(2, 3, 9)])).wait(5) is JobStatus.DONE
    assert bitwise_equal(dec.out(0), expected_row([5, 6, 7, 9], [0, 1, 2, 3]))


def test_prefill_after_past_writes_kv_positions_past_onwards(device: CalsimDevice, model: CalsimModel) -> None:
    pre = make_bufs(device, model, PREFILL)
    device.submit(model, prefill_spec(pre, 0, [1, 2, 3, 4])).wait(5)
    device.submit(model, prefill_spec(pre, 0, [8, 9], past=4)).wait(5)
    assert kernel_of(model).history(0, 7) == ([1, 2, 3, 4, 8, 9, -1], [0, 1, 2, 3, 4, 5, -1])
    assert bitwise_equal(pre.out(0), expected_row([1, 2, 3, 4, 8, 9], [0, 1, 2, 3, 4, 5]))


def test_positions_come_from_the_positions_input(device: CalsimDevice, model: CalsimModel) -> None:
    pre = make_bufs(device, model, PREFILL)
    pre.tokens.array[0, :3] = [4, 5, 6]
    pre.positions.array[0, :3] = [10, 20, 30]  # not 0..2: the device must not invent positions
    device.submit(model, pre.spec([RowSpec(1, 0, 3)])).wait(5)
    assert bitwise_equal(pre.out(0), expected_row([4, 5, 6], [10, 20, 30]))


def test_batched_decode_maps_row_i_to_its_lane_and_leaves_masked_rows(device: CalsimDevice, model: CalsimModel) -> None:
    pre, dec = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE4)
    histories = {0: [1, 2, 3], 1: [4, 5], 3: [6]}
    for lane, toks in histories.items():
        device.submit(model, prefill_spec(pre, lane, toks)).wait(5)
    dec.logits.array[...] = SENTINEL
    # rows in an order different from the lanes', so crossed rows/lanes would show
    rows = [(3, 1, 30), (0, 3, 10)]
    assert device.submit(model, decode_spec(dec, rows)).wait(5) is JobStatus.DONE
    for i, (lane, past, token) in enumerate(rows):
        toks = [*histories[lane], token]
        assert bitwise_equal(dec.out(i), expected_row(toks, list(range(past + 1))))
    assert (dec.logits.array[2:] == SENTINEL).all()  # masked rows untouched


def test_a_refill_before_h2d_is_computed_and_one_after_h2d_is_not(device: CalsimDevice, model: CalsimModel) -> None:
    a, b = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE1)
    gate = Gate()
    kernel_of(model).gate = gate
    first = device.submit(model, prefill_spec(a, 0, [1, 2]), EngineSlot.PING)
    assert gate.entered.wait(5)  # job A has done its H2D and is inside the kernel
    a.tokens.array[0, :2] = [40, 41]  # too late for A
    second = device.submit(model, decode_spec(b, [(1, 0, 7)]), EngineSlot.PONG)
    b.tokens.array[0, 0] = 8  # B's H2D has not happened yet (the worker is busy with A)
    gate.open()
    assert first.wait(5) is JobStatus.DONE and second.wait(5) is JobStatus.DONE
    assert bitwise_equal(a.out(0), expected_row([1, 2], [0, 1]))
    assert bitwise_equal(b.out(0), expected_row([8], [0]))  # the refilled token, a wrong answer on hardware


def test_status_and_counters_follow_the_pipeline(device: CalsimDevice, model: CalsimModel) -> None:
    a, b = make_bufs(device, model, DECODE1), make_bufs(device, model, DECODE1)
    gate = Gate()
    kernel_of(model).gate = gate
    assert device.counters() == JobCounters(0, 0, 0, 0, 0)
    first = device.submit(model, decode_spec(a, [(0, 0, 1)]))
    assert gate.entered.wait(5)
    second = device.submit(model, decode_spec(b, [(1, 0, 2)]))
    assert first.status() is JobStatus.RUNNING
    assert second.status() is JobStatus.PENDING  # waits for the one compute unit
    assert device.counters() == JobCounters(submitted=2, pending=1, running=1, finished=0, left=2)
    gate.open()
    assert first.wait(5) is JobStatus.DONE and second.wait(5) is JobStatus.DONE
    assert device.counters() == JobCounters(submitted=2, pending=0, running=0, finished=2, left=0)
    assert first.history() == (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.DONE)
    assert second.history() == first.history()


def test_banks_busy_auto_and_refusals_hold_nothing(device: CalsimDevice, model: CalsimModel) -> None:
    a, b, c = (make_bufs(device, model, DECODE1) for _ in range(3))
    gate = Gate()
    kernel_of(model).gate = gate
    first = device.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
    assert first.engine_slot is EngineSlot.PING
    assert gate.entered.wait(5)
    with pytest.raises(EngineBusy, match="ping"):
        device.submit(model, decode_spec(b, [(1, 0, 1)]), EngineSlot.PING)
    second = device.submit(model, decode_spec(b, [(1, 0, 1)]))  # AUTO finds the free bank
    assert second.engine_slot is EngineSlot.PONG
    with pytest.raises(EngineBusy, match="both engine banks"):
        device.submit(model, decode_spec(c, [(2, 0, 1)]))
    assert device.counters().submitted == 2
    gate.open()
    first.wait(5)
    second.wait(5)
    assert device.submit(model, decode_spec(c, [(2, 0, 1)])).wait(5) is JobStatus.DONE


def test_auto_prefers_the_bank_free_longest(device: CalsimDevice, model: CalsimModel) -> None:
    a = make_bufs(device, model, DECODE1)
    device.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING).wait(5)
    assert device.submit(model, decode_spec(a, [(0, 1, 1)])).engine_slot is EngineSlot.PONG


def test_buffer_held_by_an_in_flight_job_is_refused(device: CalsimDevice, model: CalsimModel) -> None:
    a, b = make_bufs(device, model, DECODE1), make_bufs(device, model, DECODE1)
    gate = Gate()
    kernel_of(model).gate = gate
    first = device.submit(model, decode_spec(a, [(0, 0, 1)]))
    assert gate.entered.wait(5)
    shared = b.spec([RowSpec(1, 0, 1)])
    shared.outputs["logits"] = a.logits.buffer_id
    with pytest.raises(BufferInUse, match=f"buffer {a.logits.buffer_id} is held by in-flight job {first.job_id}"):
        device.submit(model, shared)
    with pytest.raises(BufferInUse):
        device.unregister_buffer(a.tokens)
    gate.open()
    first.wait(5)
    device.unregister_buffer(a.tokens)  # free again once the job finished
    assert device.submit(model, shared).wait(5) is JobStatus.DONE


def test_lane_advanced_by_an_in_flight_job_is_refused(device: CalsimDevice, model: CalsimModel, tmp_path: Path) -> None:
    a, b = make_bufs(device, model, DECODE1), make_bufs(device, model, DECODE1)
    gate = Gate()
    kernel_of(model).gate = gate
    first = device.submit(model, decode_spec(a, [(2, 0, 1)]))
    assert gate.entered.wait(5)
    with pytest.raises(LaneBusy, match=f"lane 2 is being advanced by in-flight job {first.job_id}"):
        device.submit(model, decode_spec(b, [(2, 0, 1)]))
    other = device.configure(tmp_path, make_manifest("other"))
    c = make_bufs(device, other, DECODE1)
    same_lane_other_model = device.submit(other, decode_spec(c, [(2, 0, 1)]))  # lanes are per model
    gate.open()
    assert first.wait(5) is JobStatus.DONE and same_lane_other_model.wait(5) is JobStatus.DONE


# ---------------------------------------------------------------- determinism


def run_script(device: CalsimDevice, model: CalsimModel, engine: EngineSlot | None) -> list[Any]:
    """A fixed mix of serial and ping-pong jobs; returns every output row and timestamp."""
    pre = [make_bufs(device, model, PREFILL) for _ in range(2)]
    dec = [make_bufs(device, model, DECODE4) for _ in range(2)]
    record: list[Any] = []

    def bank(i: int) -> EngineSlot:
        if engine is not None:
            return engine
        return (EngineSlot.PING, EngineSlot.PONG)[i % 2]

    for lane in range(4):  # serial prefills
        sub = device.submit(model, prefill_spec(pre[0], lane, [lane + 1] * (lane + 2)), bank(lane))
        sub.wait(5)
        record += [sub.timestamps(), pre[0].out(0).tobytes()]
    past = [lane + 2 for lane in range(4)]
    for step in range(3):  # two decode jobs in flight at once when banks alternate
        subs: list[CalsimSubmission] = []
        for j, lanes in enumerate(((0, 2), (1, 3))):
            rows = [(lane, past[lane], 20 + step + lane) for lane in lanes]
            if engine is not None and j == 1:
                subs[0].wait(5)  # one bank only: serialize
            subs.append(device.submit(model, decode_spec(dec[j], rows), bank(j)))
        for j, sub in enumerate(subs):
            sub.wait(5)
            record += [sub.timestamps(), dec[j].logits.array[:2].tobytes()]
        for lane in range(4):
            past[lane] += 1
    return record


@pytest.mark.parametrize("time_scale", [0.0, 0.002])
def test_same_inputs_same_outputs_and_timestamps_whatever_time_scale(
    open_device: OpenDevice, tmp_path: Path, time_scale: float
) -> None:
    baseline_dev = open_device(time_scale=0.0)
    baseline = run_script(baseline_dev, baseline_dev.configure(tmp_path, make_manifest()), None)
    device = open_device(time_scale=time_scale)
    assert run_script(device, device.configure(tmp_path, make_manifest()), None) == baseline


def test_same_outputs_whatever_engine_bank(open_device: OpenDevice, tmp_path: Path) -> None:
    outputs = []
    for engine in (EngineSlot.PING, EngineSlot.PONG, None):
        device = open_device()
        record = run_script(device, device.configure(tmp_path, make_manifest()), engine)
        outputs.append([r for r in record if isinstance(r, bytes)])
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(set(outputs[0])) == len(outputs[0])  # every step's logits differ: the check has teeth


def test_output_rows_have_the_vocab_width(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE4)
    device.submit(model, decode_spec(dec, [(0, 0, 3)])).wait(5)
    assert dec.logits.array.shape == (4, VOCAB)
    assert np.isfinite(dec.out(0).astype(np.float32)).all()


def test_two_threads_one_bank_each_get_their_own_lanes_results(device: CalsimDevice, model: CalsimModel) -> None:
    failures: list[str] = []

    def client(bank: EngineSlot, lanes: tuple[int, int]) -> None:
        bufs = make_bufs(device, model, DECODE4)
        history: dict[int, list[int]] = {lane: [] for lane in lanes}
        for step in range(12):
            rows = [(lane, step, 3 * lane + step) for lane in lanes]
            sub = device.submit(model, decode_spec(bufs, rows), bank)
            if sub.wait(5) is not JobStatus.DONE:
                failures.append(f"{bank}: step {step} not done")
                return
            for i, (lane, past, token) in enumerate(rows):
                history[lane].append(token)
                if not bitwise_equal(bufs.out(i), expected_row(history[lane], list(range(past + 1)))):
                    failures.append(f"{bank}: lane {lane} step {step} wrong logits")

    threads = [
        threading.Thread(target=client, args=(EngineSlot.PING, (0, 1))),
        threading.Thread(target=client, args=(EngineSlot.PONG, (2, 3))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert device.counters().finished == 24


# ---------------------------------------------------------------- compute failures


def test_token_outside_the_vocab_ends_the_job_as_ccu_exception(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE4)
    dec.logits.array[...] = SENTINEL
    sub = device.submit(model, decode_spec(dec, [(0, 0, 1), (2, 0, VOCAB)]))
    assert sub.wait(5) is JobStatus.CCU_EXCEPTION
    assert is_poison(dec.logits.array[:2])  # no outputs: the active rows keep the submit-time poison
    assert (dec.logits.array[2:] == SENTINEL).all()  # masked rows untouched
    assert sorted(kernel_of(model).lanes_touched("corrupt")) == [0, 2]
    assert kernel_of(model).lanes_touched("decode") == []  # the kernel never ran
    assert device.healthy()


def test_kernel_value_error_is_a_ccu_exception_not_a_crash(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE1)
    kernel_of(model).fail_next = ValueError("bad registers")
    assert device.submit(model, decode_spec(dec, [(1, 0, 1)])).wait(5) is JobStatus.CCU_EXCEPTION
    assert kernel_of(model).lanes_touched("corrupt") == [1]
    assert device.submit(model, decode_spec(dec, [(1, 0, 1)])).wait(5) is JobStatus.DONE


def test_unexpected_worker_error_loses_the_device_and_wakes_waiters(
    device: CalsimDevice, model: CalsimModel, caplog: pytest.LogCaptureFixture
) -> None:
    dec = make_bufs(device, model, DECODE1)
    kernel_of(model).fail_next = RuntimeError("kernel bug")
    sub = device.submit(model, decode_spec(dec, [(1, 0, 1)]))
    with pytest.raises(DeviceLost, match="kernel bug"):
        sub.wait(5)
    assert not device.healthy()
    assert "calsim worker failed" in caplog.text
