"""Device identity, registry, resets, close, and wall-clock pacing under time_scale."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimDriver, CalsimModel
from calculet.daemon.calsim.memory import GiB, MiB
from calculet.daemon.device.errors import DeviceLost, InvalidJob, ModelReleased, TooManyConfigurations, WaitTimeout
from calculet.daemon.device.registry import available_drivers, load_driver
from calculet.daemon.device.types import DeviceCapabilities, EngineSlot, JobStatus

from .conftest import OpenDevice
from .factories import (
    DECODE1,
    LANES,
    KernelBox,
    bitwise_equal,
    decode_spec,
    expected_row,
    kernel_of,
    make_bufs,
    make_manifest,
)


def test_info_describes_the_emulated_board(open_device: OpenDevice) -> None:
    info = open_device(board=3).info()
    assert info.name == "calsim" and info.board_index == 3
    assert info.runtime_version == "0.7.6-calsim"
    assert [(c.index, c.dram_bytes, c.sram_bytes) for c in info.chips] == [
        (0, 16 * GiB, 18 * MiB),
        (1, 16 * GiB, 18 * MiB),
    ]
    assert info.capabilities == DeviceCapabilities(  # the conftest's calsim-dev profile
        max_inflight=2,
        ping_pong=True,
        max_resident_configurations=2,
        lane_selection=True,
        kernel_kinds=("numeric", "synthetic"),
    )


def test_the_default_profile_is_calrt_0_7_6_which_holds_one_calbin(tmp_path: Path, kernels: KernelBox) -> None:
    device = CalsimDriver().open(0, {"time_scale": 0.0, "kernel_factory": kernels})
    try:
        caps = device.info().capabilities
        assert (caps.max_resident_configurations, caps.max_inflight, caps.ping_pong) == (1, 2, True)
        device.configure(tmp_path, make_manifest("a"))
        with pytest.raises(TooManyConfigurations, match="the limit is 1"):
            device.configure(tmp_path, make_manifest("b"))
    finally:
        device.close()
    dev = CalsimDriver().open(0, {"profile": "calsim-dev", "max_resident_configurations": 3})
    assert dev.info().capabilities.max_resident_configurations == 3, "an explicit option beats the profile"
    dev.close()
    with pytest.raises(InvalidJob, match="profile"):
        CalsimDriver().open(0, {"profile": "calrt-9"})


def test_calsim_is_registered_as_an_entry_point() -> None:
    assert "calsim" in available_drivers()
    driver = load_driver("calsim")
    assert isinstance(driver, CalsimDriver) and driver.name == "calsim"


def test_model_handle_describes_the_package(model: CalsimModel) -> None:
    assert model.lanes == LANES and model.vocab_size == 64 and model.lane_context == 64
    assert set(model.submodels) == {"prefill_b1_t16", "decode_b1", "decode_b4"}
    assert model.submodel("decode_b4").batch == 4
    with pytest.raises(KeyError):
        model.submodel("decode")  # exact names only


def test_reset_ccu_ends_every_in_flight_job_and_corrupts_their_lanes(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan={"faults": [{"kind": "hang", "job": 1}]})
    model = device.configure(tmp_path, make_manifest())
    a, b, c = (make_bufs(device, model, DECODE1) for _ in range(3))
    device.submit(model, decode_spec(a, [(0, 0, 1)])).wait(5)
    hung = device.submit(model, decode_spec(b, [(1, 0, 2)]), EngineSlot.PING)
    behind = device.submit(model, decode_spec(c, [(2, 0, 3)]), EngineSlot.PONG)
    with pytest.raises(WaitTimeout):
        behind.wait(0.02)  # stuck behind the hang: one compute unit
    assert behind.status() is JobStatus.PENDING
    device.reset_ccu()
    assert hung.wait(5) is JobStatus.CCU_EXCEPTION and behind.wait(5) is JobStatus.CCU_EXCEPTION
    assert sorted(kernel_of(model).lanes_touched("corrupt")) == [1, 2]
    counters = device.counters()
    assert counters.left == 0 and counters.finished == 3
    for sub in (hung, behind):
        ts = sub.timestamps()
        assert ts is not None and all(math.isfinite(x) for x in (ts.compute_end, ts.d2h_end))
    # both banks are free and the device computes correctly again (lane 0 was not touched)
    again = device.submit(model, decode_spec(a, [(0, 1, 4)]))
    assert again.wait(5) is JobStatus.DONE
    assert bitwise_equal(a.out(0), expected_row([1, 4], [0, 1]))


def test_reset_configuration_drops_every_configured_model_as_calrt_does(
    open_device: OpenDevice, tmp_path: Path
) -> None:
    """CalRT 0.7.6's ResetConfiguration drops the configured calbins: every model's jobs end as CCU
    exceptions, every lane is cleared, every handle is dead afterwards and the memory is free, so the
    caller must configure (and warm up) again."""
    device = open_device(fault_plan={"faults": [{"kind": "hang", "job": 0}]})
    stuck = device.configure(tmp_path, make_manifest("stuck"))
    other = device.configure(tmp_path, make_manifest("other"))
    a, b = make_bufs(device, stuck, DECODE1), make_bufs(device, other, DECODE1)
    hung = device.submit(stuck, decode_spec(a, [(0, 0, 1)]))
    waiting = device.submit(other, decode_spec(b, [(0, 0, 2)]))
    with pytest.raises(WaitTimeout):
        waiting.wait(0.02)
    device.reset_configuration(stuck)
    assert hung.wait(5) is JobStatus.CCU_EXCEPTION
    assert waiting.wait(5) is JobStatus.CCU_EXCEPTION, "the other model's calbin is dropped too"
    for model in (stuck, other):
        assert sorted(kernel_of(model).lanes_touched("clear")) == list(range(LANES))
        with pytest.raises(ModelReleased):
            device.submit(model, decode_spec(a if model is stuck else b, [(0, 0, 5)]))
        with pytest.raises(ModelReleased):
            device.release(model)
    assert device.memory_usage().chips[0].dram_used == 0, "the dropped calbins' memory is free"
    again = device.configure(tmp_path, make_manifest("stuck"))  # the buffers stay registered
    assert device.submit(again, decode_spec(a, [(0, 0, 5)])).wait(5) is JobStatus.DONE


def test_reset_configuration_of_a_foreign_or_released_model(
    device: CalsimDevice, open_device: OpenDevice, tmp_path: Path
) -> None:
    foreign = open_device(board=1).configure(tmp_path, make_manifest())
    with pytest.raises(ModelReleased):
        device.reset_configuration(foreign)
    mine = device.configure(tmp_path, make_manifest())
    device.release(mine)
    with pytest.raises(ModelReleased):
        device.reset_configuration(mine)


def test_close_wakes_waiters_stops_the_worker_and_is_idempotent(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(board=7, fault_plan={"faults": [{"kind": "hang", "job": 0}]})
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, DECODE1)
    hung = device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    errors: list[BaseException] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        try:
            hung.wait(30)
        except DeviceLost as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(5)
    device.close()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1
    assert not device.healthy()
    assert not any(t.name == "calsim-board7" for t in threading.enumerate())
    with pytest.raises(DeviceLost, match="closed"):
        device.info()
    with pytest.raises(DeviceLost):
        device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    device.close()


def test_time_scale_makes_the_worker_wait_for_the_modelled_time(open_device: OpenDevice, tmp_path: Path) -> None:
    # a 2 ms modelled decode at a scale of 1e6 lasts ~2000 s of wall time: it cannot be done soon,
    # while the same job at scale 0 finishes at once. (No wall-clock figure is asserted.)
    slow = open_device(time_scale=1e6, configure_time_scale=0.0)
    model = slow.configure(tmp_path, make_manifest())
    bufs = make_bufs(slow, model, DECODE1)
    sub = slow.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    with pytest.raises(WaitTimeout):
        sub.wait(0.05)
    assert sub.status() is JobStatus.PENDING  # even its H2D is not due yet
    slow.close()  # wakes the pacing worker; no hang at teardown
    fast = open_device(time_scale=0.0)
    fast_model = fast.configure(tmp_path, make_manifest())
    fast_bufs = make_bufs(fast, fast_model, DECODE1)
    assert fast.submit(fast_model, decode_spec(fast_bufs, [(0, 0, 1)])).wait(5) is JobStatus.DONE


def test_wait_rejects_a_negative_timeout(device: CalsimDevice, model: CalsimModel) -> None:
    from calculet.daemon.device.errors import InvalidJob

    bufs = make_bufs(device, model, DECODE1)
    sub = device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    with pytest.raises(InvalidJob, match="timeout"):
        sub.wait(-1)
    with pytest.raises(InvalidJob, match="timeout"):
        sub.wait(float("nan"))
    assert sub.wait(5) is JobStatus.DONE
