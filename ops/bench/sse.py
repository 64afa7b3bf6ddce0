"""Reading the gateway's `/v1/completions` SSE stream, one `data:` line at a time.

`parse_sse_line` classifies a line: a chunk with a choice whose text is not empty is a token
arrival (`TEXT`; it may also carry the finish reason); a choice with empty text is the end of the
choice (`FINISH`); a chunk without choices but with `usage` carries the token counts (`USAGE`); an
in-band `{"error": {...}}` (a failure after the stream started) is `ERROR`; `[DONE]` ends the
stream. Other lines (comments, blank separators, `event:` fields) give None. The gateway drops
token chunks that make no visible text yet (a partial UTF-8 sequence, text held back by a stop
string), so an SSE chunk may stand for several tokens; its token count is not in the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from calculet.common.errors import CalculetError


class SseKind(Enum):
    TEXT = "text"
    FINISH = "finish"
    USAGE = "usage"
    ERROR = "error"
    DONE = "done"


@dataclass(frozen=True)
class SseEvent:
    """One classified `data:` line; `prompt_tokens`/`completion_tokens` for USAGE, `error` for ERROR."""

    kind: SseKind
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


class SseFormatError(CalculetError):
    """A `data:` line that is not the JSON the OpenAI stream format promises (kind INTERNAL: the
    server broke the format)."""


DONE = "[DONE]"


def data_payload(line: str) -> dict[str, Any] | str | None:
    """The JSON object of a `data:` line, `DONE` for `data: [DONE]`, None for any other line.

    Raises:
        SseFormatError: a `data:` line whose payload is not a JSON object.
    """
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == DONE:
        return DONE
    try:
        obj: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise SseFormatError(f"not JSON: {payload[:80]!r}") from None
    if not isinstance(obj, dict):
        raise SseFormatError(f"not a JSON object: {payload[:80]!r}")
    return obj


def parse_sse_line(line: str) -> SseEvent | None:
    """Classify one line of the stream (see the module docstring).

    Raises:
        SseFormatError: a `data:` line whose payload is not a JSON object of the expected shape.
    """
    obj = data_payload(line)
    if obj is None:
        return None
    if isinstance(obj, str):
        return SseEvent(SseKind.DONE)
    if "error" in obj:
        return SseEvent(SseKind.ERROR, error=error_message(obj))
    choices = obj.get("choices") or []
    if choices:
        text = choices[0].get("text") if isinstance(choices[0], dict) else None
        return SseEvent(SseKind.TEXT if text else SseKind.FINISH)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        return SseEvent(SseKind.USAGE, _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))
    raise SseFormatError(f"neither choices, usage nor error: {line[5:].strip()[:80]!r}")


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SseFormatError(f"usage.{key} is {value!r}, not a token count")
    return value


def error_message(body: Any) -> str:
    """The message of an OpenAI error body `{"error": {"message": ...}}` (the body itself if not)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        kind = error.get("type") or error.get("code")
        return f"{kind}: {error['message']}" if kind else str(error["message"])
    return str(body)[:200]
