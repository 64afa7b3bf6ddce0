"""One daemon per board and per Unix socket (issues 9 and 21), with real daemon processes.

- A second daemon for a board exits at once with EXIT_BOARD_BUSY and one line naming the holder's pid
  and the lock file (given by `--runtime-dir`, else `$RUNTIME_DIRECTORY`, else the fixed
  `$XDG_RUNTIME_DIR/calculet`, ...), while the first keeps serving. Without `--runtime-dir`, daemons
  started from two working directories meet at the same lock.
- The device is held too: a second daemon given its own `--runtime-dir` is refused by calsim's
  device lock (`$CALSIM_STATE_DIR`), with the same status and one line naming the holder's pid.
- A daemon for another board given a live daemon's socket path exits with EXIT_SOCKET_IN_USE and
  leaves that socket alone: the first daemon still answers on it.
- After a SIGKILL (a stale socket, a lock the kernel released) a new daemon takes the board and the
  path and serves.
- A clean stop removes the socket and frees the board; a daemon whose path was replaced meanwhile
  (an operator removed its socket and another daemon bound the path) leaves the new socket alone.
- A driver refusing its device options ends the start with one line and status 2.

A daemon that must refuse runs as a process that has to exit on its own; one that starts serving
instead is a failure (killed at the deadline). Liveness is a Health call with a deadline, never a sleep.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.daemon.main import EXIT_BOARD_BUSY, EXIT_OK, EXIT_SOCKET_IN_USE, EXIT_USAGE
from calculet.daemon.server.ownership import BoardLock, SocketState, lock_path, probe_socket

from .helpers import one_clear_line

pytestmark = pytest.mark.integration

EXIT_DEADLINE_S = 60.0
CALL_S = 10.0
TINY = ("--model", "tiny=tiny")  # a daemon reports SERVING once a model is Ready


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RUNTIME_DIRECTORY"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _run(
    cwd: Path, models_root: Path, *args: str, listen: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A daemon that must exit on its own; without `env`, on a host of its own (`cwd/xdg-runtime`), as
    this test process may hold calsim boards (unit tests) under the shared default."""
    cmd = [
        sys.executable, "-m", "calculet.daemon.main",
        "--listen", listen,
        "--models-root", str(models_root),
        "--time-scale", "0",
        *args,
    ]  # fmt: skip
    try:
        env = env or _env(XDG_RUNTIME_DIR=str(cwd / "xdg-runtime"))
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{args} did not exit: the daemon started serving\n{exc.stderr!r}")


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_S)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _holder(runtime: Path, board: int) -> str:
    return lock_path(runtime, board).read_text().strip()


def test_a_second_daemon_for_the_same_board_exits_busy_and_the_first_keeps_serving(
    start_daemon: Callable[..., Any], models_root: Path, tmp_path: Path
) -> None:
    runtime = tmp_path / "rt"
    first = start_daemon(*TINY, "--runtime-dir", str(runtime))
    assert _holder(runtime, 0) == str(first.proc.pid)
    other = f"unix:{tmp_path / 'other.sock'}"
    busy = f"board 0 is already served by pid {first.proc.pid} (lock {lock_path(runtime, 0).absolute()})"

    by_flag = _run(tmp_path, models_root, "--runtime-dir", str(runtime), listen=other)
    assert by_flag.returncode == EXIT_BOARD_BUSY, by_flag.stderr
    one_clear_line(by_flag, busy)
    # systemd's RuntimeDirectory= sets $RUNTIME_DIRECTORY: the same lock without the flag.
    by_env = _run(tmp_path, models_root, listen=other, env=_env(RUNTIME_DIRECTORY=str(runtime)))
    assert by_env.returncode == EXIT_BOARD_BUSY, by_env.stderr
    one_clear_line(by_env, busy)

    assert not (tmp_path / "other.sock").exists()
    assert first.alive() and _serving(first.target)
    assert _holder(runtime, 0) == str(first.proc.pid)


def test_without_runtime_dir_two_working_directories_meet_at_one_lock(
    start_daemon: Callable[..., Any], models_root: Path, tmp_path: Path
) -> None:
    # One host: the same $XDG_RUNTIME_DIR (in a temp dir, never the real /run); no $RUNTIME_DIRECTORY.
    host = {"XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    first = start_daemon(*TINY, env=host)  # working directory tmp_path/d0
    runtime = tmp_path / "xdg" / "calculet"
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o750
    assert _holder(runtime, 0) == str(first.proc.pid)
    assert (runtime / "calsim" / "board0.lock").read_text() == f"{first.proc.pid}\n"  # and the device's
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = _run(elsewhere, models_root, listen=f"unix:{tmp_path / 'other.sock'}", env=_env(**host))
    assert second.returncode == EXIT_BOARD_BUSY, second.stderr
    one_clear_line(second, f"board 0 is already served by pid {first.proc.pid} (lock {lock_path(runtime, 0)})")
    assert not (tmp_path / "other.sock").exists()
    assert not (elsewhere / "run").exists() and not (first.workdir / "run").exists()
    assert first.alive() and _serving(first.target)
    assert _holder(runtime, 0) == str(first.proc.pid)


def test_a_second_daemon_with_its_own_runtime_dir_is_refused_by_the_device(
    start_daemon: Callable[..., Any], models_root: Path, tmp_path: Path
) -> None:
    device = {"CALSIM_STATE_DIR": str(tmp_path / "calsim")}  # one emulated host's devices
    first = start_daemon(*TINY, "--runtime-dir", str(tmp_path / "rt1"), env=device)
    other = tmp_path / "other.sock"
    second = _run(tmp_path, models_root, "--runtime-dir", str(tmp_path / "rt2"), listen=f"unix:{other}",
                  env=_env(**device))  # fmt: skip
    assert second.returncode == EXIT_BOARD_BUSY, second.stderr
    device_lock = tmp_path / "calsim" / "board0.lock"
    one_clear_line(second, f"calsim board 0 is already open in pid {first.proc.pid} (device lock {device_lock})")
    assert not other.exists()
    assert first.alive() and _serving(first.target)
    BoardLock.acquire(tmp_path / "rt2", 0).release()  # the refused daemon let its board lock go


def test_a_daemon_for_another_board_on_a_live_socket_exits_and_leaves_it(
    start_daemon: Callable[..., Any], models_root: Path, tmp_path: Path
) -> None:
    runtime = tmp_path / "rt"
    first = start_daemon(*TINY, "--runtime-dir", str(runtime))
    inode = first.socket.lstat().st_ino
    second = _run(tmp_path, models_root, "--board", "1", "--runtime-dir", str(runtime), listen=first.target)
    assert second.returncode == EXIT_SOCKET_IN_USE, second.stderr
    one_clear_line(second, str(first.socket), "in use")
    assert first.socket.lstat().st_ino == inode
    assert first.alive() and _serving(first.target)
    BoardLock.acquire(runtime, 1).release()  # the refused daemon holds nothing


def test_after_a_sigkill_a_new_daemon_takes_the_board_and_the_stale_socket(
    start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    runtime = tmp_path / "rt"
    first = start_daemon(*TINY, "--runtime-dir", str(runtime))
    first.proc.kill()
    first.proc.wait(timeout=EXIT_DEADLINE_S)
    assert probe_socket(first.socket) is SocketState.STALE  # left behind; the kernel released the lock
    second = start_daemon(*TINY, "--runtime-dir", str(runtime), listen=first.target)
    assert _serving(second.target)
    assert _holder(runtime, 0) == str(second.proc.pid)


def test_a_clean_stop_removes_the_socket_and_frees_the_board(start_daemon: Callable[..., Any], tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    daemon = start_daemon(*TINY, "--runtime-dir", str(runtime))
    assert daemon.stop() == EXIT_OK
    assert not daemon.socket.exists()
    assert [p.name for p in daemon.socket.parent.iterdir() if p.name.endswith((".sock", ".bind"))] == []
    assert _holder(runtime, 0) == ""  # no stale pid for an operator to chase
    BoardLock.acquire(runtime, 0).release()


def test_a_stopping_daemon_leaves_a_socket_it_no_longer_owns(start_daemon: Callable[..., Any], tmp_path: Path) -> None:
    # A live socket is never replaced by a daemon, but an operator can remove one and start another
    # daemon on the path. grpc unlinks the path it bound when it stops; the daemon must not.
    runtime = tmp_path / "rt"
    a = start_daemon(*TINY, "--runtime-dir", str(runtime))
    a.socket.unlink()
    b = start_daemon(*TINY, "--board", "1", "--runtime-dir", str(runtime), listen=a.target)
    inode = b.socket.lstat().st_ino
    assert a.stop() == EXIT_OK
    assert b.socket.exists() and b.socket.lstat().st_ino == inode
    assert _serving(b.target)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--device-option", "no_such_option=1"], ["device_options", "no_such_option"]),
        (["--device-option", "dram_bytes=-1"], ["device_options", "dram_bytes"]),
        (["--device-option", "dram_bytes"], ["--device-option", "KEY=VALUE"]),
    ],
    ids=["unknown-option", "bad-value", "no-equals"],
)
def test_a_refused_device_option_exits_2_with_one_line(
    models_root: Path, tmp_path: Path, args: list[str], words: list[str]
) -> None:
    proc = _run(tmp_path, models_root, "--runtime-dir", str(tmp_path / "rt"), *args, listen=f"unix:{tmp_path}/d.sock")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    one_clear_line(proc, *words)
    assert not (tmp_path / "d.sock").exists()
