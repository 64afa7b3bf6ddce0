"""`ChatOutput`: one chat choice's text as OpenAI's message parts: reasoning, content and tool
calls (docs/gateway.md "Tools and reasoning").

Data flow: the choice's text deltas (after stop strings, `serving/choice.py`) -> the
`ReasoningSplitter` (an opening `<think>` block becomes `reasoning_content`) -> its content through
the `ToolCallParser` when the request offered tools (its `<tool_call>` blocks become `tool_calls`)
-> `OutputPiece`s, which the streamed answer sends as deltas and the whole answer accumulates.

Ownership: one instance per choice; not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calculet.gateway.text.reasoning import ReasoningSplitter
from calculet.gateway.text.tool_calls import CallPart, ParsedCall, ToolCallParser


@dataclass(frozen=True)
class OutputSpec:
    """How a request's chat answers are read.

    Attributes:
        in_think: the prompt ended inside an opened think block.
        parse_tools: the request offered tools (and `tool_choice` is not "none").
        parallel_tool_calls: keep every call, not only the first.
    """

    in_think: bool = False
    parse_tools: bool = False
    parallel_tool_calls: bool = True


@dataclass
class OutputPiece:
    """What a piece of the answer turned out to be (any part may be empty).

    Attributes:
        reasoning: think-block text.
        content: content text.
        calls: the tool calls that ended in it (whole answers read these).
        call_parts: the calls' streamed parts in it, in order (streamed answers send these).
    """

    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    call_parts: list[CallPart] = field(default_factory=list)


class ChatOutput:
    """Reads one chat choice's text.

    Args:
        spec: the request's `OutputSpec`.
    """

    def __init__(self, spec: OutputSpec) -> None:
        self._reasoning = ReasoningSplitter(spec.in_think)
        self._tools = ToolCallParser(spec.parallel_tool_calls) if spec.parse_tools else None

    @property
    def called(self) -> bool:
        """Whether the answer made a tool call."""
        return self._tools is not None and bool(self._tools.calls)

    @property
    def part(self) -> str:
        """Where the text fed so far ends (`ReasoningSplitter.part`)."""
        return self._reasoning.part

    def feed(self, text: str) -> OutputPiece:
        """The next text of the answer: what of it may be sent now."""
        reasoning, content = self._reasoning.feed(text)
        return self._content(reasoning, content, final=False)

    def finish(self) -> OutputPiece:
        """The end of the answer: everything still held."""
        reasoning, content = self._reasoning.finish()
        return self._content(reasoning, content, final=True)

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish reason: "tool_calls" when the answer ended normally with calls made."""
        return "tool_calls" if reason == "stop" and self.called else reason

    def _content(self, reasoning: str, content: str, *, final: bool) -> OutputPiece:
        if self._tools is None:
            return OutputPiece(reasoning, content)
        piece = self._tools.feed(content)
        if final:
            end = self._tools.finish()
            piece.content += end.content
            piece.calls += end.calls
            piece.parts += end.parts
        return OutputPiece(reasoning, piece.content, piece.calls, piece.parts)
