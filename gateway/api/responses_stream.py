"""A chat choice's events as the Responses API's output: `ResponseBuilder` turns them into OpenAI's
semantic stream events and the final `response` object; `respond` answers `POST /v1/responses`
with either, as server-sent events (`event:` and `data:` lines, no `[DONE]`, as OpenAI sends them)
or one JSON object (docs/gateway.md "Responses API").

Output items come in the answer's order: a `reasoning` item for the think block, a `message` item
for content, a `function_call` item per call (content between calls opens a new message item); an
answer with none of them is one empty message item.
Each item goes `output_item.added` -> its content part's `added` and deltas -> `done` events ->
`output_item.done`; a call's item is added once its name is known, its arguments follow as
`function_call_arguments.delta` pieces, then `.done` when its block closes. The stream starts
`response.created`, `response.in_progress` and ends `response.completed`, or `response.incomplete`
when the answer was cut by length; an error after the first byte is an `error` event and ends it.

Reasoning tokens: the tokens of the deltas that carried the think block (its tags and the
whitespace after it included), so exact when tokens come one a delta; a delta that closes the
block and starts the content counts whole.

Ownership: `sse_response` consumes and closes its `Prepared`; `respond`'s JSON path closes it too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from calculet.common.errors import CalculetError, ErrorKind
from calculet.gateway.api import responses_format as fmt
from calculet.gateway.api import streaming
from calculet.gateway.api.responses_schema import ResponsesRequest
from calculet.gateway.errors import error_body
from calculet.gateway.serving.choice import ChoiceDelta, ChoiceEvent
from calculet.gateway.serving.service import Prepared
from calculet.gateway.text.chat_output import ChatOutput, OutputPiece
from calculet.gateway.text.tool_calls import CallPart

log = logging.getLogger("calculet.gateway.http")

REASONING, MESSAGE = "reasoning", "message"


class ResponseBuilder:
    """One response's events and final object, from its (single) choice's events.

    Args:
        req: the request.
        prepared: the chat request it is served as, prepared.
    """

    def __init__(self, req: ResponsesRequest, prepared: Prepared) -> None:
        self.id = "resp_" + prepared.request_id.rsplit("-", 1)[-1]
        self.final: dict[str, Any] | None = None
        self._req, self._prepared = req, prepared
        self._output = ChatOutput(prepared.output)
        self._items: list[dict[str, Any]] = []  # done items
        self._open: tuple[str, str] | None = None  # (kind, id) of the item being written
        self._parts: list[str] = []  # its text so far
        self._call: tuple[str, str] | None = None  # (item id, call id) of the call being streamed
        self._seq = 0
        self._reasoning_tokens = 0
        self._undecided_tokens = 0  # tokens of an answer's start that may still open a think block

    def start(self) -> list[dict[str, Any]]:
        """`response.created` and `response.in_progress`."""
        snapshot = self._response("in_progress", None)
        created = self._event("response.created", response=snapshot)
        return [created, self._event("response.in_progress", response=snapshot)]

    def feed(self, event: ChoiceEvent) -> list[dict[str, Any]]:
        """The events of the choice's next event; after its `ChoiceEnd`, `final` is the response."""
        if isinstance(event, ChoiceDelta):
            before = self._output.part
            piece = self._output.feed(event.text)
            self._count(before, len(event.tokens))
            return self._piece(piece)
        events = self._piece(self._output.finish())
        if not self._items and self._open is None:
            events += self._add(MESSAGE)  # an empty answer is an empty message, as chat's content ""
        incomplete = event.finish_reason == "length"
        events += self._close(incomplete)
        prepared = self._prepared
        used = fmt.usage(
            prepared.prompt_token_count,
            prepared.cached_token_count({0: event.cached_tokens}),
            event.completion_tokens,
            self._reasoning_tokens,
        )
        self.final = self._response("incomplete" if incomplete else "completed", used)
        events.append(self._event(f"response.{self.final['status']}", response=self.final))
        return events

    def error(self, err: CalculetError) -> dict[str, Any]:
        """OpenAI's in-band `error` event for `err`."""
        body = error_body(err)["error"]
        return self._event("error", code=body["code"], message=body["message"], param=body["param"])

    def _response(self, status: str, used: dict[str, Any] | None) -> dict[str, Any]:
        prepared = self._prepared
        return fmt.response_object(
            self.id, prepared.created, prepared.model, self._req, status=status, output=list(self._items), used=used
        )

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _count(self, before: str, tokens: int) -> None:
        """Count a delta's tokens as reasoning when it carried some of the think block (`before`:
        where the answer stood before it)."""
        after = self._output.part
        if before == "reasoning" or after in ("reasoning", "layout"):
            self._reasoning_tokens += self._undecided_tokens + tokens
            self._undecided_tokens = 0
        elif after == "undecided":
            self._undecided_tokens += tokens
        else:
            self._undecided_tokens = 0

    def _piece(self, piece: OutputPiece) -> list[dict[str, Any]]:
        events = []
        if piece.reasoning:
            events += self._text(REASONING, "response.reasoning_text.delta", piece.reasoning)
        if piece.content:
            events += self._text(MESSAGE, "response.output_text.delta", piece.content, logprobs=[])
        for part in piece.call_parts:
            events += self._call_part(part)
        return events

    def _text(self, kind: str, delta_kind: str, text: str, **extra: Any) -> list[dict[str, Any]]:
        """A delta of the open item of `kind` (opened first if another or none is open)."""
        events = []
        if self._open is None or self._open[0] != kind:
            events += self._close(False)
            events += self._add(kind)
        assert self._open is not None
        self._parts.append(text)
        where = {"item_id": self._open[1], "output_index": len(self._items), "content_index": 0}
        events.append(self._event(delta_kind, **where, delta=text, **extra))
        return events

    def _add(self, kind: str) -> list[dict[str, Any]]:
        if kind == REASONING:
            iid = fmt.item_id("rs")
            item, part = fmt.reasoning_item(iid, "", "in_progress"), {"type": "reasoning_text", "text": ""}
        else:
            iid = fmt.item_id("msg")
            item, part = fmt.message_item(iid, None, "in_progress"), fmt.output_text("")
        self._open, self._parts = (kind, iid), []
        index = len(self._items)
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event("response.content_part.added", item_id=iid, output_index=index, content_index=0, part=part),
        ]

    def _close(self, incomplete: bool) -> list[dict[str, Any]]:
        """The done events of the open item, if any (`incomplete`: the answer was cut in it)."""
        if self._open is None:
            return []
        kind, iid = self._open
        text, status = "".join(self._parts), "incomplete" if incomplete else "completed"
        where = {"item_id": iid, "output_index": len(self._items), "content_index": 0}
        if kind == REASONING:
            item, part = fmt.reasoning_item(iid, text, status), {"type": "reasoning_text", "text": text}
            events = [self._event("response.reasoning_text.done", **where, text=text)]
        else:
            item, part = fmt.message_item(iid, text, status), fmt.output_text(text)
            events = [self._event("response.output_text.done", **where, text=text, logprobs=[])]
        events.append(self._event("response.content_part.done", **where, part=part))
        events.append(self._event("response.output_item.done", output_index=len(self._items), item=item))
        self._items.append(item)
        self._open, self._parts = None, []
        return events

    def _call_part(self, part: CallPart) -> list[dict[str, Any]]:
        """A call's item added (its first part), an arguments delta, or the item done (its last)."""
        if part.id is not None:
            events = self._close(False)
            index = len(self._items)
            self._call = ("fc_" + part.id.removeprefix("call_"), part.id)
            added = fmt.function_call_item(self._call[0], part.id, part.name or "", "", "in_progress")
            return [*events, self._event("response.output_item.added", output_index=index, item=added)]
        assert self._call is not None, "a call's part before its first"
        index = len(self._items)
        where = {"item_id": self._call[0], "output_index": index}
        if part.call is None:
            return [self._event("response.function_call_arguments.delta", **where, delta=part.arguments)]
        call, status = part.call, "completed" if part.call.complete else "incomplete"
        item = fmt.function_call_item(self._call[0], call.id, call.name, call.arguments, status)
        self._items.append(item)
        self._call = None
        return [
            self._event("response.function_call_arguments.done", **where, arguments=call.arguments),
            self._event("response.output_item.done", output_index=index, item=item),
        ]


def sse_events(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events, each with its `event:` line, as OpenAI sends them."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


async def sse_response(
    req: ResponsesRequest, prepared: Prepared, first: tuple[int, ChoiceEvent] | None, events: streaming.Events
) -> AsyncIterator[bytes]:
    """The streamed response; closes `prepared` however it ends."""
    builder = ResponseBuilder(req, prepared)
    try:
        yield sse_events(builder.start())
        async for _, event in streaming.chain(first, events):
            yield sse_events(builder.feed(event))
    except CalculetError as err:
        log.warning("%s: stream failed: %s", builder.id, err)
        yield sse_events([builder.error(err)])
    finally:
        prepared.close()


async def collect(req: ResponsesRequest, prepared: Prepared, events: streaming.Events) -> dict[str, Any]:
    """The whole response object.

    Raises:
        CalculetError: the choice failed (or, a bug, ended without its end event).
    """
    builder = ResponseBuilder(req, prepared)
    async for _, event in events:
        builder.feed(event)
    if builder.final is None:
        raise CalculetError(f"{builder.id}: the answer ended without its end", kind=ErrorKind.INTERNAL)
    return builder.final


async def respond(
    request: Request,
    prepare: Awaitable[Prepared],
    req: ResponsesRequest,
    metrics: streaming.ChoiceWatcher,
    started: float,
) -> Response:
    """Run a Responses request being prepared (as chat) and answer it: SSE once its first event
    exists, or JSON at the end. `started`: its arrival (`time.perf_counter()`).

    Raises:
        CalculetError: before any byte is sent (the exception handlers answer it).
    """
    if req.stream:
        head = streaming.prepared_head(prepare, metrics, started)
        prepared, events, first = await streaming.unless_disconnected(request, head, streaming.close_head)
        body = sse_response(req, prepared, first, events)
        return StreamingResponse(body, media_type="text/event-stream", headers=streaming.SSE_HEADERS)
    prepared = await streaming.unless_disconnected(request, prepare, Prepared.close)
    try:
        watched = metrics.watch(prepared.events(), prepared.model, prepared.prompt_token_count, started)
        final = await streaming.unless_disconnected(request, collect(req, prepared, watched))
    finally:
        prepared.close()
    return Response(orjson.dumps(final), media_type="application/json")
