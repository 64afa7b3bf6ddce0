"""The chat backend against a mock HTTP transport (no process): the request body, the chat SSE stream
(the opening role chunk and the finish chunk are no tokens, content chunks are, the answer is their
text), usage's cached tokens (absent = 0, and said so), and every failure a failed record."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from calculet.ops.bench.multiturn.chat import ChatBackend
from calculet.ops.bench.multiturn.chat_sse import ChatKind, parse_chat_line
from calculet.ops.bench.multiturn.turns import TurnMessage, TurnRecord, TurnRequest
from calculet.ops.bench.sse import SseFormatError

from .http_fakes import ADDRESS, send_through, sse

REQUEST = TurnRequest(
    user=3, turn=2, index=11, messages=(TurnMessage("system", "be brief"), TurnMessage("user", "hi")), max_tokens=4
)
DONE = "data: [DONE]\n\n"


def data(obj: dict[str, Any]) -> str:
    return "data: " + json.dumps(obj) + "\n\n"


def role() -> str:
    return data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})


def content(text: str) -> str:
    return data({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def finish() -> str:
    return data({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})


def usage(prompt: int, completion: int, cached: int | None = None) -> str:
    body: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return data({"choices": [], "usage": body})


def send_with(
    handler: Callable[[httpx.Request], httpx.Response], *, send_user: bool = False, request: TurnRequest = REQUEST
) -> TurnRecord:
    return send_through(
        handler, lambda http: ChatBackend(http, ADDRESS, "qwen", seed=100, send_user=send_user), request
    )


def test_a_streamed_turn_records_its_chunks_answer_and_cached_tokens() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return sse(role(), content("He"), content("llo"), content(" you"), finish(), usage(57, 4, 40), DONE)(request)

    turn = send_with(handler)
    assert turn.ok, turn.record.error
    assert (turn.user, turn.turn, turn.answer) == (3, 2, "Hello you")
    assert (turn.cached_tokens, turn.cache_reported) == (40, True)
    rec = turn.record
    assert (rec.index, rec.max_tokens, rec.prompt_tokens, rec.output_tokens) == (11, 4, 57, 4)
    assert len(rec.chunks) == 3 and all(c.tokens is None for c in rec.chunks)  # role and finish are no tokens
    assert rec.end is not None and rec.start <= rec.chunks[0].time <= rec.chunks[-1].time <= rec.end
    assert seen[0].url.path == "/v1/chat/completions"
    assert json.loads(seen[0].content) == {
        "model": "qwen",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "seed": 111,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_send_user_names_the_conversation() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sse(content("x"), usage(5, 1), DONE)(request)

    send_with(handler, send_user=True)
    assert bodies[0]["user"] == "calctl-bench-100-3"


@pytest.mark.parametrize("details", [None, {}, {"cached_tokens": None}])
def test_usage_without_cached_tokens_counts_zero_and_says_so(details: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {"prompt_tokens": 9, "completion_tokens": 1}
    if details is not None:
        body["prompt_tokens_details"] = details
    turn = send_with(sse(content("x"), data({"choices": [], "usage": body}), DONE))
    assert turn.ok and (turn.cached_tokens, turn.cache_reported) == (0, False)


@pytest.mark.parametrize(
    ("parts", "status", "error"),
    [
        ((json.dumps({"error": {"message": "all boards are busy", "type": "rate_limit_exceeded"}}),), 429,
         "HTTP 429: rate_limit_exceeded: all boards are busy"),
        ((content("a"), data({"error": {"message": "board lost", "type": "server_error"}}), DONE), 200,
         "error in the stream: server_error: board lost"),
        ((content("a"), finish(), DONE), 200, "the stream carried no usage chunk"),
        ((content("a"), usage(3, 1)), 200, "the stream ended before data: [DONE]"),
        ((content("a"), "data: {oops\n\n"), 200, "bad stream: not JSON"),
        ((role(), finish(), usage(3, 0), DONE), 200, "the stream ended without a token"),
    ],
)  # fmt: skip
def test_failures_are_failed_records(parts: tuple[str, ...], status: int, error: str) -> None:
    turn = send_with(sse(*parts, status=status))
    assert not turn.ok and turn.record.error is not None and turn.record.error.startswith(error), turn.record.error
    assert turn.record.end is not None


def test_a_refused_connection_is_a_failed_record() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    turn = send_with(handler)
    assert not turn.ok and turn.record.error == "ConnectError: connection refused"


def test_describe_names_the_chat_api() -> None:
    backend = ChatBackend(httpx.AsyncClient(), ADDRESS, "qwen", seed=0)
    assert backend.describe() == {"kind": "gateway", "address": "http://gw.test:8000", "api": "chat"}
    asyncio.run(backend.close())


@pytest.mark.parametrize(
    ("line", "kind", "text", "cached"),
    [
        (content("abc").strip(), ChatKind.TEXT, "abc", None),
        (role().strip(), ChatKind.OTHER, "", None),
        (finish().strip(), ChatKind.OTHER, "", None),
        (usage(8, 2, 6).strip(), ChatKind.USAGE, "", 6),
        ("data: [DONE]", ChatKind.DONE, "", None),
    ],
)
def test_chat_lines_are_classified(line: str, kind: ChatKind, text: str, cached: int | None) -> None:
    event = parse_chat_line(line)
    assert event is not None and (event.kind, event.text, event.cached_tokens) == (kind, text, cached)


@pytest.mark.parametrize("line", ["", ": keep-alive", "event: message"])
def test_other_lines_are_skipped(line: str) -> None:
    assert parse_chat_line(line) is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('data: {"choices": [], "usage": {"prompt_tokens": -1, "completion_tokens": 1}}', "usage.prompt_tokens"),
        ('data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, '
         '"prompt_tokens_details": {"cached_tokens": "4"}}}', "usage.prompt_tokens_details.cached_tokens"),
        ('data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, '
         '"prompt_tokens_details": 4}}', "prompt_tokens_details is 4"),
        ("data: [1, 2]", "not a JSON object"),
        ('data: {"id": "x"}', "neither choices, usage nor error"),
    ],
)  # fmt: skip
def test_malformed_lines_are_format_errors(line: str, message: str) -> None:
    with pytest.raises(SseFormatError, match=message.replace("[", r"\[")):
        parse_chat_line(line)
