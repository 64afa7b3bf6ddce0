"""The Responses API through a real gateway and a qwen board (calsim, the qwen3-30b-a3b package and
its Qwen3-convention template), with the official `openai` client's `responses.create`, whole and
streamed: `instructions`, a user message, a `function_call` item and its `function_call_output`
become the prompt the package template renders from the equivalent chat messages (usage's input
tokens and the seeded answer match an oracle that renders and generates without the gateway).
How calls and reasoning in answers become output items is tested with scripted answers
(tests/unit/gateway/test_responses_api.py): the synthetic model writes neither."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.local_fleet import local_fleet
from tests.integration.test_gateway_tools import MESSAGES, TOOLS

pytestmark = pytest.mark.integration
FLAT_TOOLS: list[Any] = [{"type": "function", **tool["function"]} for tool in TOOLS]
INPUT: list[Any] = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "4C and rain"},
]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[tuple[GatewayProcess, Oracle]]:
    with local_fleet(tmp_path_factory.mktemp("responses"), models_root, [["--model", "qwen=qwen"]]) as (daemons, gw):
        yield gw, Oracle(daemons[0].target, "qwen")


def _expected(oracle: Oracle, seed: int) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of the equivalent chat messages, without the gateway (with the
    constraint and thinking budget chat sends with tools under `tool_choice: auto`)."""
    views = [*MESSAGES[:2], {**MESSAGES[2], "content": ""}, MESSAGES[3]]
    text = oracle.template.render(messages=views, add_generation_prompt=True, tools=TOOLS)
    prompt = list(oracle.tokenizer.encode(text, add_special_tokens=False).ids)
    return prompt, oracle.tokens(prompt, seed=seed, max_tokens=MAX_TOKENS, **oracle.auto_tools(TOOLS))


def _request(seed: int, **fields: Any) -> dict[str, Any]:
    return {
        "model": "qwen",
        "instructions": MESSAGES[0]["content"],
        "input": INPUT,
        "tools": FLAT_TOOLS,
        "max_output_tokens": MAX_TOKENS,
        "extra_body": {"seed": seed},
        **fields,
    }


def test_responses_create_renders_the_input_as_chat_does(qwen: tuple[GatewayProcess, Oracle]) -> None:
    gateway, oracle = qwen
    prompt, answer = _expected(oracle, 7)
    with gateway.openai() as client:
        r = client.responses.create(**_request(7))
    assert r.id.startswith("resp_") and r.usage is not None
    assert r.usage.input_tokens == len(prompt) and r.usage.output_tokens == len(answer)
    assert r.usage.total_tokens == len(prompt) + len(answer)
    assert r.output_text == oracle.text(answer)
    assert r.status == ("incomplete" if len(answer) == MAX_TOKENS else "completed")
    assert [item.type for item in r.output] == ["message"]


def test_responses_create_streams_the_same_answer(qwen: tuple[GatewayProcess, Oracle]) -> None:
    gateway, oracle = qwen
    prompt, answer = _expected(oracle, 9)
    with gateway.openai() as client:
        events = list(client.responses.create(**_request(9), stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert final.response.usage is not None and final.response.usage.input_tokens == len(prompt)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.response.output_text == oracle.text(answer)
