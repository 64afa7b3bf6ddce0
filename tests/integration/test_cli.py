"""`calculet-daemon`'s command line: a bad flag or config value ends the process with exit
status 2 and one line naming the problem (never a traceback), a listen address that cannot be
bound ends it with one line too, and the config file accepts the flag names it is documented with.

The failing cases run the real entry point as a process that must exit on its own; a process that
starts serving instead is a failure (it is killed at the deadline).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calculet.client import DaemonClient

from .helpers import one_clear_line

pytestmark = pytest.mark.integration

EXIT_DEADLINE_S = 60.0


def _run(tmp_path: Path, models_root: Path, *args: str, listen: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "calculet.daemon.main",
        "--listen", listen or f"unix:{tmp_path / 'd.sock'}",
        "--models-root", str(models_root),
        "--time-scale", "0",
        *args,
    ]  # fmt: skip
    # Its own host: this test process may hold calsim boards (unit tests) under the shared default.
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "xdg-runtime")}
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{args} did not exit: the daemon accepted it and started serving\n{exc.stderr!r}")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--log-level", "LOUD"], ["log_level", "LOUD"]),
        (["--job-timeout", "nan"], ["job_timeout"]),
        (["--job-timeout", "inf"], ["job_timeout"]),
        (["--drain-timeout", "-1"], ["drain_timeout"]),
        (["--admission-timeout", "0"], ["admission_timeout"]),
        (["--admission-timeout", "nan"], ["admission_timeout"]),
        (["--max-message-bytes", "0"], ["max_message_bytes"]),
        (["--board", "-1"], ["board"]),
        (["--device", "nosuchdriver"], ["device", "nosuchdriver"]),
    ],
    ids=[
        "log-level",
        "job-timeout-nan",
        "job-timeout-inf",
        "drain-timeout-negative",
        "admission-timeout-0",
        "admission-timeout-nan",
        "max-message-bytes-0",
        "board-negative",
        "unknown-device",
    ],
)
def test_a_bad_flag_value_exits_2_with_one_line(
    tmp_path: Path, models_root: Path, args: list[str], names: list[str]
) -> None:
    proc = _run(tmp_path, models_root, *args)
    one_clear_line(proc, *names)
    assert proc.returncode == 2


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[daemon\n", ["config"]),
        ('[daemon]\nboard = "zero"\n', ["board"]),
        ('[daemon]\njob_timeout = "long"\n', ["job_timeout"]),
        ("[daemon]\nmax_inflight = 3\n", ["max_inflight"]),
        ("[daemon]\nqueue_depth = true\n", ["queue_depth"]),
        ("[daemon]\nmodels = 3\n", ["models"]),
        ("[daemon.models]\ntiny = 3\n", ["models", "tiny"]),
        ("daemon = 5\n", ["daemon"]),
        ("[daemon]\ntime_scael = 0\n", ["time_scael"]),
    ],
    ids=[
        "syntax",
        "board-str",
        "job-timeout-str",
        "max-inflight-3",
        "queue-depth-bool",
        "models-int",
        "model-path-int",
        "daemon-not-a-table",
        "typo-key",
    ],
)
def test_a_bad_config_file_exits_2_with_one_line(
    tmp_path: Path, models_root: Path, text: str, names: list[str]
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(text)
    proc = _run(tmp_path, models_root, "--config", str(config))
    one_clear_line(proc, *names)
    assert proc.returncode == 2


def test_a_listen_address_that_cannot_be_bound_exits_with_one_line(tmp_path: Path, models_root: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        host, port = taken.getsockname()
        proc = _run(tmp_path, models_root, "--insecure", listen=f"{host}:{port}")
    one_clear_line(proc, "listen", str(port))
    assert proc.returncode == 2


def test_the_config_file_takes_the_flag_names_it_is_documented_with(
    start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    # README: "TOML with a [daemon] table using the flag names".
    config = tmp_path / "daemon.toml"
    config.write_text('[daemon]\nmax-inflight = 1\n[daemon.models]\ntiny = "tiny"\n')
    daemon = start_daemon("--config", str(config))
    with DaemonClient(daemon.target) as c:
        status = c.status()
    assert status.max_inflight == 1, "max-inflight from the file (the default is 2)"
