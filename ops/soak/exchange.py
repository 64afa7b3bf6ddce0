"""One request through the official `openai` client, as the soak's clients make it.

`send(client, body, ...)` posts `body` (from `RequestSpec.body`) with `AsyncOpenAI` and returns an
`Exchange`: each choice's text and finish reason, the times (send, first content, end; from the
injected clock), the usage's completion tokens, and how it ended: complete, cut by the client
(a stream closed after `disconnect_after` chunks, or a non-streamed request past its client
timeout), or with an error (`ExchangeError`: an HTTP status, an in-band stream error and its code,
a timeout the client did not plan, a broken connection). Nothing here judges the texts: that is
`classify`.

`max_retries` is 0 on the clients the soak makes: every request is exactly one HTTP request, so an
error the gateway returns is seen, never hidden by a retry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

CUT_DISCONNECT = "disconnect"
CUT_TIMEOUT = "timeout"


@dataclass(frozen=True)
class ExchangeError:
    """Why a request did not complete.

    Attributes:
        kind: "http" (a status), "in-band" (an error event in the stream), "timeout" (past the
            generous lost timeout), "connection" (the connection broke without an error).
        status: the HTTP status, when there was one.
        code: OpenAI's error `code` (the Calculet error kind: "unavailable", "overloaded", ...).
        message: the error's message.
    """

    kind: str
    status: int | None
    code: str | None
    message: str

    def describe(self) -> str:
        head = f"HTTP {self.status}" if self.status is not None else self.kind
        return f"{head} {self.code or ''}: {self.message}".replace("  ", " ")


@dataclass
class Exchange:
    """What one request got (module docstring). Times are seconds on the caller's clock."""

    start: float
    stream: bool
    n: int
    texts: list[str] = field(default_factory=list)
    finishes: list[str | None] = field(default_factory=list)
    first_token: float | None = None
    end: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cut: str | None = None  # CUT_DISCONNECT / CUT_TIMEOUT: the client ended it on purpose
    error: ExchangeError | None = None
    request_id: str | None = None  # sent as `x-request-id`: the gateway's and the daemons' logs name it

    def __post_init__(self) -> None:
        self.texts = [""] * self.n
        self.finishes = [None] * self.n


async def send(
    client: openai.AsyncOpenAI,
    body: dict[str, Any],
    *,
    lost_timeout_s: float,
    disconnect_after: int = 0,
    client_timeout_s: float | None = None,
    request_id: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Exchange:
    """Send `body` once (module docstring).

    Args:
        client: an `AsyncOpenAI` with `max_retries=0`.
        body: the request (`stream` decides how it is read).
        lost_timeout_s: past this the request is given up as a timeout error (a hang).
        disconnect_after: > 0: close the stream after that many chunks (a client disconnect).
        client_timeout_s: a non-streamed request's own timeout (the client gives up: `cut`).
        request_id: sent as `x-request-id` (the gateway logs it and passes it to the daemons).
        clock: the time source.

    Returns:
        The exchange; never raises for a failed request.
    """
    n = int(body.get("n", 1))
    if request_id is not None:
        body = {**body, "extra_headers": {"x-request-id": request_id}}
    out = Exchange(clock(), bool(body.get("stream")), n, request_id=request_id)
    try:
        async with asyncio.timeout(lost_timeout_s):
            if out.stream:
                await _read_stream(client, body, out, disconnect_after, clock)
            else:
                await _read_whole(client, body, out, client_timeout_s, clock)
    except TimeoutError:
        out.error = ExchangeError("timeout", None, None, f"no complete answer within {lost_timeout_s:g} s")
    except openai.APITimeoutError as err:
        out.error = ExchangeError("timeout", None, None, f"client timeout: {err}")
    except openai.APIStatusError as err:
        out.error = ExchangeError("http", err.status_code, _code(err.body), _message(err.body, str(err)))
    except openai.APIConnectionError as err:
        cause = f" ({err.__cause__!r})" if err.__cause__ is not None else ""
        out.error = ExchangeError("connection", None, None, f"{type(err).__name__}: {err}{cause}")
    except openai.APIError as err:  # an error event inside a stream (the gateway's in-band error)
        out.error = ExchangeError("in-band", None, _code(err.body), _message(err.body, err.message))
    if out.end is None:
        out.end = clock()
    return out


async def _read_stream(
    client: openai.AsyncOpenAI, body: dict[str, Any], out: Exchange, disconnect_after: int, clock: Callable[[], float]
) -> None:
    stream = await client.chat.completions.create(**body)
    chunks = 0
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
                out.prompt_tokens = chunk.usage.prompt_tokens
            for choice in chunk.choices:
                if choice.index >= out.n:
                    continue
                text = choice.delta.content if choice.delta is not None else None
                if text:
                    out.texts[choice.index] += text
                    if out.first_token is None:
                        out.first_token = clock()
                if choice.finish_reason is not None:
                    out.finishes[choice.index] = choice.finish_reason
            chunks += 1
            if disconnect_after and chunks >= disconnect_after and not all(out.finishes):
                out.cut = CUT_DISCONNECT
                break
    finally:
        await stream.close()
    out.end = clock()


async def _read_whole(
    client: openai.AsyncOpenAI,
    body: dict[str, Any],
    out: Exchange,
    client_timeout_s: float | None,
    clock: Callable[[], float],
) -> None:
    target = client if client_timeout_s is None else client.with_options(timeout=client_timeout_s)
    try:
        reply = await target.chat.completions.create(**body)
    except openai.APITimeoutError:
        if client_timeout_s is None:
            raise
        out.cut = CUT_TIMEOUT
        out.end = clock()
        return
    out.end = clock()
    for choice in reply.choices:
        if choice.index < out.n:
            out.texts[choice.index] = choice.message.content or ""
            out.finishes[choice.index] = choice.finish_reason
    if reply.usage is not None:
        out.completion_tokens = reply.usage.completion_tokens
        out.prompt_tokens = reply.usage.prompt_tokens


def _code(body: object) -> str | None:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("code") is not None:
            return str(inner["code"])
    return None


def _message(body: object, fallback: str) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return fallback
