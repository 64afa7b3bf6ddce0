"""A switch through the real servicer: the Load stream carries the old generation's drain and
unload, a stale expectation is ABORTED, and switch notes without switch_from are INVALID_ARGUMENT."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import common_pb2, operate_pb2

from .served_core import CALL_S, ServedCore

M = common_pb2


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCore]:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    config = DaemonConfig(
        models_root=root, models=(("a", "tiny"),), device_options={"time_scale": 0.0, "profile": "calrt-0.7.6"}
    )
    core = DeviceCore(config)
    core.start()
    board = ServedCore(core, tmp_path_factory.mktemp("sock") / "d.sock")
    yield board
    board.close()


def _switch(
    served: ServedCore, alias: str, frm: str, generation: int, **notes: object
) -> list[operate_pb2.LoadProgress]:
    options = operate_pb2.LoadOptions(switch_from=operate_pb2.SwitchFrom(alias=frm, generation=generation), **notes)
    request = operate_pb2.LoadRequest(alias=alias, package="tiny", options=options)
    return list(served.stub.Load(request, timeout=CALL_S))


def test_the_stream_reports_the_old_generation_leaving_then_the_new_one(served: ServedCore) -> None:
    generation = served.core.models.published("a").generation
    stream = _switch(served, "b", "a", generation, reason="test", requester="pytest")
    old = [(p.state, p.message.split(":")[0]) for p in stream if p.generation == generation]
    assert old == [
        (s, f"a@{generation}") for s in (M.MODEL_STATE_DRAINING, M.MODEL_STATE_UNLOADING, M.MODEL_STATE_UNLOADED)
    ]
    assert stream[-1].done and stream[-1].state == M.MODEL_STATE_READY and stream[-1].generation > generation
    with pytest.raises(grpc.RpcError) as info:  # the same switch again: a@generation is gone
        _switch(served, "c", "a", generation)
    assert info.value.code() is grpc.StatusCode.ABORTED
    assert "another switch or load won" in (info.value.details() or "")


@pytest.mark.parametrize("notes", [{"force": True}, {"reason": "why"}, {"requester": "me"}])
def test_switch_notes_without_switch_from_are_invalid(served: ServedCore, notes: dict[str, object]) -> None:
    request = operate_pb2.LoadRequest(alias="x", package="tiny", options=operate_pb2.LoadOptions(**notes))
    with pytest.raises(grpc.RpcError) as info:
        list(served.stub.Load(request, timeout=CALL_S))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "switch_from" in (info.value.details() or "")


def test_a_reason_over_256_characters_is_invalid(served: ServedCore) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _switch(served, "x", "b", 1, reason="r" * 257)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "at most 256" in (info.value.details() or "")
