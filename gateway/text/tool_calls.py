"""`ToolCallParser`: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of an
answer's content, as OpenAI tool calls (Hermes' and Qwen3's format, which the calsim templates ask
for; docs/gateway.md "Tools and reasoning").

A block counts when its body is one JSON object with a string `name` and an object `arguments`
(absent: `{}`); the call's arguments are that object's text. The text between blocks is content;
the whitespace right before a block and right after a call is layout, not content. With `parallel`
false only the first call is kept; later ones are dropped. Nothing of a tag is ever emitted as
content while it may still be one.

Streaming: a call is announced as soon as its block's head, `{"name": "...", "arguments": `, has
arrived (a `CallPart` with its id and name), its arguments follow in pieces as they arrive, and a
last part closes it (OpenAI's chunk shape: name first, arguments in pieces). The gateway constrains
every call it parses (`api/tool_grammar.py`), so a block whose head arrived is a call: one cut short
by `max_tokens` stays a call, with the arguments it has (as OpenAI's, with `finish_reason: "length"`).
A block whose head is any other JSON is read when it closes: a call if it parses, else content word
for word (as vLLM's hermes parser leaves it), as is a block that never closes.

Ownership: one instance per choice; not thread-safe.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from calculet.gateway.text.tags import held_tail

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


# A call's head, up to its arguments object (the name a JSON string): `{"name": "f", "arguments": {`.
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')


@dataclass(frozen=True)
class ParsedCall:
    """One tool call of an answer.

    Attributes:
        index: its position among the answer's calls (OpenAI's `tool_calls[].index`).
        id: `call_` and 24 hex digits.
        name: the function's name.
        arguments: its arguments as a JSON string.
        complete: its block closed (False: the answer was cut in its arguments).
    """

    index: int
    id: str
    name: str
    arguments: str
    complete: bool = True


@dataclass(frozen=True)
class CallPart:
    """A piece of a streamed call, in the answer's order: the first of a call has its `id` and
    `name` (and no arguments), the next ones pieces of its arguments, the last its whole `call`.

    Attributes:
        index: the call's position among the answer's calls.
        id: the call's id (first part only).
        name: the function's name (first part only).
        arguments: a piece of the arguments' text ("" in the first and last parts).
        call: the whole call (last part only).
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    call: ParsedCall | None = None


@dataclass
class ToolPiece:
    """What a piece of content turned out to be.

    Attributes:
        content: content that may be emitted now.
        calls: calls that ended in it (closed, or cut by the answer's end).
        parts: the streamed calls' parts in it, in order.
    """

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    parts: list[CallPart] = field(default_factory=list)


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


class _ObjectEnd:
    """Finds where a JSON object that starts a text ends, the text fed piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.done = False
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> int:
        """How many characters of `text` belong to the object (all of them until it ends)."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


@dataclass
class _Streamed:
    """The call of the open block, announced: its arguments start at `start` of the body."""

    index: int
    id: str
    name: str
    start: int
    arguments: str = ""
    end: _ObjectEnd = field(default_factory=_ObjectEnd)

    def call(self) -> ParsedCall:
        return ParsedCall(self.index, self.id, self.name, self.arguments, complete=self.end.done)


def _call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    """Finds the tool calls in one answer's content as it streams.

    Args:
        parallel: keep every call (OpenAI's `parallel_tool_calls`); False keeps only the first.
    """

    def __init__(self, parallel: bool = True) -> None:
        self._parallel = parallel
        self._in_block = False
        self._after_call = False  # whitespace from here on is layout
        self._held = ""  # text that may begin a tag
        self._body = ""  # the open block's body so far
        self._streamed: _Streamed | None = None  # the open block's announced call
        self._layout = ""  # the whitespace before the open block: content again if it is no call
        self._count = 0  # calls announced or read
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> ToolPiece:
        """The next piece of content.

        Args:
            text: new content text.
        Returns:
            The content that may be emitted now, the calls that ended and the streamed parts.
        """
        out = ToolPiece()
        content: list[str] = []
        text = self._held + text
        self._held = ""
        while text:
            if self._in_block:
                end = text.find(CALL_CLOSE)
                if end < 0:
                    hold = held_tail(text, CALL_CLOSE)
                    self._body += text[: len(text) - hold]
                    self._held = text[len(text) - hold :]
                    self._stream(out)
                    break
                self._body += text[:end]
                text = text[end + len(CALL_CLOSE) :]
                content.append(self._close(out))
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
                self._in_block, self._body, text = True, "", text[start + len(CALL_OPEN) :]
                continue
            hold = held_tail(text, CALL_OPEN)
            body = text[: len(text) - hold]
            kept = body.rstrip()  # whitespace may be layout before a block: held until that is known
            self._held = body[len(kept) :] + text[len(text) - hold :]
            if kept:
                self._after_call = False
            content.append(kept)
            text = ""
        out.content = "".join(content)
        return out

    def finish(self) -> ToolPiece:
        """The end of the content: what was held, as content (an unclosed block included, unless
        its call was announced: that call ends with the arguments it has)."""
        out = ToolPiece()
        held, self._held = self._held, ""
        if not self._in_block:
            out.content = held
            return out
        self._in_block = False
        if self._streamed is not None:
            self._end(out, self._streamed.call())
            return out
        out.content = self._layout + CALL_OPEN + self._body + held
        return out

    def _stream(self, out: ToolPiece) -> None:
        """Announce the open block's call once its head is there, and pass on new arguments."""
        streamed = self._streamed
        if streamed is None:
            head = HEAD.match(self._body)
            if head is None or not (self._parallel or self._count == 0):
                return
            name = json.loads(head.group(1))
            if not name:
                return
            streamed = self._streamed = _Streamed(self._count, _call_id(), name, head.end())
            self._count += 1
            out.parts.append(CallPart(streamed.index, id=streamed.id, name=name))
        if streamed.end.done:
            return
        new = self._body[streamed.start + len(streamed.arguments) :]
        piece = new[: streamed.end.feed(new)]
        if piece:
            streamed.arguments += piece
            out.parts.append(CallPart(streamed.index, arguments=piece))

    def _close(self, out: ToolPiece) -> str:
        """The open block closed: its call (announced, or read now), or its text as content."""
        self._in_block = False
        self._stream(out)
        if self._streamed is not None:
            self._end(out, self._streamed.call())
            return ""
        parsed = parse_block(self._body.strip())
        if parsed is None:
            self._after_call = False
            return self._layout + CALL_OPEN + self._body + CALL_CLOSE
        self._after_call = True
        if self._count and not self._parallel:
            return ""
        call = ParsedCall(self._count, _call_id(), *parsed)
        self._count += 1
        out.parts += [CallPart(call.index, id=call.id, name=call.name), CallPart(call.index, arguments=call.arguments)]
        self._end(out, call)
        return ""

    def _end(self, out: ToolPiece, call: ParsedCall) -> None:
        self._streamed = None
        self._after_call = True
        self.calls.append(call)
        out.calls.append(call)
        out.parts.append(CallPart(call.index, call=call))
