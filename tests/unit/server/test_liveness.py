"""Liveness apart from readiness (issue 10 leftover): grpc.health.v1 service `calculet.liveness`.

- Readiness (`""`) goes NOT_SERVING when the board is drained, has no Ready model, or waits for an
  operator past its reset budget; liveness stays SERVING through all three (a restart cures none).
- A lost device turns liveness NOT_SERVING (only a restart helps), published by the engine's own
  health change.
- A wedged engine thread (a device `submit` held on an event: `held_device.py`) turns liveness
  NOT_SERVING by itself, with no RPC to the Daemon service (the test only reads health Watch streams
  and calls the core directly); released, it reads SERVING again.
- A model alias spelled `calculet.liveness` never overwrites liveness.
- The policy and the beat clock refuse bad values and count a silence exactly.

Every wait is for a published status or a job's end, with a deadline only a defect reaches; the
wedge is deterministic, so waiting for NOT_SERVING is not a race.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from calculet.common.errors import InvalidArgument
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinishReason, wait_finished
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.core.resets.budget import BoardHalt
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.server.liveness import LIVENESS_MARGIN_S, LIVENESS_SERVICE, EngineBeats, LivenessPolicy
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import operate_pb2

from .held_device import HeldSubmitDevice
from .served_core import CALL_S, ServedCore

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WEDGE = LivenessPolicy(timeout_s=0.5, beat_s=0.05)  # the wedge test's: silent 0.5 s = wedged


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    return root


class Watched:
    """Follows one grpc.health.v1 service with a Watch stream; `wait_for(status)` waits until it was
    the last status published."""

    def __init__(self, served: ServedCore, service: str) -> None:
        self._call = served.health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=4 * CALL_S)
        self.seen: list[int] = []
        self.ended: grpc.StatusCode | None = None  # how the stream ended (only `close` should end it)
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._follow, name=f"watch-{service}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for reply in self._call:
                with self._cond:
                    self.seen.append(reply.status)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            self.ended = exc.code()

    def wait_for(self, status: int, timeout: float = CALL_S) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: bool(self.seen) and self.seen[-1] == status, timeout)

    def close(self) -> None:
        assert self.ended is None, f"the Watch stream ended by itself: {self.ended}"
        self._call.cancel()
        self._thread.join(CALL_S)


def _check(served: ServedCore, service: str) -> int:
    return served.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_S).status


def _request(prompt: tuple[int, ...] = (5, 6, 7)) -> GenerationRequest:
    stopping = StoppingParams(max_tokens=4, ignore_eos=True)
    return GenerationRequest("tiny", prompt, SamplingParams(temperature=0.0), stopping)


def _finish(core: DeviceCore, job_id: str) -> FinishReason:
    log = core.event_log(job_id, for_wait=False)
    assert wait_finished(log, CALL_S), f"job {job_id} did not finish"
    return log.read(0)[-1].reason  # type: ignore[union-attr]  # the last event of a finished log is its Final


def _served(tmp_path: Path, models: Path, alias: str = "tiny", **config: Any) -> ServedCore:
    core = DeviceCore(DaemonConfig(models_root=models, models=((alias, "tiny"),), **config))
    core.start()
    return ServedCore(core, tmp_path / "d.sock")


@pytest.fixture
def served(tmp_path: Path, models: Path) -> Iterator[ServedCore]:
    board = _served(tmp_path, models)
    try:
        yield board
    finally:
        board.close()


# ---- readiness falls, liveness stays ---------------------------------------------------------------


def test_a_drained_board_is_not_ready_but_alive(served: ServedCore) -> None:
    assert _check(served, "") == SERVING and _check(served, LIVENESS_SERVICE) == SERVING

    served.stub.Drain(operate_pb2.DrainRequest(timeout_ms=0), timeout=CALL_S)
    assert _check(served, "") == NOT_SERVING
    assert _check(served, "tiny") == NOT_SERVING
    assert _check(served, LIVENESS_SERVICE) == SERVING

    served.stub.Resume(operate_pb2.ResumeRequest(), timeout=CALL_S)
    assert _check(served, "") == SERVING and _check(served, LIVENESS_SERVICE) == SERVING


def test_a_board_without_a_ready_model_is_not_ready_but_alive(served: ServedCore) -> None:
    served.stub.Unload(operate_pb2.UnloadRequest(alias="tiny", drain_timeout_ms=0), timeout=CALL_S)
    assert _check(served, "") == NOT_SERVING
    assert _check(served, LIVENESS_SERVICE) == SERVING


def test_a_board_past_its_reset_budget_is_not_ready_but_alive(tmp_path: Path, models: Path) -> None:
    served = _served(tmp_path, models, fault_injection=True, job_timeout_s=0.3)
    overall = Watched(served, "")
    try:
        assert overall.wait_for(SERVING)
        served.core.set_reset_budget(0)
        served.core.inject_fault(Fault(FaultKind.HANG))
        assert _finish(served.core, served.core.submit(_request()).job_id) is FinishReason.ERROR
        assert served.core.snapshot().halt is BoardHalt.AWAITING_OPERATOR
        assert overall.wait_for(NOT_SERVING), overall.seen  # published by the engine's health change
        assert _check(served, LIVENESS_SERVICE) == SERVING
    finally:
        overall.close()
        served.close()


def test_an_alias_spelled_like_the_liveness_service_does_not_overwrite_it(tmp_path: Path, models: Path) -> None:
    served = _served(tmp_path, models, alias=LIVENESS_SERVICE)
    try:
        served.stub.Drain(operate_pb2.DrainRequest(timeout_ms=0), timeout=CALL_S)
        assert _check(served, "") == NOT_SERVING
        assert _check(served, LIVENESS_SERVICE) == SERVING
    finally:
        served.close()


# ---- liveness falls ---------------------------------------------------------------------------------


def test_a_lost_device_turns_liveness_not_serving(tmp_path: Path, models: Path) -> None:
    served = _served(tmp_path, models, fault_injection=True)
    liveness = Watched(served, LIVENESS_SERVICE)
    try:
        assert liveness.wait_for(SERVING)
        served.core.inject_fault(Fault(FaultKind.DEVICE_LOST))
        assert _finish(served.core, served.core.submit(_request()).job_id) is FinishReason.ERROR
        assert liveness.wait_for(NOT_SERVING), liveness.seen  # no RPC: the engine's health change
        assert served.core.snapshot().halt is BoardHalt.LOST
        assert _check(served, "") == NOT_SERVING
    finally:
        liveness.close()
        served.close()


def test_a_wedged_engine_turns_liveness_not_serving_by_itself_and_a_released_one_serving(
    tmp_path: Path, models: Path
) -> None:
    device = HeldSubmitDevice()
    core = DeviceCore(DaemonConfig(models_root=models, models=(("tiny", "tiny"),)), device=device)
    core.start()
    served = ServedCore(core, tmp_path / "d.sock", liveness=WEDGE)
    liveness = Watched(served, LIVENESS_SERVICE)
    try:
        assert liveness.wait_for(SERVING)
        device.hold()
        job_id = core.submit(_request()).job_id  # the core directly: no RPC wakes the servicer
        assert device.entered.wait(CALL_S), "the engine never submitted the job"

        # The engine thread is inside device.submit: it cannot beat until let go.
        assert liveness.wait_for(NOT_SERVING), liveness.seen
        assert _check(served, "") == SERVING, "readiness does not follow the engine heartbeat"

        device.let_go()
        assert liveness.wait_for(SERVING), liveness.seen
        assert _finish(core, job_id) is FinishReason.LENGTH
    finally:
        device.let_go()
        liveness.close()
        served.close()


# ---- the policy and the beat clock -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_silence_counts_from_the_last_beat() -> None:
    clock = Clock()
    beats = EngineBeats(10.0, clock)
    assert beats.expires_in() == 10.0  # a fresh watch gives the engine one whole timeout
    clock.now += 9.5
    assert not beats.beat(), "a beat within the timeout ends no silence"
    assert beats.expires_in() == 10.0
    clock.now += 10.0
    assert beats.expires_in() == 0.0
    assert beats.beat(), "a beat after the timeout ends a silence"
    assert not beats.beat()


def test_the_daemon_policy_is_the_job_timeout_plus_the_margin() -> None:
    policy = LivenessPolicy.for_job_timeout(30.0)
    assert policy.timeout_s == 30.0 + LIVENESS_MARGIN_S
    assert LivenessPolicy.for_job_timeout(90.0).timeout_s > 90.0  # raised with the job timeout
    assert policy.beat_s * 2 <= policy.timeout_s


@pytest.mark.parametrize(
    ("timeout_s", "beat_s", "message"),
    [
        (0.0, 0.05, "liveness timeout: must be a positive number of seconds, got 0.0"),
        (-1.0, 0.05, "liveness timeout: must be a positive number of seconds"),
        (float("nan"), 0.05, "liveness timeout: must be a positive number of seconds, got nan"),
        (float("inf"), 0.05, "liveness timeout: must be a positive number of seconds, got inf"),
        (1.0, 0.0, "liveness beat interval: must be a positive number of seconds, got 0.0"),
        (1.0, 0.6, "liveness beat interval 0.6 s: must be at most half the timeout (1.0 s)"),
    ],
)
def test_a_bad_policy_is_refused(timeout_s: float, beat_s: float, message: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        LivenessPolicy(timeout_s, beat_s)
    assert message in str(refused.value)
