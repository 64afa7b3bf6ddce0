"""OpenAI response objects (chat and text completions, whole and streamed), built as plain dicts.

Shapes follow OpenAI's API reference: `chat.completion` / `chat.completion.chunk` and
`text_completion`; logprobs as `choices[].logprobs.content[]` (chat) or the legacy
`tokens/token_logprobs/top_logprobs/text_offset` lists (completions); usage with
`prompt_tokens`, `completion_tokens`, `total_tokens` and `prompt_tokens_details.cached_tokens`
(prompt tokens the boards served from KV rather than prefilled). No I/O; `ChoiceState`
accumulates one choice for the non-streamed answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calculet.client.types import TokenLogprob
from calculet.gateway.serving.choice import ChoiceDelta
from calculet.gateway.text.model_text import ModelText


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object.

    Args:
        prompt_tokens: each prompt once.
        completion_tokens: every choice's.
        cached_tokens: of `prompt_tokens`, those served from KV (`Prepared.cached_token_count`).
    Returns:
        `{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}`.
    """
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _token_entry(text: ModelText, token: int, logprob: float) -> dict[str, Any]:
    s = text.token_text(token)
    return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}


def chat_logprobs(text: ModelText, logprobs: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """`logprobs.content` entries of chat completions."""
    out = []
    for lp in logprobs:
        entry = _token_entry(text, lp.token, lp.logprob)
        entry["top_logprobs"] = [_token_entry(text, t, v) for t, v in lp.top]
        out.append(entry)
    return out


@dataclass
class CompletionLogprobs:
    """The legacy completions logprobs object, grown chunk by chunk."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, text: ModelText, logprobs: tuple[TokenLogprob, ...], offset: int) -> None:
        for lp in logprobs:
            s = text.token_text(lp.token)
            self.tokens.append(s)
            self.token_logprobs.append(lp.logprob)
            self.top_logprobs.append({text.token_text(t): v for t, v in lp.top})
            self.text_offset.append(offset)
            offset += len(s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


@dataclass
class ChoiceState:
    """One choice of a non-streamed answer."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    chat_lp: list[dict[str, Any]] = field(default_factory=list)
    legacy_lp: CompletionLogprobs = field(default_factory=CompletionLogprobs)

    def add(self, delta: ChoiceDelta, model_text: ModelText, chat: bool) -> None:
        if delta.logprobs:
            if chat:
                self.chat_lp.extend(chat_logprobs(model_text, delta.logprobs))
            else:
                self.legacy_lp.add(model_text, delta.logprobs, len(self.text))
        self.text += delta.text


def chat_response(
    rid: str, created: int, model: str, choices: list[ChoiceState], used: dict[str, Any], logprobs: bool
) -> dict[str, Any]:
    """A whole chat answer; `used`: its `usage` object."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": {"content": c.chat_lp} if logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": used,
    }


def completion_response(
    rid: str, created: int, model: str, choices: list[ChoiceState], used: dict[str, Any], logprobs: bool
) -> dict[str, Any]:
    """A whole text completion answer; `used`: its `usage` object."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": c.legacy_lp.as_dict() if logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": used,
    }


def chat_chunk(rid: str, created: int, model: str, choice: dict[str, Any] | None, with_usage: bool) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice] if choice is not None else [],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def completion_chunk(
    rid: str, created: int, model: str, choice: dict[str, Any] | None, with_usage: bool
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk
