"""`MetricsServer`: a plaintext HTTP listener answering `GET /metrics` with a render function's
Prometheus text (the daemon's `--metrics-listen HOST:PORT`; not gRPC, so any Prometheus scrapes it).

Threads: a `ThreadingHTTPServer` accepting on a daemon thread of its own (blocked in accept, not
polling: `close` shuts the listening socket down to wake it), one short thread per scrape; the render
function must be thread-safe. Anything but GET /metrics answers 404 (HEAD too: scrapers use GET).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from calculet.common.errors import InvalidArgument

if TYPE_CHECKING:
    from http.server import BaseHTTPRequestHandler

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (`[V6]:PORT` for IPv6; port 0 = any free port) -> (host, port).

    Raises:
        InvalidArgument: no port, a port outside 0..65535, or an empty host.
    """
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]") if host.startswith("[") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"metrics_listen: expected HOST:PORT (port 0..65535), got {listen!r}")
    return host, int(port)


class MetricsServer:
    """Serves `render()` at GET /metrics on `listen` until `close`.

    Args:
        listen: HOST:PORT (see `parse_listen`).
        render: one scrape's body (bytes) and its content type.

    Raises (on construction):
        InvalidArgument: a bad address, or one that cannot be bound (in use, not local, not permitted).
    """

    def __init__(self, listen: str, render: Callable[[], tuple[bytes, str]]) -> None:
        # Here, not at the top: every daemon parses --metrics-listen (`parse_listen`), few serve it.
        from http.server import ThreadingHTTPServer

        host, port = parse_listen(listen)
        handler = _handler(render)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("_Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        try:
            self._server = server_class((host, port), handler)
        except OSError as exc:
            raise InvalidArgument(f"metrics_listen: cannot bind {listen}: {exc.strerror or exc}") from None
        self._closing = False
        self._thread = threading.Thread(target=self._accept, name="calculet-metrics", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing:
            self._server.handle_request()  # blocks until a connection, or until `close` shuts the socket

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port): the real port when 0 was asked for."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{METRICS_PATH}"

    def close(self) -> None:
        """Stop answering and release the port (idempotent)."""
        if not self._closing:
            self._closing = True
            with contextlib.suppress(OSError):  # not connected: Linux still wakes the blocked accept
                self._server.socket.shutdown(socket.SHUT_RDWR)
            self._thread.join()
            self._server.server_close()


def _handler(render: Callable[[], tuple[bytes, str]]) -> type[BaseHTTPRequestHandler]:
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != METRICS_PATH:
                self.send_error(404, f"only {METRICS_PATH} is served here")
                return
            try:
                body, content_type = render()
            except Exception:
                log.exception("metrics scrape failed")
                self.send_error(500, "metrics scrape failed (see the daemon log)")
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("metrics %s: " + format, self.address_string(), *args)

    return Handler
