"""Tools and reasoning over HTTP (docs/gateway.md "Tools and reasoning"): the fake board's model
answers a scripted text, so each test knows exactly what the model wrote; the answer comes back
with `reasoning_content`, `tool_calls` and finish "tool_calls", whole and streamed, also as the
official `openai` client reads it; the tools, the history and `enable_thinking` reach the template
(the prompt the board got is decoded and checked)."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pytest
from starlette.testclient import TestClient
from tokenizers import Tokenizer

from calculet.ops.sim_packages.chat_template import QWEN_TEMPLATE_RESOURCE, load_chat_template
from tests.unit.gateway.fakes import ALIAS, FakeDaemon, byte_tokenizer_json, script_text
from tests.unit.gateway.harness import gateway

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ANSWER = (
    "<think>\nThe user wants the weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
TOKENIZER = Tokenizer.from_str(byte_tokenizer_json().decode())


def board(answer: str, template: str | None = None) -> FakeDaemon:
    # Byte tokens: the tools system turn alone is ~600 of them.
    daemon = FakeDaemon("a", chat_template=template or load_chat_template(QWEN_TEMPLATE_RESOURCE), context=4096)
    script_text(daemon, answer)
    return daemon


def prompt_of(daemon: FakeDaemon, i: int = 0) -> str:
    return TOKENIZER.decode(list(daemon.submitted[i].job.prompt_tokens), skip_special_tokens=False)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": "Weather in Paris?"}], **fields}


def stream_chunks(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    resp = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert resp.status_code == 200
    lines = [line for line in resp.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [orjson.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_a_tool_call_comes_back_as_tool_calls_with_the_reasoning_apart() -> None:
    daemon = board(ANSWER)
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(tools=[TOOL]))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["reasoning_content"] == "The user wants the weather."
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    prompt = prompt_of(daemon)
    assert "<tools>\n" + json.dumps(TOOL, sort_keys=True) + "\n</tools>" in prompt
    assert prompt.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_streamed_tool_calls_and_reasoning_come_as_openai_deltas() -> None:
    daemon = board("Sure.\n" + ANSWER.split("\n\n", 1)[1])  # content, then a call
    with gateway(daemon) as client:
        chunks = stream_chunks(client, chat(tools=[TOOL]))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert all(len(c) == 1 for c in calls)
    head, *args = [c[0] for c in calls]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    # The arguments in pieces, as the model writes them (the fake board sends a token a delta).
    assert len(args) == len('{"city": "Paris"}') and all(set(a) == {"index", "function"} for a in args)
    assert "".join(a["function"]["arguments"] for a in args) == '{"city": "Paris"}'
    assert all(a["index"] == 0 and set(a["function"]) == {"arguments"} for a in args)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("<" not in (d.get("content") or "") for d in deltas)  # no part of a tag leaked


def test_streamed_reasoning_never_leaks_a_tag() -> None:
    daemon = board("<think>\nStep.\n</think>\n\nHello!")
    with gateway(daemon) as client:
        chunks = stream_chunks(client, chat())
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Step."
    assert "".join(d.get("content") or "" for d in deltas) == "Hello!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_the_official_client_reads_calls_and_reasoning() -> None:
    daemon = board(ANSWER)
    with gateway(daemon) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        whole = client.chat.completions.create(
            model=ALIAS,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[TOOL],  # type: ignore[list-item]
        )
        call = whole.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        assert whole.choices[0].finish_reason == "tool_calls"
        assert whole.choices[0].message.reasoning_content == "The user wants the weather."
        streamed: dict[str, str] = {"name": "", "arguments": ""}
        for chunk in client.chat.completions.create(
            model=ALIAS,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[TOOL],
            stream=True,  # type: ignore[list-item]
        ):
            for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                streamed["name"] += (tc.function.name or "") if tc.function else ""
                streamed["arguments"] += (tc.function.arguments or "") if tc.function else ""
        assert streamed == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_tool_choice_none_offers_no_tools_and_parses_no_calls() -> None:
    daemon = board(ANSWER)
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(tools=[TOOL], tool_choice="none"))
    choice = resp.json()["choices"][0]
    assert "<tools>" not in prompt_of(daemon)
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == ANSWER.split("\n\n", 1)[1]  # the block stays content


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    block = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
    daemon = board(block.format("Paris") + "\n" + block.format("Rome"))
    with gateway(daemon) as client:
        both = client.post("/v1/chat/completions", json=chat(tools=[TOOL])).json()
        first = client.post("/v1/chat/completions", json=chat(tools=[TOOL], parallel_tool_calls=False)).json()
    assert [c["function"]["arguments"] for c in both["choices"][0]["message"]["tool_calls"]] == [
        '{"city": "Paris"}',
        '{"city": "Rome"}',
    ]
    assert [c["function"]["arguments"] for c in first["choices"][0]["message"]["tool_calls"]] == ['{"city": "Paris"}']


def test_enable_thinking_reaches_the_template() -> None:
    daemon = board("Hi.")
    with gateway(daemon) as client:
        body = chat(chat_template_kwargs={"enable_thinking": False})
        assert client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"] == {
            "role": "assistant",
            "content": "Hi.",
        }
        assert client.post("/v1/chat/completions", json=chat()).status_code == 200
    assert prompt_of(daemon, 0).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt_of(daemon, 1).endswith("<|im_start|>assistant\n")


def test_a_template_that_opens_the_think_block_makes_the_answer_reasoning_first() -> None:
    opens = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n<think>\n"
    )
    daemon = board("Thinking.\n</think>\n\nDone.", template=opens)
    with gateway(daemon) as client:
        message = client.post("/v1/chat/completions", json=chat()).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Done.", "reasoning_content": "Thinking."}


def test_a_history_of_calls_and_results_renders_through_the_template() -> None:
    daemon = board("It is 18C.")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json={"model": ALIAS, "messages": messages, "tools": [TOOL]})
    assert resp.json()["choices"][0]["message"] == {"role": "assistant", "content": "It is 18C."}
    assert prompt_of(daemon).endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools.0.function.name"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ],
)
def test_bad_tool_fields_are_400_naming_them(fields: dict[str, Any], param: str) -> None:
    daemon = board("x")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(**fields))
    assert resp.status_code == 400 and param in resp.json()["error"]["message"]
    assert daemon.submitted == []
