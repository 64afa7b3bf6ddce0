"""`LocalFleet` and `calctl up` with real calsim daemons (time scale 0, preset tiny) and a stand-in
gateway (a small http.server script honouring the gateway's command line, /health and /ready), so
these tests do not depend on the real gateway. Checked: both boards SERVING (their board and device
locks in the fleet's own directory), a crash reported while the rest keep running, startup failures
stop everything, and no child process or socket survives.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from calculet.ops.fleet import ChildExit, FleetConfig, FleetError, LocalFleet, daemon_serving, http_ok

pytestmark = pytest.mark.integration

TIMEOUT_S = 90.0

STAND_IN_GATEWAY = '''
"""Stand-in for calculet-gateway: /health 200; /ready 200 once some daemon answers SERVING, else 503.
Like the real one, it dies with the calctl that started it (calculet.common.parent_death)."""
import argparse
import http.server

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.common.parent_death import die_with_parent

die_with_parent()

parser = argparse.ArgumentParser()
parser.add_argument("--listen", required=True)
parser.add_argument("--daemon", action="append", default=[])
args = parser.parse_args()
host, _, port = args.listen.rpartition(":")


def serving(target):
    try:
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = self.path == "/health" or (self.path == "/ready" and any(serving(t) for t in args.daemon))
        body = b'{"status":"ok"}' if ready else b'{"status":"not ready"}'
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


print(f"stand-in gateway on {args.listen} for {args.daemon}", flush=True)
http.server.ThreadingHTTPServer((host.strip("[]"), int(port)), Handler).serve_forever()
'''

FAILING_GATEWAY = 'import sys\nprint("stand-in gateway: refusing to start", flush=True)\nsys.exit(3)\n'


@pytest.fixture
def stand_ins(tmp_path: Path) -> Path:
    """A directory with `fake_gateway.py` (serves) and `failing_gateway.py` (exits 3)."""
    folder = tmp_path / "stand_ins"
    folder.mkdir()
    (folder / "fake_gateway.py").write_text(STAND_IN_GATEWAY)
    (folder / "failing_gateway.py").write_text(FAILING_GATEWAY)
    return folder


def script_gateway(script: Path) -> Callable[[str, Sequence[str]], list[str]]:
    def argv(listen: str, daemons: Sequence[str]) -> list[str]:
        return [sys.executable, str(script), "--listen", listen, *(a for t in daemons for a in ("--daemon", t))]

    return argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def my_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_for(done: Callable[[], bool], what: str, explain: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{explain()}")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def logs(workdir: Path) -> str:
    return "\n".join(f"---- {p}\n{p.read_text(errors='replace')}" for p in sorted((workdir / "logs").glob("*.log")))


@pytest.fixture
def make_fleet(tmp_path: Path, models_root: Path, stand_ins: Path) -> Iterator[Callable[..., LocalFleet]]:
    """`make_fleet(**config)` -> an unstarted 2-board tiny fleet with the stand-in gateway; stopped at teardown."""
    fleets: list[LocalFleet] = []

    def make(**kw: object) -> LocalFleet:
        settings: dict[str, object] = {
            "workdir": tmp_path / f"run{len(fleets)}",
            "boards": 2,
            "model": "tiny",
            "package": "tiny",
            "models_root": models_root,
            "port": free_port(),
            "time_scale": 0.0,
            "gateway_command": script_gateway(stand_ins / "fake_gateway.py"),
        }
        settings.update(kw)
        fleet = LocalFleet(FleetConfig(**settings))  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop(daemon_timeout_s=30)


def assert_nothing_left(fleet: LocalFleet, before: set[int]) -> None:
    assert all(gone(pid) for pid in fleet.pids()), [c.name for c in fleet.children() if c.alive()]
    assert my_children() - before == set()
    assert sorted(fleet.workdir.glob("*.sock")) == []


def test_two_boards_and_the_gateway_start_and_stop_without_leftovers(make_fleet: Callable[..., LocalFleet]) -> None:
    before = my_children()
    fleet = make_fleet()
    fleet.start(TIMEOUT_S)
    fleet.wait_ready(TIMEOUT_S)
    assert [daemon_serving(t) for t in fleet.targets] == [True, True]
    assert http_ok(f"{fleet.base_url}/ready") and http_ok(f"{fleet.base_url}/health")
    pids = fleet.pids()
    assert len(pids) == 3 and set(pids) <= my_children()
    assert fleet.poll() == [] and fleet.serving_boards() == 2
    # The fleet is its own host: board locks in its dir, calsim's device locks in <dir>/calsim.
    for i, daemon in enumerate(fleet.daemons):
        assert (fleet.workdir / f"calculet-board{i}.lock").read_text() == f"{daemon.pid}\n"
        assert (fleet.workdir / "calsim" / f"board{i}.lock").read_text() == f"{daemon.pid}\n"
    assert fleet.stop() == []  # nothing needed SIGKILL
    assert [d.returncode() for d in fleet.daemons] in ([0, 0], [-signal.SIGTERM] * 2, [0, -signal.SIGTERM])
    assert_nothing_left(fleet, before)
    assert fleet.stop() == []  # idempotent


def test_a_killed_board_is_reported_and_the_rest_keep_serving(make_fleet: Callable[..., LocalFleet]) -> None:
    before = my_children()
    fleet = make_fleet()
    fleet.start(TIMEOUT_S)
    fleet.wait_ready(TIMEOUT_S)
    victim = fleet.daemons[1]
    os.kill(victim.pid, signal.SIGKILL)
    exits: list[ChildExit] = []

    def noticed() -> bool:
        exits.extend(fleet.poll())
        return bool(exits)

    wait_for(noticed, "the fleet to notice board1 died", lambda: logs(fleet.workdir))
    assert [(e.name, e.role, e.pid, e.returncode) for e in exits] == [("board1", "daemon", victim.pid, -signal.SIGKILL)]
    assert "board1" in exits[0].describe() and "SIGKILL" in exits[0].describe()
    assert "serving on" in exits[0].tail
    assert victim.socket is not None and not victim.socket.exists()  # leftover removed
    assert daemon_serving(fleet.targets[0]) and fleet.gateway.alive()
    assert http_ok(f"{fleet.base_url}/ready")
    assert fleet.poll() == [] and fleet.serving_boards() == 1  # reported once
    assert fleet.stop() == []
    assert_nothing_left(fleet, before)


def test_a_missing_package_fails_the_start_and_stops_everything(make_fleet: Callable[..., LocalFleet]) -> None:
    before = my_children()
    fleet = make_fleet(package="no-such-package")
    with pytest.raises(FleetError) as info:
        fleet.start(TIMEOUT_S)
    text = str(info.value)
    assert "board" in text and "exited with code 1" in text and "no-such-package" in text
    assert fleet.gateway.proc is None
    assert_nothing_left(fleet, before)


def test_one_board_exiting_at_startup_stops_the_others(make_fleet: Callable[..., LocalFleet]) -> None:
    before = my_children()
    fleet = make_fleet()
    fleet.daemons[1].argv += ["--max-inflight", "7"]  # argparse refuses it: exit 2
    with pytest.raises(FleetError, match=r"board1 \(pid \d+\) exited with code 2"):
        fleet.start(TIMEOUT_S)
    assert fleet.daemons[0].proc is not None  # it was started, and is stopped now
    assert_nothing_left(fleet, before)


def test_a_gateway_that_exits_fails_wait_ready_and_stops_the_boards(
    make_fleet: Callable[..., LocalFleet], stand_ins: Path
) -> None:
    before = my_children()
    fleet = make_fleet(gateway_command=script_gateway(stand_ins / "failing_gateway.py"))
    fleet.start(TIMEOUT_S)
    with pytest.raises(FleetError) as info:
        fleet.wait_ready(TIMEOUT_S)
    assert "gateway" in str(info.value) and "exited with code 3" in str(info.value)
    assert "refusing to start" in str(info.value)
    assert_nothing_left(fleet, before)


def test_a_live_board_socket_is_not_stolen(make_fleet: Callable[..., LocalFleet]) -> None:
    first = make_fleet()
    first.start(TIMEOUT_S)
    second = make_fleet(workdir=first.workdir)
    with pytest.raises(FleetError, match="in use by a running daemon"):
        second.start(TIMEOUT_S)
    assert second.pids() == [] and daemon_serving(first.targets[0])


# ---------------------------------------------------------------- calctl up as a process


class Up:
    """`calctl up` run as a subprocess with the stand-in gateway module on PYTHONPATH."""

    def __init__(self, workdir: Path, stand_ins: Path, gateway: str, *extra: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.out_path = workdir.parent / f"{workdir.name}.out"
        self.err_path = workdir.parent / f"{workdir.name}.err"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(stand_ins), os.environ.get("PYTHONPATH")])),
        }
        cmd = [
            sys.executable, "-m", "calculet.ops.calctl", "up", "--boards", "2", "--preset", "tiny",
            "--time-scale", "0", "--port", str(self.port), "--dir", str(workdir), "--gateway-module", gateway, *extra,
        ]  # fmt: skip
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def explain(self) -> str:
        return f"---- stdout\n{self.out()}\n---- stderr\n{self.err()}\n{logs(self.workdir)}"

    def wait_banner(self) -> None:
        def shown() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"calctl up exited with {self.proc.returncode}\n{self.explain()}")
            return "Stop with Ctrl-C" in self.out()

        wait_for(shown, "the banner", self.explain)

    def children(self) -> list[int]:
        return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def test_calctl_up_serves_until_ctrl_c_then_exits_0(tmp_path: Path, stand_ins: Path) -> None:
    up = Up(tmp_path / "run", stand_ins, "fake_gateway")
    up.wait_banner()
    out = up.out()
    assert f"OpenAI base URL: http://127.0.0.1:{up.port}/v1" in out
    assert f"http://127.0.0.1:{up.port}/v1/chat/completions" in out and '"model": "tiny"' in out
    assert http_ok(f"http://127.0.0.1:{up.port}/ready")
    children = up.children()
    assert len(children) == 3, up.explain()
    up.proc.send_signal(signal.SIGINT)
    assert up.finish() == 0, up.explain()
    assert all(gone(pid) for pid in children)
    assert "== stopped (all exited cleanly)" in up.out()
    assert sorted((tmp_path / "run").glob("*.sock")) == []


def test_calctl_up_exits_1_when_the_gateway_does_not_start(tmp_path: Path, stand_ins: Path) -> None:
    up = Up(tmp_path / "run", stand_ins, "failing_gateway")
    assert up.finish() == 1, up.explain()
    err = up.err()
    assert "startup failed" in err and "exited with code 3" in err and "refusing to start" in err
    assert "everything started was stopped" in err
    run = str(tmp_path / "run")
    strays = [p.pid for p in psutil.process_iter(["cmdline"]) if run in " ".join(p.info["cmdline"] or ())]
    assert strays == []
    assert sorted((tmp_path / "run").glob("*.sock")) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_children_stop_when_calctl_up_is_killed(tmp_path: Path, stand_ins: Path) -> None:
    up = Up(tmp_path / "run", stand_ins, "fake_gateway")
    up.wait_banner()
    children = up.children()
    assert len(children) == 3, up.explain()
    up.proc.kill()
    up.finish()
    wait_for(lambda: all(gone(pid) for pid in children), "the children to stop after their parent died", up.explain)
    wait_for(lambda: not any((tmp_path / "run").glob("*.sock")), "the daemons to remove their sockets", up.explain)
