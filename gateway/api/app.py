"""The FastAPI application: routes that parse, call `GatewayService`, and format.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`
(`responses_stream.py`), `POST /tokenize` and
`POST /detokenize` (vLLM's, `serving/tokenize.py`), `GET /v1/models`, `GET /health`
(the process answers), `GET /ready` (some board can serve: 200, else 503; the body also shows each
board's state and what the router sees of it), `GET /metrics` (the
gateway's Prometheus metrics, `telemetry.metrics`; every request is counted by its middleware).
With API keys (`--api-key-file`), every path but /health, /ready and /metrics needs
`Authorization: Bearer <key>` (`auth.ApiKeyAuth`, answering 401 before any route runs). Bodies
are bounded (`max_body_bytes`: 413 before a larger one is read whole, `body_limit.BodyLimit`),
read raw and validated by `schemas.parse_body` (strict types, unknown fields ignored); every
`CalculetError` becomes its HTTP status through `errors.error_response`, the only place that
decides statuses; any other exception is logged and answered 500 without details.

Workers (`--workers N`, `worker` given): every response carries `x-calculet-worker: I`
(`worker_header.py`), `/health` also names the worker and its pid, and `/metrics` answers for the
whole gateway, every sample labelled by worker (`telemetry.worker_scrape`; `?scope=worker`: this
worker's own, unlabelled). With one process all three are as they were.

Ownership: the lifespan creates the fleet inside the server's event loop (gRPC aio channels bind
to it) and closes it on shutdown.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse

from calculet.common.errors import CalculetError, ErrorKind
from calculet.gateway.api import formats, responses_stream, streaming
from calculet.gateway.api.auth import ApiKeyAuth
from calculet.gateway.api.body_limit import BodyLimit
from calculet.gateway.api.responses_schema import ResponsesRequest, in_responses_terms
from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from calculet.gateway.api.tokenize_schemas import DetokenizeRequest, TokenizeRequest
from calculet.gateway.api.worker_header import WorkerHeader
from calculet.gateway.config import DEFAULT_MAX_BODY_BYTES
from calculet.gateway.errors import error_response, internal_error_response
from calculet.gateway.fleet.board import Board
from calculet.gateway.serving import tokenize as tokenizing
from calculet.gateway.serving.service import GatewayService, Prepared
from calculet.gateway.telemetry.metrics import GatewayMetrics
from calculet.gateway.telemetry.middleware import MetricsMiddleware
from calculet.gateway.telemetry.request_context import RequestContextMiddleware
from calculet.gateway.telemetry.worker_scrape import SCOPE_PARAM, WORKER_SCOPE, WorkerScrape
from calculet.gateway.workers.identity import WorkerIdentity

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("calculet.gateway.http")

SESSION_HEADER = "x-session-id"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def session_key(request: Request, user: str | None) -> str:
    """Affinity key: the session header, else `user` (chat: `prompt_cache_key`, else `user`); hashed to
    the daemon's 128-byte limit."""
    raw = request.headers.get(SESSION_HEADER) or user or ""
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest() if raw else ""


async def respond(
    request: Request,
    prepare: Awaitable[Prepared],
    stream: bool,
    include_usage: bool,
    logprobs: bool,
    *,
    chat: bool,
    started: float,
) -> Response:
    """Run a request being prepared and answer it: SSE once its first token exists, or JSON at the end.
    `started`: the request's arrival (`time.perf_counter()`), for its time to first token.

    Raises:
        CalculetError: before any byte is sent (the exception handlers answer it).
    """
    metrics: GatewayMetrics = request.app.state.metrics
    if stream:
        # One watch of the connection for the submit and the first event (each watch is a task and a
        # wait on the time-to-first-token path).
        head = streaming.prepared_head(prepare, metrics, started)
        prepared, events, first = await streaming.unless_disconnected(request, head, streaming.close_head)
        sse = streaming.sse_chat if chat else streaming.sse_completion
        body = sse(prepared, first, events, logprobs=logprobs, include_usage=include_usage)
        # The body closes the `Prepared`.
        return StreamingResponse(body, media_type="text/event-stream", headers=streaming.SSE_HEADERS)
    prepared = await streaming.unless_disconnected(request, prepare, Prepared.close)
    try:
        events = metrics.watch(prepared.events(), prepared.model, prepared.prompt_token_count, started)
        states = await streaming.unless_disconnected(request, streaming.collect(prepared, events, chat=chat))
    finally:
        prepared.close()  # every placement released, even of choices whose events never ran
    answer = formats.chat_response if chat else formats.completion_response
    used = streaming.usage_of(prepared, states)
    return json_response(answer(prepared.request_id, prepared.created, prepared.model, states, used, logprobs))


def routing_view(board: Board) -> dict[str, dict[str, int]]:
    """What the router sees of `board`, per model of its last report: queued + running jobs
    (other gateways' as reported, this gateway's now), this gateway's jobs, prompt tokens still to
    prefill, and the prefix blocks its lanes advertise (docs/gateway.md, "Routing")."""
    models = board.report.models if board.report is not None else ()
    return {
        m.alias: {
            "jobs": board.jobs(m.alias),
            "own_jobs": board.placed,
            "pending_prefill_tokens": board.pending(m.alias),
            "prefix_blocks": len(m.prefix_hashes),
        }
        for m in models
    }


def create_app(
    make_service: Callable[[], AsyncIterator[GatewayService]],
    *,
    api_keys: Sequence[bytes] = (),
    tracer_provider: TracerProvider | None = None,
    worker: WorkerIdentity | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The app. `make_service` is an async context (generator) yielding the running service;
    `api_keys`: the keys /v1/* requests must present (none: the API is open); `tracer_provider`:
    where request spans go (None: tracing off; request ids and log lines all the same); `worker`:
    this process is that worker of a `--workers N` gateway (None: the gateway's only process);
    `max_body_bytes`: a larger body is refused with 413 (by its Content-Length before a byte of it
    is read, or once that many bytes of a body without one arrived)."""

    metrics = GatewayMetrics()
    siblings = WorkerScrape(worker) if worker is not None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            async with asynccontextmanager(make_service)() as service:
                service.observer = metrics  # retries, failovers, answer memory
                if service.placer is not None:
                    service.placer.observer = metrics  # switches, waits for a model
                metrics.attach(service.fleet, service.answers, service.placer)
                app.state.service = service
                yield
        finally:
            metrics.close()

    app = FastAPI(title="Calculet gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # innermost: a 401 never reads the body either
    if api_keys:
        app.add_middleware(ApiKeyAuth, keys=tuple(api_keys))
    app.add_middleware(RequestContextMiddleware, provider=tracer_provider)  # ids, spans, log lines
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # a 401 is counted too
    if worker is not None:
        app.add_middleware(WorkerHeader, index=worker.index)  # outermost: on every response

    @app.exception_handler(CalculetError)
    async def calculet_error(_: Request, err: CalculetError) -> Response:
        if err.kind is ErrorKind.INTERNAL:
            log.error("internal error: %s", err)
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> Response:
        kind = ErrorKind.NOT_FOUND if err.status_code == 404 else ErrorKind.INVALID_ARGUMENT
        resp = error_response(CalculetError(str(err.detail), kind=kind))
        resp.status_code = err.status_code
        return resp

    @app.exception_handler(Exception)
    async def bug(_: Request, err: Exception) -> Response:
        log.exception("unhandled error", exc_info=err)
        return internal_error_response()

    def service_of(request: Request) -> GatewayService:
        return request.app.state.service

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        req = parse_body(ChatCompletionRequest, await request.body())
        key = session_key(request, req.prompt_cache_key or req.user)  # OpenAI: prompt_cache_key replaces user
        prepare = service_of(request).prepare_chat(req, key, request.state.telemetry)
        return await respond(request, prepare, req.stream, req.include_usage, req.logprobs, chat=True, started=started)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        """OpenAI's Responses API, stateless, served as a chat request (`responses_schema.py`)."""
        started = time.perf_counter()
        req = parse_body(ResponsesRequest, await request.body())
        chat = req.to_chat()
        key = session_key(request, chat.prompt_cache_key or chat.user)
        prepare = in_responses_terms(service_of(request).prepare_chat(chat, key, request.state.telemetry))
        return await responses_stream.respond(request, prepare, req, request.app.state.metrics, started)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        started = time.perf_counter()
        req = parse_body(CompletionRequest, await request.body())
        prepare = service_of(request).prepare_completion(req, session_key(request, req.user), request.state.telemetry)
        logprobs = req.logprobs is not None
        return await respond(request, prepare, req.stream, req.include_usage, logprobs, chat=False, started=started)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        req = parse_body(TokenizeRequest, await request.body())
        return json_response(await tokenizing.tokenize(service_of(request), req))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        req = parse_body(DetokenizeRequest, await request.body())
        return json_response(await tokenizing.detokenize(service_of(request), req))

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        """Every model a board serves, and every catalog model: `state` ready (on `boards` boards,
        with its context length) or loadable (in the catalog, served nowhere now)."""
        service = service_of(request)
        ready = service.fleet.known_models()
        catalog = {m.alias: m for m in service.catalog}
        data = []
        for alias in sorted(set(ready) | set(catalog)):
            boards = ready.get(alias, 0)
            if boards == 0 and alias not in catalog:
                continue
            entry: dict[str, Any] = {"id": alias, "object": "model", "created": 0, "owned_by": "calculet"}
            if boards:
                context = await service.model_context(alias)
                entry |= {"max_model_len": context, "context_length": context}
            entry |= {"boards": boards, "state": "ready" if boards else "loadable"}
            data.append(entry)
        return json_response({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        if worker is None:
            return json_response({"status": "ok"})
        return json_response({"status": "ok", "worker": worker.index, "workers": worker.count, "pid": os.getpid()})

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        fleet = service_of(request).fleet
        models = fleet.known_models()
        ok = any(n > 0 for n in models.values())
        body = {
            "status": "ready" if ok else "not_ready",
            "boards": {b.target: b.state.value for b in fleet.boards.values()},
            "models": models,
            "routing": {b.target: routing_view(b) for b in fleet.boards.values()},
        }
        return json_response(body, 200 if ok else 503)

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.render()
        if siblings is not None and request.query_params.get(SCOPE_PARAM) != WORKER_SCOPE:
            body = await siblings.merged(body)
        return Response(body, media_type=content_type)

    return app
