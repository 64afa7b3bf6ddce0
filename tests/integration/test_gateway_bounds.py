"""Bounded requests against a real gateway over two real daemons (docs/gateway.md, "Bounded requests").

One request must not take the fleet down: bodies of 10 MB and 100 MB (declared or chunked) are refused
with 413 before they are read whole, the gateway's memory stays bounded and it keeps serving; a
completion with more prompts than the boards admit is refused whole with 429 and Retry-After, and
nothing of it reaches a board; an unknown chat role is a 400 naming it. Before these bounds, a 100 MB
body got the gateway killed for memory, and 3,000 prompts got a 499 while the client was connected.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from calculet.client import DaemonClient
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess
from tests.integration.local_fleet import local_fleet

pytestmark = pytest.mark.integration
RSS_BOUND = 512 << 20  # what the gateway may hold after the hostile bodies (it starts near 100 MiB)
MB = 1 << 20


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, models_root: Path
) -> Iterator[tuple[list[DaemonProcess], GatewayProcess]]:
    boards = [["--board", str(i), "--model", "tiny=tiny", "--queue-depth", "4"] for i in range(2)]
    with local_fleet(tmp_path_factory.mktemp("bounds"), models_root, boards) as running:
        yield running


def body_of(size: int) -> bytes:
    return b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * size + b'"}], "max_tokens": 2}'


def small_request_ok(gateway: GatewayProcess) -> None:
    with gateway.http() as http:
        r = http.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert r.status_code == 200, r.text


def submits_seen(daemons: list[DaemonProcess]) -> tuple[int, int]:
    """Submits the boards accepted or refused, and the jobs they hold now."""
    seen = held = 0
    for d in daemons:
        with DaemonClient(d.target) as client:
            status = client.status()
        seen += status.job_counters.accepted + status.job_counters.rejected
        held += len(status.jobs)
    return seen, held


@pytest.mark.parametrize("size_mb", [10, 100])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_huge_body_is_413_and_the_fleet_keeps_serving(
    fleet: tuple[list[DaemonProcess], GatewayProcess], size_mb: int, chunked: bool
) -> None:
    daemons, gateway = fleet
    body = body_of(size_mb * MB)

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), MB):
            yield body[i : i + MB]

    # Both send the body in 1 MB pieces; declared, its Content-Length is set, which keeps httpx from
    # chunking it. (As one bytes object, httpcore re-slices the unsent rest after each socket write:
    # 15 s of CPU for 100 MB.)
    headers = {"content-type": "application/json"}
    if not chunked:
        headers["content-length"] = str(len(body))
    with gateway.http() as http:
        r = http.post("/v1/chat/completions", content=pieces(), headers=headers)
        assert r.status_code == 413, r.text[:300]
        error = r.json()["error"]
        assert error["code"] == "request_too_large" and "4194304 bytes" in error["message"]
    small_request_ok(gateway)
    assert psutil.Process(gateway.proc.pid).memory_info().rss < RSS_BOUND
    assert gateway.proc.poll() is None and all(d.alive() for d in daemons)


def test_more_prompts_than_the_boards_admit_are_refused_whole(
    fleet: tuple[list[DaemonProcess], GatewayProcess],
) -> None:
    daemons, gateway = fleet
    before, _ = submits_seen(daemons)
    with gateway.http() as http:
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": ["hi"] * 3000, "max_tokens": 1})
        assert r.status_code == 400 and "at most 2048" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": ["hi"] * 2000, "max_tokens": 1})
        assert r.status_code == 429, r.text[:300]
        assert r.headers["retry-after"] == "1"
        assert "jobs (prompts x n)" in r.json()["error"]["message"]
    assert submits_seen(daemons) == (before, 0)  # nothing of either reached a board
    small_request_ok(gateway)


def test_an_unknown_role_is_400_naming_it(fleet: tuple[list[DaemonProcess], GatewayProcess]) -> None:
    _, gateway = fleet
    with gateway.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]})
        assert r.status_code == 400 and "'wizard'" in r.json()["error"]["message"]
    small_request_ok(gateway)
