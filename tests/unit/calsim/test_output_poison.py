"""calsim output poisoning: from submit until `wait` returns DONE a job's output rows hold poison.

calsim computes the outputs as before but copies them into the host buffers only when `wait`
returns DONE, so a daemon that reads logits after polling `status`, or for a CCU_EXCEPTION job,
reads NaN (every byte 0xFF), never a plausible answer. Nothing here depends on machine speed:
time_scale 0, and the job's own event (`done`) or the kernel gate say when the device has finished.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimModel, CalsimSubmission
from calculet.daemon.calsim.engine import poison_rows
from calculet.daemon.device.errors import SubmitFailed
from calculet.daemon.device.types import JobStatus

from .conftest import OpenDevice
from .factories import (
    DECODE1,
    DECODE4,
    PREFILL,
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


def finished_on_device(sub: CalsimSubmission) -> None:
    """Block until the device has finished the job, without `wait` (what a poller sees)."""
    assert isinstance(sub, CalsimSubmission)
    assert sub._job.done.wait(5)
    assert sub.status() is JobStatus.DONE


def test_logits_read_before_wait_are_poison_and_after_wait_the_real_values(
    device: CalsimDevice, model: CalsimModel
) -> None:
    pre = make_bufs(device, model, PREFILL)
    pre.logits.array[...] = SENTINEL
    sub = device.submit(model, prefill_spec(pre, 1, [5, 6, 7]))
    early = pre.out(0)
    assert is_poison(early) and np.isnan(early.astype(np.float32)).all()
    finished_on_device(sub)
    assert is_poison(pre.out(0))  # status DONE is not enough: a daemon that polled reads NaN
    assert sub.wait(5) is JobStatus.DONE
    assert bitwise_equal(pre.out(0), expected_row([5, 6, 7], [0, 1, 2]))


def test_poison_is_there_while_the_job_runs(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE1)
    gate = Gate()
    kernel_of(model).gate = gate
    sub = device.submit(model, decode_spec(dec, [(0, 0, 3)]))
    assert gate.entered.wait(5)
    assert sub.status() is JobStatus.RUNNING and is_poison(dec.out(0))
    gate.open()
    assert sub.wait(5) is JobStatus.DONE
    assert bitwise_equal(dec.out(0), expected_row([3], [0]))


def test_only_active_rows_are_poisoned(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE4)
    dec.logits.array[...] = SENTINEL
    sub = device.submit(model, decode_spec(dec, [(2, 0, 4), (0, 0, 9)]))
    assert is_poison(dec.logits.array[:2])
    assert (dec.logits.array[2:] == SENTINEL).all()  # masked rows: the device never writes them
    assert sub.wait(5) is JobStatus.DONE
    assert bitwise_equal(dec.out(0), expected_row([4], [0])) and bitwise_equal(dec.out(1), expected_row([9], [0]))
    assert (dec.logits.array[2:] == SENTINEL).all()


def test_ccu_exception_outputs_stay_poisoned(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan={"faults": [{"kind": "ccu_exception", "job": 0}]})
    model = device.configure(tmp_path, make_manifest())
    dec = make_bufs(device, model, DECODE1)
    sub = device.submit(model, decode_spec(dec, [(0, 0, 3)]))
    assert sub.wait(5) is JobStatus.CCU_EXCEPTION
    assert is_poison(dec.out(0))
    assert sub.wait(5) is JobStatus.CCU_EXCEPTION and is_poison(dec.out(0))


def test_nan_logits_fault_delivers_its_nans_at_wait(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan={"faults": [{"kind": "nan_logits", "job": 0}]})
    model = device.configure(tmp_path, make_manifest())
    dec = make_bufs(device, model, DECODE1)
    sub = device.submit(model, decode_spec(dec, [(0, 0, 3)]))
    assert sub.wait(5) is JobStatus.DONE
    row = dec.out(0)
    assert np.isnan(row.astype(np.float32)).all() and not is_poison(row)  # the fault's NaN, delivered


def test_hung_job_reset_leaves_poison_and_the_next_job_delivers(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan={"faults": [{"kind": "hang", "job": 0}]})
    model = device.configure(tmp_path, make_manifest())
    dec = make_bufs(device, model, DECODE1)
    hung = device.submit(model, decode_spec(dec, [(0, 0, 3)]))
    device.reset_ccu()
    assert hung.wait(5) is JobStatus.CCU_EXCEPTION and is_poison(dec.out(0))
    assert device.submit(model, decode_spec(dec, [(1, 0, 3)])).wait(5) is JobStatus.DONE
    assert bitwise_equal(dec.out(0), expected_row([3], [0]))


def test_a_later_job_naming_the_buffer_takes_it_over_from_an_unwaited_one(
    device: CalsimDevice, model: CalsimModel
) -> None:
    a, b = make_bufs(device, model, DECODE1), make_bufs(device, model, DECODE1)
    first = device.submit(model, decode_spec(a, [(0, 0, 3)]))
    finished_on_device(first)  # calsim's own checks let the buffer go when the job ends on the device
    reuse = decode_spec(b, [(1, 0, 8)])
    reuse.outputs["logits"] = a.logits.buffer_id  # the daemon bug: reused before `first` was waited
    second = device.submit(model, reuse)
    assert first.wait(5) is JobStatus.DONE
    assert is_poison(a.out(0))  # `first`'s answer is lost, not silently mixed up
    assert second.wait(5) is JobStatus.DONE
    assert bitwise_equal(a.out(0), expected_row([8], [0]))


def test_outputs_are_delivered_once(device: CalsimDevice, model: CalsimModel) -> None:
    dec = make_bufs(device, model, DECODE1)
    sub = device.submit(model, decode_spec(dec, [(0, 0, 3)]))
    assert sub.wait(5) is JobStatus.DONE
    dec.logits.array[...] = SENTINEL  # the daemon zeroes its buffers when the context goes back
    assert sub.wait(5) is JobStatus.DONE
    assert (dec.logits.array == SENTINEL).all()


def test_a_refused_submit_poisons_nothing(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan={"faults": [{"kind": "submit_error", "job": 0}]})
    model = device.configure(tmp_path, make_manifest())
    dec = make_bufs(device, model, DECODE1)
    dec.logits.array[...] = SENTINEL
    with pytest.raises(SubmitFailed):
        device.submit(model, decode_spec(dec, [(0, 0, 3)]))
    assert (dec.logits.array == SENTINEL).all()


@pytest.mark.parametrize(
    ("dtype", "check"),
    [
        (ml_dtypes.bfloat16, lambda a: np.isnan(a.astype(np.float32)).all()),
        (np.float32, lambda a: np.isnan(a).all()),
        (np.int32, lambda a: (a == -1).all()),
        (np.uint16, lambda a: (a == 0xFFFF).all()),
    ],
)
def test_poison_is_nan_for_floats_and_all_ones_for_integers(dtype: type, check: Callable[[np.ndarray], bool]) -> None:
    array: np.ndarray = np.zeros((3, 5), dtype=dtype)
    poison_rows(array, 2)
    assert check(array[:2])
    assert (array[2] == 0).all()
