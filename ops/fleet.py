"""`LocalFleet`: N calsim board daemons and one gateway, run as child processes of this process.

This module owns the child processes of a local fleet (what `calctl up` and `make run` start):
their command lines, logs (`<dir>/logs/board<i>.log`, `<dir>/logs/gateway.log`), readiness checks
(`grpc.health.v1` Check on each board, `GET /ready` on the gateway), crash detection and the
stop order (gateway first, then the boards; SIGTERM, a grace period, then SIGKILL), and the board
sockets `<dir>/board<i>.sock` left behind by a daemon that did not stop cleanly. Packages,
signals and printing belong to the caller (`calculet.ops.commands.up`).

A fleet is its own emulated host: its board locks live in `<dir>` (`--runtime-dir`) and calsim's
device locks in `<dir>/calsim` (`$CALSIM_STATE_DIR`), so fleets in other directories (and the test
suite's daemons) never meet it, while two fleets in one directory refuse each other's boards.

Children run in their own process group (a terminal's Ctrl-C reaches only the parent, which
stops them in order) and, on Linux, with PR_SET_PDEATHSIG=SIGTERM, so they stop when the thread
that started them dies, even if the parent was killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.common.parent_death import PARENT_PID_ENV
from calculet.daemon.calsim.device_lock import STATE_DIR_ENV

GATEWAY_MODULE = "calculet.gateway.main"
DAEMON_MODULE = "calculet.daemon.main"
POLL_S = 0.05  # readiness and exit polling period
PROBE_TIMEOUT_S = 2.0  # one health Check / one GET /ready
TAIL_LINES = 20
GATEWAY_STOP_S = 15.0
DAEMON_STOP_S = 45.0  # the daemon drains for up to its --drain-timeout (30 s by default) on SIGTERM

GatewayCommand = Callable[[str, Sequence[str]], list[str]]
"""(listen "HOST:PORT", daemon targets) -> the gateway's argv."""


class FleetError(Exception):
    """The fleet could not start (a child exited, a deadline passed, an address is taken, or the
    start was cancelled). When `LocalFleet.start` / `wait_ready` raise it, nothing is left running."""


def gateway_argv(listen: str, daemons: Sequence[str], module: str = GATEWAY_MODULE) -> list[str]:
    """The real gateway's command line: `python -m MODULE --listen LISTEN --daemon T ...`.

    Args:
        listen: "HOST:PORT" (IPv6 hosts in brackets).
        daemons: board targets, `unix:PATH`.
        module: the module run with `-m` (a stand-in in tests).

    Returns:
        The argv list.
    """
    argv = [sys.executable, "-m", module, "--listen", listen]
    for target in daemons:
        argv += ["--daemon", target]
    return argv


@dataclass(frozen=True)
class FleetConfig:
    """What to run.

    Attributes:
        workdir: holds `board<i>.sock`, `logs/`, and by default `models/`.
        boards: number of daemons, board indexes 0..boards-1.
        model: alias each board serves.
        package: the package directory, relative to `models_root`.
        models_root: the daemons' `--models-root` (default `workdir/models`).
        host, port: where the gateway listens.
        time_scale: calsim wall seconds per modelled second (0 = never sleep).
        policy: "continuous" or "serial".
        daemon_args: extra flags for every daemon, after the fleet's own (`calctl up --daemon-arg`).
        gateway_command: builds the gateway's argv (injectable so tests can run a stand-in).
        gateway_args: extra flags for the gateway, after `gateway_command`'s (`calctl up --gateway-arg`).
    """

    workdir: Path
    boards: int
    model: str
    package: str
    models_root: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    time_scale: float = 1.0
    policy: str = "continuous"
    daemon_args: tuple[str, ...] = ()
    gateway_command: GatewayCommand = gateway_argv
    gateway_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChildExit:
    """A child that exited while the fleet was not stopping."""

    name: str
    role: str  # "daemon" or "gateway"
    pid: int
    returncode: int
    log_path: Path
    tail: str

    def describe(self) -> str:
        """`board1 (pid 123) was killed by SIGKILL; last lines of run/logs/board1.log:` + the tail."""
        return f"{self.name} (pid {self.pid}) {exit_text(self.returncode)}; {tail_block(self.log_path, self.tail)}"


def exit_text(returncode: int) -> str:
    """`exited with code 2` or `was killed by SIGKILL`."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def tail_block(log_path: Path, tail: str) -> str:
    return f"last lines of {log_path}:\n{tail}" if tail else f"{log_path} is empty"


def read_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last `lines` lines of a text file ('' if it is missing), indented for reports."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


@dataclass
class Child:
    """One child process and its log file. Owns the Popen; `LocalFleet` owns the Child."""

    name: str
    role: str
    argv: list[str]
    log_path: Path
    socket: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    reported: bool = False

    def start(self, append: bool = False) -> None:
        """Start the process in its own process group, stdout and stderr to the log (truncated, or
        continued with `append`). It learns our pid (`parent_death.PARENT_PID_ENV`) and dies with us
        (`die_with_parent`).

        Raises:
            FleetError: the process could not be started.
        """
        env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid()), **self.env}
        try:
            with self.log_path.open("ab" if append else "wb") as log:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    process_group=0,  # no preexec_fn: vfork, so grpcio's at-fork handlers never run
                )
        except OSError as exc:
            raise FleetError(f"{self.name}: cannot start {self.argv[0]}: {exc}") from None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def returncode(self) -> int | None:
        """None while running (or never started); reaps the process when it has exited."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the child's process group, only while the child is not reaped (its pid, which is
        the group id, cannot have been reused)."""
        if self.alive() and self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def tail(self) -> str:
        return read_tail(self.log_path)

    def exit_record(self) -> ChildExit:
        code = self.returncode()
        return ChildExit(self.name, self.role, self.pid, -1 if code is None else code, self.log_path, self.tail())

    def remove_socket(self) -> None:
        """Remove the board socket a dead daemon left behind (only a started child's, once it is gone)."""
        if self.socket is not None and self.proc is not None and not self.alive():
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()


def daemon_serving(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when the daemon at `target` answers SERVING to the standard health Check (service "")."""
    try:
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when GET `url` answers 200 (no proxies: the fleet is local)."""
    try:
        with _NO_PROXY.open(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _socket_in_use(path: Path) -> bool:
    """True when something accepts connections on the Unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(PROBE_TIMEOUT_S)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def check_port_free(host: str, port: int) -> None:
    """Raises: FleetError: `host:port` cannot be bound (in use, or not an address of this host)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FleetError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise FleetError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


class LocalFleet:
    """N board daemons and one gateway on this host, children of this process.

    Ownership: the fleet owns every process it starts, their log files and the board sockets
    under `workdir`; nothing else may signal or reap them. `start` and `wait_ready` stop
    everything before they raise, so after a FleetError nothing is left running; `stop` is
    idempotent and must be called (or the fleet used as a context manager) once started. Call
    `start` from a thread that outlives the fleet (the main thread): the children's
    PR_SET_PDEATHSIG fires when that thread ends. Not thread-safe: one thread drives a fleet.
    """

    def __init__(self, config: FleetConfig) -> None:
        """Nothing starts until `start`.

        Args:
            config: what to run.

        Raises:
            ValueError: fewer than one board.
        """
        if config.boards < 1:
            raise ValueError(f"boards must be >= 1, got {config.boards}")
        self.config = config
        self.workdir = config.workdir
        self.models_root = config.models_root if config.models_root is not None else config.workdir / "models"
        self.log_dir = config.workdir / "logs"
        self.daemons = [
            Child(
                f"board{i}",
                "daemon",
                self.daemon_argv(i),
                self.log_dir / f"board{i}.log",
                socket=config.workdir / f"board{i}.sock",
                env=self.daemon_env(),
            )
            for i in range(config.boards)
        ]
        gateway_argv = [*config.gateway_command(self.listen, self.targets), *config.gateway_args]
        self.gateway = Child("gateway", "gateway", gateway_argv, self.log_dir / "gateway.log")
        self._stopping = False

    # ------------------------------------------------------------------ addresses

    @property
    def targets(self) -> list[str]:
        """The boards' gRPC targets, `unix:<dir>/board<i>.sock`."""
        return [f"unix:{self.config.workdir / f'board{i}.sock'}" for i in range(self.config.boards)]

    @property
    def listen(self) -> str:
        """The gateway's `--listen` value, HOST:PORT ([HOST]:PORT for IPv6)."""
        host = self.config.host
        return f"[{host}]:{self.config.port}" if _is_ipv6(host) else f"{host}:{self.config.port}"

    @property
    def base_url(self) -> str:
        """Where clients reach the gateway: `http://HOST:PORT` (loopback for a wildcard host)."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.config.host, self.config.host)
        return f"http://[{host}]:{self.config.port}" if _is_ipv6(host) else f"http://{host}:{self.config.port}"

    def daemon_argv(self, board: int) -> list[str]:
        """The command line of board `board`'s daemon."""
        c = self.config
        return [
            sys.executable, "-m", DAEMON_MODULE,
            "--board", str(board),
            "--listen", f"unix:{c.workdir / f'board{board}.sock'}",
            "--runtime-dir", str(c.workdir),
            "--models-root", str(self.models_root),
            "--model", f"{c.model}={c.package}",
            "--time-scale", f"{c.time_scale:g}",
            "--policy", c.policy,
            *c.daemon_args,
        ]  # fmt: skip

    def daemon_env(self) -> dict[str, str]:
        """What the daemons' environment adds: calsim's device locks in `<workdir>/calsim`."""
        return {STATE_DIR_ENV: str(self.config.workdir / "calsim")}

    def children(self) -> list[Child]:
        """The gateway (once started) and the daemons."""
        return ([self.gateway] if self.gateway.proc is not None else []) + self.daemons

    def pids(self) -> list[int]:
        """Process ids of every child started so far (running or not)."""
        return [c.pid for c in self.children() if c.proc is not None]

    # ------------------------------------------------------------------ startup

    def start(self, timeout_s: float = 120.0, cancelled: Callable[[], bool] | None = None) -> None:
        """Start the daemons, wait until each reports SERVING, then start the gateway.

        Args:
            timeout_s: deadline for the daemons to become SERVING.
            cancelled: polled while waiting; True stops the fleet and raises FleetError.

        Raises:
            FleetError: a board socket is in use by a live process, the gateway's address is taken,
                a child exited or was not SERVING in time, or the start was cancelled. Everything
                started is stopped first.
        """
        try:
            self._prepare()
            for d in self.daemons:
                d.start()
            self._wait(self._daemons_serving_check(), "the boards to report SERVING", timeout_s, cancelled)
            self.gateway.start()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float = 60.0, cancelled: Callable[[], bool] | None = None) -> None:
        """Wait until the gateway's `GET /ready` answers 200.

        Raises:
            FleetError: a child exited, the deadline passed or the wait was cancelled; everything is
                stopped first.
        """
        ready_url = f"{self.base_url}/ready"
        try:
            self._wait(lambda: http_ok(ready_url), f"{ready_url} to answer 200", timeout_s, cancelled)
        except BaseException:
            self.stop()
            raise

    def _prepare(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for d in self.daemons:
            assert d.socket is not None
            if d.socket.exists():
                if _socket_in_use(d.socket):
                    raise FleetError(
                        f"{d.socket} is in use by a running daemon (another `calctl up` in {self.workdir}?); "
                        "stop it or choose another --dir"
                    )
                d.socket.unlink()
        check_port_free(self.config.host, self.config.port)

    def _daemons_serving_check(self) -> Callable[[], bool]:
        """A check that is True once every daemon has answered SERVING (each is asked until it has)."""
        serving: set[int] = set()

        def check() -> bool:
            for i, d in enumerate(self.daemons):
                if i not in serving and d.socket is not None and d.socket.exists() and daemon_serving(self.targets[i]):
                    serving.add(i)
            return len(serving) == len(self.daemons)

        return check

    def _wait(
        self, done: Callable[[], bool], what: str, timeout_s: float, cancelled: Callable[[], bool] | None
    ) -> None:
        """Poll `done` until True; fail fast when a started child exits.

        Raises:
            FleetError: a child exited, the deadline passed, or `cancelled()` became True.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            for child in self.children():
                if child.proc is not None and child.returncode() is not None:
                    child.reported = True
                    raise FleetError(f"{child.exit_record().describe()}")
            if done():
                return
            if cancelled is not None and cancelled():
                raise FleetError(f"interrupted while waiting for {what}")
            if time.monotonic() >= deadline:
                tails = "\n".join(tail_block(c.log_path, c.tail()) for c in self.children())
                raise FleetError(f"gave up after {timeout_s:g}s waiting for {what}\n{tails}")
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ running

    def poll(self) -> list[ChildExit]:
        """Children that exited since the last call, each reported once (none while stopping).

        A dead daemon's leftover socket is removed; the other children keep running.
        """
        if self._stopping:
            return []
        exits = []
        for child in self.children():
            if not child.reported and child.proc is not None and child.returncode() is not None:
                child.reported = True
                child.remove_socket()
                exits.append(child.exit_record())
        return exits

    def serving_boards(self) -> int:
        """Daemons still running."""
        return sum(1 for d in self.daemons if d.alive())

    def restart_daemon(self, board: int) -> Child:
        """Start board `board`'s daemon again, with the same command line and socket, after its
        process exited (what systemd's `Restart=` does); its log continues in the same file, after a
        marker line. Readiness is the caller's to wait for. Call it from the thread that started the
        fleet (the children's parent-death signal follows that thread).

        Returns:
            The new child (also `daemons[board]`).

        Raises:
            FleetError: the fleet is stopping, the old process still runs, or the new one cannot start.
            IndexError: no such board.
        """
        old = self.daemons[board]
        if self._stopping:
            raise FleetError(f"{old.name}: the fleet is stopping")
        if old.proc is None or old.alive():
            raise FleetError(f"{old.name}: restart needs its process to have exited")
        old.reported = True  # its exit is superseded by the restart
        old.remove_socket()
        child = Child(old.name, old.role, old.argv, old.log_path, socket=old.socket, env=old.env)
        marker = f"---- restarting {old.name}: pid {old.pid} {exit_text(old.returncode() or 0)}\n"
        with contextlib.suppress(OSError), child.log_path.open("ab") as log:
            log.write(marker.encode())
        child.start(append=True)
        self.daemons[board] = child
        return child

    # ------------------------------------------------------------------ stopping

    def stop(
        self,
        gateway_timeout_s: float = GATEWAY_STOP_S,
        daemon_timeout_s: float = DAEMON_STOP_S,
        hurry: Callable[[], bool] | None = None,
    ) -> list[str]:
        """Stop the gateway, then the daemons: SIGTERM, wait up to the timeout, then SIGKILL.

        Idempotent. Afterwards no child is running or unreaped and no board socket is left.

        Args:
            gateway_timeout_s: grace for the gateway.
            daemon_timeout_s: grace for the daemons (they drain running requests on SIGTERM).
            hurry: polled while waiting; True skips the rest of the grace (SIGKILL now).

        Returns:
            Names of the children that had to be killed with SIGKILL.
        """
        self._stopping = True
        killed = _terminate([self.gateway], gateway_timeout_s, hurry)
        killed += _terminate(self.daemons, daemon_timeout_s, hurry)
        for d in self.daemons:
            d.remove_socket()
        return killed

    def __enter__(self) -> LocalFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(children: Sequence[Child], timeout_s: float, hurry: Callable[[], bool] | None) -> list[str]:
    """SIGTERM every running child, wait (polling, bounded), SIGKILL the rest; reaps all.

    Returns:
        Names of the children killed with SIGKILL.
    """
    for c in children:
        c.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(c.alive() for c in children) and time.monotonic() < deadline and not (hurry and hurry()):
        time.sleep(POLL_S)
    killed = []
    for c in children:
        if c.alive():
            c.signal_group(signal.SIGKILL)
            killed.append(c.name)
        if c.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=PROBE_TIMEOUT_S * 5)
    return killed
