"""The gateway's routing over real daemon processes (issue 19): a burst spreads because every pick
counts against its board before anything awaits, and a conversation returns to the board that holds
its prefix.

64 streams opened at once through one gateway in front of 4 boards of 16 lanes (a tiny package
built with 16 lanes) land at most 1 apart per board, by each daemon's Status `accepted` counter and
by the gateway's own view (`calculet_gateway_board_jobs`), under `--routing prefix` (the default)
and `--routing load` alike. Closing the streams (the client disconnects) cancels every job and
brings the gateway's counts back to 0.

A conversation's second turn, sent without any session key once the gateway's view shows the first
turn's blocks on its board (`GET /ready`'s routing view, fed by WatchLoad every 50 ms), goes to
that board alone and reports the reused tokens in `usage.prompt_tokens_details.cached_tokens`.

Time: the burst's boards run calsim at time scale 5, so a 200-token job lasts far longer than the burst
takes to place on a loaded machine (a slower machine only makes it last longer); every wait polls a
condition with a deadline, never a pace. Prompts are a few tokens: no full 64-token block, so no
prefix term, and their prefill work ahead stays far below the wait for a lane of a full board.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from calculet.client import DaemonClient
from calculet.ops.sim_packages.build import build_sim_package
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import BASE_URL, GatewayProcess
from tests.unit.telemetry.scrape import Scrape

pytestmark = pytest.mark.integration

BOARDS = 4
LANES = 16
STREAMS = BOARDS * LANES
WAIT_S = 120.0
PACKAGE = "tiny16"

StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]


@pytest.fixture(scope="module")
def sixteen_lanes(models_root: Path) -> str:
    """A tiny package with 16 lanes (and a decode batch of 16) beside the session's packages."""
    if not (models_root / PACKAGE).exists():
        build_sim_package("tiny", models_root / PACKAGE, decode_batches=(1, 4, 16), lanes=LANES)
    return PACKAGE


def accepted(daemon: DaemonProcess) -> int:
    with DaemonClient(daemon.target) as client:
        return int(client.status().job_counters.accepted)


def gateway_jobs(gateway: GatewayProcess, boards: list[DaemonProcess]) -> list[float]:
    """The gateway's own count of its choices on each board."""
    with gateway.http(10) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    scrape = Scrape(response.text)
    return [scrape.one("calculet_gateway_board_jobs", board=b.target) for b in boards]


async def open_streams(gateway: GatewayProcess, holds: contextlib.AsyncExitStack, count: int) -> None:
    """Open `count` streamed completions at once and return when each has its first token; the
    streams stay open (held by `holds`) until it closes."""
    transport = httpx.AsyncHTTPTransport(uds=str(gateway.socket))
    limits = httpx.Limits(max_connections=count + 8, max_keepalive_connections=0)
    client = await holds.enter_async_context(
        httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=WAIT_S, limits=limits)
    )

    readers = []  # kept: an abandoned line iterator, once collected, would close its stream

    async def one(i: int) -> None:
        body = {
            "model": "tiny", "prompt": f"{i} ", "max_tokens": 200, "ignore_eos": True, "stream": True, "seed": i,
        }  # fmt: skip
        response = await holds.enter_async_context(client.stream("POST", "/v1/completions", json=body))
        assert response.status_code == 200, await response.aread()
        lines = response.aiter_lines()
        readers.append(lines)
        async for line in lines:
            if line.startswith("data: {"):
                return
        raise AssertionError(f"stream {i} ended without a token")

    await asyncio.gather(*(one(i) for i in range(count)))
    holds.push_async_callback(_close_all, readers)  # exit order: these iterators, the streams, the client


async def _close_all(readers: list[AsyncIterator[str]]) -> None:
    for lines in readers:
        await lines.aclose()  # type: ignore[attr-defined]


def burst(gateway: GatewayProcess, boards: list[DaemonProcess]) -> tuple[list[int], list[float]]:
    """Open STREAMS streams at once; while all are held, each board's newly accepted jobs and the
    gateway's count of its jobs there. Then the streams close (the client disconnects)."""
    before = [accepted(b) for b in boards]
    result: tuple[list[int], list[float]] = ([], [])

    async def run() -> None:
        nonlocal result
        async with contextlib.AsyncExitStack() as holds:
            await open_streams(gateway, holds, STREAMS)
            landed = [accepted(b) - n for b, n in zip(boards, before, strict=True)]
            result = (landed, gateway_jobs(gateway, boards))

    asyncio.run(run())
    return result


def daemon_jobs(boards: list[DaemonProcess]) -> list[int]:
    """Jobs each daemon still holds (queued or running; finished ones may keep their lane parked)."""
    found = []
    for board in boards:
        with DaemonClient(board.target) as client:
            found.append(len(client.status().jobs))
    return found


def settle(gateway: GatewayProcess, boards: list[DaemonProcess]) -> None:
    """Every job cancelled on the daemons and every count back to 0 in the gateway."""
    deadline = time.monotonic() + WAIT_S
    while (jobs := (daemon_jobs(boards), gateway_jobs(gateway, boards))) != ([0] * BOARDS, [0.0] * BOARDS):
        assert time.monotonic() < deadline, f"jobs left (daemons, gateway): {jobs}"
        time.sleep(0.05)


def test_64_simultaneous_streams_on_4_boards_of_16_lanes_land_at_most_1_apart(
    start_daemon: StartDaemon, start_gateway: StartGateway, sixteen_lanes: str
) -> None:
    boards = [
        start_daemon("--board", str(i), "--model", f"tiny={sixteen_lanes}", "--time-scale", "5") for i in range(BOARDS)
    ]
    targets = [flag for b in boards for flag in ("--daemon", b.target)]
    for mode in ("prefix", "load"):
        gateway = start_gateway(*targets, "--routing", mode)
        gateway.wait_until(lambda body: body["models"] == {"tiny": BOARDS}, "every board ready")
        landed, seen = burst(gateway, boards)
        assert sum(landed) == STREAMS, (mode, landed)
        assert max(landed) - min(landed) <= 1, (mode, landed)
        assert seen == [float(n) for n in landed], (mode, seen, landed)  # the gateway's view agrees
        settle(gateway, boards)
        gateway.stop()


def test_a_conversation_goes_back_to_the_board_holding_its_prefix(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    # No session key: only the advertised prefix can bring turn 2 back to turn 1's board, where
    # its first 128 tokens are in a parked lane (the other boards hold nothing).
    boards = [start_daemon("--board", str(i), "--model", "tiny=tiny") for i in range(BOARDS)]
    gateway = start_gateway(*(f for b in boards for f in ("--daemon", b.target)), "--load-interval-ms", "50")
    gateway.wait_until(lambda body: body["models"] == {"tiny": BOARDS}, "every board ready")
    turn1 = [(i * 37) % 400 + 20 for i in range(150)]  # 2 full blocks + 22 tokens
    turn2 = [*turn1, 11, 12, 13, 14, 15, 16, 17, 18]
    body = {"model": "tiny", "max_tokens": 4, "ignore_eos": True, "seed": 5}
    before = [accepted(b) for b in boards]
    with gateway.http() as http:
        first = http.post("/v1/completions", json={**body, "prompt": turn1})
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    home = next(i for i, b in enumerate(boards) if accepted(b) > before[i])
    advertised = f"board {home} advertising turn 1's blocks to the gateway"
    gateway.wait_until(lambda ready: ready["routing"][boards[home].target]["tiny"]["prefix_blocks"] >= 2, advertised)
    others = [n for i, n in enumerate(prefix_blocks(gateway, boards)) if i != home]
    assert others == [0] * (BOARDS - 1)  # nothing else holds them: only the prefix can decide

    before = [accepted(b) for b in boards]
    streamed = {**body, "prompt": turn2, "stream": True, "stream_options": {"include_usage": True}}
    with gateway.http() as http, http.stream("POST", "/v1/completions", json=streamed) as sse:
        assert sse.status_code == 200
        chunks = [line for line in sse.iter_lines() if line.startswith("data: {")]
    assert [accepted(b) - n for b, n in zip(boards, before, strict=True)] == [int(i == home) for i in range(BOARDS)]
    cached = json.loads(chunks[-1][6:])["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 128 <= cached <= len(turn1)  # at least the advertised blocks; never the new tokens


def prefix_blocks(gateway: GatewayProcess, boards: list[DaemonProcess]) -> list[int]:
    routing = gateway.ready()["routing"]
    return [routing[b.target].get("tiny", {}).get("prefix_blocks", 0) for b in boards]
