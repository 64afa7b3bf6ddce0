"""`MetricsMiddleware`: a pure ASGI middleware recording every HTTP request's route, status and, for
the completion routes, its duration until the last body byte (streams included).

Routes outside `ROUTES` are counted as "other", so unknown paths cannot grow the label set.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.gateway.telemetry.metrics import GatewayMetrics

COMPLETION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
ROUTES = COMPLETION_ROUTES | {"/v1/models", "/health", "/ready", "/metrics", "/tokenize", "/detokenize"}


class MetricsMiddleware:
    """Counts the app's HTTP requests into `metrics`."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500, "done": False}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self._record(route, status, started)

        try:
            await self.app(scope, receive, sending)
        finally:
            self._record(route, status, started)  # a request that ended without its last byte

    def _record(self, route: str, status: dict[str, Any], started: float) -> None:
        if status["done"]:
            return
        status["done"] = True
        seconds = time.perf_counter() - started if route in COMPLETION_ROUTES else None
        self.metrics.http_request(route, int(status["code"]), seconds)
