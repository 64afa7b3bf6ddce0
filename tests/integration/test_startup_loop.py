"""Fleet start-ups in a loop under load (issue 21): no start-up aborts, every stop is clean.

A gateway once died at start-up inside grpcio's poller (`ev_epoll1_linux.cc ... Check failed:
wakeup_fd_->Wakeup().ok()`, "epoll_wait error: Bad file descriptor", SIGABRT): `calctl up` spawned
its children with a `preexec_fn`, which makes `subprocess` fork() a process that runs gRPC threads
(grpc/grpc#43055; `calculet.common.parent_death`). This test starts the fleet the way `calctl up`
and `make run` do, `calculet.ops.fleet.LocalFleet`, many times over, while this process (the one
that spawns) keeps gRPC busy and the CPU is saturated:

- each iteration: one tiny calsim board and a real `calculet-gateway` in front of it; wait for the
  board's health SERVING and the gateway's `/ready` (LocalFleet's own checks); one chat completion
  through the gateway, answered in full; SIGTERM (LocalFleet.stop); the board must exit with
  status 0 and the gateway with 0 or, after its logged complete shutdown, by the SIGTERM itself
  (uvicorn re-raises it); no other signal, nothing needing SIGKILL, and neither log may mention
  "Check failed" or "epoll";
- all the while: a stream of generations from this process to a separate board over gRPC (each
  iteration waits until one more has completed, so the load overlapped it), and one CPU-spinning
  process per core, at the lowest priority.

Size: `CALCULET_STARTUP_LOOPS` (default 3, the `make test` version); `make startup-loop` runs 200.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from calculet.client import DaemonClient
from calculet.common.parent_death import PARENT_PID_ENV
from calculet.ops.fleet import Child, FleetConfig, LocalFleet, exit_text, read_tail
from tests.integration.conftest import DaemonProcess
from tests.integration.tls_helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.startup_loop]

LOOPS = int(os.environ.get("CALCULET_STARTUP_LOOPS", "3"))
ALIAS = "tiny"  # the model alias and its package directory under models_root
CHAT_TOKENS = 8
LOAD_PROMPT = (9, 8, 7, 6, 5)
LOAD_TOKENS = 16
SPINNERS = os.cpu_count() or 2
START_TIMEOUT_S = 120.0  # LocalFleet: the board SERVING
READY_TIMEOUT_S = 60.0  # LocalFleet: the gateway's /ready
LOAD_TIMEOUT_S = 60.0  # one more background generation
ABORT_MARKERS = ("check failed", "epoll")  # grpcio's poller abort (matched case-insensitively)
GATEWAY_STOPPED = "Finished server process"  # uvicorn's last line after a complete shutdown

# A CPU spinner that, like the fleet's children, dies with the process that started it. At the lowest
# priority it takes every cycle nothing else wants, so the CPU stays saturated whatever else runs, but
# takes none from other work (in `make test`, the other tests, which saturate the CPU themselves).
SPIN = """
import os
from calculet.common.parent_death import die_with_parent
die_with_parent()
os.nice(19)
while True:
    pass
"""

StartDaemon = Callable[..., DaemonProcess]


class BackgroundLoad:
    """One CPU-spinning process per core, and one thread of this process streaming generations to a
    board over gRPC, until `stop`. The thread keeps gRPC's poller busy in the very process that
    spawns the fleet's children. Owns its processes and thread; `stop` is idempotent."""

    def __init__(self, target: str, spinners: int) -> None:
        self.target = target
        self._spinner_count = spinners
        self._spinners: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._completed = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._stream, name="startup-loop-load", daemon=True)

    def start(self) -> None:
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        for _ in range(self._spinner_count):
            # No preexec_fn: spawned like the fleet's children (vfork), never fork() under gRPC.
            self._spinners.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self._thread.start()

    def _stream(self) -> None:
        try:
            with DaemonClient(self.target) as client:
                seed = 0
                while not self._stop.is_set():
                    gen = client.generate(ALIAS, LOAD_PROMPT, max_tokens=LOAD_TOKENS, seed=seed, ignore_eos=True)
                    tokens = gen.result()
                    if len(tokens) != LOAD_TOKENS:
                        raise AssertionError(f"background generation {seed}: {len(tokens)} tokens, not {LOAD_TOKENS}")
                    seed += 1
                    with self._cond:
                        self._completed += 1
                        self._cond.notify_all()
        except BaseException as exc:  # reported by wait_progress / stop
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def completed(self) -> int:
        with self._cond:
            return self._completed

    def wait_progress(self, after: int, timeout: float = LOAD_TIMEOUT_S) -> None:
        """Wait until more than `after` generations have completed; fail if the stream broke or the
        spinners died."""
        with self._cond:
            self._cond.wait_for(lambda: self._completed > after or self._error is not None, timeout)
            error, completed = self._error, self._completed
        assert error is None, f"the background request stream failed: {error!r}"
        assert completed > after, f"no background generation completed in {timeout}s"
        dead = [p.returncode for p in self._spinners if p.poll() is not None]
        assert not dead, f"CPU spinners exited: {dead}"

    def stop(self) -> None:
        self._stop.set()
        for proc in self._spinners:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._thread.join(LOAD_TIMEOUT_S)


@pytest.fixture
def background_load(start_daemon: StartDaemon) -> Iterator[BackgroundLoad]:
    board = start_daemon("--model", f"{ALIAS}={ALIAS}")
    load = BackgroundLoad(board.target, SPINNERS)
    load.start()
    try:
        yield load
    finally:
        load.stop()


def logs(fleet: LocalFleet) -> str:
    return "\n".join(f"{c.log_path}:\n{read_tail(c.log_path)}" for c in fleet.children())


def chat_once(fleet: LocalFleet, seed: int) -> None:
    """One chat completion through the gateway, answered in full."""
    request = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": CHAT_TOKENS,
        "seed": seed,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=fleet.base_url, trust_env=False, timeout=60.0) as http:
        resp = http.post("/v1/chat/completions", json=request)
    assert resp.status_code == 200, f"{resp.status_code} {resp.text}\n{logs(fleet)}"
    body = resp.json()
    assert body["object"] == "chat.completion", body
    assert body["choices"][0]["finish_reason"] == "length", body
    assert body["usage"]["completion_tokens"] == CHAT_TOKENS, body


def assert_clean_exit(child: Child, iteration: int) -> None:
    """Exit status 0, no abort in the log. The gateway may instead die of the very SIGTERM it was
    sent, once its shutdown is complete: uvicorn re-raises a signal it handled after its graceful
    shutdown (`uvicorn.Server.capture_signals`), so a cleanly stopped gateway exits -SIGTERM."""
    code = child.returncode()
    text = child.log_path.read_text(errors="replace")
    clean = code == 0 or (child.role == "gateway" and code == -signal.SIGTERM and GATEWAY_STOPPED in text)
    assert clean, (
        f"iteration {iteration}: {child.name} (pid {child.pid}) "
        f"{'is still running' if code is None else exit_text(code)}\n{read_tail(child.log_path)}"
    )
    text = text.lower()
    found = [marker for marker in ABORT_MARKERS if marker in text]
    assert not found, f"iteration {iteration}: {child.name}'s log mentions {found}\n{read_tail(child.log_path)}"


def start_use_stop(workdir: Path, models_root: Path, load: BackgroundLoad, iteration: int) -> None:
    """One board and the real gateway, started and stopped by LocalFleet (`calctl up`'s machinery)."""
    fleet = LocalFleet(
        FleetConfig(
            workdir=workdir,
            boards=1,
            model=ALIAS,
            package=ALIAS,
            models_root=models_root,
            port=free_port(),
            time_scale=0.0,
        )
    )
    before = load.completed()
    try:
        fleet.start(timeout_s=START_TIMEOUT_S)  # the board SERVING, then the gateway started
        fleet.wait_ready(timeout_s=READY_TIMEOUT_S)  # GET /ready 200
        chat_once(fleet, seed=iteration)
        load.wait_progress(after=before)  # the load ran while this fleet started and served
    finally:
        killed = fleet.stop()  # SIGTERM: the gateway, then the board
    assert not killed, f"iteration {iteration}: needed SIGKILL: {killed}\n{logs(fleet)}"
    children = fleet.children()
    assert [c.role for c in children] == ["gateway", "daemon"], children
    for child in children:
        assert_clean_exit(child, iteration)


@pytest.mark.timeout(300 + 120 * LOOPS)
def test_fleet_start_ups_under_load_never_abort(
    tmp_path: Path, models_root: Path, background_load: BackgroundLoad
) -> None:
    assert LOOPS >= 1, "CALCULET_STARTUP_LOOPS must be at least 1"
    began = time.monotonic()  # for the printed summary only
    for i in range(LOOPS):
        start_use_stop(tmp_path / f"it{i:03d}", models_root, background_load, i)
    print(
        f"\nstartup loop: {LOOPS} fleet start-ups (1 board + gateway), all stopped cleanly; "
        f"{background_load.completed()} background generations, {SPINNERS} CPU spinners; "
        f"{time.monotonic() - began:.0f} s"
    )
