"""`RequestContextMiddleware`: each HTTP request's id, its span, and its log line.

Request id: the client's `x-request-id` when it is 1..128 printable ASCII characters, else a new
one (32 hex digits); echoed in the response's `x-request-id` header, given to the serving layer as
`request.state.telemetry` (a `RequestScope`), sent to the daemons with every Submit, and written
on the gateway's log line for the request (and the daemon's for its job).

Traces (only with a tracer provider, i.e. `OTEL_TRACES_EXPORTER` set): one SERVER span per
completion request (`POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`), child of the
client's W3C `traceparent` when it sent one, from the first byte in to the last byte out (streams
included), with one CLIENT span `calculet.submit` per board attempt whose context travels to the
daemon. Without a provider no span is created.

A pure ASGI middleware (like `MetricsMiddleware`), so it sees a streamed body's true end.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.common.telemetry.tracing import trace_headers
from calculet.gateway.serving.tracing import REQUEST_ID_METADATA, AttemptScope, PlainScope, RequestScope
from calculet.gateway.telemetry.middleware import COMPLETION_ROUTES

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("calculet.gateway.requests")

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID = 128


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's request id when usable (1..128 printable ASCII), else a new random one."""
    for key, value in headers:
        if key == REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            if 0 < len(text) <= MAX_REQUEST_ID and text.isascii() and text.isprintable():
                return text
            break
    return uuid.uuid4().hex


class _TracedAttempt(AttemptScope):
    def __init__(self, span: Span, request_id: str) -> None:
        self._span = span
        self.metadata = ((REQUEST_ID_METADATA, request_id), *trace_headers(span))

    def end(self, error: BaseException | None) -> None:
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, str(error)))
        self._span.end()


class _TracedScope(RequestScope):
    def __init__(self, tracer: Tracer, span: Span, request_id: str) -> None:
        self.request_id = request_id
        self._tracer, self.span = tracer, span

    def attempt(self, board: str, resumed_tokens: int) -> AttemptScope:
        span = self._tracer.start_span(
            "calculet.submit",
            context=set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes={"calculet.board": board, "calculet.resumed_tokens": resumed_tokens},
        )
        return _TracedAttempt(span, self.request_id)


class RequestContextMiddleware:
    """Request ids for every request; spans and log lines for the completion routes."""

    def __init__(self, app: ASGIApp, provider: TracerProvider | None = None) -> None:
        self.app = app
        self._tracer = provider.get_tracer("calculet.gateway") if provider is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(scope.get("headers", []))
        path = scope.get("path", "")
        traced = path in COMPLETION_ROUTES
        span = self._start_span(scope, path, request_id) if traced and self._tracer else None
        telemetry = _TracedScope(self._tracer, span, request_id) if span and self._tracer else PlainScope(request_id)
        scope.setdefault("state", {})["telemetry"] = telemetry
        started, outcome = time.perf_counter(), {"status": 500, "done": False}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                outcome["status"] = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER, request_id.encode())]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False) and traced:
                self._finish(scope, request_id, span, outcome, started)

        try:
            await self.app(scope, receive, sending)
        finally:
            if traced:
                self._finish(scope, request_id, span, outcome, started)  # ended without its last byte

    def _start_span(self, scope: Scope, path: str, request_id: str) -> Span:
        assert self._tracer is not None
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        parent = TraceContextTextMapPropagator().extract(carrier)
        method = scope.get("method", "POST")
        return self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path, "calculet.request_id": request_id},
        )

    @staticmethod
    def _finish(scope: Scope, request_id: str, span: Span | None, outcome: dict[str, Any], started: float) -> None:
        if outcome["done"]:
            return
        outcome["done"] = True
        status = int(outcome["status"])
        if span is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()
        ms = (time.perf_counter() - started) * 1000
        method, path = scope.get("method", ""), scope.get("path", "")
        log.info(
            "request %s: %s %s -> %d in %.1f ms", request_id, method, path, status, ms, extra={"request_id": request_id}
        )
