"""Daemons on TCP with TLS for the integration tests: a free port, the wait until such a daemon is
SERVING (over TLS, through the open grpc.health.v1 Watch), and a context manager that starts one
with the throwaway PKI of `tests/unit/client/pki.py` and stops it (log printed on a bad exit)."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.client import DaemonClient, ServingStatus, TlsConfig
from calculet.common.errors import Unavailable
from tests.integration.conftest import DaemonProcess
from tests.unit.client.pki import SERVER_NAME, Pki


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_tls_serving(daemon: DaemonProcess, tls: TlsConfig, timeout: float = 60.0) -> None:
    """Poll the (open) grpc.health.v1 Watch over TLS until the board is SERVING."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not daemon.alive():
            pytest.fail(f"daemon exited during startup:\n{daemon.log()}")
        with (
            contextlib.suppress(Unavailable),
            DaemonClient(daemon.target, timeout=2.0, tls=tls) as client,
            contextlib.closing(client.watch_health()) as statuses,  # type: ignore[type-var]
        ):
            if next(statuses) is ServingStatus.SERVING:
                return
        time.sleep(0.1)
    pytest.fail(f"daemon not SERVING over TLS after {timeout}s:\n{daemon.log()}")


@contextlib.contextmanager
def tls_daemon(workdir: Path, models_root: Path, pki: Pki, *args: str) -> Iterator[DaemonProcess]:
    """A SERVING daemon on 127.0.0.1:<free port> with the PKI's server certificate (no client CA:
    plain TLS), started with `args`; stopped at the end."""
    workdir.mkdir()
    tls_args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    daemon = DaemonProcess(workdir, models_root, [*args, *tls_args], listen=f"127.0.0.1:{free_port()}")
    try:
        wait_tls_serving(daemon, TlsConfig(pki.ca, server_name=SERVER_NAME))
        yield daemon
    finally:
        code = daemon.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"---- daemon log (exit {code}) ----\n{daemon.log()}")
