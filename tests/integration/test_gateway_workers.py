"""`calculet-gateway --workers 2` over real daemon processes (docs/gateway.md, "Workers").

- Both workers serve the one socket: completions and streams equal the oracle's text whichever
  worker answers (`x-calculet-worker`), and `/metrics` on either one counts every request, labelled
  by worker.
- Every worker's load reaches the boards' reports: requests placed alternately through each worker's
  private socket, each once both workers' views equal what the boards run, fill both boards' lanes
  evenly; a worker that saw none of the other's placements would pile onto one board (and its view
  would never match).
- SIGTERM lets a running stream finish, then every worker, the socket and the run directory are gone;
  a killed worker is started again and serves; a killed supervisor takes its workers with it.
- `--workers 0` exits 2 with one line.

A worker is reached alone through its private socket, found from the supervisor's start line. Nothing
sleeps against the work: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calculet.client import DaemonClient
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import BASE_URL, GatewayProcess, Oracle, plain_uds_transport
from tests.integration.helpers import poll

pytestmark = pytest.mark.integration

WAIT_S = 60.0
WORKERS = 2
StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]


def run_dir(gateway: GatewayProcess) -> Path:
    """The supervisor's private directory, from its start line."""
    pattern = re.compile(r"run directory (\S+)\)")
    poll(lambda: pattern.search(gateway.log()) is not None, "the supervisor's start line", WAIT_S)
    match = pattern.search(gateway.log())
    assert match is not None
    return Path(match.group(1))


def worker_client(gateway: GatewayProcess, index: int, timeout: float = 60.0) -> httpx.Client:
    """A client of worker `index` alone (its private socket)."""
    transport = plain_uds_transport(run_dir(gateway) / f"worker-{index}.sock")
    return httpx.Client(transport=transport, base_url=BASE_URL, timeout=timeout)


def worker_get(gateway: GatewayProcess, index: int, path: str) -> dict[str, Any] | None:
    """GET `path` on worker `index` (None while it does not answer)."""
    try:
        with worker_client(gateway, index, timeout=5) as client:
            response = client.get(path)
    except httpx.HTTPError:
        return None
    assert response.headers["x-calculet-worker"] == str(index)
    return response.json()  # type: ignore[no-any-return]


def wait_workers_ready(gateway: GatewayProcess, models: dict[str, int]) -> list[int]:
    """Every worker's /ready shows `models`; their pids."""
    for index in range(WORKERS):
        poll(
            lambda i=index: (worker_get(gateway, i, "/ready") or {}).get("models") == models,
            f"worker {index} ready",
            WAIT_S,
        )
    pids = [(worker_get(gateway, i, "/health") or {})["pid"] for i in range(WORKERS)]
    assert len(set(pids)) == WORKERS and gateway.proc.pid not in pids
    return pids


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def chat_body(i: int, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"Tell me about the sea, part {i}."}]
    return {"model": "tiny", "messages": messages, "seed": 100 + i, "temperature": 0.9, **fields}


def sse_text(lines: Iterator[str]) -> tuple[str, bool]:
    """(the streamed text, whether `data: [DONE]` ended it)."""
    text, done = "", False
    for line in lines:
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunk = json.loads(line.removeprefix("data: "))
            assert "error" not in chunk, chunk
            text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
    return text, done


def request_counts(text: str, route: str) -> dict[str, float]:
    """worker -> calculet_gateway_requests_total{route, status="200"}."""
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "calculet_gateway_requests"]
    return {
        s.labels["worker"]: s.value
        for s in family.samples
        if s.labels["route"] == route and s.labels["status"] == "200" and s.name.endswith("_total")
    }


def test_two_workers_answer_exactly_and_metrics_count_every_request(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    boards = [start_daemon("--board", str(i), "--model", "tiny=tiny") for i in range(2)]
    gateway = start_gateway("--workers", str(WORKERS), *(f for b in boards for f in ("--daemon", b.target)))
    wait_workers_ready(gateway, {"tiny": 2})
    oracle = Oracle(boards[0].target, "tiny")

    served: set[str] = set()
    sent = 0
    while served != {"0", "1"} or sent < 4:  # each request on a new connection: the kernel picks the worker
        assert sent < 200, f"only workers {served} answered {sent} requests"
        body = chat_body(sent, max_tokens=12)
        expected = oracle.text(oracle.tokens(oracle.chat_prompt(body["messages"]), seed=body["seed"],
                                             max_tokens=12, temperature=0.9))  # fmt: skip
        with gateway.http() as http:
            if sent % 2:
                with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200, r.read()
                    text, done = sse_text(r.iter_lines())
                    assert done
            else:
                r = http.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                text = r.json()["choices"][0]["message"]["content"]
        assert text == expected, (sent, r.headers["x-calculet-worker"])
        served.add(r.headers["x-calculet-worker"])
        sent += 1

    with gateway.http() as http:
        metrics = http.get("/metrics")
    assert metrics.status_code == 200
    counts = request_counts(metrics.text, "/v1/chat/completions")
    assert set(counts) == {"0", "1"} and sum(counts.values()) == sent, counts
    assert 'calculet_gateway_worker_up{worker="0"} 1.0' in metrics.text.splitlines()
    assert 'calculet_gateway_worker_up{worker="1"} 1.0' in metrics.text.splitlines()
    # Each worker's own view of the boards, side by side.
    board_up = [line for line in metrics.text.splitlines() if line.startswith("calculet_gateway_board_up{")]
    assert len(board_up) == 2 * WORKERS and all(line.endswith(" 1.0") for line in board_up), board_up


def running_jobs(daemon: DaemonProcess) -> int:
    with DaemonClient(daemon.target) as client:
        return len(client.status().jobs)


def lanes(daemon: DaemonProcess) -> int:
    with DaemonClient(daemon.target) as client:
        return len(client.status().models[0].lanes)


@contextmanager
def held_stream(client: httpx.Client, body: dict[str, Any]) -> Iterator[None]:
    """A streamed request whose first chunk has arrived, held open until the block ends."""
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()  # kept: a dropped line iterator closes the response (a disconnect)
        next(line for line in lines if line.startswith("data: "))
        yield


def test_every_workers_load_reaches_the_boards_so_they_do_not_pile_up(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    # qwen at twice the modelled board's time: a 2,000-token answer runs for over a minute, so every
    # held stream is still running when the test looks, however slow the machine.
    boards = [start_daemon("--board", str(i), "--model", "qwen=qwen", "--time-scale", "2") for i in range(2)]
    gateway = start_gateway(
        "--workers", str(WORKERS), "--load-interval-ms", "100", *(f for b in boards for f in ("--daemon", b.target))
    )
    wait_workers_ready(gateway, {"qwen": 2})
    per_board = lanes(boards[0])
    assert lanes(boards[1]) == per_board

    def views_match_the_boards() -> bool:
        """Both workers see on every board the jobs it runs: their own and the other worker's."""
        truth = {b.target: running_jobs(b) for b in boards}
        for index in range(WORKERS):
            routing = (worker_get(gateway, index, "/ready") or {}).get("routing", {})
            if {t: routing.get(t, {}).get("qwen", {}).get("jobs") for t in truth} != truth:
                return False
        return True

    with ExitStack() as holds:
        clients = [holds.enter_context(worker_client(gateway, i, timeout=120)) for i in range(WORKERS)]
        for n in range(2 * per_board):
            poll(views_match_the_boards, f"both workers' views of the boards after {n} requests", WAIT_S)
            body = {**chat_body(n, max_tokens=2000, ignore_eos=True), "model": "qwen"}
            holds.enter_context(held_stream(clients[n % WORKERS], body))  # alternately through each worker
        poll(views_match_the_boards, "both workers' views of the full boards", WAIT_S)
        assert [running_jobs(b) for b in boards] == [per_board, per_board]
        for index in range(WORKERS):
            routing = (worker_get(gateway, index, "/ready") or {})["routing"]
            assert sum(routing[b.target]["qwen"]["own_jobs"] for b in boards) == per_board  # its own half


def test_sigterm_finishes_the_running_stream_then_leaves_nothing(
    start_daemon: StartDaemon, start_gateway: StartGateway
) -> None:
    board = start_daemon("--model", "tiny=tiny", "--time-scale", "5")
    gateway = start_gateway("--workers", str(WORKERS), "--daemon", board.target)
    pids = wait_workers_ready(gateway, {"tiny": 1})
    directory = run_dir(gateway)
    with gateway.http() as http, http.stream(
        "POST", "/v1/chat/completions", json={**chat_body(0, max_tokens=60, ignore_eos=True), "stream": True,
                                              "stream_options": {"include_usage": True}},
    ) as r:  # fmt: skip
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        gateway.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    usage = [json.loads(x.removeprefix("data: ")) for x in rest if x.startswith("data: {")][-1]["usage"]
    assert rest[-1] == "data: [DONE]" and usage["completion_tokens"] == 60, [first, *rest][-3:]
    assert gateway.proc.wait(WAIT_S) == 0, gateway.log()
    poll(lambda: all(gone(pid) for pid in pids), "the workers gone", WAIT_S)
    assert not directory.exists() and not gateway.socket.exists()
    assert "workers stopped" in gateway.log()


def test_a_killed_worker_is_started_again_and_serves(start_daemon: StartDaemon, start_gateway: StartGateway) -> None:
    board = start_daemon("--model", "tiny=tiny")
    gateway = start_gateway("--workers", str(WORKERS), "--daemon", board.target)
    pids = wait_workers_ready(gateway, {"tiny": 1})
    os.kill(pids[1], signal.SIGKILL)
    poll(
        lambda: (worker_get(gateway, 1, "/ready") or {}).get("models") == {"tiny": 1}, "worker 1 serving again", WAIT_S
    )
    new_pid = (worker_get(gateway, 1, "/health") or {})["pid"]
    assert new_pid != pids[1] and (worker_get(gateway, 0, "/health") or {})["pid"] == pids[0]
    with worker_client(gateway, 1) as client:
        r = client.post("/v1/chat/completions", json=chat_body(1, max_tokens=4))
    assert r.status_code == 200, r.text
    assert re.search(r"worker 1 exited \(-9\) after serving; starting it again", gateway.log())
    with gateway.http() as http:
        metrics = http.get("/metrics").text.splitlines()
    assert 'calculet_gateway_worker_up{worker="1"} 1.0' in metrics


def test_workers_die_with_a_killed_supervisor(start_daemon: StartDaemon, start_gateway: StartGateway) -> None:
    board = start_daemon("--model", "tiny=tiny")
    gateway = start_gateway("--workers", str(WORKERS), "--daemon", board.target)
    pids = wait_workers_ready(gateway, {"tiny": 1})
    directory = run_dir(gateway)
    gateway.proc.kill()
    gateway.proc.wait(WAIT_S)
    poll(lambda: all(gone(pid) for pid in pids), "the workers gone with their supervisor", WAIT_S)
    shutil.rmtree(directory)  # a killed supervisor cannot remove it: it was still there


def test_zero_workers_is_refused_with_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "calculet.gateway.main", "--daemon", "unix:x.sock", "--workers", "0"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=WAIT_S)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["calculet-gateway: workers: must be in [1, 64], got 0"]
