"""A device whose `submit` is slow must not delay the rest of the daemon (issue 8): Health, Status,
WatchLoad, Submit and Cancel answer while the engine thread is stuck inside `device.submit`, because no
device call runs under the engine lock and Submit only hands the request to the engine.

The device's submit is held on an event the test releases only after the other calls have answered,
so the test does not depend on timing: with a device call under the engine lock those calls would
wait for the release and fail with DEADLINE_EXCEEDED instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import common_pb2, inference_pb2, observe_pb2

from .held_device import HeldSubmitDevice
from .served_core import CALL_S, ServedCore

ANSWER_S = 10.0  # deadline of the calls that must answer while the submit is held


@pytest.fixture
def board(tmp_path: Path) -> Iterator[tuple[ServedCore, HeldSubmitDevice]]:
    build_sim_package("tiny", tmp_path / "models" / "tiny")
    device = HeldSubmitDevice()
    core = DeviceCore(DaemonConfig(models_root=tmp_path / "models", models=(("tiny", "tiny"),)), device=device)
    core.start()
    served = ServedCore(core, tmp_path / "d.sock")
    try:
        yield served, device
    finally:
        device.let_go()
        served.close()


def _submit(served: ServedCore, prompt: list[int]) -> str:
    request = inference_pb2.SubmitRequest(
        model="tiny",
        prompt_tokens=prompt,
        sampling=inference_pb2.SamplingParams(temperature=0.0),
        stopping=inference_pb2.StoppingParams(max_tokens=4, ignore_eos=True),
    )
    return served.stub.Submit(request, timeout=ANSWER_S).job_id


def _tokens(served: ServedCore, job_id: str) -> list[int]:
    events = served.stub.Wait(inference_pb2.WaitRequest(job_id=job_id), timeout=CALL_S)
    return [t for e in events for t in e.tokens.tokens]


def test_a_slow_device_submit_delays_no_other_rpc(board: tuple[ServedCore, HeldSubmitDevice]) -> None:
    served, device = board
    reference = _tokens(served, _submit(served, [5, 6, 7]))  # undisturbed, before the hold

    device.hold()
    first = _submit(served, [5, 6, 7])
    assert device.entered.wait(CALL_S), "the engine never submitted the job"

    # The engine thread is now inside device.submit. Everything else must answer meanwhile.
    health = served.stub.Health(observe_pb2.HealthRequest(), timeout=ANSWER_S)
    assert health.status == common_pb2.SERVING_STATUS_SERVING
    status = served.stub.Status(observe_pb2.StatusRequest(), timeout=ANSWER_S)
    assert {j.job_id for j in status.jobs} == {first} and status.inflight_submissions == 1
    report = next(served.stub.WatchLoad(observe_pb2.WatchLoadRequest(), timeout=ANSWER_S))
    assert report.status == common_pb2.SERVING_STATUS_SERVING
    grpc_health = served.health.Check(health_pb2.HealthCheckRequest(), timeout=ANSWER_S)
    assert grpc_health.status == health_pb2.HealthCheckResponse.SERVING
    second = _submit(served, [5, 6, 7])  # queued behind the held job, answered at once
    third = _submit(served, [8, 9])
    cancel = served.stub.Cancel(inference_pb2.CancelRequest(job_id=third), timeout=ANSWER_S)
    assert not cancel.already_finished
    assert not device.released.is_set(), "every call above answered while the submit was still held"

    device.let_go()
    assert _tokens(served, first) == reference, "the held job's tokens are those of an undisturbed run"
    assert _tokens(served, second) == reference
    assert served.core.engine.wait_drained(CALL_S) == 0
    assert served.core.engine.idle()
