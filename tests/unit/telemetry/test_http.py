"""`MetricsServer` (`--metrics-listen`): GET /metrics answers the render function's body and content
type, anything else 404, a failing render 500 (logged); bad or unbindable addresses are refused with
one clear `metrics_listen` error; `close` frees the port."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.telemetry.http import MetricsServer, parse_listen

BODY = b"# TYPE calculet_x gauge\ncalculet_x 1.0\n"


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    srv = MetricsServer("127.0.0.1:0", lambda: (BODY, "text/plain; version=0.0.4"))
    yield srv
    srv.close()


def test_get_metrics_answers_the_render(server: MetricsServer) -> None:
    host, port = server.address
    assert host == "127.0.0.1" and port > 0
    assert server.url == f"http://127.0.0.1:{port}/metrics"
    response = httpx.get(server.url, timeout=10)
    assert response.status_code == 200
    assert response.content == BODY
    assert response.headers["content-type"] == "text/plain; version=0.0.4"


@pytest.mark.parametrize("path", ["/", "/metricsx", "/v1/models"])
def test_other_paths_are_404(server: MetricsServer, path: str) -> None:
    host, port = server.address
    assert httpx.get(f"http://{host}:{port}{path}", timeout=10).status_code == 404


def test_a_failing_render_is_a_logged_500(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> tuple[bytes, str]:
        raise RuntimeError("scrape bug")

    srv = MetricsServer("127.0.0.1:0", broken)
    try:
        with caplog.at_level(logging.ERROR, logger="calculet.daemon.telemetry.http"):
            assert httpx.get(srv.url, timeout=10).status_code == 500
        assert any("metrics scrape failed" in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        srv.close()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:0", ("::1", 0)), ("0.0.0.0:80", ("0.0.0.0", 80))],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["", "9464", ":9464", "host:", "host:port", "host:70000", "host:-1"])
def test_malformed_addresses_are_refused_clearly(listen: str) -> None:
    with pytest.raises(InvalidArgument, match=r"metrics_listen: expected HOST:PORT \(port 0\.\.65535\)"):
        parse_listen(listen)


def test_a_port_in_use_is_refused_and_close_frees_the_port() -> None:
    srv = MetricsServer("127.0.0.1:0", lambda: (BODY, "text/plain"))
    _, port = srv.address
    with pytest.raises(InvalidArgument, match=rf"metrics_listen: cannot bind 127\.0\.0\.1:{port}"):
        MetricsServer(f"127.0.0.1:{port}", lambda: (BODY, "text/plain"))
    srv.close()
    srv.close()  # idempotent
    with socket.socket() as probe:  # the port is free again
        probe.bind(("127.0.0.1", port))
