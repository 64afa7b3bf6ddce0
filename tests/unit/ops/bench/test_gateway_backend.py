"""The gateway backend against a mock HTTP transport (no process): the request body, SSE reading
(text chunks, usage, [DONE]), and every failure becoming a failed record with a clear error; the
`--gateway` address forms; the gateway's boards from /ready."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from calculet.common.errors import InvalidArgument, Unavailable
from calculet.ops.bench.backend import BenchSampling
from calculet.ops.bench.discovery import gateway_boards, model_vocab
from calculet.ops.bench.gateway_backend import GatewayAddress, GatewayBackend
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.sse import SseFormatError, SseKind, parse_sse_line
from calculet.ops.bench.workload import BenchRequest

from .http_fakes import ADDRESS, send_through, sse


def chunk(text: str, finish: str | None = None) -> str:
    body = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return "data: " + json.dumps(body) + "\n\n"


def usage(prompt: int, completion: int) -> str:
    body = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return "data: " + json.dumps(body) + "\n\n"


DONE = "data: [DONE]\n\n"


def send_with(handler: Callable[[httpx.Request], httpx.Response], request: BenchRequest) -> RequestRecord:
    return send_through(handler, lambda http: GatewayBackend(http, ADDRESS, "qwen", ignore_eos=True, seed=100), request)


def test_a_streamed_completion_records_each_text_chunk_and_the_usage_counts() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return sse(chunk("He"), chunk("llo"), chunk(""), chunk(" you", "length"), usage(3, 5), DONE)(request)

    rec = send_with(handler, BenchRequest(7, 5, prompt_tokens=(11, 12, 13)))
    assert rec.ok, rec.error
    assert len(rec.chunks) == 3 and all(c.tokens is None for c in rec.chunks)  # the empty-text chunk is no token
    assert (rec.output_tokens, rec.prompt_tokens) == (5, 3)
    assert rec.end is not None and rec.start <= rec.chunks[0].time <= rec.chunks[-1].time <= rec.end
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/completions"
    assert body == {
        "model": "qwen",
        "prompt": [11, 12, 13],
        "max_tokens": 5,
        "seed": 107,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def test_a_text_prompt_is_sent_as_text() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sse(chunk("x"), usage(2, 1), DONE)(request)

    rec = send_with(handler, BenchRequest(0, 1, prompt_text="Hi there"))
    assert rec.ok and bodies[0]["prompt"] == "Hi there" and rec.prompt_tokens == 2


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        (
            sse('{"error": {"message": "every board is full", "type": "rate_limit_error"}}', status=429),
            "HTTP 429: rate_limit_error: every board is full",
        ),
        (sse("<html>oops</html>", status=502), "HTTP 502: <html>oops</html>"),
        (
            sse(chunk("a"), 'data: {"error": {"message": "board lost", "type": "server_error"}}\n\n', DONE),
            "error in the stream: server_error: board lost",
        ),
        (sse(chunk("a"), chunk("b")), "the stream ended before data: [DONE]"),
        (sse(chunk("a"), DONE), "the stream carried no usage chunk"),
        (sse("data: {not json\n\n", DONE), "bad stream: not JSON"),
        (sse(usage(1, 0), DONE), "the stream ended without a token"),
    ],
)
def test_failures_become_failed_records(handler: Callable[[httpx.Request], httpx.Response], error: str) -> None:
    rec = send_with(handler, BenchRequest(0, 4, prompt_tokens=(1,)))
    assert not rec.ok
    assert rec.error is not None and rec.error.startswith(error), rec.error
    assert rec.end is not None


def test_a_connection_failure_is_a_failed_record() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    rec = send_with(refuse, BenchRequest(0, 4, prompt_tokens=(1,)))
    assert rec.error == "ConnectError: connection refused"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("data: [DONE]", SseKind.DONE),
        (chunk("x").strip(), SseKind.TEXT),
        (chunk("", "stop").strip(), SseKind.FINISH),
        (usage(1, 2).strip(), SseKind.USAGE),
        ('data: {"error": {"message": "m"}}', SseKind.ERROR),
    ],
)
def test_sse_lines_are_classified(line: str, kind: SseKind) -> None:
    event = parse_sse_line(line)
    assert event is not None and event.kind is kind


def test_sse_non_data_lines_are_skipped_and_bad_payloads_refused() -> None:
    assert parse_sse_line("") is None and parse_sse_line(": ping") is None and parse_sse_line("event: x") is None
    for bad in ("data: [1]", 'data: {"usage": {"completion_tokens": -1, "prompt_tokens": 1}}', 'data: {"id": 1}'):
        with pytest.raises(SseFormatError):
            parse_sse_line(bad)


@pytest.mark.parametrize(
    ("text", "base", "uds"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000", None),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000", None),
        ("https://gw.example:443", "https://gw.example:443", None),
        ("unix:run/gw.sock", "http://gateway", "run/gw.sock"),
    ],
)
def test_gateway_addresses(text: str, base: str, uds: str | None) -> None:
    address = GatewayAddress.parse(text)
    assert (address.base_url, address.uds, address.text) == (base, uds, text)


@pytest.mark.parametrize("text", ["127.0.0.1:8000", "ftp://x", "unix:", "http://"])
def test_bad_gateway_addresses_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match=r"expected http|needs a socket path"):
        GatewayAddress.parse(text)


def _boards(handler: Callable[[httpx.Request], httpx.Response]) -> list[str]:
    async def go() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url=ADDRESS.base_url) as http:
            return await gateway_boards(http, "http://gw.test:8000")

    return asyncio.run(go())


def test_gateway_boards_come_from_ready_even_when_not_ready() -> None:
    body = {"status": "not_ready", "boards": {"unix:b0.sock": "ready", "unix:b1.sock": "down"}, "models": {}}
    assert _boards(lambda r: httpx.Response(503, json=body)) == ["unix:b0.sock", "unix:b1.sock"]


@pytest.mark.parametrize(
    "response", [httpx.Response(200, json={"status": "ready"}), httpx.Response(404, text="no such page")]
)
def test_a_ready_answer_without_boards_is_refused(response: httpx.Response) -> None:
    with pytest.raises(Unavailable, match=r"gateway http://gw\.test:8000: GET /ready"):
        _boards(lambda r: response)


def test_model_vocab_asks_daemons_in_turn_and_says_what_to_do_when_none_answers() -> None:
    async def vocab_of(target: str) -> int:
        if target == "unix:down.sock":
            raise Unavailable("connection refused")
        return 151_936

    assert asyncio.run(model_vocab(["unix:down.sock", "unix:up.sock"], vocab_of)) == 151_936
    with pytest.raises(Unavailable, match=r"unix:down.sock: unavailable: connection refused\); give --vocab N"):
        asyncio.run(model_vocab(["unix:down.sock"], vocab_of))
    with pytest.raises(Unavailable, match="no daemon to ask"):
        asyncio.run(model_vocab([], vocab_of))


def test_the_sampling_flags_go_into_every_body_and_unset_ones_stay_out() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sse(chunk("x"), usage(2, 1), DONE)(request)

    sampling = BenchSampling(temperature=0.8, top_k=40)
    rec = send_through(
        handler,
        lambda http: GatewayBackend(http, ADDRESS, "qwen", ignore_eos=False, seed=0, sampling=sampling),
        BenchRequest(0, 1, prompt_tokens=(5,)),
    )
    assert rec.ok and bodies[0]["temperature"] == 0.8 and bodies[0]["top_k"] == 40 and "top_p" not in bodies[0]
