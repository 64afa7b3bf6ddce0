"""Access planes (issue 10 item 2), without a server: the method -> plane table, the bearer check, and
the listener's security settings (TCP refused without TLS unless `--insecure`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from calculet.daemon.server.access import METHOD_PLANE, AccessPolicy, Plane, bearer
from calculet.daemon.settings import security_from
from calculet.v1 import daemon_pb2_grpc


def test_every_daemon_method_has_a_plane_and_an_unknown_one_is_refused() -> None:
    service = daemon_pb2_grpc.DaemonServicer
    methods = {m for m in dir(service) if not m.startswith("_")}
    assert methods == set(METHOD_PLANE), "a new RPC must be given a plane"
    policy = AccessPolicy({Plane.OPERATE: (b"t",)})
    with pytest.raises(PermissionDenied):
        policy.check("/calculet.v1.Daemon/Shutdown", b"t")
    with pytest.raises(Unauthenticated):
        policy.check("/calculet.v1.Daemon/Status", None)
    policy.check("/grpc.health.v1.Health/Check", None)
    assert bearer([("authorization", "Bearer abc ")]) == b"abc" and bearer([("authorization", "Basic abc")]) is None


def test_tcp_without_tls_is_refused_unless_insecure_and_tls_needs_cert_and_key(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="needs TLS"):
        security_from({}, "127.0.0.1:0")
    assert security_from({"insecure": True}, "127.0.0.1:0").insecure
    assert security_from({}, "unix:/tmp/x.sock").policy.enabled is False
    with pytest.raises(InvalidArgument, match="both"):
        security_from({"tls_cert": str(tmp_path / "c.pem")}, "127.0.0.1:0")
    with pytest.raises(InvalidArgument, match="tls file"):
        security_from({"tls_cert": str(tmp_path / "c.pem"), "tls_key": str(tmp_path / "k.pem")}, "127.0.0.1:0")
    empty = tmp_path / "empty.tokens"
    empty.write_text("# nothing\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="no token"):
        security_from({"token_file_operate": str(empty)}, "unix:/tmp/x.sock")
