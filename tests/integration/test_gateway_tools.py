"""Tools through a real gateway and a qwen board (calsim, the qwen3-30b-a3b package and its
Qwen3-convention template), with the official `openai` client: `tools=[...]`, a history of a call
and its `role: "tool"` result, and `chat_template_kwargs.enable_thinking` are accepted, and the
prompt the board got is the package template's rendering of exactly them (usage's prompt tokens
and the seeded text match an oracle that renders and generates without the gateway), and `/tokenize`
gives those ids, `/detokenize` their text. `required` and named calls hold, their arguments
streamed in pieces, and a call begun under `auto` is held to the grammar from its tag on. The
synthetic model hardly writes calls by itself; how calls and reasoning are parsed is tested with
scripted answers (tests/unit/gateway/test_tools_reasoning_api.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calculet.gateway.text.tool_calls import CALL_OPEN, ToolCallParser
from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.local_fleet import local_fleet

pytestmark = pytest.mark.integration
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4C and rain"},
]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[tuple[GatewayProcess, Oracle]]:
    with local_fleet(tmp_path_factory.mktemp("tools"), models_root, [["--model", "qwen=qwen"]]) as (daemons, gw):
        yield gw, Oracle(daemons[0].target, "qwen")


def _expected(oracle: Oracle, seed: int, **template_vars: Any) -> tuple[list[int], str, str]:
    """(prompt ids, prompt text, answer text) rendered and generated without the gateway, under the
    constraint and the unbounded thinking budget the gateway sends with tools (`tool_choice: auto`)."""
    views = [*MESSAGES[:2], {**MESSAGES[2], "content": ""}, MESSAGES[3]]
    text = oracle.template.render(messages=views, add_generation_prompt=True, **template_vars)
    prompt = list(oracle.tokenizer.encode(text, add_special_tokens=False).ids)
    sent = oracle.auto_tools(TOOLS, thinking=template_vars.get("enable_thinking") is not False)
    return prompt, text, oracle.text(oracle.tokens(prompt, seed=seed, max_tokens=16, **sent))


def test_tools_and_a_tool_history_reach_the_template(qwen: tuple[GatewayProcess, Oracle]) -> None:
    gateway, oracle = qwen
    prompt, text, answer = _expected(oracle, 7, tools=TOOLS)
    assert "<tools>" in text and "<tool_response>\n4C and rain\n</tool_response>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    with gateway.openai() as client:
        r = client.chat.completions.create(
            model="qwen",
            messages=MESSAGES,
            tools=TOOLS,
            max_tokens=16,
            seed=7,  # type: ignore[arg-type]
        )
    assert r.usage is not None and r.usage.prompt_tokens == len(prompt)
    assert r.choices[0].message.content == answer and r.choices[0].message.tool_calls is None


def test_enable_thinking_false_reaches_the_template(qwen: tuple[GatewayProcess, Oracle]) -> None:
    gateway, oracle = qwen
    prompt, text, answer = _expected(oracle, 9, tools=TOOLS, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with gateway.openai() as client:
        r = client.chat.completions.create(
            model="qwen", messages=MESSAGES, tools=TOOLS, max_tokens=16, seed=9,  # type: ignore[arg-type]
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )  # fmt: skip
    assert r.usage is not None and r.usage.prompt_tokens == len(prompt)
    assert r.choices[0].message.content == answer


def test_tokenize_gives_the_ids_a_chat_request_submits(qwen: tuple[GatewayProcess, Oracle]) -> None:
    gateway, oracle = qwen
    prompt, text, _ = _expected(oracle, 7, tools=TOOLS)
    with gateway.http() as client:
        got = client.post("/tokenize", json={"model": "qwen", "messages": MESSAGES, "tools": TOOLS}).json()
        back = client.post("/detokenize", json={"model": "qwen", "tokens": got["tokens"]}).json()
    assert got["tokens"] == prompt and got["count"] == len(prompt) and got["max_model_len"] > len(prompt)
    assert back == {"prompt": text}


BOUNDED = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"enum": ["Oslo", "Rome"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choice_are_enforced(qwen: tuple[GatewayProcess, Oracle], stream: bool) -> None:
    """The synthetic model writes random tokens: every call here was made so by the board's grammar."""
    gateway, _ = qwen
    named = {"type": "function", "function": {"name": "get_weather"}}
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    with gateway.openai() as client:
        for seed, choice in [(s, c) for s in range(3) for c in ("required", named)]:
            kwargs: dict[str, Any] = dict(model="qwen", messages=messages, tools=BOUNDED, tool_choice=choice,
                                          parallel_tool_calls=False, max_tokens=64, seed=seed)  # fmt: skip
            if stream:
                calls: dict[int, dict[str, str]] = {}
                finish, pieces = None, 0
                for chunk in client.chat.completions.create(stream=True, **kwargs):
                    for delta in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                        entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                        entry["name"] += delta.function.name or "" if delta.function else ""
                        entry["arguments"] += delta.function.arguments or "" if delta.function else ""
                        pieces += bool(delta.function and delta.function.arguments)
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                got = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
                # The arguments in pieces, as the board writes them (`{}` is one token).
                assert pieces > 1 or got == [("get_time", "{}")], got
            else:
                r = client.chat.completions.create(**kwargs)
                finish = r.choices[0].finish_reason
                got = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or ()]
            assert finish == "tool_calls", (seed, choice, got)
            ((name, arguments),) = got
            args = json.loads(arguments)
            if choice == named or name == "get_weather":
                assert name == "get_weather" and args["city"] in ("Oslo", "Rome") and 1 <= args["days"] <= 7
                assert set(args) == {"city", "days"}
            else:
                assert (name, args) == ("get_time", {})


@pytest.mark.parametrize("seed", range(4))
def test_a_call_the_model_begins_under_auto_is_constrained_from_its_tag(
    qwen: tuple[GatewayProcess, Oracle], seed: int
) -> None:
    """The synthetic model hardly ever opens a call by itself (one token in 151,936), so the answer
    here already has some text and the opening tag (resume tokens, as after a failover): the board
    replays the lazy grammar over them, and from there writes one call that validates, then stops."""
    _, oracle = qwen
    prompt = oracle.chat_prompt([{"role": "user", "content": "Weather in Oslo?"}])
    begun = oracle.tokenizer.encode("Let me check. " + CALL_OPEN, add_special_tokens=False).ids
    grammar = oracle.auto_tools(BOUNDED, parallel=False)["constraint"]
    rest = oracle.tokens(prompt, seed=seed, max_tokens=64, constraint=grammar, resume=begun)
    parser = ToolCallParser(parallel=False)
    text = oracle.tokenizer.decode(begun + rest, skip_special_tokens=False)
    piece, end = parser.feed(text.split("<|im_end|>")[0]), parser.finish()
    ((call,),) = [piece.calls + end.calls]
    assert call.complete and piece.content + end.content == "Let me check.", text
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert args["city"] in ("Oslo", "Rome") and 1 <= args["days"] <= 7
    else:
        assert (call.name, args) == ("get_time", {})
    # Ended by the grammar (its close, after which nothing may follow), not by max_tokens.
    assert len(rest) < 64 and rest[-1] == oracle.tokenizer.token_to_id("</tool_call>"), text
