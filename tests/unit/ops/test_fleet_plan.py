"""`LocalFleet` before it starts anything: command lines, addresses, exit descriptions, log tails."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from calculet.ops.fleet import (
    DAEMON_MODULE,
    ChildExit,
    FleetConfig,
    FleetError,
    LocalFleet,
    check_port_free,
    exit_text,
    read_tail,
)


def config(tmp: Path, **kw: object) -> FleetConfig:
    return FleetConfig(workdir=tmp, boards=2, model="tiny", package="tiny", **kw)  # type: ignore[arg-type]


def test_daemon_command_lines(tmp_path: Path) -> None:
    fleet = LocalFleet(config(tmp_path, time_scale=0.0, policy="serial", daemon_args=("--log-level", "DEBUG")))
    assert fleet.daemon_argv(1) == [
        sys.executable, "-m", DAEMON_MODULE, "--board", "1", "--listen", f"unix:{tmp_path}/board1.sock",
        "--runtime-dir", str(tmp_path), "--models-root", str(tmp_path / "models"), "--model", "tiny=tiny",
        "--time-scale", "0", "--policy", "serial", "--log-level", "DEBUG",
    ]  # fmt: skip
    assert [d.log_path for d in fleet.daemons] == [tmp_path / "logs/board0.log", tmp_path / "logs/board1.log"]
    # A fleet is its own host: board locks in its dir (--runtime-dir), calsim's device locks in <dir>/calsim.
    assert [d.env for d in fleet.daemons] == [{"CALSIM_STATE_DIR": str(tmp_path / "calsim")}] * 2
    assert fleet.gateway.env == {}
    assert fleet.targets == [f"unix:{tmp_path}/board0.sock", f"unix:{tmp_path}/board1.sock"]
    assert fleet.pids() == [] and fleet.poll() == []


def test_the_gateway_command_is_injectable(tmp_path: Path) -> None:
    seen: list[tuple[str, Sequence[str]]] = []

    def stand_in(listen: str, daemons: Sequence[str]) -> list[str]:
        seen.append((listen, list(daemons)))
        return ["stand-in", listen]

    fleet = LocalFleet(config(tmp_path, port=8123, gateway_command=stand_in))
    assert fleet.gateway.argv == ["stand-in", "127.0.0.1:8123"]
    assert seen == [("127.0.0.1:8123", fleet.targets)]
    assert fleet.gateway.log_path == tmp_path / "logs/gateway.log"


@pytest.mark.parametrize(
    ("host", "listen", "url"),
    [
        ("127.0.0.1", "127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("0.0.0.0", "0.0.0.0:9000", "http://127.0.0.1:9000"),
        ("localhost", "localhost:9000", "http://localhost:9000"),
        ("::1", "[::1]:9000", "http://[::1]:9000"),
        ("::", "[::]:9000", "http://[::1]:9000"),
    ],
)
def test_addresses(tmp_path: Path, host: str, listen: str, url: str) -> None:
    fleet = LocalFleet(config(tmp_path, host=host, port=9000))
    assert (fleet.listen, fleet.base_url) == (listen, url)


def test_zero_boards_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LocalFleet(FleetConfig(workdir=tmp_path, boards=0, model="tiny", package="tiny"))


def test_exit_descriptions(tmp_path: Path) -> None:
    assert exit_text(2) == "exited with code 2"
    assert exit_text(-signal.SIGKILL) == "was killed by SIGKILL"
    log = tmp_path / "board1.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    ex = ChildExit("board1", "daemon", 42, -9, log, read_tail(log, lines=2))
    assert ex.describe() == f"board1 (pid 42) was killed by SIGKILL; last lines of {log}:\n    line 98\n    line 99"
    assert read_tail(tmp_path / "missing.log") == ""


def test_a_taken_port_is_reported() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(FleetError, match=f"cannot listen on 127.0.0.1:{port}"):
            check_port_free("127.0.0.1", port)
