"""`GatewayBackend`: benchmark requests through the gateway's OpenAI `/v1/completions`, streamed.

Each request is one POST with `prompt` (token ids, or the JSONL text), `max_tokens`, `seed`,
`stream: true`, `stream_options.include_usage: true` and `ignore_eos` when asked; the body is
encoded before the clock starts. Times: `start` just before the POST, each SSE text chunk when its
line was read, `end` when `data: [DONE]` arrived. Token counts: the SSE chunks do not carry them, so
each chunk is recorded with an unknown count and the request's output and prompt tokens come from
the final usage chunk (see `sse` and `latency` for what that means for ITL).

`GatewayAddress` parses `--gateway`: `http(s)://HOST:PORT` (a trailing `/v1` is accepted and
dropped) or `unix:PATH` (HTTP over a Unix socket). The API key, when given, goes in
`Authorization: Bearer`. Failures (connection refused, HTTP errors with OpenAI's error body, an
in-band error, a stream cut before `[DONE]`, a malformed chunk) become failed records.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.backend import BenchBackend, BenchSampling
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.sse import SseEvent, SseFormatError, SseKind, error_message, parse_sse_line
from calculet.ops.bench.workload import BenchRequest

UNIX_BASE_URL = "http://gateway"
COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class GatewayAddress:
    """Where the gateway listens: a base URL, and the Unix socket path when it is one."""

    text: str
    base_url: str
    uds: str | None

    @classmethod
    def parse(cls, text: str) -> GatewayAddress:
        """Raises: InvalidArgument: neither `http(s)://...` nor `unix:PATH`."""
        if text.startswith("unix:"):
            path = text.removeprefix("unix:")
            if not path:
                raise InvalidArgument(f"--gateway {text!r}: unix: needs a socket path")
            return cls(text, UNIX_BASE_URL, path)
        if text.startswith(("http://", "https://")) and len(text.split("://", 1)[1].strip("/")) > 0:
            return cls(text, text.rstrip("/").removesuffix("/v1"), None)
        raise InvalidArgument(f"--gateway {text!r}: expected http(s)://HOST:PORT or unix:PATH")


def open_http(address: GatewayAddress, *, timeout_s: float, api_key: str | None = None) -> httpx.AsyncClient:
    """An httpx client of the gateway (no connection limit: the schedule decides what is in flight)."""
    transport = httpx.AsyncHTTPTransport(uds=address.uds) if address.uds else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=address.base_url,
        transport=transport,
        headers=headers,
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


class GatewayBackend(BenchBackend):
    """Streams completions from a gateway (see the module docstring).

    Args:
        http: a client from `open_http` (owned: `close` closes it).
        address: the gateway's address (for the report).
        model: the model alias.
        ignore_eos: ask for exactly `max_tokens` tokens.
        seed: request i samples with seed `seed + i`.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        address: GatewayAddress,
        model: str,
        *,
        ignore_eos: bool,
        seed: int,
        sampling: BenchSampling | None = None,
    ) -> None:
        self._http, self._address, self._model = http, address, model
        self._ignore_eos, self._seed = ignore_eos, seed
        self._sampling = (sampling or BenchSampling()).fields()

    async def prepare(self, requests: Sequence[BenchRequest]) -> list[BenchRequest]:
        return list(requests)  # the gateway takes token ids and text alike

    def body(self, request: BenchRequest) -> dict[str, Any]:
        prompt = list(request.prompt_tokens) if request.prompt_tokens is not None else request.prompt_text
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "seed": self._seed + request.index,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self._sampling,
        }
        if self._ignore_eos:
            body["ignore_eos"] = True
        return body

    async def send(self, request: BenchRequest) -> RequestRecord:
        content = orjson.dumps(self.body(request))
        headers = {"Content-Type": "application/json"}
        prompt_len = len(request.prompt_tokens) if request.prompt_tokens is not None else None
        record = RequestRecord(request.index, request.max_tokens, time.perf_counter(), prompt_tokens=prompt_len)
        try:
            async with self._http.stream("POST", COMPLETIONS, content=content, headers=headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    record.fail(time.perf_counter(), f"HTTP {response.status_code}: {body_error(response)}")
                else:
                    await _read_stream(response, record)
        except httpx.HTTPError as err:
            record.fail(time.perf_counter(), f"{type(err).__name__}: {err}")
        except SseFormatError as err:
            record.fail(time.perf_counter(), f"bad stream: {err}")
        return record

    async def close(self) -> None:
        await self._http.aclose()

    def describe(self) -> dict[str, object]:
        return {"kind": "gateway", "address": self._address.text}


async def _read_stream(response: httpx.Response, record: RequestRecord) -> None:
    """Record the chunks of one SSE stream until `[DONE]`, then finish or fail the record."""
    usage: SseEvent | None = None
    async for line in response.aiter_lines():
        now = time.perf_counter()
        event = parse_sse_line(line)
        if event is None:
            continue
        if event.kind is SseKind.TEXT:
            record.arrived(now, None)
        elif event.kind is SseKind.USAGE:
            usage = event
        elif event.kind is SseKind.ERROR:
            record.fail(now, f"error in the stream: {event.error}")
            return
        elif event.kind is SseKind.DONE:
            if usage is None or usage.completion_tokens is None:
                record.fail(now, "the stream carried no usage chunk")
                return
            record.prompt_tokens = usage.prompt_tokens
            record.finish(now, usage.completion_tokens)
            return
    record.fail(time.perf_counter(), "the stream ended before data: [DONE]")


def body_error(response: httpx.Response) -> str:
    """What a refused HTTP response says: OpenAI's error body's message, else the start of its text."""
    try:
        return error_message(orjson.loads(response.content))
    except orjson.JSONDecodeError:
        return response.text[:200] or response.reason_phrase
