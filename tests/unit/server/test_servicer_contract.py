"""The daemon's transport contract: the real `DaemonServicer` over a calsim `DeviceCore`, served by an
in-process grpc.aio server on a Unix socket, driven through raw stubs so the exact status codes show.

Each test pins one place where the servicer or the wire conversion differed from the contract in
`protos/calculet/v1/` (Wait indexes, the Final's stop token, WatchLoad interval and change reports,
Submit limits, drain windows, Reset, InjectFault, grpc.health.v1 after loads and unloads, a lost
device reported as DRAINING, load reports "ready" on a draining board, paths and messages that broke
the status mapping). Every call that a defect could leave hanging carries a deadline, so a
regression fails with DEADLINE_EXCEEDED instead of stalling the suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import common_pb2, daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

from .served_core import CALL_S, ServedCore

Stub = daemon_pb2_grpc.DaemonStub
ONE_HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    return root


def _serve(models_root: Path, sock: Path) -> ServedCore:
    config = DaemonConfig(
        models_root=models_root,
        models=(("tiny", "tiny"),),
        device_options={"time_scale": 0.0, "profile": "calsim-dev"},  # two models side by side
        fault_injection=True,
    )
    core = DeviceCore(config)
    core.start()
    return ServedCore(core, sock)


@pytest.fixture(scope="module")
def served(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedCore]:
    """One board for the module; tests leave it idle, serving `tiny` only, with no planned fault."""
    board = _serve(models_root, tmp_path_factory.mktemp("sock") / "d.sock")
    yield board
    board.close()


@pytest.fixture
def stub(served: ServedCore) -> daemon_pb2_grpc.DaemonStub:
    return served.stub


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code `call` (which finishes its call, streams included) fails with."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _submit(stub: Stub, max_tokens: int = 6, **fields: Any) -> inference_pb2.SubmitResponse:
    """Submit to `tiny`: a 3-token prompt, greedy, `max_tokens` ignoring EOS, unless `fields` say otherwise."""
    fields.setdefault("model", "tiny")
    fields.setdefault("prompt_tokens", [5, 6, 7])
    fields.setdefault("stopping", inference_pb2.StoppingParams(max_tokens=max_tokens, ignore_eos=True))
    fields.setdefault("sampling", inference_pb2.SamplingParams(temperature=0.0))
    return stub.Submit(inference_pb2.SubmitRequest(**fields), timeout=CALL_S)


def _events(stub: Stub, job_id: str, start: int = 0) -> list[inference_pb2.WaitEvent]:
    return list(stub.Wait(inference_pb2.WaitRequest(job_id=job_id, from_event_index=start), timeout=CALL_S))


def _tokens(events: list[inference_pb2.WaitEvent]) -> list[int]:
    return [t for e in events if e.HasField("tokens") for t in e.tokens.tokens]


# ---------------------------------------------------------------- Wait


def test_wait_from_an_index_beyond_the_events_produced_is_invalid_argument(stub: Stub) -> None:
    job = _submit(stub).job_id
    produced = len(_events(stub, job))
    assert _code(lambda: _events(stub, job, produced + 1)) is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: _events(stub, job, produced + 1000)) is grpc.StatusCode.INVALID_ARGUMENT


def test_wait_from_the_end_of_a_finished_job_ends_ok_without_events(stub: Stub) -> None:
    job = _submit(stub).job_id
    events = _events(stub, job)
    assert events[-1].HasField("final")
    assert _events(stub, job, len(events)) == [], "nothing is left after the Final: the stream just ends"
    assert _events(stub, job, len(events) - 1) == events[-1:], "the Final alone is still re-readable"


def test_final_names_the_stop_token_that_ended_the_job(stub: Stub) -> None:
    reference = _tokens(_events(stub, _submit(stub, max_tokens=8).job_id))
    stop = reference[3]
    stopping = inference_pb2.StoppingParams(max_tokens=8, stop_token_ids=[stop], ignore_eos=True)
    job = _submit(stub, stopping=stopping).job_id
    events = _events(stub, job)
    final = events[-1].final
    assert final.finish_reason == inference_pb2.FINISH_REASON_STOP
    assert final.HasField("stop_token_id") and final.stop_token_id == stop == _tokens(events)[-1]
    alone = _events(stub, job, len(events) - 1)
    assert alone[0].final.stop_token_id == stop, "re-attaching at the Final still names the stop token"
    length = _events(stub, _submit(stub, max_tokens=2).job_id)[-1].final
    assert length.finish_reason == inference_pb2.FINISH_REASON_LENGTH and not length.HasField("stop_token_id")


# ---------------------------------------------------------------- WatchLoad


@pytest.mark.parametrize("interval_ms", [1, 49, 60_001, 4_000_000])
def test_watch_load_refuses_an_interval_out_of_range(stub: Stub, interval_ms: int) -> None:
    request = observe_pb2.WatchLoadRequest(interval_ms=interval_ms)
    assert _code(lambda: next(stub.WatchLoad(request, timeout=CALL_S))) is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("interval_ms", [0, 50, 60_000])
def test_watch_load_accepts_the_documented_intervals(stub: Stub, interval_ms: int) -> None:
    stream = stub.WatchLoad(observe_pb2.WatchLoadRequest(interval_ms=interval_ms), timeout=CALL_S)
    first = next(stream)
    stream.cancel()
    assert first.sequence == 0 and [m.alias for m in first.models] == ["tiny"]


def test_watch_load_reports_a_model_state_change_without_waiting_for_the_interval(stub: Stub) -> None:
    # A 60 s interval: the only way a second report arrives within the call deadline is the change.
    stream = stub.WatchLoad(observe_pb2.WatchLoadRequest(interval_ms=60_000), timeout=CALL_S)
    try:
        assert [m.alias for m in next(stream).models] == ["tiny"]
        _load(stub, "extra")
        seen = next(stream)
        while "extra" not in [m.alias for m in seen.models]:
            seen = next(stream)
        assert seen.sequence >= 1
    finally:
        stream.cancel()
        stub.Unload(operate_pb2.UnloadRequest(alias="extra"), timeout=CALL_S)


def _load(stub: Stub, alias: str) -> operate_pb2.LoadProgress:
    progress = list(stub.Load(operate_pb2.LoadRequest(alias=alias, package="tiny"), timeout=CALL_S))
    assert progress[-1].done and progress[-1].state == common_pb2.MODEL_STATE_READY, progress[-1]
    return progress[-1]


# ---------------------------------------------------------------- Submit limits


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": 1001},
        {"priority": -1001},
        {"priority": 2**31 - 1},
        {"session_id": "s" * 129},
        {"session_id": "é" * 65},  # 65 characters, 130 bytes
        {"client_request_id": "é" * 65},
    ],
    ids=["priority>1000", "priority<-1000", "priority-int32-max", "session-129", "session-130-bytes", "crid-bytes"],
)
def test_submit_refuses_fields_beyond_their_wire_limits(stub: Stub, served: ServedCore, fields: dict[str, Any]) -> None:
    accepted = served.core.status().accepted
    assert _code(lambda: _submit(stub, **fields)) is grpc.StatusCode.INVALID_ARGUMENT
    assert served.core.status().accepted == accepted, "nothing was enqueued"


@pytest.mark.parametrize("fields", [{"priority": 1000}, {"priority": -1000}, {"session_id": "s" * 128}])
def test_submit_accepts_fields_at_their_wire_limits(stub: Stub, fields: dict[str, Any]) -> None:
    events = _events(stub, _submit(stub, **fields).job_id)
    assert events[-1].final.finish_reason == inference_pb2.FINISH_REASON_LENGTH


# ---------------------------------------------------------------- operations: timeouts, Reset, InjectFault


def test_drain_and_unload_refuse_a_window_above_one_hour(stub: Stub, served: ServedCore) -> None:
    too_long = ONE_HOUR_MS + 1
    assert _code(lambda: stub.Drain(operate_pb2.DrainRequest(timeout_ms=too_long), timeout=CALL_S)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert served.core.health().serving, "a refused Drain must not stop admission"
    unload = operate_pb2.UnloadRequest(alias="tiny", drain_timeout_ms=too_long)
    assert _code(lambda: stub.Unload(unload, timeout=CALL_S)) is grpc.StatusCode.INVALID_ARGUMENT
    assert [m.alias for m in served.core.health().models] == ["tiny"], "a refused Unload unloads nothing"


@pytest.mark.parametrize(
    ("kind", "reason", "model", "code"),
    [
        (common_pb2.RESET_KIND_CCU, "", "", grpc.StatusCode.INVALID_ARGUMENT),
        (common_pb2.RESET_KIND_CCU, "r" * 257, "", grpc.StatusCode.INVALID_ARGUMENT),
        (common_pb2.RESET_KIND_CCU, "ok", "tiny", grpc.StatusCode.INVALID_ARGUMENT),
        (common_pb2.RESET_KIND_CONFIGURATION, "ok", "nope", grpc.StatusCode.NOT_FOUND),
        (common_pb2.RESET_KIND_UNSPECIFIED, "ok", "", grpc.StatusCode.INVALID_ARGUMENT),
    ],
    ids=["empty-reason", "reason-257-bytes", "model-with-ccu", "unknown-model", "unspecified-kind"],
)
def test_reset_refuses_bad_requests_before_resetting_anything(
    stub: Stub, served: ServedCore, kind: int, reason: str, model: str, code: grpc.StatusCode
) -> None:
    resets = served.core.status().resets
    request = operate_pb2.ResetRequest(kind=kind, reason=reason, model=model)  # type: ignore[arg-type]
    assert _code(lambda: stub.Reset(request, timeout=CALL_S)) is code
    assert served.core.status().resets == resets, "a refused reset is not performed nor counted"


def test_reset_result_carries_the_reason_given_and_the_generations(stub: Stub) -> None:
    reason = "operator: ticket 42"
    result = stub.Reset(
        operate_pb2.ResetRequest(kind=common_pb2.RESET_KIND_CONFIGURATION, reason=reason, model="tiny"),
        timeout=CALL_S,
    )
    assert result.ok and result.reason == reason and not result.HasField("error")
    assert [g.alias for g in result.generations] == ["tiny"]
    ccu = stub.Reset(operate_pb2.ResetRequest(kind=common_pb2.RESET_KIND_CCU, reason="ccu " + reason), timeout=CALL_S)
    assert ccu.ok and ccu.reason == "ccu " + reason


@pytest.mark.parametrize(
    "spec",
    [
        operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_CCU_EXCEPTION, job_index=10**6, delay_ms=5),
        operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_HANG, probability=0.5, delay_ms=1),
        operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_NAN_LOGITS, probability=0.0),
        operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_SLOW_JOB, job_index=10**6),
    ],
    ids=["delay-on-ccu", "delay-on-hang", "probability-zero", "slow-job-without-delay"],
)
def test_inject_fault_refuses_a_bad_spec_and_changes_no_plan(stub: Stub, spec: operate_pb2.FaultSpec) -> None:
    far = operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_CCU_EXCEPTION, job_index=10**7)
    planned = stub.InjectFault(operate_pb2.InjectFaultRequest(fault=far, clear_existing=True), timeout=CALL_S)
    try:
        for clear in (False, True):
            request = operate_pb2.InjectFaultRequest(fault=spec, clear_existing=clear)
            assert _code(partial(stub.InjectFault, request, timeout=CALL_S)) is grpc.StatusCode.INVALID_ARGUMENT
            now = stub.InjectFault(operate_pb2.InjectFaultRequest(), timeout=CALL_S).planned_faults
            assert now == planned.planned_faults == 1, "a refused request neither plans nor clears"
    finally:
        stub.InjectFault(operate_pb2.InjectFaultRequest(clear_existing=True), timeout=CALL_S)


def test_a_reset_that_the_device_fails_is_reported_in_its_result(models_root: Path, tmp_path: Path) -> None:
    board = _serve(models_root, tmp_path / "lost.sock")
    try:
        lost = operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_DEVICE_LOST)  # the next submit attempt
        board.stub.InjectFault(operate_pb2.InjectFaultRequest(fault=lost), timeout=CALL_S)
        events = _events(board.stub, _submit(board.stub).job_id)
        assert events[-1].final.error.kind == common_pb2.ERROR_KIND_UNAVAILABLE
        request = operate_pb2.ResetRequest(kind=common_pb2.RESET_KIND_CCU, reason="after device loss")
        result = board.stub.Reset(request, timeout=CALL_S)
        assert not result.ok and result.error.kind == common_pb2.ERROR_KIND_UNAVAILABLE and result.error.message
        assert result.health_after == common_pb2.SERVING_STATUS_NOT_SERVING
        # A lost device finishes nothing: NOT_SERVING everywhere, never DRAINING.
        assert board.stub.Health(observe_pb2.HealthRequest(), timeout=CALL_S).status == (
            common_pb2.SERVING_STATUS_NOT_SERVING
        )
        assert board.stub.Status(observe_pb2.StatusRequest(), timeout=CALL_S).health == (
            common_pb2.SERVING_STATUS_NOT_SERVING
        )
        report = next(board.stub.WatchLoad(observe_pb2.WatchLoadRequest(), timeout=CALL_S))
        assert report.status == common_pb2.SERVING_STATUS_NOT_SERVING
    finally:
        board.close()


# ---------------------------------------------------------------- Load whose caller left


def test_grpc_health_follows_a_load_whose_caller_disconnected(stub: Stub, served: ServedCore) -> None:
    alias = "left"
    watch = served.health.Watch(health_pb2.HealthCheckRequest(service=alias), timeout=CALL_S)
    try:
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        load = stub.Load(operate_pb2.LoadRequest(alias=alias, package="tiny"), timeout=CALL_S)
        assert next(load).state == common_pb2.MODEL_STATE_VALIDATING
        load.cancel()  # the operator's calctl went away; the load goes on (operate.proto)
        status = next(watch).status
        while status != health_pb2.HealthCheckResponse.SERVING:
            status = next(watch).status
    finally:
        watch.cancel()
    stub.Unload(operate_pb2.UnloadRequest(alias=alias), timeout=CALL_S)


def test_grpc_health_of_an_unloaded_alias_is_not_serving(stub: Stub, served: ServedCore) -> None:
    alias = "gone"
    _load(stub, alias)
    check = health_pb2.HealthCheckRequest(service=alias)
    assert served.health.Check(check, timeout=CALL_S).status == health_pb2.HealthCheckResponse.SERVING
    stub.Unload(operate_pb2.UnloadRequest(alias=alias), timeout=CALL_S)
    assert served.health.Check(check, timeout=CALL_S).status == health_pb2.HealthCheckResponse.NOT_SERVING
    overall = health_pb2.HealthCheckRequest(service="")
    assert served.health.Check(overall, timeout=CALL_S).status == health_pb2.HealthCheckResponse.SERVING


def test_a_fault_that_fired_is_no_longer_counted_as_planned(stub: Stub) -> None:
    ccu = operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_CCU_EXCEPTION)  # the next submit attempt
    assert stub.InjectFault(operate_pb2.InjectFaultRequest(fault=ccu), timeout=CALL_S).planned_faults == 1
    events = _events(stub, _submit(stub).job_id)
    assert events[-1].final.finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert events[-1].final.recoveries == 1, "the fault fired (and the job recovered)"
    after = stub.InjectFault(operate_pb2.InjectFaultRequest(), timeout=CALL_S)
    assert after.planned_faults == 0, "a one-shot fault that fired is not planned any more"


def test_load_report_says_not_ready_while_the_board_drains(stub: Stub) -> None:
    assert next(stub.WatchLoad(observe_pb2.WatchLoadRequest(), timeout=CALL_S)).models[0].ready
    stub.Drain(operate_pb2.DrainRequest(timeout_ms=0), timeout=CALL_S)
    try:
        report = next(stub.WatchLoad(observe_pb2.WatchLoadRequest(), timeout=CALL_S))
        assert report.status == common_pb2.SERVING_STATUS_DRAINING
        assert not report.models[0].ready, "ready means Submit would be admitted now (observe.proto)"
        assert _code(lambda: _submit(stub)) is grpc.StatusCode.UNAVAILABLE
    finally:
        stub.Resume(operate_pb2.ResumeRequest(), timeout=CALL_S)


@pytest.mark.parametrize("package", ["ti\x00ny", "x" * 300, "a/" * 3000], ids=["nul", "long-name", "long-path"])
def test_load_of_an_impossible_package_path_is_invalid_argument(stub: Stub, package: str) -> None:
    request = operate_pb2.LoadRequest(alias="bad", package=package)
    assert _code(lambda: list(stub.Load(request, timeout=CALL_S))) is grpc.StatusCode.INVALID_ARGUMENT


def test_an_error_that_echoes_a_huge_input_keeps_its_code(stub: Stub) -> None:
    job_id = "j" * 100_000  # the message quotes it; a status message is one HTTP/2 header
    assert _code(lambda: _events(stub, job_id)) is grpc.StatusCode.NOT_FOUND
    cancel = inference_pb2.CancelRequest(job_id=job_id)
    assert _code(lambda: stub.Cancel(cancel, timeout=CALL_S)) is grpc.StatusCode.NOT_FOUND
