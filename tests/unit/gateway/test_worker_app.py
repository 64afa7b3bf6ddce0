"""The app as worker I of a `--workers N` gateway (in-process, fake boards): every response names the
worker (`x-calculet-worker`), `/health` its index and pid, and `/metrics` answers for the whole
gateway, each sample labelled by worker, a sibling's own metrics fetched from its private socket
(here a stand-in HTTP server on a Unix socket); a sibling that does not answer is
`calculet_gateway_worker_up 0`. `?scope=worker` is the worker's own, unlabelled. Without a worker
identity nothing of this appears."""

from __future__ import annotations

import os
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from starlette.testclient import TestClient

from calculet.gateway.api.app import create_app
from calculet.gateway.workers.identity import WorkerIdentity, worker_socket
from tests.unit.gateway.fakes import FakeDaemon
from tests.unit.gateway.harness import serving

SIBLING_METRICS = b"""\
# HELP calculet_gateway_requests_total HTTP requests answered
# TYPE calculet_gateway_requests_total counter
calculet_gateway_requests_total{route="/v1/completions",status="200"} 7.0
"""


class _Sibling(BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(SIBLING_METRICS)))
        self.end_headers()
        self.wfile.write(SIBLING_METRICS)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def sibling(tmp_path: Path) -> Iterator[type[_Sibling]]:
    """Worker 1 of 3 answering its own metrics on its private socket (worker 2 has none)."""
    _Sibling.paths = []
    server = socketserver.UnixStreamServer(str(worker_socket(tmp_path, 1)), _Sibling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield _Sibling
    server.shutdown()
    server.server_close()
    thread.join()


def _client(worker: WorkerIdentity | None) -> TestClient:
    return TestClient(create_app(serving(FakeDaemon("board-0")), worker=worker), raise_server_exceptions=True)


def test_a_worker_names_itself_and_merges_its_siblings_metrics(tmp_path: Path, sibling: type[_Sibling]) -> None:
    with _client(WorkerIdentity(0, 3, tmp_path)) as client:
        health = client.get("/health")
        assert health.headers["x-calculet-worker"] == "0"
        assert health.json() == {"status": "ok", "worker": 0, "workers": 3, "pid": os.getpid()}
        assert client.get("/ready").headers["x-calculet-worker"] == "0"

        metrics = client.get("/metrics")
        assert metrics.headers["x-calculet-worker"] == "0"
        lines = metrics.text.splitlines()
        assert sibling.paths == ["/metrics?scope=worker"]
        assert 'calculet_gateway_requests_total{route="/health",status="200",worker="0"} 1.0' in lines
        assert 'calculet_gateway_requests_total{route="/v1/completions",status="200",worker="1"} 7.0' in lines
        assert lines.count("# TYPE calculet_gateway_requests_total counter") == 1
        assert [line for line in lines if line.startswith("calculet_gateway_worker_up")] == [
            'calculet_gateway_worker_up{worker="0"} 1.0',
            'calculet_gateway_worker_up{worker="1"} 1.0',
            'calculet_gateway_worker_up{worker="2"} 0.0',
        ]
        own = client.get("/metrics", params={"scope": "worker"}).text
        assert "worker=" not in own and "calculet_gateway_worker_up" not in own
        assert sibling.paths == ["/metrics?scope=worker"]  # a worker's own scrape asks nobody


def test_one_process_is_as_before() -> None:
    with _client(None) as client:
        health = client.get("/health")
        assert health.json() == {"status": "ok"} and "x-calculet-worker" not in health.headers
        text = client.get("/metrics").text
        assert "worker=" not in text and "calculet_gateway_worker_up" not in text
        assert 'calculet_gateway_requests_total{route="/health",status="200"} 1.0' in text.splitlines()
