"""Fixtures that run the real `calculet-daemon` process on a Unix socket in a temp dir.

`DaemonProcess` starts `python -m calculet.daemon.main` with calsim at time scale 0, polls its
health until SERVING (failing fast, with its log, if the process dies), and stops it with SIGTERM
at teardown. Each daemon is its own host: `$XDG_RUNTIME_DIR` is `<workdir>/xdg-runtime`, so its
default board lock and calsim's device lock are its own (a test that wants two daemons to meet
passes the same `env` to both, or `--runtime-dir`). Packages are built once per run, for all workers
(tests/integration/package_cache.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.ops.sim_packages.build import build_sim_package
from tests.integration.gateway_process import GatewayProcess, terminate
from tests.integration.package_cache import session_packages

STARTUP_TIMEOUT_S = 60.0


def build_session_packages(root: Path) -> None:
    build_sim_package("tiny", root / "tiny")
    build_sim_package("qwen3-30b-a3b", root / "qwen", decode_batches=(1, 4), lanes=4, lane_context=4096)
    build_sim_package("qwen3-30b-a3b-b1", root / "qwen3-30b-a3b-b1")  # today's calbin (issue 33), as built
    for chip in (0, 1):  # qwen3-4b, one per chip (issue 20)
        build_sim_package("qwen3-4b", root / f"dense{chip}", decode_batches=(1, 4), lane_context=1024, chip=chip)


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This worker's models root: the session packages, built once for all workers."""
    return session_packages(tmp_path_factory, build_session_packages)


class DaemonProcess:
    """One daemon process under test."""

    def __init__(
        self,
        workdir: Path,
        models_root: Path,
        args: list[str],
        listen: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`env` is added to the daemon's environment, after its own `XDG_RUNTIME_DIR`."""
        self.workdir = workdir
        self.socket = (
            Path(listen.removeprefix("unix:")) if listen and listen.startswith("unix:") else workdir / "board0.sock"
        )
        self.target = listen or f"unix:{self.socket}"
        self._tcp = not self.target.startswith("unix:")
        self.log_path = workdir / "daemon.log"
        cmd = [
            sys.executable, "-m", "calculet.daemon.main",
            "--listen", self.target,
            "--models-root", str(models_root),
            "--time-scale", "0",
            "--log-level", "INFO",
            # Two resident models, so tests may load qwen beside tiny; a test of the one-calbin board
            # passes --device-profile calrt-0.7.6, which comes later and wins.
            "--device-profile", "calsim-dev",
            # Boards start and reload without the modelled switch cost whatever their --time-scale;
            # a test of that cost passes its own configure_time_scale, which comes later and wins.
            "--device-option", "configure_time_scale=0",
            *args,
        ]  # fmt: skip
        self._log = self.log_path.open("wb")
        private = {"PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(workdir / "xdg-runtime")}
        full_env = {**os.environ, **private, **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, env=full_env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"daemon exited with {self.proc.returncode} during startup:\n{self.log()}")
            if self._tcp or self.socket.exists():
                try:
                    with grpc.insecure_channel(self.target) as ch:
                        stub = health_pb2_grpc.HealthStub(ch)
                        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                        if resp.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                except grpc.RpcError:
                    pass
            time.sleep(0.05)
        pytest.fail(f"daemon not SERVING after {timeout}s:\n{self.log()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        code = terminate(self.proc)
        self._log.close()
        return code


@contextlib.contextmanager
def shared_daemon(workdir: Path, models_root: Path, *args: str) -> Iterator[DaemonProcess]:
    """A SERVING daemon for all of a module's tests (the body of a module-scoped fixture): the tests
    that share it leave it idle and assert nothing only a fresh board shows (counters, audit trail).
    Stopped after them; one that does not exit cleanly fails the fixture with its log."""
    daemon = DaemonProcess(workdir, models_root, list(args))
    try:
        daemon.wait_serving()
        yield daemon
    finally:  # also after a failed start: no daemon left behind (the failure is the one reported)
        code = daemon.stop()
    assert code in (0, -signal.SIGTERM), f"exit {code}\n{daemon.log()}"


@pytest.fixture
def start_daemon(
    tmp_path: Path, models_root: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., DaemonProcess]]:
    """`start_daemon(*flags, listen=None, env=None)` -> a SERVING DaemonProcess (on `listen`, default a
    Unix socket in its own temp dir; `env` added to its environment); stopped (log shown on failure)
    at teardown."""
    started: list[DaemonProcess] = []

    def start(*args: str, listen: str | None = None, env: Mapping[str, str] | None = None) -> DaemonProcess:
        workdir = tmp_path / f"d{len(started)}"
        workdir.mkdir()
        daemon = DaemonProcess(workdir, models_root, list(args), listen, env)
        started.append(daemon)
        daemon.wait_serving()
        return daemon

    yield start
    for daemon in started:
        code = daemon.stop()
        rep = getattr(request.node, "rep_call", None)
        if (rep is not None and rep.failed) or code not in (0, -signal.SIGTERM):
            print(f"---- daemon log ({daemon.workdir}, exit {code}) ----\n{daemon.log()}")


@pytest.fixture
def start_gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., GatewayProcess]]:
    """`start_gateway(*flags)` -> a GatewayProcess on a Unix socket, ready (some board can serve)."""
    started: list[GatewayProcess] = []

    def start(*args: str, wait_ready: bool = True) -> GatewayProcess:
        workdir = tmp_path / f"gw{len(started)}"
        workdir.mkdir()
        gateway = GatewayProcess(workdir, list(args))
        started.append(gateway)
        gateway.wait_up(ready=wait_ready)
        return gateway

    yield start
    for gateway in started:
        code = gateway.stop()
        rep = getattr(request.node, "rep_call", None)
        if (rep is not None and rep.failed) or code not in (0, -signal.SIGTERM):
            print(f"---- gateway log ({gateway.workdir}, exit {code}) ----\n{gateway.log()}")


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)
