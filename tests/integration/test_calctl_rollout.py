"""`calctl rollout` over 3 real calsim boards (tiny, time scale 0) behind a real gateway, while client
threads send a steady stream of chat requests through the gateway:

- a good package: zero failed requests, and every board ends on the new package (a new generation,
  READY, admitting);
- a package that fails its golden check (its manifest's golden decode tokens altered): the rollout
  stops at the first board, exit 1 with one line naming it; zero failed requests; the first board
  serves the old package again and the other two were not touched (same generation). On the
  one-calbin profile (calrt-0.7.6) the failed load unloaded the old generation, so the first board
  is loaded again with the old package; on calsim-dev the old generation kept serving beside it.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from calculet.client import DaemonClient
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import common_pb2, observe_pb2
from tests.integration.calctl_process import run_calctl
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration
NEW, BAD = "tiny-rollout-v2", "tiny-rollout-bad-golden"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Keep going."}], "max_tokens": 6}
CLIENTS = 2
MIN_REQUESTS_AFTER = 10  # each client, after calctl has returned
# Between a client's requests: a steady stream through every drain and load, without the CPU of a
# closed loop at full speed.
THINK_S = 0.1


@pytest.fixture(scope="module")
def packages(models_root: Path) -> Path:
    """The new package (tiny, built again) and one whose golden check fails, beside `tiny`."""
    if not (models_root / NEW).exists():
        build_sim_package("tiny", models_root / NEW)
    if not (models_root / BAD).exists():
        shutil.copytree(models_root / "tiny", models_root / BAD)
        manifest_path = models_root / BAD / "calculet-package.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["golden"]["decode_tokens"][1] = (manifest["golden"]["decode_tokens"][1] + 1) % 256
        manifest_path.write_text(json.dumps(manifest))
    return models_root


class Traffic:
    """Client threads sending chat requests through the gateway one after another until stopped;
    every answer that is not a 200 is kept."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self._gateway = gateway
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.ok: list[int] = [0] * CLIENTS
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def mark(self) -> list[int]:
        with self._lock:
            return list(self.ok)

    def wait_for(self, counts: list[int], timeout: float = 60.0) -> None:
        """Block until every client has completed `counts[i]` requests, or a request failed."""
        deadline = time.monotonic() + timeout
        while any(a < b for a, b in zip(self.mark(), counts, strict=True)) and not self.failures:
            assert time.monotonic() < deadline, f"clients stalled at {self.mark()} requests (wanted {counts})"
            time.sleep(0.05)

    def _client(self, index: int) -> None:
        with self._gateway.http(timeout=60) as http:
            seed = 0
            while not self._stop.is_set():
                seed += 1
                try:
                    reply = http.post("/v1/chat/completions", json={**CHAT, "seed": seed})
                except httpx.HTTPError as err:
                    self._record(index, f"client {index}: {err!r}")
                    continue
                self._record(index, None if reply.status_code == 200 else f"{reply.status_code}: {reply.text}")
                self._stop.wait(THINK_S)

    def _record(self, index: int, failure: str | None) -> None:
        with self._lock:
            if failure is None:
                self.ok[index] += 1
            else:
                self.failures.append(failure)


def _tiny(target: str) -> tuple[observe_pb2.ModelStatus, bool]:
    """The board's READY `tiny` generation and whether the board is draining."""
    with DaemonClient(target) as client:
        status = client.status()
    ready = [m for m in status.models if m.alias == "tiny" and m.state == common_pb2.MODEL_STATE_READY]
    assert len(ready) == 1, status.models
    return ready[0], status.draining


def _fleet(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess], profile: str
) -> tuple[list[str], GatewayProcess]:
    daemons = [start_daemon("--model", "tiny=tiny", "--device-profile", profile) for _ in range(3)]
    gateway = start_gateway(*[flag for d in daemons for flag in ("--daemon", d.target)])
    gateway.wait_until(lambda body: body.get("models", {}).get("tiny") == 3, "all three boards ready")
    return sorted(d.target for d in daemons), gateway


@pytest.fixture
def traffic_during() -> Iterator[Callable[[GatewayProcess, Callable[[], object]], Traffic]]:
    """`traffic_during(gateway, action)`: run `action` while clients send requests, and let each
    client complete some more requests after it; returns the traffic record."""

    def run(gateway: GatewayProcess, action: Callable[[], object]) -> Traffic:
        with Traffic(gateway) as traffic:
            traffic.wait_for([1] * CLIENTS)  # the stream is flowing before the rollout starts
            action()
            after = [n + MIN_REQUESTS_AFTER for n in traffic.mark()]
            traffic.wait_for(after)
        return traffic

    yield run


def test_a_rollout_under_traffic_drops_nothing_and_ends_on_the_new_package(
    packages: Path,
    start_daemon: Callable[..., DaemonProcess],
    start_gateway: Callable[..., GatewayProcess],
    traffic_during: Callable[[GatewayProcess, Callable[[], object]], Traffic],
) -> None:
    targets, gateway = _fleet(start_daemon, start_gateway, "calrt-0.7.6")
    before = {t: _tiny(t)[0].generation for t in targets}
    procs = []
    traffic = traffic_during(
        gateway, lambda: procs.append(run_calctl("rollout", "tiny", NEW, "--gateway", f"unix:{gateway.socket}"))
    )
    (proc,) = procs
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert traffic.failures == [], traffic.failures[:5]
    for target in targets:
        model, draining = _tiny(target)
        assert (model.package_path, draining) == (NEW, False), target
        assert model.generation > before[target]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(steps) == 3 * 4, proc.stdout  # drained, loaded, resumed, rejoined, per board
    assert proc.stdout.splitlines()[-1] == f"rollout done: 3 board(s) serve tiny from {NEW}"


@pytest.mark.parametrize("profile", ["calrt-0.7.6", "calsim-dev"])
def test_a_package_failing_its_golden_check_stops_at_the_first_board_and_the_fleet_keeps_serving(
    packages: Path,
    start_daemon: Callable[..., DaemonProcess],
    start_gateway: Callable[..., GatewayProcess],
    traffic_during: Callable[[GatewayProcess, Callable[[], object]], Traffic],
    profile: str,
) -> None:
    targets, gateway = _fleet(start_daemon, start_gateway, profile)
    before = {t: _tiny(t)[0].generation for t in targets}
    procs = []
    traffic = traffic_during(
        gateway, lambda: procs.append(run_calctl("rollout", "tiny", BAD, "--gateway", f"unix:{gateway.socket}"))
    )
    (proc,) = procs
    (line,) = proc.stderr.splitlines()
    assert proc.returncode == 1 and line.startswith("calctl: rollout stopped at board 1 of 3"), proc.stderr
    assert targets[0] in line and "golden" in line and line.endswith(f"not touched: {targets[1]}, {targets[2]}")
    assert traffic.failures == [], traffic.failures[:5]

    first, draining = _tiny(targets[0])
    assert (first.package_path, draining) == ("tiny", False)
    if profile == "calsim-dev":
        assert first.generation == before[targets[0]], "the old generation kept serving beside the failed one"
        assert "still serves tiny" in proc.stdout
    else:
        assert first.generation > before[targets[0]], "the old package was loaded again"
        assert "restored tiny" in proc.stdout
    for target in targets[1:]:
        model, draining = _tiny(target)
        assert (model.package_path, model.generation, draining) == ("tiny", before[target], False)
    assert proc.stdout.splitlines()[-1].endswith(": the gateway routes tiny to 3 board(s) again"), proc.stdout
