"""The requests of `--workload structured` and `--workload tools`, and the check of each answer.

Request i is drawn from `random.Random(f"calctl-bench:{seed}:structured:{i}")`, so a run and its
re-run send the same schemas whatever the schedule:
- `structured`: a chat request with `response_format` json_schema (strict) over a bounded
  `schemas.object_schema`; valid when the answer's content is JSON that validates against it.
- `tools`: a chat request with a `schemas.tool_set` and `tool_choice` alternately `required` and
  one of the functions named (`parallel_tool_calls: false`); valid when the answer makes exactly one
  call, of an offered function (the named one when named), whose arguments validate against its
  parameters, and its finish reason is `tool_calls`.
Thinking is off (`chat_template_kwargs.enable_thinking: false`) unless a thinking budget is given,
which goes as `thinking_token_budget`; the grammar applies after the think block either way.

`ChatAnswer` is what the backend read of one streamed answer; `check` judges it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from calculet.ops.bench.structured.schemas import Json, object_schema, parsed, response_format, tool_set, validates
from calculet.ops.bench.workload import BenchRequest

PROMPT = "Describe item {index} as JSON."


class StructuredKind(Enum):
    """Which workload."""

    STRUCTURED = "structured"
    TOOLS = "tools"


@dataclass
class ChatAnswer:
    """One streamed chat answer as read: its content, its calls by index (name, arguments) and its
    finish reason (None: the stream ended without one)."""

    content: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add_call_delta(self, entry: dict[str, Any]) -> None:
        """One `delta.tool_calls` entry: its name and arguments piece appended to its call's."""
        call = self.calls.setdefault(int(entry.get("index", 0)), ["", ""])
        function = entry.get("function") or {}
        call[0] += function.get("name") or ""
        call[1] += function.get("arguments") or ""


@dataclass(frozen=True)
class Expectation:
    """What one request's answer must be.

    Attributes:
        schema: the content's schema (`structured`).
        parameters: each offered function's parameters by name (`tools`).
        named: the function `tool_choice` named (None: `required`).
    """

    schema: Json | None = None
    parameters: dict[str, Json] | None = None
    named: str | None = None


class StructuredWorkload:
    """The requests and checks of one run (module docstring).

    Args:
        kind: structured or tools.
        seed: the run's `--seed`.
        thinking_budget: `thinking_token_budget` of every request (None: thinking off).
    """

    def __init__(self, kind: StructuredKind, seed: int, thinking_budget: int | None = None) -> None:
        self.kind, self.seed, self.thinking_budget = kind, seed, thinking_budget

    def requests(self, count: int, max_tokens: int) -> list[BenchRequest]:
        """`count` requests (their chat fields come from `fields`)."""
        return [BenchRequest(i, max_tokens, prompt_text=PROMPT.format(index=i)) for i in range(count)]

    def fields(self, index: int) -> tuple[dict[str, Any], Expectation]:
        """Request `index`'s chat fields beyond messages, max_tokens and seed, and its expectation."""
        rng = random.Random(f"calctl-bench:{self.seed}:structured:{index}")
        thinking: dict[str, Any] = (
            {"chat_template_kwargs": {"enable_thinking": False}}
            if self.thinking_budget is None
            else {"thinking_token_budget": self.thinking_budget}
        )
        if self.kind is StructuredKind.STRUCTURED:
            schema = object_schema(rng)
            return {"response_format": response_format(schema), **thinking}, Expectation(schema=schema)
        tools = tool_set(rng)
        parameters = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        named = tools[index % len(tools)]["function"]["name"] if index % 2 else None
        choice: Any = {"type": "function", "function": {"name": named}} if named else "required"
        fields = {"tools": tools, "tool_choice": choice, "parallel_tool_calls": False, **thinking}
        return fields, Expectation(parameters=parameters, named=named)

    def describe(self) -> dict[str, Any]:
        return {"source": self.kind.value, "thinking_budget": self.thinking_budget}


def check(expect: Expectation, answer: ChatAnswer) -> str | None:
    """Why the answer is not what was asked, or None when it is."""
    if expect.schema is not None:
        ok, value = parsed(answer.content)
        if not ok:
            return f"content is not JSON (finish {answer.finish_reason})"
        return None if validates(value, expect.schema) else "content does not validate"
    if answer.finish_reason != "tool_calls":
        return f"finish reason {answer.finish_reason}, not tool_calls"
    if len(answer.calls) != 1:
        return f"{len(answer.calls)} calls, not 1"
    ((name, arguments),) = answer.calls.values()
    assert expect.parameters is not None
    if name not in expect.parameters or (expect.named is not None and name != expect.named):
        return f"called {name!r}"
    ok, value = parsed(arguments)
    if not ok:
        return "arguments are not JSON"
    return None if validates(value, expect.parameters[name]) else "arguments do not validate"
