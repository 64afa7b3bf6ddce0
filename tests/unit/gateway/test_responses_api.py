"""The Responses API (docs/gateway.md "Responses API") over the fake board, whose model answers a
scripted text: input forms render as the equivalent chat request renders (the prompt the board got
is decoded and compared), the output items, usage and incomplete status, the stream's events in
OpenAI's order and shapes, the official `openai` client reading both, and every refusal naming its
field before any board is asked."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import orjson
import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient

from calculet.common.errors import Unavailable
from calculet.gateway.api.responses_schema import ResponsesRequest
from calculet.gateway.api.responses_stream import sse_response
from calculet.gateway.serving.choice import ChoiceDelta, ChoiceEvent
from calculet.gateway.serving.service import Prepared
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.test_tools_reasoning_api import ANSWER, TOOL, board, gateway, prompt_of

FLAT_TOOL = {"type": "function", **TOOL["function"]}
THINK = "<think>\nThe user wants the weather.\n</think>\n\n"
HELLO = "<think>\nStep.\n</think>\n\nHello!"


PARIS = '{"city": "Paris"}'


def text(kind: str, value: str) -> dict[str, str]:
    return {"type": kind, "text": value}


def ask(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "input": "Weather in Paris?", **fields}


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/v1/responses", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def events_of(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream's events, each checked to carry an `event:` line naming its type."""
    resp = client.post("/v1/responses", json={**body, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in resp.text.split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        event = orjson.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {event['type']}"
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """Event types, a run of deltas of one type as one."""
    out: list[str] = []
    for e in events:
        if not (e["type"].endswith(".delta") and out and out[-1] == e["type"]):
            out.append(e["type"])
    return out


def without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in ("id", "call_id")}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def test_a_string_input_with_instructions_answers_a_message_and_chat_usage() -> None:
    daemon = board("Hello!")
    with gateway(daemon) as client:
        resp = post(client, ask(instructions="Be brief.", metadata={"k": "v"}, store=False, reasoning=None))
        chat = client.post(
            "/v1/chat/completions",
            json={
                "model": ALIAS,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Weather in Paris?"},
                ],
            },
        ).json()
    assert resp["id"].startswith("resp_") and resp["object"] == "response" and resp["status"] == "completed"
    assert resp["model"] == ALIAS and resp["incomplete_details"] is None and resp["metadata"] == {"k": "v"}
    [message] = resp["output"]
    assert message["id"].startswith("msg_") and message["role"] == "assistant" and message["status"] == "completed"
    assert message["content"] == [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}]
    assert prompt_of(daemon, 0) == prompt_of(daemon, 1)  # rendered exactly as the chat request
    assert prompt_of(daemon, 0).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    used = chat["usage"]
    assert resp["usage"] == {
        "input_tokens": used["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": used["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": used["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": used["total_tokens"],
    }


def test_input_items_render_as_the_chat_messages_they_stand_for() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Hi, "}, {"type": "input_text", "text": "you"}],
        },
        {"type": "message", "role": "assistant", "content": [text("output_text", "Hello.")]},
        {"role": "user", "content": "Weather?"},
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi, you"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Weather?"},
    ]
    daemon = board("Sunny.")
    with gateway(daemon) as client:
        post(client, {"model": ALIAS, "input": items})
        client.post("/v1/chat/completions", json={"model": ALIAS, "messages": messages})
    assert prompt_of(daemon, 0) == prompt_of(daemon, 1)


def test_a_tool_call_comes_back_as_a_function_call_item_after_the_reasoning() -> None:
    daemon = board(ANSWER)
    with gateway(daemon) as client:
        resp = post(client, ask(tools=[FLAT_TOOL], tool_choice="auto"))
    reasoning, call = resp["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_") and reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user wants the weather."}]
    assert call["type"] == "function_call" and call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    assert (call["name"], call["arguments"], call["status"]) == ("get_weather", '{"city": "Paris"}', "completed")
    assert resp["tools"][0]["name"] == "get_weather" and resp["tool_choice"] == "auto"
    assert "<tools>\n" + json.dumps(TOOL, sort_keys=True) + "\n</tools>" in prompt_of(daemon)  # chat's shape
    # Reasoning tokens: the think block's, one byte a token here.
    assert resp["usage"]["output_tokens_details"]["reasoning_tokens"] == len(THINK.encode())
    assert resp["usage"]["output_tokens"] == len(ANSWER.encode()) + 1  # and EOS


def test_a_history_of_calls_and_outputs_renders_as_chat_tool_history() -> None:
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Look it up."}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21C"}]},
    ]
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": "Look it up."},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
    ]
    daemon = board("It is 18C.")
    with gateway(daemon) as client:
        resp = post(client, {"model": ALIAS, "input": items, "tools": [FLAT_TOOL]})
        client.post("/v1/chat/completions", json={"model": ALIAS, "messages": messages, "tools": [TOOL]})
    assert resp["output"][0]["content"][0]["text"] == "It is 18C."
    assert prompt_of(daemon, 0) == prompt_of(daemon, 1)
    assert "<think>\nLook it up.\n</think>" in prompt_of(daemon, 0)
    assert "<tool_response>\n18C\n</tool_response>\n<tool_response>\n21C\n</tool_response>" in prompt_of(daemon, 0)


def test_a_reasoning_item_goes_to_the_assistant_turn_after_it_or_nowhere() -> None:
    summary = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Greet back."}]}
    hi = {"role": "user", "content": "Hi"}
    reasoned = {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."}
    daemon = board("Fine.")
    with gateway(daemon) as client:
        post(client, {"model": ALIAS, "input": [hi, summary, {"role": "assistant", "content": "Hello."}]})
        client.post("/v1/chat/completions", json={"model": ALIAS, "messages": [hi, reasoned]})
        post(client, {"model": ALIAS, "input": [hi, summary]})  # nothing follows it
        post(client, {"model": ALIAS, "input": [hi]})
    assert prompt_of(daemon, 0) == prompt_of(daemon, 1)
    assert "<think>\nGreet back.\n</think>\n\nHello." in prompt_of(daemon, 0)  # the summary, as no content is
    assert prompt_of(daemon, 2) == prompt_of(daemon, 3)


def test_an_answer_cut_by_max_output_tokens_is_incomplete() -> None:
    daemon = board("A long answer that goes on.")
    with gateway(daemon) as client:
        resp = post(client, ask(max_output_tokens=6))
        events = events_of(client, ask(max_output_tokens=6))
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["output"][0]["status"] == "incomplete" and resp["output"][0]["content"][0]["text"] == "A long"
    assert resp["usage"]["output_tokens"] == 6 and daemon.submitted[0].job.max_tokens == 6
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_answer_is_one_empty_message() -> None:
    daemon = board("")
    with gateway(daemon) as client:
        resp = post(client, ask())
        events = events_of(client, ask())
    [message] = resp["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "" and resp["status"] == "completed"
    assert kinds(events)[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_the_stream_sends_openai_events_in_order() -> None:
    daemon = board(HELLO)
    with gateway(daemon) as client:
        events = events_of(client, ask())
        whole = post(client, ask())
    assert kinds(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, final = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    assert created["id"] == final["id"] and final["status"] == "completed"
    by_type = {e["type"]: e for e in events}
    reasoning_id, message_id = (e["item"]["id"] for e in events if e["type"] == "response.output_item.added")
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Step."
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello!"
    assert by_type["response.output_text.done"] == {
        "type": "response.output_text.done",
        "sequence_number": by_type["response.output_text.done"]["sequence_number"],
        "item_id": message_id,
        "output_index": 1,
        "content_index": 0,
        "text": "Hello!",
        "logprobs": [],
    }
    assert by_type["response.reasoning_text.done"]["item_id"] == reasoning_id
    assert [item["id"] for item in final["output"]] == [reasoning_id, message_id]
    assert without_ids(final["output"]) == without_ids(whole["output"])
    assert final["usage"] == whole["usage"]


def test_a_streamed_call_is_one_item_with_its_arguments_in_pieces() -> None:
    daemon = board("Sure.\n" + ANSWER.split("\n\n", 1)[1])
    arguments = '{"city": "Paris"}'
    with gateway(daemon) as client:
        events = events_of(client, ask(tools=[FLAT_TOOL]))
    assert kinds(events)[5:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",  # a run of them: a token a delta
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    pieces = len(arguments)
    added, deltas, done, item_done = events[-4 - pieces], events[-3 - pieces : -3], events[-3], events[-2]
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress" and added["output_index"] == 1
    assert "".join(d["delta"] for d in deltas) == done["arguments"] == arguments
    assert all(d["item_id"] == added["item"]["id"] and d["output_index"] == 1 for d in deltas)
    assert item_done["item"] == {**added["item"], "arguments": arguments, "status": "completed"}
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Sure."


def test_an_error_after_the_stream_started_is_an_error_event() -> None:
    async def broken() -> Any:
        yield 0, ChoiceDelta("Hi", (72, 105), ())
        raise Unavailable("board gone")

    async def body() -> list[dict[str, Any]]:
        prepared = Prepared(ALIAS, None, [[1, 2]], [], "chatcmpl-abc")  # type: ignore[arg-type]
        first: tuple[int, ChoiceEvent] = (0, ChoiceDelta("", (), ()))
        chunks = [c async for c in sse_response(ResponsesRequest(model=ALIAS, input="x"), prepared, first, broken())]
        blocks = b"".join(chunks).decode().strip().split("\n\n")
        return [orjson.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]

    events = asyncio.run(body())
    assert events[-1] == {
        "type": "error",
        "sequence_number": len(events) - 1,
        "code": "unavailable",
        "message": "board gone",
        "param": None,
    }
    assert [e["type"] for e in events[:-1]][-1] == "response.output_text.delta"


def test_the_official_client_creates_streams_and_parses() -> None:
    daemon = board(HELLO)
    with gateway(daemon) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        whole = client.responses.create(model=ALIAS, input="Hi", instructions="Be brief.")
        assert whole.output_text == "Hello!" and whole.status == "completed"
        assert whole.output[0].type == "reasoning" and whole.output[0].content[0].text == "Step."  # type: ignore[index]
        assert whole.usage is not None and whole.usage.output_tokens_details.reasoning_tokens > 0
        streamed = list(client.responses.create(model=ALIAS, input="Hi", stream=True))
        assert streamed[-1].type == "response.completed"
        assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == "Hello!"
        with client.responses.stream(model=ALIAS, input="Hi") as stream:
            assert stream.get_final_response().output_text == "Hello!"
        parsed = client.responses.parse(model=ALIAS, input="Hi")
        assert parsed.output_text == "Hello!"

    class Weather(BaseModel):
        city: str

    daemon = board('{"city":"Oslo"}')  # what the board's constraint would let the model write
    with gateway(daemon) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        weather = client.responses.parse(model=ALIAS, input="Where?", text_format=Weather)
        assert weather.output_parsed == Weather(city="Oslo")
    (submitted,) = daemon.submitted
    constraint = submitted.job.sampling.constraint
    assert constraint is not None and constraint.kind == "json_schema"
    assert json.loads(constraint.text)["properties"] == {"city": {"title": "City", "type": "string"}}


def test_the_official_client_reads_a_call_and_sends_its_output_back() -> None:
    daemon = board(ANSWER)
    with gateway(daemon) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        first = client.responses.create(model=ALIAS, input="Weather?", tools=[FLAT_TOOL])  # type: ignore[list-item]
        call = next(item for item in first.output if item.type == "function_call")
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        history: list[Any] = [{"role": "user", "content": "Weather?"}, *first.output]
        history.append({"type": "function_call_output", "call_id": call.call_id, "output": "18C"})
        second = client.responses.create(model=ALIAS, input=history, tools=[FLAT_TOOL])  # type: ignore[list-item]
        assert second.status == "completed"
    assert "<tool_response>\n18C\n</tool_response>" in prompt_of(daemon, 1)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt_of(daemon, 1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "w"}}}, "text.format"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),  # the fake's tokenizer has no think markers
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "1"}, "temperature"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"input": []}, "input"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"tools": [{"type": "function", "name": "no spaces"}]}, "tools.0.name"),
        ({"tools": [FLAT_TOOL, FLAT_TOOL]}, "tools[1].name"),
        ({"tools": [FLAT_TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
        ({"tools": [FLAT_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ],
)
def test_every_refusal_is_a_400_naming_its_field(fields: dict[str, Any], param: str) -> None:
    daemon = board("x")
    with gateway(daemon) as client:
        resp = client.post("/v1/responses", json=ask(**fields))
        streamed = client.post("/v1/responses", json=ask(stream=True, **fields))
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith(param + ":"), message
    assert streamed.status_code == 400 and streamed.json()["error"]["message"] == message
    assert daemon.submitted == []


def test_what_asks_for_nothing_unserved_is_accepted() -> None:
    daemon = board("Hi.")
    accepted = {
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": None},
        "store": False,
        "truncation": "disabled",
        "include": [],
        "user": "u1",
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "parallel_tool_calls": False,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 11,
        "tools": [FLAT_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    with gateway(daemon) as client:
        resp = post(client, ask(**accepted))
    assert resp["status"] == "completed" and resp["user"] == "u1" and resp["temperature"] == 0.5
    assert resp["tool_choice"] == {"type": "function", "name": "get_weather"} and resp["parallel_tool_calls"] is False
    job = daemon.submitted[0].job
    assert job.sampling.temperature == 0.5 and job.sampling.top_p == pytest.approx(0.9) and job.sampling.seed == 11


def test_unknown_models_are_404_as_in_chat() -> None:
    daemon: FakeDaemon = board("x")
    with gateway(daemon) as client:
        resp = client.post("/v1/responses", json={"model": "nope", "input": "x"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_responses_are_counted_and_timed_as_completions_are() -> None:
    daemon = board("Hi.")
    with gateway(daemon) as client:
        post(client, ask())
        assert client.post("/v1/responses", json=ask(store=True)).status_code == 400
        lines = client.get("/metrics").text.splitlines()
    assert 'calculet_gateway_requests_total{route="/v1/responses",status="200"} 1.0' in lines
    assert 'calculet_gateway_requests_total{route="/v1/responses",status="400"} 1.0' in lines
    e2e = 'calculet_gateway_e2e_request_latency_seconds_count{route="/v1/responses"}'
    assert any(line.startswith(e2e) for line in lines)
