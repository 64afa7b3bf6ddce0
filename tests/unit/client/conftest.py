"""Fixtures: a `FakeDaemon` served by a real in-process gRPC server on a Unix socket in tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-daemon"))
    daemon_pb2_grpc.add_DaemonServicer_to_server(fake, server)
    health_pb2_grpc.add_HealthServicer_to_server(fake.health, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    return server


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
