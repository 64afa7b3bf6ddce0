"""`ToolCallParser`: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of an
answer's content, as OpenAI tool calls (Hermes' and Qwen3's format, which the calsim templates ask
for; docs/gateway.md "Tools and reasoning").

A block counts when its body is one JSON object with a string `name` and an object `arguments`
(absent: `{}`); the call's arguments are that object as a JSON string. A block that does not parse,
or never closes, stays content, word for word (as vLLM's hermes parser leaves it). The text between
blocks is content; the whitespace right before a block and right after a call is layout, not
content. A call is emitted when its block closes (not before: until then the block may still turn
out to be content). With `parallel` false only the first call is kept; later ones are dropped.
Nothing of a tag is ever emitted as content while it may still be one.

Ownership: one instance per choice; not thread-safe.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from calculet.gateway.text.tags import held_tail

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ParsedCall:
    """One tool call of an answer.

    Attributes:
        index: its position among the answer's calls (OpenAI's `tool_calls[].index`).
        id: `call_` and 24 hex digits.
        name: the function's name.
        arguments: its arguments as a JSON string.
    """

    index: int
    id: str
    name: str
    arguments: str


def parse_block(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON) of a block's body, or None when it is not a call."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


class ToolCallParser:
    """Finds the tool calls in one answer's content as it streams.

    Args:
        parallel: keep every call (OpenAI's `parallel_tool_calls`); False keeps only the first.
    """

    def __init__(self, parallel: bool = True) -> None:
        self._parallel = parallel
        self._in_block = False
        self._after_call = False  # whitespace from here on is layout
        self._held = ""
        self._layout = ""  # the whitespace before the open block: content again if it is no call
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        """The next piece of content.

        Args:
            text: new content text.
        Returns:
            (content that may be emitted now, calls whose blocks closed in it).
        """
        content: list[str] = []
        calls: list[ParsedCall] = []
        text = self._held + text
        self._held = ""
        while text:
            if self._in_block:
                end = text.find(CALL_CLOSE)
                if end < 0:
                    self._held, text = text, ""
                    break
                body, text = text[:end], text[end + len(CALL_CLOSE) :]
                self._in_block = False
                call = self._call(body)
                if call is None:
                    content.append(self._layout + CALL_OPEN + body + CALL_CLOSE)
                    self._after_call = False
                else:
                    calls.extend(call)
                    self._after_call = True
                continue
            if self._after_call:
                text = text.lstrip()
                if not text:
                    break
            start = text.find(CALL_OPEN)
            if start >= 0:
                before = text[:start]
                kept = before.rstrip()  # the layout before a block
                content.append(kept)
                self._layout = before[len(kept) :]
                self._in_block, text = True, text[start + len(CALL_OPEN) :]
                continue
            hold = held_tail(text, CALL_OPEN)
            body = text[: len(text) - hold]
            kept = body.rstrip()  # whitespace may be layout before a block: held until that is known
            self._held = body[len(kept) :] + text[len(text) - hold :]
            if kept:
                self._after_call = False
            content.append(kept)
            text = ""
        return "".join(content), calls

    def finish(self) -> str:
        """The end of the content: what was held, as content (an unclosed block included)."""
        held, self._held = self._held, ""
        if self._in_block:
            self._in_block = False
            return self._layout + CALL_OPEN + held
        return held

    def _call(self, body: str) -> list[ParsedCall] | None:
        """The call of a closed block ([] when it is one past the first without `parallel`)."""
        parsed = parse_block(body.strip())
        if parsed is None:
            return None
        if self.calls and not self._parallel:
            return []
        call = ParsedCall(len(self.calls), f"call_{secrets.token_hex(12)}", *parsed)
        self.calls.append(call)
        return [call]
