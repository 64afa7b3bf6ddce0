"""Running under systemd (issue 10, item 1), with the real units and processes.

- The units pass `systemd-analyze verify` once installed with ExecStart= pointing at existing
  commands (skipped only where `systemd-analyze` is absent); a typo in a copy is reported, so the
  check is live.
- `calctl install-units` installs the units, the sysusers file and the example configs under a
  prefix, rewrites ExecStart= only, and never overwrites an operator's config.
- A real daemon started with `$NOTIFY_SOCKET` (a datagram socket of the test) and
  `WATCHDOG_USEC=400000` sends, from its main process: STATUS= while its startup model loads, READY=1
  with a STATUS=, WATCHDOG=1 (several, none before READY=1), RELOADING=1 ... READY=1 around SIGHUP
  (a model new in the config file is loaded; a bad file changes nothing), and STOPPING=1 after
  SIGTERM, then exits 0.
- The gateway sends READY=1 once it listens and STOPPING=1 on SIGTERM; with `--workers 2` only its
  main process (the supervisor) sends them, READY=1 once both workers serve HTTP. The gateway unit
  stops the supervisor alone (KillMode=mixed) within TimeoutStopSec, and its example config runs
  two workers.

Every wait is for a message or an exit, with a deadline only a defect reaches; nothing sleeps.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from calculet.daemon.core.resets.escalations import EXIT_DEVICE_UNHEALTHY
from calculet.gateway.config import config_from as gateway_config_from
from calculet.gateway.config import read_config as gateway_read_config
from calculet.gateway.workers.supervisor import STOP_GRACE_S
from calculet.ops.calctl import main as calctl
from calculet.ops.commands.install_units import (
    COMMANDS,
    CONFIGS,
    UNITS,
    UNITS_SOURCE,
    install_units,
    resolve_command,
    rewrite_exec_start,
)
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0  # for any one expected message or exit
CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid


# ---- the unit files -------------------------------------------------------------------------------


def _installed(prefix: Path) -> Path:
    commands = {name: resolve_command(name) for name in COMMANDS}
    for argv in commands.values():
        assert Path(argv[0]).is_file(), f"{argv[0]}: the command systemd-analyze checks must exist"
    install_units(UNITS_SOURCE, prefix, commands)
    return prefix / "etc" / "systemd" / "system"


def _verify(units_dir: Path, *units: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{units_dir}:"}  # ':' = then the default paths
    cmd = ["systemd-analyze", "verify", "--man=no", *units]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=units_dir, env=env, timeout=DEADLINE_S)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    units_dir = _installed(tmp_path)
    # The template is verified through its instances (the target's Wants=).
    result = _verify(units_dir, "calculet.target", "calculet-gateway.service", "calculet-daemon@0.service",
                     "calculet-daemon@1.service")  # fmt: skip
    ours = [line for line in (result.stdout + result.stderr).splitlines() if "calculet" in line]
    assert result.returncode == 0 and ours == [], result.stdout + result.stderr

    # The check is live: a typo in a copy of a unit is reported.
    typo = (units_dir / "calculet-gateway.service").read_text().replace("NotifyAccess=", "NotifyAcess=")
    (units_dir / "calculet-typo.service").write_text(typo)
    result = _verify(units_dir, "calculet-typo.service")
    assert "NotifyAcess" in result.stderr, result.stderr


def test_the_daemon_unit_maps_the_issue() -> None:
    """The directives the daemon's operation depends on (exit statuses, timeouts, the socket)."""
    text = (UNITS_SOURCE / "calculet-daemon@.service").read_text()
    directives = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )  # last one wins, like systemd for these keys
    assert directives["Type"] == "notify" and directives["NotifyAccess"] == "main"
    assert directives["RestartPreventExitStatus"] == "2 3 4" and directives["Restart"] == "on-failure"
    assert directives["RestartForceExitStatus"] == str(EXIT_DEVICE_UNHEALTHY), "a lost device asks for a restart"
    assert float(directives["WatchdogSec"].removesuffix("s")) > 30  # the default --job-timeout
    assert float(directives["TimeoutStopSec"].removesuffix("s")) >= 30 + 10  # --drain-timeout + grace
    assert "--listen unix:/run/calculet/board%i.sock" in directives["ExecStart"]
    assert directives["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert directives["RuntimeDirectory"] == "calculet" and directives["DevicePolicy"] == "closed"
    assert directives["PartOf"] == "calculet.target"


def test_the_gateway_unit_stops_its_workers_through_the_supervisor() -> None:
    text = (UNITS_SOURCE / "calculet-gateway.service").read_text()
    directives = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert directives["Type"] == "notify" and directives["NotifyAccess"] == "main"
    # SIGTERM to the supervisor only (a worker signalled twice would still stop gracefully, but the
    # supervisor decides); SIGKILL to every process left after TimeoutStopSec.
    assert directives["KillMode"] == "mixed"
    assert float(directives["TimeoutStopSec"].removesuffix("s")) > STOP_GRACE_S
    assert directives["RestartPreventExitStatus"] == "2"
    assert gateway_config_from(gateway_read_config(UNITS_SOURCE / "gateway.toml")).workers == 2


# ---- calctl install-units -----------------------------------------------------------------------


def test_install_units_into_a_prefix_rewrites_exec_start_and_keeps_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = Path(os.path.abspath(sys.executable)).parent
    assert calctl(["install-units", "--prefix", str(tmp_path), "--bin", str(bin_dir)]) == 0
    out = capsys.readouterr().out
    assert "systemctl daemon-reload && systemctl enable --now calculet.target" in out

    units_dir = tmp_path / "etc" / "systemd" / "system"
    for name in UNITS:
        source = (UNITS_SOURCE / name).read_text().splitlines()
        installed = (units_dir / name).read_text().splitlines()
        assert stat.S_IMODE((units_dir / name).stat().st_mode) == 0o644
        changed = [(a, b) for a, b in zip(source, installed, strict=True) if a != b]
        for before, after in changed:  # only ExecStart= of our commands, arguments kept
            program = before.split()[0].removeprefix("ExecStart=")
            assert Path(program).name in COMMANDS
            assert after == before.replace(program, str(bin_dir / Path(program).name))
        assert len(changed) == (1 if name.endswith(".service") else 0)
    assert (tmp_path / "etc" / "sysusers.d" / "calculet.conf").read_text().startswith("#")
    for name in CONFIGS:
        assert (tmp_path / "etc" / "calculet" / name).read_text() == (UNITS_SOURCE / name).read_text()

    # A second run replaces the units but keeps the operator's configs.
    (tmp_path / "etc" / "calculet" / "daemon.toml").write_text("[daemon]\nboard = 7\n")
    (units_dir / "calculet.target").write_text("stale")
    assert calctl(["install-units", "--prefix", str(tmp_path), "--bin", str(bin_dir)]) == 0
    assert "kept" in capsys.readouterr().out
    assert (tmp_path / "etc" / "calculet" / "daemon.toml").read_text() == "[daemon]\nboard = 7\n"
    assert (units_dir / "calculet.target").read_text() == (UNITS_SOURCE / "calculet.target").read_text()

    assert calctl(["install-units", "--prefix", str(tmp_path), "--bin", str(tmp_path)]) == 2  # no commands there
    assert "no executable calculet-daemon" in capsys.readouterr().err


def test_exec_start_words_are_escaped_for_systemd() -> None:
    text = "ExecStart=/usr/local/bin/calculet-daemon --board %i\nExecStart=/bin/other x\n"
    commands = {"calculet-daemon": ["/opt/my venv/bin/python", "-m", "calculet.daemon.main"]}
    assert rewrite_exec_start(text, commands) == (
        'ExecStart="/opt/my venv/bin/python" -m calculet.daemon.main --board %i\nExecStart=/bin/other x\n'
    )
    assert rewrite_exec_start(text, {"calculet-daemon": ["/opt/100%/$x/calculet-daemon"]}).startswith(
        "ExecStart=/opt/100%%/$$x/calculet-daemon --board %i\n"
    )


# ---- notifications from the real processes ----------------------------------------------------


class NotifyListener:
    """The test's `$NOTIFY_SOCKET`: every field received, in order, with the sender of each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the sender's pid, as systemd sees it
        self.sock.settimeout(0.5)  # to notice a process that died; no message is ever waited for less
        self.fields: list[str] = []
        self.senders: set[int] = set()

    def until(self, done: Callable[[list[str]], bool], proc: subprocess.Popen[bytes], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not done(self.fields):
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} in {DEADLINE_S}s; received {self.fields}")
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(CREDENTIALS.size))
            except TimeoutError:
                if proc.poll() is not None and not done(self.fields):
                    pytest.fail(f"exited with {proc.returncode} before {what}; received {self.fields}")
                continue
            for level, kind, cred in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    self.senders.add(CREDENTIALS.unpack(cred[: CREDENTIALS.size])[0])
            self.fields += data.decode().split("\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifyListener]:
    """A NotifyListener in tmp_path (or a shorter directory if that path would not fit AF_UNIX),
    named by `$NOTIFY_SOCKET` for the processes the test starts, with `WATCHDOG_USEC=400000`."""
    with tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as short:
        path = tmp_path / "notify.sock"
        if len(str(path)) > 100:
            path = Path(short) / "notify.sock"
        notify = NotifyListener(path)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.setenv("WATCHDOG_USEC", "400000")
        for name in ("WATCHDOG_PID", "RUNTIME_DIRECTORY"):
            monkeypatch.delenv(name, raising=False)
        try:
            yield notify
        finally:
            notify.close()


def _find(fields: list[str], start: int, *wanted: str) -> int:
    """Index of the last of `wanted`, found in this order at or after `start`; -1 if they are not all there."""
    at = start - 1
    for field in wanted:
        if field not in fields[at + 1 :]:
            return -1
        at = fields.index(field, at + 1)
    return at


def _status_after(fields: list[str], start: int) -> str:
    return next(f for f in fields[start:] if f.startswith("STATUS="))


def _write_config(path: Path, models: dict[str, str], extra: str = "") -> None:
    body = "\n".join(f'{alias} = "{pkg}"' for alias, pkg in models.items())
    path.write_text(f'[daemon]\nlog-level = "INFO"\n{extra}\n[daemon.models]\n{body}\n')


def test_the_daemon_notifies_systemd_in_order(tmp_path: Path, models_root: Path, listener: NotifyListener) -> None:
    config = tmp_path / "daemon.toml"
    _write_config(config, {})
    workdir = tmp_path / "d"
    workdir.mkdir()
    daemon = DaemonProcess(workdir, models_root, ["--config", str(config), "--model", "tiny=tiny"])
    fields = listener.fields
    try:
        listener.until(lambda f: "READY=1" in f, daemon.proc, "READY=1")
        ready = fields.index("READY=1")
        assert any(f.startswith("STATUS=load tiny") for f in fields[:ready]), "progress while the model loads"
        assert "WATCHDOG=1" not in fields[:ready]
        assert _status_after(fields, ready).startswith("STATUS=serving on unix:"), fields
        assert "tiny READY" in _status_after(fields, ready)
        listener.until(lambda f: f[ready:].count("WATCHDOG=1") >= 3, daemon.proc, "3 WATCHDOG=1 after READY=1")

        # SIGHUP with a model new in the file: RELOADING=1, the model loads, READY=1.
        _write_config(config, {"tiny2": "tiny"})
        mark = len(fields)
        daemon.proc.send_signal(signal.SIGHUP)
        listener.until(lambda f: _find(f, mark, "RELOADING=1", "READY=1") >= 0, daemon.proc, "RELOADING=1, READY=1")
        reloaded = _find(fields, mark, "RELOADING=1", "READY=1")
        assert "tiny2 READY" in _status_after(fields, reloaded) and "tiny READY" in _status_after(fields, reloaded)

        # SIGHUP with a bad file: logged, nothing changes, still READY=1 afterwards.
        _write_config(config, {}, extra="no-such-setting = 1")
        mark = len(fields)
        daemon.proc.send_signal(signal.SIGHUP)
        listener.until(lambda f: _find(f, mark, "RELOADING=1", "READY=1") >= 0, daemon.proc, "a reload of a bad file")
        assert _status_after(fields, _find(fields, mark, "RELOADING=1", "READY=1")) == _status_after(fields, reloaded)
        assert "not applied, nothing changed" in daemon.log()

        mark = len(fields)
        daemon.proc.send_signal(signal.SIGTERM)
        listener.until(lambda f: "STOPPING=1" in f[mark:], daemon.proc, "STOPPING=1")
        assert daemon.proc.wait(DEADLINE_S) == 0, daemon.log()
    finally:
        code = daemon.stop()
    watchdogs = [i for i, f in enumerate(fields) if f == "WATCHDOG=1"]
    assert ready < watchdogs[2] < fields.index("STOPPING=1")
    assert listener.senders == {daemon.proc.pid}, "every message from the main process (NotifyAccess=main)"
    assert code == 0


def test_the_gateway_notifies_ready_and_stopping(tmp_path: Path, listener: NotifyListener) -> None:
    workdir = tmp_path / "gw"
    workdir.mkdir()
    gateway = GatewayProcess(workdir, ["--daemon", f"unix:{workdir / 'no-board.sock'}"])  # READY=1 needs no board
    try:
        listener.until(lambda f: "READY=1" in f, gateway.proc, "READY=1")
        assert gateway.socket.exists(), "READY=1 only once it listens"
        gateway.proc.send_signal(signal.SIGTERM)
        listener.until(lambda f: "STOPPING=1" in f, gateway.proc, "STOPPING=1")
        assert gateway.proc.wait(DEADLINE_S) in (0, -signal.SIGTERM), gateway.log()
    finally:
        gateway.stop()
    assert listener.fields.index("READY=1") < listener.fields.index("STOPPING=1")
    assert listener.senders == {gateway.proc.pid}


def test_the_gateway_with_workers_notifies_ready_once_every_worker_serves(
    tmp_path: Path, listener: NotifyListener
) -> None:
    workdir = tmp_path / "gw"
    workdir.mkdir()
    gateway = GatewayProcess(workdir, ["--daemon", f"unix:{workdir / 'no-board.sock'}", "--workers", "2"])
    try:
        listener.until(lambda f: "READY=1" in f, gateway.proc, "READY=1")
        assert "STATUS=serving: 2 workers" in listener.fields
        run_dir = Path(re.findall(r"run directory (\S+)\)", gateway.log())[0])
        for index in range(2):  # both serve HTTP already: READY=1 came after theirs
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(run_dir / f"worker-{index}.sock"))) as client:
                assert client.get("http://worker/health").json()["worker"] == index
        gateway.proc.send_signal(signal.SIGTERM)
        listener.until(lambda f: "STOPPING=1" in f, gateway.proc, "STOPPING=1")
        assert gateway.proc.wait(DEADLINE_S) == 0, gateway.log()
    finally:
        gateway.stop()
    assert listener.senders == {gateway.proc.pid}, "every message from the main process (NotifyAccess=main)"
    assert listener.fields.count("READY=1") == 1
