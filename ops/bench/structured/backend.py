"""`StructuredBackend`: the requests of `--workload structured|tools` through the gateway's OpenAI
`/v1/chat/completions`, streamed, each answer checked (docs/benchmarking.md).

Each request is one POST with the user message `BenchRequest.prompt_text`, `max_tokens`, `seed` =
`--seed` + its index, the sampling flags, `stream: true`, `stream_options.include_usage: true` and
the workload's fields for its index (`workload.StructuredWorkload.fields`: the schema, or the tools
and tool choice, and thinking). The body is encoded before the clock starts. Times as in
`gateway_backend`: `start` just before the POST, each chunk that carries answer (content, reasoning
or a tool call's delta) when its line was read, `end` at `data: [DONE]`; token counts from the final
usage chunk. The answer read from the deltas goes to `workload.check`; its verdict is kept by index
in `verdicts` (a failed request has none). Failures (connection, HTTP errors, an in-band error, a
stream cut before `[DONE]`, a malformed chunk) become failed records, never exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from calculet.ops.bench.backend import BenchBackend, BenchSampling
from calculet.ops.bench.gateway_backend import GatewayAddress, body_error
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.sse import SseFormatError, data_payload, error_message
from calculet.ops.bench.structured.workload import ChatAnswer, StructuredWorkload, check
from calculet.ops.bench.workload import BenchRequest

CHAT_COMPLETIONS = "/v1/chat/completions"


@dataclass(frozen=True)
class Verdict:
    """One answer's check: `problem` None when valid; its finish reason."""

    problem: str | None
    finish_reason: str | None


class StructuredBackend(BenchBackend):
    """Streams and checks structured or tool-call chat answers (module docstring).

    Args:
        http: a client from `gateway_backend.open_http` (owned: `close` closes it).
        address: the gateway's address (for the report).
        model: the model alias.
        workload: the requests' fields and checks.
        seed: request i samples with seed `seed + i`.
        sampling: the sampling flags.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        address: GatewayAddress,
        model: str,
        workload: StructuredWorkload,
        *,
        seed: int,
        sampling: BenchSampling | None = None,
    ) -> None:
        self._http, self._address, self._model, self._workload = http, address, model, workload
        self._seed = seed
        self._sampling = (sampling or BenchSampling()).fields()
        self.verdicts: dict[int, Verdict] = {}

    async def prepare(self, requests: Sequence[BenchRequest]) -> list[BenchRequest]:
        return list(requests)

    def body(self, request: BenchRequest, fields: dict[str, Any] | None = None) -> dict[str, Any]:
        """The request's body (`fields`: its workload fields, drawn already, else drawn here)."""
        if fields is None:
            fields, _ = self._workload.fields(request.index)
        return {
            "model": self._model,
            "messages": [{"role": "user", "content": request.prompt_text}],
            "max_tokens": request.max_tokens,
            "seed": self._seed + request.index,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self._sampling,
            **fields,
        }

    async def send(self, request: BenchRequest) -> RequestRecord:
        fields, expect = self._workload.fields(request.index)  # drawn once: the body and the check
        content = orjson.dumps(self.body(request, fields))
        headers = {"Content-Type": "application/json"}
        record = RequestRecord(request.index, request.max_tokens, time.perf_counter())
        answer = ChatAnswer()
        try:
            async with self._http.stream("POST", CHAT_COMPLETIONS, content=content, headers=headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    record.fail(time.perf_counter(), f"HTTP {response.status_code}: {body_error(response)}")
                else:
                    await _read(response, record, answer)
        except httpx.HTTPError as err:
            record.fail(time.perf_counter(), f"{type(err).__name__}: {err}")
        except SseFormatError as err:
            record.fail(time.perf_counter(), f"bad stream: {err}")
        if record.ok:
            self.verdicts[request.index] = Verdict(check(expect, answer), answer.finish_reason)
        return record

    async def close(self) -> None:
        await self._http.aclose()

    def describe(self) -> dict[str, object]:
        return {"kind": "gateway", "address": self._address.text, "api": "chat"}


async def _read(response: httpx.Response, record: RequestRecord, answer: ChatAnswer) -> None:
    """Record one stream's answer chunks until `[DONE]`, then finish or fail the record."""
    completion_tokens: int | None = None
    async for line in response.aiter_lines():
        now = time.perf_counter()
        event = data_payload(line)
        if event is None:
            continue
        if isinstance(event, str):  # `data: [DONE]`
            if completion_tokens is None:
                record.fail(now, "the stream carried no usage chunk")
            else:
                record.finish(now, completion_tokens)
            return
        if "error" in event:
            record.fail(now, f"error in the stream: {error_message(event)}")
            return
        if event.get("usage"):
            completion_tokens = event["usage"].get("completion_tokens")
            record.prompt_tokens = event["usage"].get("prompt_tokens")
        if _take(event, answer):
            record.arrived(now, None)
    record.fail(time.perf_counter(), "the stream ended before data: [DONE]")


def _take(event: dict[str, Any], answer: ChatAnswer) -> bool:
    """Add a chunk's deltas to the answer; True when it carried any of the answer."""
    carried = False
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            answer.content += delta["content"]
            carried = True
        if delta.get("reasoning_content"):
            carried = True
        for entry in delta.get("tool_calls") or ():
            answer.add_call_delta(entry)
            carried = True
        if choice.get("finish_reason"):
            answer.finish_reason = choice["finish_reason"]
    return carried
