"""The gateway over real daemon processes when boards die, drain, fill up, come and go.

Time: boards that must still be busy when the test acts run calsim at a time scale > 0, so a job
lasts many modelled seconds; a slower machine only makes it last longer, never shorter. Nothing
here waits on a sleep: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from calculet.client import DaemonClient
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.helpers import assert_idle_soon, poll

pytestmark = pytest.mark.integration
MESSAGES = [{"role": "user", "content": "Write a long poem about the sea."}]
WAIT_S = 30.0
JOB_STATE_QUEUED = 1  # observe.proto JobState

StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]


def accepted(daemon: DaemonProcess) -> int:
    with DaemonClient(daemon.target) as client:
        return int(client.status().job_counters.accepted)


def running_jobs(daemon: DaemonProcess) -> int:
    with DaemonClient(daemon.target) as client:
        return len(client.status().jobs)


@contextlib.contextmanager
def held_stream(gateway: GatewayProcess, body: dict[str, Any]) -> Iterator[list[str]]:
    """A streamed request whose first token has arrived, held open until the block ends (then closed:
    the client disconnects)."""
    with gateway.http() as http, http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()
        got = [line for line in (next(lines) for _ in range(2)) if line]
        yield got


def chat(gateway: GatewayProcess, model: str, **fields: Any) -> httpx.Response:
    with gateway.http() as http:
        return http.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES, **fields})


def stream_text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_sigkill_mid_stream_fails_over_with_identical_text(
    start_daemon: StartDaemon, start_gateway: StartGateway, tmp_path: Path
) -> None:
    # Board a serves at the modelled board speed (a 1,500-token answer takes > 25 s), so it is
    # surely mid-stream when killed; board b, started once the stream runs, takes over. Board b has
    # fixed slots (no lane selection, docs/daemon.md): the failover crosses both lane settings.
    a = start_daemon("--model", "qwen=qwen", "--time-scale", "1")
    late = f"unix:{tmp_path / 'late.sock'}"
    gateway = start_gateway("--daemon", a.target, "--daemon", late, "--failover-wait", "60")
    client = gateway.openai(timeout=120)
    request: dict[str, Any] = {
        "model": "qwen",
        "messages": MESSAGES,
        "max_tokens": 1500,
        "seed": 123,
        "temperature": 0.9,
    }
    stream = iter(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
    )
    chunks = [next(stream) for _ in range(6)]
    b = start_daemon("--board", "1", "--model", "qwen=qwen", "--device-option", "lane_selection=false", listen=late)
    gateway.wait_until(lambda body: sorted(body["boards"].values()) == ["up", "up"], "board b up")
    assert running_jobs(a) == 1 and accepted(b) == 0
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    chunks.extend(stream)

    text = stream_text(chunks)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 1500
    assert accepted(b) == 1  # the resumed job
    oracle = Oracle(b.target, "qwen")
    prompt = oracle.chat_prompt(MESSAGES)
    expected_tokens = oracle.tokens(prompt, seed=123, max_tokens=1500, temperature=0.9, ignore_eos=True)
    assert text == oracle.text(expected_tokens)  # no text lost, doubled or changed by the switch
    assert usage.prompt_tokens == len(prompt)


def test_client_disconnect_cancels_the_daemon_job(start_daemon: StartDaemon, start_gateway: StartGateway) -> None:
    a = start_daemon("--model", "qwen=qwen", "--time-scale", "1")
    gateway = start_gateway("--daemon", a.target)
    with held_stream(gateway, {"model": "qwen", "messages": MESSAGES, "max_tokens": 2000, "ignore_eos": True}):
        assert running_jobs(a) == 1  # the job runs > 30 modelled seconds unless cancelled
    with DaemonClient(a.target) as client:
        assert_idle_soon(client, timeout=5.0)
        assert client.status().job_counters.cancelled == 1


def test_routing_drain_and_every_board_draining(start_daemon: StartDaemon, start_gateway: StartGateway) -> None:
    boards = [start_daemon("--board", str(i), "--model", "tiny=tiny", "--time-scale", "5") for i in range(2)]
    gateway = start_gateway(*(f for b in boards for f in ("--daemon", b.target)))
    gateway.wait_until(lambda body: body["models"] == {"tiny": 2}, "both boards ready")
    long = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True}
    # Two requests at once go to two boards: the second sees the first placed on its board.
    with held_stream(gateway, long), held_stream(gateway, long):
        assert [running_jobs(b) for b in boards] == [1, 1]

    first, second = boards
    with DaemonClient(first.target) as ops:
        ops.drain(timeout_ms=0, interrupt_remaining=True)
    gateway.wait_until(lambda body: body["models"] == {"tiny": 1}, "drained board out of routing")
    before = [accepted(b) for b in boards]
    for _ in range(3):
        assert chat(gateway, "tiny", max_tokens=2).status_code == 200
    assert [accepted(b) for b in boards] == [before[0], before[1] + 3]

    with DaemonClient(second.target) as ops:
        ops.drain(timeout_ms=0, interrupt_remaining=True)
    gateway.wait_until(lambda body: body["status"] == "not_ready", "no board ready")
    r = chat(gateway, "tiny", max_tokens=2)
    assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
    for b in boards:
        with DaemonClient(b.target) as ops:
            ops.resume()
    gateway.wait_until(lambda body: body["models"] == {"tiny": 2}, "boards resumed")
    assert chat(gateway, "tiny", max_tokens=2).status_code == 200


def test_queue_full_is_429_with_retry_after(start_daemon: StartDaemon, start_gateway: StartGateway) -> None:
    board = start_daemon("--model", "tiny=tiny", "--time-scale", "5", "--queue-depth", "1")
    gateway = start_gateway("--daemon", board.target)
    long = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True}
    with DaemonClient(board.target) as client:
        lanes = len(client.status().models[0].lanes)
    with contextlib.ExitStack() as holds:
        for _ in range(lanes):
            holds.enter_context(held_stream(gateway, long))
        queued_client = gateway.http()
        holds.callback(queued_client.close)

        def wait_in_queue() -> None:
            with contextlib.suppress(httpx.HTTPError):  # ends when the test closes the client
                queued_client.post("/v1/chat/completions", json={**long, "stream": True})

        waiting = threading.Thread(target=wait_in_queue, daemon=True)
        waiting.start()

        def queued() -> bool:
            with DaemonClient(board.target) as client:
                return [j.state for j in client.status().jobs].count(JOB_STATE_QUEUED) == 1

        poll(queued, "one request queued behind the full lanes", WAIT_S)
        r = chat(gateway, "tiny", max_tokens=2)
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    waiting.join(timeout=WAIT_S)
    with DaemonClient(board.target) as client:
        assert_idle_soon(client, timeout=10.0)  # every held or queued request was cancelled
    assert chat(gateway, "tiny", max_tokens=2).status_code == 200


def _free_port(*hosts: str) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return int(port)
        except OSError:
            continue
    pytest.skip("no port free on every loopback address")


def test_dns_names_add_and_remove_boards(
    start_daemon: StartDaemon, start_gateway: StartGateway, tmp_path: Path
) -> None:
    # A name with several addresses on one port, like a Kubernetes headless service; the names
    # come from a hosts-format file the test rewrites, re-read every 0.2 s.
    port = _free_port("127.0.0.2", "127.0.0.3")
    # Plain TCP on loopback: --insecure says so explicitly (the daemon refuses TCP without TLS otherwise).
    a = start_daemon("--model", "tiny=tiny", "--time-scale", "5", "--insecure", listen=f"127.0.0.2:{port}")
    b = start_daemon(
        "--board", "1", "--model", "tiny=tiny", "--time-scale", "5", "--insecure", listen=f"127.0.0.3:{port}"
    )  # fmt: skip
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 boards.test\n")
    gateway = start_gateway("--dns", f"boards.test:{port}", "--dns-hosts-file", str(hosts), "--dns-interval", "0.2")
    assert chat(gateway, "tiny", max_tokens=2).status_code == 200
    assert (accepted(a), accepted(b)) == (1, 0)

    hosts.write_text("127.0.0.2 boards.test\n127.0.0.3 boards.test\n")
    gateway.wait_until(lambda body: len(body["boards"]) == 2 and body["models"] == {"tiny": 2}, "new board routed")
    long = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True}
    with held_stream(gateway, long), held_stream(gateway, long):
        assert (running_jobs(a), running_jobs(b)) == (1, 1)  # the added board took one

    hosts.write_text("127.0.0.3 boards.test\n")
    gateway.wait_until(lambda body: list(body["boards"]) == [f"127.0.0.3:{port}"], "removed board dropped")
    before = accepted(a)
    assert chat(gateway, "tiny", max_tokens=2).status_code == 200
    assert accepted(a) == before
    assert json.loads(json.dumps(gateway.ready()))["models"] == {"tiny": 1}
