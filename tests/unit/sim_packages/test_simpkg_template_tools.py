"""The calsim chat templates' tools and reasoning conventions (Qwen3's): tools in the system turn,
assistant tool calls, tool results, reasoning blocks and `enable_thinking`; both shipped templates
render alike, and a conversation without any of these renders as before, byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from calculet.ops.sim_packages.chat_template import (
    QWEN_TEMPLATE_RESOURCE,
    TEMPLATE_RESOURCE,
    load_chat_template,
    render_chat,
)
from calculet.ops.sim_packages.golden import GOLDEN_MESSAGES

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS_TURN = (
    "# Tools\n\nThese functions are available; call any of them when it helps answer.\n\n"
    "Their signatures, one JSON object a line, inside <tools></tools>:\n<tools>\n"
    + json.dumps(WEATHER, sort_keys=True)
    + "\n</tools>\n\nTo call a function, write its name and arguments as one JSON object inside "
    "<tool_call></tool_call>, a block per call:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call><|im_end|>\n'
)
# The plain ChatML the templates rendered before tools and reasoning (the golden prompt's shape).
PLAIN_CASES: list[list[dict[str, Any]]] = [
    list(GOLDEN_MESSAGES),
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": ""}],
    [{"role": "assistant", "content": None}],
]


def _plain(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content'] or ''}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _render(resource: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kw: Any) -> str:
    """The rendering, checked to be the same in Jinja2's defaults and the gateway's settings."""
    template = load_chat_template(resource)
    envs = [SandboxedEnvironment(), ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)]
    out = {env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **kw)
           for env in envs}  # fmt: skip
    assert len(out) == 1, out
    return out.pop()


RESOURCES = [TEMPLATE_RESOURCE, QWEN_TEMPLATE_RESOURCE]


@pytest.mark.parametrize("resource", RESOURCES)
@pytest.mark.parametrize("messages", PLAIN_CASES)
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_without_tools_or_thinking_the_rendering_is_plain_chatml(
    resource: str, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    expected = _plain(messages, add_generation_prompt)
    assert _render(resource, messages, add_generation_prompt) == expected
    assert _render(resource, messages, add_generation_prompt, tools=None) == expected  # the gateway passes None
    assert _render(resource, messages, add_generation_prompt, tools=[]) == expected


@pytest.mark.parametrize("resource", RESOURCES)
def test_tools_join_the_first_system_message(resource: str) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    assert _render(resource, messages, tools=[WEATHER]) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_TURN
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )  # fmt: skip


@pytest.mark.parametrize("resource", RESOURCES)
def test_tools_without_a_system_message_get_their_own_system_turn(resource: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert _render(resource, messages, tools=[WEATHER]) == (
        "<|im_start|>system\n" + TOOLS_TURN + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("resource", RESOURCES)
def test_tool_calls_and_results_render_as_blocks(resource: str) -> None:
    second = {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
    messages = [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL, second]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "still 18C"},
    ]
    assert _render(resource, messages, add_generation_prompt=False) == (
        "<|im_start|>user\nParis and Rome?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n25C\n</tool_response><|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nstill 18C\n</tool_response><|im_end|>\n"
    )


@pytest.mark.parametrize("resource", RESOURCES)
def test_reasoning_content_is_a_think_block(resource: str) -> None:
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "\nadd\n"},
    ]
    assert _render(resource, messages, add_generation_prompt=False) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n"
    )


@pytest.mark.parametrize("resource", RESOURCES)
def test_enable_thinking_false_closes_an_empty_think_block(resource: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    head = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert _render(resource, messages, enable_thinking=False) == head + "<think>\n\n</think>\n\n"
    assert _render(resource, messages, enable_thinking=True) == head
    assert _render(resource, messages, add_generation_prompt=False, enable_thinking=False) == head[: -len(
        "<|im_start|>assistant\n"
    )]  # fmt: skip


def test_render_chat_passes_tools_and_kwargs() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    text = render_chat(
        load_chat_template(), messages, add_generation_prompt=True, tools=[WEATHER], enable_thinking=False
    )
    assert text.startswith("<|im_start|>system\n# Tools") and text.endswith("<think>\n\n</think>\n\n")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text


@pytest.mark.parametrize("resource", RESOURCES)
def test_markup_characters_pass_through_unescaped(resource: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"html": "<b>&</b>"}}}
    messages = [
        {"role": "assistant", "content": "a <b> & c", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "<i>x & y</i>"},
    ]
    text = _render(resource, messages, add_generation_prompt=False)
    assert "a <b> & c\n<tool_call>" in text and "<tool_response>\n<i>x & y</i>\n</tool_response>" in text
    # tojson writes <, > and & as JSON escapes: still the same JSON value.
    assert '"arguments": {"html": "\\u003cb\\u003e\\u0026\\u003c/b\\u003e"}}' in text
