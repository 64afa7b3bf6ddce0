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
from calculet.gateway.text.chat_output import ChatOutput, OutputPiece
from calculet.gateway.text.model_text import ModelText
from calculet.gateway.text.tool_calls import CallPart, ParsedCall


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
    """One choice of a non-streamed answer.

    Attributes:
        output: reads a chat answer's reasoning and tool calls (None: text completions, whose
            `text` is the answer).
    """

    index: int
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    chat_lp: list[dict[str, Any]] = field(default_factory=list)
    legacy_lp: CompletionLogprobs = field(default_factory=CompletionLogprobs)
    output: ChatOutput | None = None
    reasoning: str = ""
    calls: list[ParsedCall] = field(default_factory=list)

    def add(self, delta: ChoiceDelta, model_text: ModelText, chat: bool) -> None:
        if delta.logprobs:
            if chat:
                self.chat_lp.extend(chat_logprobs(model_text, delta.logprobs))
            else:
                self.legacy_lp.add(model_text, delta.logprobs, len(self.text))
        if self.output is None:
            self.text += delta.text
        else:
            self._take(self.output.feed(delta.text))

    def end(self, finish_reason: str) -> None:
        """The choice ended with the daemon's `finish_reason` (held text is read, calls counted)."""
        if self.output is not None:
            self._take(self.output.finish())
            finish_reason = self.output.finish_reason(finish_reason)
        self.finish_reason = finish_reason

    def message(self) -> dict[str, Any]:
        """The chat answer's `message`: content (null when only tool calls were made),
        `reasoning_content` when the answer reasoned, `tool_calls` when it called."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["content"] = self.text or None
            message["tool_calls"] = [tool_call(call) for call in self.calls]
        return message

    def _take(self, piece: OutputPiece) -> None:
        self.reasoning += piece.reasoning
        self.text += piece.content
        self.calls += piece.calls


def tool_call(call: ParsedCall) -> dict[str, Any]:
    """A call as OpenAI's `message.tool_calls[]` entry."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_delta(part: CallPart) -> dict[str, Any] | None:
    """A call's part as a streamed `delta.tool_calls` entry (None: its closing part, which OpenAI's
    stream does not mark): index, id and name first (with empty arguments, as OpenAI's first delta
    of a call), then pieces of the arguments."""
    if part.call is not None:
        return None
    if part.id is not None:
        function = {"name": part.name, "arguments": ""}
        return {"index": part.index, "id": part.id, "type": "function", "function": function}
    return {"index": part.index, "function": {"arguments": part.arguments}}


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
                "message": c.message(),
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
