"""`ChatBackend`: one turn through the gateway's OpenAI `/v1/chat/completions`, streamed.

Each turn is one POST with the conversation's `messages`, `max_tokens`, `seed` = `--seed` + the
turn's index, `ignore_eos: true` (answers are exactly `max_tokens` tokens, so every run's turns
have the same shape), `stream: true` and `stream_options.include_usage: true`; with `send_user`,
also OpenAI's `user` (`calctl-bench-<seed>-<user>`), which the gateway takes as a session
affinity key (off by default, so routing has to find the cached prefix by itself). The body is
encoded before the clock starts. Times as in `gateway_backend`: `start` just before the POST,
each content chunk when its line was read, `end` at `data: [DONE]`; token counts and the cached
tokens come from the final usage chunk. The answer's text is the concatenated content deltas.
Failures (connection, HTTP errors with OpenAI's error body, an in-band error, a stream cut before
`[DONE]`, no usage, a malformed chunk) become failed records, never exceptions.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from calculet.ops.bench.gateway_backend import GatewayAddress, body_error
from calculet.ops.bench.multiturn.chat_sse import ChatEvent, ChatKind, parse_chat_line
from calculet.ops.bench.multiturn.turns import TurnRecord, TurnRequest
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.sse import SseFormatError

CHAT_COMPLETIONS = "/v1/chat/completions"


class ChatBackend:
    """Streams chat turns from a gateway (module docstring). Used from one asyncio loop.

    Args:
        http: a client from `gateway_backend.open_http` (owned: `close` closes it).
        address: the gateway's address (for the report).
        model: the model alias.
        seed: turn i samples with seed `seed + i`.
        send_user: send OpenAI's `user` per conversation.
    """

    def __init__(
        self, http: httpx.AsyncClient, address: GatewayAddress, model: str, *, seed: int, send_user: bool = False
    ) -> None:
        self._http, self._address, self._model = http, address, model
        self._seed, self._send_user = seed, send_user

    def body(self, request: TurnRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [m.as_dict() for m in request.messages],
            "max_tokens": request.max_tokens,
            "seed": self._seed + request.index,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self._send_user:
            body["user"] = f"calctl-bench-{self._seed}-{request.user}"
        return body

    async def send(self, request: TurnRequest) -> TurnRecord:
        """Send one turn and read its whole stream.

        Returns:
            Its record; a refused or broken turn is a failed record (its `error` says why).
        """
        content = orjson.dumps(self.body(request))
        headers = {"Content-Type": "application/json"}
        record = RequestRecord(request.index, request.max_tokens, time.perf_counter())
        reader = _StreamReader(record)
        try:
            async with self._http.stream("POST", CHAT_COMPLETIONS, content=content, headers=headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    record.fail(time.perf_counter(), f"HTTP {response.status_code}: {body_error(response)}")
                else:
                    async for line in response.aiter_lines():
                        if reader.take(line, time.perf_counter()):
                            break
                    else:
                        record.fail(time.perf_counter(), "the stream ended before data: [DONE]")
        except httpx.HTTPError as err:
            record.fail(time.perf_counter(), f"{type(err).__name__}: {err}")
        except SseFormatError as err:
            record.fail(time.perf_counter(), f"bad stream: {err}")
        cached = reader.cached_tokens
        return TurnRecord(request.user, request.turn, record, "".join(reader.text), cached or 0, cached is not None)

    async def close(self) -> None:
        await self._http.aclose()

    def describe(self) -> dict[str, object]:
        return {"kind": "gateway", "address": self._address.text, "api": "chat"}


class _StreamReader:
    """Feeds one stream's lines into its record; remembers the text and the cached tokens."""

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.text: list[str] = []
        self.usage: ChatEvent | None = None

    @property
    def cached_tokens(self) -> int | None:
        return self.usage.cached_tokens if self.usage is not None else None

    def take(self, line: str, now: float) -> bool:
        """One line; True when the stream is over (done or failed).

        Raises:
            SseFormatError: a malformed `data:` line.
        """
        event = parse_chat_line(line)
        if event is None or event.kind is ChatKind.OTHER:
            return False
        if event.kind is ChatKind.TEXT:
            self.record.arrived(now, None)
            self.text.append(event.text)
            return False
        if event.kind is ChatKind.USAGE:
            self.usage = event
            return False
        if event.kind is ChatKind.ERROR:
            self.record.fail(now, f"error in the stream: {event.error}")
            return True
        if self.usage is None or self.usage.completion_tokens is None:
            self.record.fail(now, "the stream carried no usage chunk")
            return True
        self.record.prompt_tokens = self.usage.prompt_tokens
        self.record.finish(now, self.usage.completion_tokens)
        return True
