"""Running a prepared request for HTTP: SSE streams, whole answers, and the client's disconnect.

`prepared_head` submits a streamed request and waits for its first event while
`unless_disconnected` watches the connection, so errors that
happen before any output (every board overloaded or draining) still become a proper HTTP status,
and a client that leaves during the prefill cancels its jobs at once. `sse_chat` / `sse_completion`
turn choice events into `data: {...}` lines (tokens that arrived together become one event) and
end with `data: [DONE]`; an error after the first byte is sent in-band as `data: {"error": ...}`.
Usage (non-streamed, or streamed with `stream_options.include_usage`) counts each prompt once,
its cached tokens by its first choice's `ChoiceEnd` (`Prepared.cached_token_count`).

Ownership: the SSE bodies and `collect` consume a `Prepared`'s events; the SSE bodies close the
`Prepared` when they end (however they end), releasing any placement still held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import orjson
from starlette.requests import Request

from calculet.common.errors import CalculetError, ErrorKind
from calculet.gateway.api import formats
from calculet.gateway.errors import error_body
from calculet.gateway.serving.choice import ChoiceDelta, ChoiceEnd, ChoiceEvent
from calculet.gateway.serving.service import Prepared
from calculet.gateway.text.chat_output import ChatOutput, OutputPiece

log = logging.getLogger("calculet.gateway.http")

T = TypeVar("T")
Events = AsyncIterator[tuple[int, ChoiceEvent]]
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ChoiceWatcher(Protocol):
    """What records a request's choice events as they pass (`GatewayMetrics.watch`)."""

    def watch(self, events: Events, model: str, prompt_tokens: int, started: float) -> Events: ...


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T], abandon: Callable[[T], None] | None = None) -> T:
    """Await `work`; cancel it if the client disconnects first.

    Args:
        request: the HTTP request whose connection is watched.
        work: what to await.
        abandon: given a result of `work` that nobody will use (the work finished although the
            client left, or this call was cancelled), so it can release what the result holds.
    Returns:
        The result of `work`.
    Raises:
        CalculetError: (CANCELLED) the client went away; whatever `work` raises.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        _drop(task, abandon)  # this call was cancelled: the work's result, if any, has no taker
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        _drop(task, abandon)
        raise CalculetError("client disconnected", kind=ErrorKind.CANCELLED)
    return task.result()


def _drop(task: asyncio.Future[T], abandon: Callable[[T], None] | None) -> None:
    """Cancel `task`; hand a result it produces anyway to `abandon`."""
    task.cancel()
    if abandon is None:
        return

    def done(finished: asyncio.Future[T]) -> None:
        if not finished.cancelled() and finished.exception() is None:
            abandon(finished.result())

    task.add_done_callback(done)


Head = tuple[Prepared, Events, "tuple[int, ChoiceEvent] | None"]


async def prepared_head(prepare: Awaitable[Prepared], metrics: ChoiceWatcher, started: float) -> Head:
    """A request prepared (submitted), its events (watched by the metrics) and the first of them
    (None if there is none): what a streamed answer needs before its first byte. Run it under
    `unless_disconnected` with `close_head`; the SSE body then owns the `Prepared`.

    Raises:
        CalculetError: preparing failed, or the choices failed before any event; the `Prepared`, if
            any, is closed.
    """
    prepared = await prepare
    try:
        events = metrics.watch(prepared.events(), prepared.model, prepared.prompt_token_count, started)
        return prepared, events, await anext(events, None)
    except BaseException:
        prepared.close()
        raise


def close_head(head: Head) -> None:
    """Release a head nobody will stream (the client left as it became ready)."""
    head[0].close()


async def chain(first: tuple[int, ChoiceEvent] | None, events: Events) -> Events:
    """`first` (unless None), then `events`: a head's events whole again."""
    if first is not None:
        yield first
    async for item in events:
        yield item


async def sse_chat(
    prepared: Prepared, first: tuple[int, ChoiceEvent] | None, events: Events, *, logprobs: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    rid, created, model, text = prepared.request_id, prepared.created, prepared.model, prepared.text
    outputs: dict[int, ChatOutput] = {}  # by choice, from its first event
    completion_tokens = 0
    cached: dict[int, int] = {}

    def chunk(index: int, delta: dict[str, Any], lp: dict[str, Any] | None = None, reason: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
        return sse(formats.chat_chunk(rid, created, model, choice, include_usage))

    try:
        async for index, event in chain(first, events):
            out = []
            output = outputs.get(index)
            if output is None:
                output = outputs[index] = ChatOutput(prepared.output)
                out.append(chunk(index, {"role": "assistant", "content": ""}))
            if isinstance(event, ChoiceDelta):
                lp = {"content": formats.chat_logprobs(text, event.logprobs)} if logprobs else None
                out += _piece_chunks(chunk, index, output.feed(event.text), lp)
            elif isinstance(event, ChoiceEnd):
                completion_tokens += event.completion_tokens
                cached[index] = event.cached_tokens
                out += _piece_chunks(chunk, index, output.finish(), None, end=True)
                out.append(chunk(index, {}, reason=output.finish_reason(event.finish_reason)))
            yield b"".join(out)
        if include_usage:
            used = formats.usage(prepared.prompt_token_count, completion_tokens, prepared.cached_token_count(cached))
            yield sse(formats.chat_chunk(rid, created, model, None, with_usage=False) | {"choices": [], "usage": used})
    except CalculetError as err:
        log.warning("%s: stream failed: %s", rid, err)
        yield sse(error_body(err))
    finally:
        prepared.close()
    yield DONE


def _piece_chunks(
    chunk: Callable[[int, dict[str, Any], dict[str, Any] | None], bytes],
    index: int,
    piece: OutputPiece,
    lp: dict[str, Any] | None,
    *,
    end: bool = False,
) -> list[bytes]:
    """The chunks of one piece of a choice's answer: its reasoning and content as one delta (a
    content delta, even empty, for every token event, as without reasoning or tools; at the end
    only what was still held), then the tool calls' deltas, a chunk each."""
    chunks = []
    delta: dict[str, Any] = {}
    if piece.reasoning:
        delta["reasoning_content"] = piece.reasoning
    if piece.content or not (end or piece.reasoning or piece.call_parts):
        delta["content"] = piece.content
    if delta:
        chunks.append(chunk(index, delta, lp))
        lp = None
    for part in piece.call_parts:
        entry = formats.tool_call_delta(part)
        if entry is not None:
            chunks.append(chunk(index, {"tool_calls": [entry]}, lp))
            lp = None
    return chunks


async def sse_completion(
    prepared: Prepared, first: tuple[int, ChoiceEvent] | None, events: Events, *, logprobs: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    rid, created, model, text = prepared.request_id, prepared.created, prepared.model, prepared.text
    completion_tokens = 0
    cached: dict[int, int] = {}
    offsets: dict[int, int] = {}
    try:
        async for index, event in chain(first, events):
            if isinstance(event, ChoiceDelta):
                lp = None
                if logprobs:
                    legacy = formats.CompletionLogprobs()
                    legacy.add(text, event.logprobs, offsets.get(index, 0))
                    lp = legacy.as_dict()
                offsets[index] = offsets.get(index, 0) + len(event.text)
                choice = {"index": index, "text": event.text, "logprobs": lp, "finish_reason": None}
            else:
                completion_tokens += event.completion_tokens
                cached[index] = event.cached_tokens
                choice = {"index": index, "text": "", "logprobs": None, "finish_reason": event.finish_reason}
            yield sse(formats.completion_chunk(rid, created, model, choice, include_usage))
        if include_usage:
            used = formats.usage(prepared.prompt_token_count, completion_tokens, prepared.cached_token_count(cached))
            yield sse(
                formats.completion_chunk(rid, created, model, None, with_usage=False) | {"choices": [], "usage": used}
            )
    except CalculetError as err:
        log.warning("%s: stream failed: %s", rid, err)
        yield sse(error_body(err))
    finally:
        prepared.close()
    yield DONE


async def collect(prepared: Prepared, events: Events, *, chat: bool) -> list[formats.ChoiceState]:
    """Every choice's whole output (non-streamed answers). Raises: CalculetError."""
    n = len(prepared.runners)
    states = [formats.ChoiceState(i, output=ChatOutput(prepared.output) if chat else None) for i in range(n)]
    async for index, event in events:
        state = states[index]
        if isinstance(event, ChoiceDelta):
            state.add(event, prepared.text, chat)
        else:
            state.end(event.finish_reason)
            state.completion_tokens = event.completion_tokens
            state.cached_tokens = event.cached_tokens
    return states


def usage_of(prepared: Prepared, states: list[formats.ChoiceState]) -> dict[str, Any]:
    """The usage object of a non-streamed answer."""
    cached = {state.index: state.cached_tokens for state in states}
    completion = sum(state.completion_tokens for state in states)
    return formats.usage(prepared.prompt_token_count, completion, prepared.cached_token_count(cached))
