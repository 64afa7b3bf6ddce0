"""The chat request's tool fields, history messages with tool calls and results, and
`chat_template_kwargs`: accepted when well formed, a 400 naming the field otherwise."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from calculet.common.errors import InvalidArgument
from calculet.gateway.api.schemas import ChatCompletionRequest, parse_body

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
USER = {"role": "user", "content": "Weather?"}


def _req(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [USER], **fields}
    return parse_body(ChatCompletionRequest, orjson.dumps(body))


def test_history_with_tool_calls_and_results_is_accepted() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "X"}'}}
    req = _req(
        messages=[
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "assistant", "content": "It is 18C.", "reasoning_content": "easy"},
        ],
        tools=[TOOL],
    )
    views = [m.template_view() for m in req.messages]
    assert views[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert views[2] == {"role": "tool", "content": "18C", "tool_call_id": "call_1"}
    assert views[3] == {"role": "assistant", "content": "It is 18C.", "reasoning_content": "easy"}


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "user", "content": "18C", "tool_call_id": "call_1"}, "tool_call_id"),
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            "tool_calls",
        ),
        ({"role": "user", "content": "x", "reasoning_content": "r"}, "reasoning_content"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]},
            "messages.0.tool_calls.0.function.arguments",
        ),
    ],
)
def test_malformed_history_messages_name_the_field(message: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        _req(messages=[message])


def test_tools_and_choices_decide_what_the_template_gets() -> None:
    assert _req().template_tools() == (None, False)
    assert _req(tool_choice="none").template_tools() == (None, False)
    tools = [TOOL]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}, None):
        assert _req(tools=tools, tool_choice=choice).template_tools() == (tools, True)
    assert _req(tools=tools, tool_choice="none").template_tools() == (None, False)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools.0.function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
            "tools.0.function.parameters",
        ),
        ({"tool_choice": "sometimes", "tools": [TOOL]}, "tool_choice"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ],
)
def test_malformed_tool_fields_name_the_field(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        _req(**fields)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"tool_choice": "auto"}, "tool_choice: only allowed when tools are given"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "tool_choice.function.name: 'other' is not among the tools",
        ),
        ({"tools": [TOOL, TOOL]}, r"tools\[1\].function.name: 'get_weather' is given twice"),
    ],
)
def test_inconsistent_tool_fields_are_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        _req(**fields).template_tools()
