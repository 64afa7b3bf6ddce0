"""The device's KV lane hooks (CalRT KV Apply / Free): the daemon opens a lane before the first job of
the sequence that takes it and closes it when the sequence leaves it (or, with prefix reuse, when its
parked KV is evicted or dropped, always before it opens the lane again), outside the engine lock; a
device with no KV space refuses with OutOfKV, which ends that request OVERLOADED (retry elsewhere)
and leaves the board serving with nothing held."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from calculet.common.errors import ErrorKind
from calculet.daemon.calsim.device import CalsimDevice
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.scheduler import SchedulingPolicy
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.errors import OutOfKV

from .engine_factories import (
    OwnerLock,
    build_models,
    finish,
    generate_all,
    generate_each,
    request,
    track_engine_lock,
)


class LaneRecordingDevice(CalsimDevice):
    """calsim that records every open/close, and refuses opens with OutOfKV while `full` is set."""

    def __init__(self) -> None:
        super().__init__(0, parse_options({"time_scale": 0.0}))
        self.calls: list[tuple[str, int]] = []
        self.full = threading.Event()
        self.engine_lock_held: list[bool] = []
        self.engine_lock: OwnerLock | None = None

    def _note(self, what: str, lane: int) -> None:
        self.calls.append((what, lane))
        if self.engine_lock is not None:
            self.engine_lock_held.append(self.engine_lock.held_here())

    def open_lane(self, model: ConfiguredModel, lane: int) -> None:
        self._note("open", lane)
        if self.full.is_set():
            raise OutOfKV(f"no KV space for lane {lane}")
        super().open_lane(model, lane)

    def close_lane(self, model: ConfiguredModel, lane: int) -> None:
        self._note("close", lane)
        super().close_lane(model, lane)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


@contextmanager
def recording_core(models: Path, **overrides: object) -> Iterator[tuple[DeviceCore, LaneRecordingDevice]]:
    device = LaneRecordingDevice()
    config = DaemonConfig(models_root=models, models=(("tiny", "tiny"),), **overrides)  # type: ignore[arg-type]
    core = DeviceCore(config, device=device)
    device.engine_lock = track_engine_lock(core)
    core.start()
    try:
        yield core, device
    finally:
        core.close()


def _open_now(calls: list[tuple[str, int]]) -> set[int]:
    state: set[int] = set()
    for what, lane in calls:
        if what == "open":
            assert lane not in state, f"lane {lane} opened twice without a close"
            state.add(lane)
        else:
            assert lane in state, f"lane {lane} closed while not open"
            state.discard(lane)
    return state


def test_every_lane_a_request_takes_is_opened_first_and_closed_after_without_the_engine_lock(models: Path) -> None:
    reqs = [request((i + 1, 2, 3), 6, seed=i, temperature=0.8) for i in range(6)]
    with recording_core(models, prefix_reuse=False) as (core, device):
        reference = generate_each(core, reqs)
        assert generate_all(core, reqs) == reference
        finish(core, core.submit(request((9, 9), 2, seed=7)).job_id)  # its job drains the last closes first
        opens = [lane for what, lane in device.calls if what == "open"]
        assert len(opens) >= len(reqs) * 2, "each request's lane was opened for its prefill"
        assert _open_now(device.calls) <= {0}, "lanes of finished requests were closed (the last one may be open)"
        assert device.engine_lock_held and not any(device.engine_lock_held), "a lane hook ran under the engine lock"
        assert core.engine.idle()


def test_parked_lanes_stay_open_and_an_evicted_one_is_closed_before_it_opens_again(models: Path) -> None:
    """With prefix reuse a finished request's lane stays open (parked); a request that finds no FREE
    lane evicts the least recently used parked one: KV Free, then KV Apply, never Apply twice."""
    reqs = [request((i + 1, 2, 3), 6, seed=i, temperature=0.8) for i in range(6)]
    with recording_core(models) as (core, device):
        rt = core.models.published("tiny")
        assert rt is not None and rt.kv is not None
        lanes = rt.kv.lanes
        reference = generate_each(core, reqs)
        assert generate_all(core, reqs) == reference
        open_now = _open_now(device.calls)  # also checks no lane was opened twice or closed while closed
        assert len(open_now) == lanes, "every lane stays open while parked"
        assert rt.kv.parked_count() == lanes and rt.kv.free_count() == lanes
        closes = [lane for what, lane in device.calls if what == "close"]
        assert len(closes) >= len(reqs) - lanes, "requests beyond the lanes evicted parked lanes (KV Free first)"
        assert not any(device.engine_lock_held), "a lane hook ran under the engine lock"
        assert core.engine.idle()


def test_out_of_kv_ends_the_request_overloaded_and_the_board_keeps_serving(models: Path) -> None:
    with recording_core(models) as (core, device):
        device.full.set()
        tokens, final = finish(core, core.submit(request((1, 2, 3), 4, seed=1)).job_id)
        assert tokens == [] and final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.OVERLOADED
        assert "KV" in final.error_message
        assert final.retry_after_s == SchedulingPolicy().retry_after_s, "an in-band OVERLOADED carries its hint"
        assert core.health().serving and core.engine.idle()
        status = core.status()
        assert all(lane.owner is None for m in status.models for lane in m.lanes), "no lane left held"
        device.full.clear()
        assert finish(core, core.submit(request((1, 2, 3), 4, seed=1)).job_id)[1].reason is FinishReason.LENGTH


def test_calsim_refuses_a_lane_opened_twice_or_closed_while_closed(models: Path) -> None:
    with recording_core(models) as (core, device):
        rt = core.models.published("tiny")
        assert rt is not None and rt.model is not None
        free = rt.model.lanes - 1  # the warm-up used lane 0 and closed it
        device.open_lane(rt.model, free)
        with pytest.raises(Exception, match="already open"):
            device.open_lane(rt.model, free)
        device.close_lane(rt.model, free)
        with pytest.raises(Exception, match="not open"):
            device.close_lane(rt.model, free)
        with pytest.raises(Exception, match="out of range"):
            device.open_lane(rt.model, rt.model.lanes)
