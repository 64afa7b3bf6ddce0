"""Reading the gateway's `/v1/chat/completions` SSE stream, one `data:` line at a time.

`parse_chat_line` classifies a line: a chunk whose first choice's `delta.content` is a non-empty
string is a token arrival (`TEXT`, with the text); any other choice chunk (the opening
`{"role": "assistant", "content": ""}`, the finish chunk with an empty delta) is `OTHER`; a chunk
without choices but with `usage` carries the counts (`USAGE`: `prompt_tokens`,
`completion_tokens`, and `prompt_tokens_details.cached_tokens`, None when the server does not
report it); an in-band `{"error": {...}}` is `ERROR`; `[DONE]` ends the stream. Lines that are not
`data:` (comments, blank separators) give None. Like the completions stream (`sse.py`), a chunk may
stand for several tokens; their count is not in the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from calculet.ops.bench.sse import SseFormatError, data_payload, error_message


class ChatKind(Enum):
    TEXT = "text"
    OTHER = "other"
    USAGE = "usage"
    ERROR = "error"
    DONE = "done"


@dataclass(frozen=True)
class ChatEvent:
    """One classified line: `text` for TEXT; the counts for USAGE (`cached_tokens` None when the
    usage has no `prompt_tokens_details.cached_tokens`); `error` for ERROR."""

    kind: ChatKind
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


def parse_chat_line(line: str) -> ChatEvent | None:
    """Classify one line of a chat stream (module docstring).

    Raises:
        SseFormatError: a `data:` line whose payload is not a JSON object of the expected shape.
    """
    obj = data_payload(line)
    if obj is None:
        return None
    if isinstance(obj, str):
        return ChatEvent(ChatKind.DONE)
    if "error" in obj:
        return ChatEvent(ChatKind.ERROR, error=error_message(obj))
    choices = obj.get("choices") or []
    if choices:
        delta = choices[0].get("delta") if isinstance(choices[0], dict) else None
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            return ChatEvent(ChatKind.TEXT, text=content)
        return ChatEvent(ChatKind.OTHER)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        return ChatEvent(
            ChatKind.USAGE,
            prompt_tokens=_count(usage, "prompt_tokens"),
            completion_tokens=_count(usage, "completion_tokens"),
            cached_tokens=_cached(usage),
        )
    raise SseFormatError(f"neither choices, usage nor error: {line[5:].strip()[:80]!r}")


def _count(usage: dict[str, Any], key: str, where: str = "usage") -> int:
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SseFormatError(f"{where}.{key} is {value!r}, not a token count")
    return value


def _cached(usage: dict[str, Any]) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, None when absent or null (not reported)."""
    details = usage.get("prompt_tokens_details")
    if details is None:
        return None
    if not isinstance(details, dict):
        raise SseFormatError(f"usage.prompt_tokens_details is {details!r}, not an object")
    if details.get("cached_tokens") is None:
        return None
    return _count(details, "cached_tokens", "usage.prompt_tokens_details")
