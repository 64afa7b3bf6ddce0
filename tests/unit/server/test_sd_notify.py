"""systemd notifications without libsystemd (issue 10, item 1): `common/sd_notify.py`, the
engine heartbeat that drives WATCHDOG=1, and the SIGHUP reload of the config file (`reload_config`).

- A notification is one datagram of `KEY=VALUE` lines to `$NOTIFY_SOCKET` (a path, or an abstract
  name after '@'); without `$NOTIFY_SOCKET` nothing is sent and nothing is created.
- A send never blocks and never raises: a missing, refusing or full socket loses the message and is
  logged once.
- The watchdog interval is half of `$WATCHDOG_USEC`, and only for the process `$WATCHDOG_PID` names.
- A wedged engine thread stops the heartbeat (so systemd's watchdog restarts the daemon) and a
  released one resumes it. The engine is wedged deterministically (a device `submit` held on an
  event), so waiting for beats that must not come is not a race; beats that must come are waited
  for with a condition, never a sleep.
- A busy engine under `--policy serial` beats between device jobs (its longest silence is one job).
- SIGHUP (`reload_config`): the log level applies, models new in the file load, a removed model stays
  loaded, a bad file changes nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.common.sd_notify import Notifier, watchdog_interval
from calculet.daemon.calsim.device import CalsimDevice
from calculet.daemon.calsim.handles import CalsimSubmission
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import wait_finished
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.request import GenerationRequest, StoppingParams
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec
from calculet.daemon.main import reload_config
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.settings import build_parser
from calculet.ops.sim_packages.build import build_sim_package

from .held_device import HeldSubmitDevice

CALL_S = 20.0  # the longest any expected event may take (only a defect reaches it)
BEAT_S = 0.05  # heartbeat interval of the wedge test
QUIET_BEATS = 20  # intervals to watch a wedged engine for a beat that must not come


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose socket paths fit AF_UNIX's 108 bytes whatever pytest's tmp_path is."""
    with tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as d:
        yield Path(d)


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(CALL_S)
    return sock


def _fields(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


# ---- the protocol ----------------------------------------------------------------------------


def test_each_message_is_one_datagram_of_key_value_lines(short_dir: Path) -> None:
    path = short_dir / "notify.sock"
    with _receiver(str(path)) as rx:
        notifier = Notifier(str(path))
        assert notifier.enabled
        assert notifier.ready("serving on unix:/run/calculet/board0.sock;\nmodels:  tiny")
        assert _fields(rx) == ["READY=1", "STATUS=serving on unix:/run/calculet/board0.sock; models: tiny"]
        assert notifier.status("draining")
        assert _fields(rx) == ["STATUS=draining"]
        notifier.watchdog()
        assert _fields(rx) == ["WATCHDOG=1"]
        assert notifier.stopping()
        assert _fields(rx) == ["STOPPING=1"]
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert notifier.reloading("reloading")
        reloading, monotonic, status = _fields(rx)
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert reloading == "RELOADING=1" and status == "STATUS=reloading"
        key, _, usec = monotonic.partition("=")
        assert key == "MONOTONIC_USEC" and before <= int(usec) <= after
        notifier.close()
        assert not notifier.enabled and not notifier.ready()


def test_an_address_starting_with_at_is_in_the_abstract_namespace() -> None:
    name = f"calculet-test-{uuid.uuid4().hex}"
    with _receiver("\0" + name) as rx:
        notifier = Notifier("@" + name)
        assert notifier.ready()
        assert _fields(rx) == ["READY=1"]
        notifier.close()


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}, {"WATCHDOG_USEC": "400000"}])
def test_without_notify_socket_nothing_is_sent(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[object] = []
    monkeypatch.setattr(socket, "socket", lambda *a, **kw: created.append(a))
    notifier = Notifier.from_environ(environ)
    assert not notifier.enabled
    assert not notifier.ready("serving") and not notifier.stopping() and not notifier.notify("X=1")
    notifier.watchdog()
    assert created == [], "no socket is created without NOTIFY_SOCKET"


def test_send_errors_are_swallowed_and_logged_once(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="calculet.common.sd_notify")
    notifier = Notifier(str(short_dir / "nobody-listens.sock"))  # ENOENT
    assert notifier.enabled
    assert not notifier.ready()
    notifier.watchdog()
    assert not notifier.stopping()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "nobody-listens.sock" in warnings[0].getMessage()

    # A receiver that appears later gets the next message: errors do not switch notifications off.
    with _receiver(str(short_dir / "nobody-listens.sock")) as rx:
        assert notifier.status("back")
        assert _fields(rx) == ["STATUS=back"]
    notifier.close()


def test_a_full_socket_loses_the_message_instead_of_blocking(short_dir: Path) -> None:
    path = short_dir / "full.sock"
    with _receiver(str(path)):  # never read: its queue fills up
        notifier = Notifier(str(path))
        sent = 0
        while notifier.notify("WATCHDOG=1"):
            sent += 1
            assert sent < 1_000_000, "the receiver's queue never filled"
        assert not notifier.notify("WATCHDOG=1"), "still full, still not blocking"
        notifier.close()


def test_an_unsupported_address_turns_notifications_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="calculet.common.sd_notify")
    notifier = Notifier("vsock:2:1234")
    assert not notifier.enabled and not notifier.ready()
    assert "unsupported NOTIFY_SOCKET" in caplog.text


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "400000"}, 0.2),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"}, None),  # inherited from another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_interval_is_half_of_watchdog_usec(environ: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(environ) == expected
    assert Notifier.from_environ(environ).watchdog_s == expected


# ---- the engine heartbeat ----------------------------------------------------------------------


class Beats:
    """A heartbeat listener that counts its calls; `wait_for(n)` waits until it was called n times."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= n, timeout)


def test_a_wedged_engine_thread_stops_the_heartbeat_and_a_released_one_resumes_it(tmp_path: Path) -> None:
    build_sim_package("tiny", tmp_path / "models" / "tiny")
    device = HeldSubmitDevice()
    core = DeviceCore(DaemonConfig(models_root=tmp_path / "models", models=(("tiny", "tiny"),)), device=device)
    core.start()
    beats = Beats()
    core.on_heartbeat(beats, BEAT_S)
    try:
        assert beats.wait_for(3, CALL_S), "an idle engine beats"

        device.hold()
        request = GenerationRequest(
            "tiny", (5, 6, 7), SamplingParams(temperature=0.0), StoppingParams(max_tokens=4, ignore_eos=True)
        )
        job_id = core.submit(request).job_id
        assert device.entered.wait(CALL_S), "the engine never submitted the job"
        # The engine thread is inside device.submit: it cannot beat (beats run on it) until let go.
        wedged_at = beats.count
        assert not beats.wait_for(wedged_at + 1, QUIET_BEATS * BEAT_S), "a wedged engine thread still beats"

        device.let_go()
        assert beats.wait_for(wedged_at + 3, CALL_S), "the released engine beats again"
        assert wait_finished(core.event_log(job_id, for_wait=False), CALL_S), "the held job ends"
    finally:
        device.let_go()
        core.close()


class PacedDevice(CalsimDevice):
    """calsim whose every `submit`, once `paced` is set, waits for a ticket from the test (`entered`
    counts the submits that started waiting)."""

    def __init__(self) -> None:
        super().__init__(0, parse_options({"time_scale": 0.0}))
        self.paced = False
        self.tickets = threading.Semaphore(0)
        self.entered = Beats()

    def submit(
        self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO
    ) -> CalsimSubmission:
        if self.paced:
            self.entered()
            assert self.tickets.acquire(timeout=60.0), "the test never gave a ticket"
        return super().submit(model, job, engine_slot)


def test_a_busy_serial_engine_beats_between_device_jobs(tmp_path: Path) -> None:
    build_sim_package("tiny", tmp_path / "models" / "tiny")
    device = PacedDevice()
    config = DaemonConfig(models_root=tmp_path / "models", models=(("tiny", "tiny"),), policy="serial")
    core = DeviceCore(config, device=device)
    core.start()  # the golden warm-up's device jobs are not paced
    device.paced = True
    beats = Beats()
    core.on_heartbeat(beats, BEAT_S)
    jobs = 5
    try:
        stopping = StoppingParams(max_tokens=1, ignore_eos=True)  # one prefill job each
        for i in range(jobs):
            core.submit(GenerationRequest("tiny", (5, 6, 7 + i), SamplingParams(temperature=0.0), stopping))
        missed = []
        for n in range(1, jobs):
            assert device.entered.wait_for(n, CALL_S), "the engine never submitted the next job"
            before = beats.count
            time.sleep(BEAT_S)  # a lower bound only: the beat is due once the job is through, however slow
            device.tickets.release()
            assert device.entered.wait_for(n + 1, CALL_S), "the engine never submitted the next job"
            if beats.count == before:
                missed.append(n)
        assert missed == [], f"no beat between device jobs {missed} although requests were queued"
    finally:
        for _ in range(jobs + 1):
            device.tickets.release()
        core.close()


# ---- SIGHUP: reload_config ------------------------------------------------------------------------


def _write_config(path: Path, models_root: Path, log_level: str, models: dict[str, str], extra: str = "") -> None:
    lines = ["[daemon]", f'models-root = "{models_root}"', f'log-level = "{log_level}"', extra, "[daemon.models]"]
    lines += [f'{alias} = "{pkg}"' for alias, pkg in models.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_sighup_reload_applies_the_log_level_and_loads_new_models_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models_root = tmp_path / "models"
    build_sim_package("tiny", models_root / "tiny")
    config = tmp_path / "daemon.toml"
    _write_config(config, models_root, "INFO", {"tiny": "tiny"})
    args: argparse.Namespace = build_parser().parse_args(["--config", str(config)])
    options = {"time_scale": 0.0, "profile": "calsim-dev"}
    core = DeviceCore(DaemonConfig(models_root=models_root, models=(("tiny", "tiny"),), device_options=options))
    core.start()
    root = logging.getLogger()
    level = root.level
    try:

        def models() -> dict[str, tuple[int, ModelState]]:
            return {m.alias: (m.generation, m.state) for m in core.health().models}

        started = models()
        assert set(started) == {"tiny"}

        _write_config(config, models_root, "DEBUG", {"tiny": "tiny", "tiny2": "tiny"})
        reload_config(args, core)
        after = models()
        assert after["tiny"] == started["tiny"], "a model already loaded is left alone"
        assert after["tiny2"][1] is ModelState.READY, "a model new in the file is loaded"
        assert root.level == logging.DEBUG

        caplog.clear()
        _write_config(config, models_root, "WARNING", {"tiny": "tiny"}, extra="no-such-setting = 1")
        reload_config(args, core)
        assert models() == after and root.level == logging.DEBUG, "a bad file changes nothing"
        assert "not applied" in caplog.text

        _write_config(config, models_root, "INFO", {"tiny": "tiny"})
        reload_config(args, core)
        assert models() == after, "a model removed from the file stays loaded"
        assert root.level == logging.INFO
    finally:
        root.setLevel(level)
        core.close()
