"""Fixtures: a `FakeDaemon` served by a real in-process gRPC server on a Unix socket in tmp_path
(or on TCP with TLS), and a server interceptor recording the metadata of every call."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from calculet.v1 import daemon_pb2_grpc

from .fake_daemon import FakeDaemon


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


def start_server(fake: FakeDaemon, sock: Path) -> grpc.Server:
    """Serve `fake` and its grpc.health.v1 servicer on the Unix socket `sock` (gRPC replaces a
    stale socket file)."""
    return serve(fake, f"unix://{sock}")[0]


def serve(
    fake: FakeDaemon,
    address: str,
    *,
    credentials: grpc.ServerCredentials | None = None,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> tuple[grpc.Server, int]:
    """Serve `fake` and its health servicer on `address` (TLS with `credentials`); the server and
    the bound port (for `127.0.0.1:0`)."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-daemon"), interceptors=list(interceptors)
    )
    daemon_pb2_grpc.add_DaemonServicer_to_server(fake, server)
    health_pb2_grpc.add_HealthServicer_to_server(fake.health, server)
    port = server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
    server.start()
    return server, port


class MetadataRecorder(grpc.ServerInterceptor):
    """Records (full method name, `authorization` metadata or None) of every call the server gets,
    health and Daemon alike, before its handler runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[tuple[str, str | None]] = []

    def intercept_service(self, continuation: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        value = dict(handler_call_details.invocation_metadata or ()).get("authorization")
        with self._lock:
            self._calls.append((handler_call_details.method, value if isinstance(value, str) else None))
        return continuation(handler_call_details)

    @property
    def calls(self) -> list[tuple[str, str | None]]:
        with self._lock:
            return list(self._calls)

    def methods(self) -> list[str]:
        """The short method names called, in order (`Submit`, `Check`, ...)."""
        return [method.rsplit("/", 1)[-1] for method, _ in self.calls]


@pytest.fixture
def daemon(tmp_path: Path, fake: FakeDaemon) -> Iterator[str]:
    """The fake's target, `unix:///.../d.sock`, served until the test ends."""
    sock = tmp_path / "d.sock"
    server = start_server(fake, sock)
    try:
        yield f"unix://{sock}"
    finally:
        fake.open_all_gates()
        server.stop(grace=None).wait(5)
