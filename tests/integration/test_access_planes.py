"""Access planes (issue 10 item 2) on a real daemon process: per-plane bearer tokens from files, checked
in one interceptor; the Unix socket is owner and group only (0660)."""

from __future__ import annotations

import socket
import stat
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.v1 import daemon_pb2_grpc, inference_pb2, observe_pb2, operate_pb2

from .conftest import DaemonProcess

CALL_S = 20.0
TOKENS = {"inference": "inf-token", "observe": "obs-token", "operate": "op-token"}


@pytest.fixture
def daemon(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> DaemonProcess:
    flags: list[str] = []
    for plane, token in TOKENS.items():
        path = tmp_path / f"{plane}.tokens"
        path.write_text(f"# the {plane} plane\n\n{token}\n", encoding="utf-8")
        flags += [f"--token-file-{plane}", str(path)]
    return start_daemon("--model", "tiny=tiny", "--fault-injection", *flags)


def _auth(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token is not None else []


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def _load(s: daemon_pb2_grpc.DaemonStub, md: list[tuple[str, str]]) -> object:
    return next(s.Load(operate_pb2.LoadRequest(alias="x", package="tiny"), metadata=md, timeout=CALL_S))


OPERATE_CALLS: dict[str, Callable[[daemon_pb2_grpc.DaemonStub, list[tuple[str, str]]], object]] = {
    "Load": _load,
    "Unload": lambda s, md: s.Unload(operate_pb2.UnloadRequest(alias="nope"), metadata=md, timeout=CALL_S),
    "Drain": lambda s, md: s.Drain(operate_pb2.DrainRequest(), metadata=md, timeout=CALL_S),
    "Reset": lambda s, md: s.Reset(operate_pb2.ResetRequest(), metadata=md, timeout=CALL_S),
    "InjectFault": lambda s, md: s.InjectFault(operate_pb2.InjectFaultRequest(), metadata=md, timeout=CALL_S),
}


def test_the_inference_token_cannot_operate_and_the_socket_is_0660(daemon: DaemonProcess) -> None:
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o660
    with grpc.insecure_channel(daemon.target) as channel:
        stub = daemon_pb2_grpc.DaemonStub(channel)
        for name, call in OPERATE_CALLS.items():
            for token, code in (
                (TOKENS["inference"], grpc.StatusCode.PERMISSION_DENIED),
                (TOKENS["observe"], grpc.StatusCode.PERMISSION_DENIED),
                ("forged", grpc.StatusCode.PERMISSION_DENIED),
                (None, grpc.StatusCode.UNAUTHENTICATED),
            ):
                assert _code(lambda call=call, token=token: call(stub, _auth(token))) is code, (name, token)


def test_each_plane_takes_its_own_token_and_the_operate_token_everywhere(daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.target) as channel:
        stub = daemon_pb2_grpc.DaemonStub(channel)
        submit = inference_pb2.SubmitRequest(
            model="tiny", prompt_tokens=[5, 6], stopping=inference_pb2.StoppingParams(max_tokens=2, ignore_eos=True)
        )
        assert stub.Submit(submit, metadata=_auth(TOKENS["inference"]), timeout=CALL_S).job_id
        assert _code(lambda: stub.Submit(submit, metadata=_auth(TOKENS["observe"]), timeout=CALL_S)) is (
            grpc.StatusCode.PERMISSION_DENIED
        )
        for plane in ("observe", "operate"):
            stub.Status(observe_pb2.StatusRequest(), metadata=_auth(TOKENS[plane]), timeout=CALL_S)
        denied = _code(
            lambda: stub.Status(observe_pb2.StatusRequest(), metadata=_auth(TOKENS["inference"]), timeout=CALL_S)
        )
        assert denied is grpc.StatusCode.PERMISSION_DENIED
        watch = stub.WatchLoad(observe_pb2.WatchLoadRequest(), metadata=_auth(TOKENS["inference"]), timeout=CALL_S)
        assert next(watch).models, "a gateway's inference token may follow load reports"
        watch.cancel()
        assert stub.Submit(submit, metadata=_auth(TOKENS["operate"]), timeout=CALL_S).job_id
        stub.Resume(operate_pb2.ResumeRequest(), metadata=_auth(TOKENS["operate"]), timeout=CALL_S)
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_S)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, "grpc.health stays open for probes"


def test_tcp_without_tls_is_refused_at_start(tmp_path: Path) -> None:
    refused = DaemonProcess(tmp_path, tmp_path, ["--model", "tiny=tiny"], "127.0.0.1:0")
    assert refused.proc.wait(CALL_S) == 2
    assert "needs TLS" in refused.log()


def test_a_plaintext_health_listener_serves_only_grpc_health(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Kubernetes' gRPC probes cannot speak TLS or send tokens: --health-listen answers grpc.health.v1
    in plaintext and nothing else."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = tmp_path / "operate.tokens"
    token.write_text("secret\n", encoding="utf-8")
    start_daemon("--model", "tiny=tiny", "--token-file-operate", str(token), "--health-listen", f"127.0.0.1:{port}")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_S)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        live = health_pb2.HealthCheckRequest(service="calculet.liveness")  # the livenessProbe's service
        assert health_pb2_grpc.HealthStub(channel).Check(live, timeout=CALL_S).status == health.status
        stub = daemon_pb2_grpc.DaemonStub(channel)
        assert _code(lambda: stub.Status(observe_pb2.StatusRequest(), timeout=CALL_S)) is grpc.StatusCode.UNIMPLEMENTED
