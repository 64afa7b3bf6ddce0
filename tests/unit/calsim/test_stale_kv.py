"""calsim's KV rules for prefix reuse: a lane keeps what its jobs wrote, a row may truncate it (tail
deletion, `past_kv_len` below the valid length), and a row that reads past it is refused (StaleKV)
once KV Free, a CCU exception or a configuration reset destroyed it."""

from __future__ import annotations

import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimModel
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.device.errors import StaleKV
from calculet.daemon.device.types import JobStatus

from .factories import DECODE1, PREFILL, bitwise_equal, decode_spec, expected_row, kernel_of, make_bufs, prefill_spec


def test_a_lane_holds_what_its_jobs_wrote_and_a_row_may_not_read_past_it(
    device: CalsimDevice, model: CalsimModel
) -> None:
    pre, dec = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE1)
    with pytest.raises(StaleKV, match="past_kv_len 1 on KV lane 0, which holds only 0"):
        device.submit(model, decode_spec(dec, [(0, 1, 9)]))
    assert device.counters().submitted == 0  # refused before anything was held
    assert device.submit(model, prefill_spec(pre, 0, [5, 6, 7])).wait(5) is JobStatus.DONE
    assert model.kv.valid(0) == 3
    with pytest.raises(StaleKV):
        device.submit(model, decode_spec(dec, [(0, 4, 9)]))
    assert device.submit(model, decode_spec(dec, [(0, 3, 9)])).wait(5) is JobStatus.DONE
    assert model.kv.valid(0) == 4


def test_a_truncated_lane_continues_exactly_as_a_cold_one(device: CalsimDevice, model: CalsimModel) -> None:
    """Tail deletion: keep positions [0, 2), write from 2 on; the result is the cold run's, and the
    truncated tail is no longer valid."""
    pre = make_bufs(device, model, PREFILL)
    device.submit(model, prefill_spec(pre, 1, [5, 6, 7, 8, 9])).wait(5)
    assert device.submit(model, prefill_spec(pre, 1, [3], past=2)).wait(5) is JobStatus.DONE
    assert bitwise_equal(pre.out(0), expected_row([5, 6, 3], [0, 1, 2]))
    assert model.kv.valid(1) == 3
    with pytest.raises(StaleKV):
        device.submit(model, prefill_spec(pre, 1, [9], past=4))  # the old tail was cut off


def test_kv_free_poisons_the_lane(device: CalsimDevice, model: CalsimModel) -> None:
    pre = make_bufs(device, model, PREFILL)
    device.open_lane(model, 2)
    device.submit(model, prefill_spec(pre, 2, [5, 6, 7])).wait(5)
    device.close_lane(model, 2)
    assert model.kv.valid(2) == 0
    assert kernel_of(model).history(2, 3)[0] != [5, 6, 7]  # overwritten, not kept
    device.open_lane(model, 2)
    with pytest.raises(StaleKV, match="KV lane 2"):
        device.submit(model, prefill_spec(pre, 2, [8], past=3))
    assert device.submit(model, prefill_spec(pre, 2, [5, 6, 7, 8])).wait(5) is JobStatus.DONE  # cold is fine


def test_a_ccu_exception_leaves_its_lanes_invalid_and_others_intact(device: CalsimDevice, model: CalsimModel) -> None:
    pre, dec = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE1)
    for lane in (0, 1):
        device.submit(model, prefill_spec(pre, lane, [4, 5])).wait(5)
    device.inject(Fault(FaultKind.CCU_EXCEPTION))
    assert device.submit(model, decode_spec(dec, [(0, 2, 9)])).wait(5) is JobStatus.CCU_EXCEPTION
    assert (model.kv.valid(0), model.kv.valid(1)) == (0, 2)
    with pytest.raises(StaleKV):
        device.submit(model, decode_spec(dec, [(0, 2, 9)]))
    assert device.submit(model, decode_spec(dec, [(1, 2, 9)])).wait(5) is JobStatus.DONE


def test_reset_ccu_and_reset_configuration_leave_nothing_valid(device: CalsimDevice, model: CalsimModel) -> None:
    pre = make_bufs(device, model, PREFILL)
    device.submit(model, prefill_spec(pre, 0, [4, 5])).wait(5)
    device.reset_ccu()  # no job in flight: lanes outside jobs keep their KV
    assert model.kv.valid(0) == 2
    device.reset_configuration(model)
    assert model.kv.valid(0) == 0
