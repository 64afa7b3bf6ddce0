"""A chat request's bound on thinking reaches the board as a `ThinkingBudget` with the package's own
marker ids (docs/gateway.md "Tools and reasoning"): `thinking_token_budget`, or the gateway's budget
for a `reasoning_effort` (the Responses API's `reasoning.effort` too); a model without think markers
is a 400 naming the field, and so is an effort that does not exist. A constrained answer that asks
no bound gets an unbounded one, so it may think before its grammar applies."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from calculet.client import ThinkingBudget
from calculet.gateway.api.thinking import DEFAULT_BUDGETS, MAX_BUDGET, free_thinking, thinking_budget
from tests.unit.gateway import fakes
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import gateway

PLAIN_TOKENIZER = fakes.byte_tokenizer_json
TOOL = {"type": "function", "function": {"name": "f"}}


def thinking_tokenizer_json() -> bytes:
    """The fakes' byte tokenizer with Qwen3's think markers as added tokens."""
    tok = Tokenizer.from_str(PLAIN_TOKENIZER().decode())
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    return tok.to_str().encode()


@pytest.fixture
def thinking_model(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    monkeypatch.setattr(fakes, "byte_tokenizer_json", thinking_tokenizer_json)
    tok = Tokenizer.from_str(thinking_tokenizer_json().decode())
    opening, closing = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    assert opening is not None and closing is not None
    return opening, closing


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


@pytest.mark.parametrize(
    ("fields", "tokens"),
    [
        ({"reasoning_effort": "low"}, DEFAULT_BUDGETS["low"]),
        ({"reasoning_effort": "high"}, DEFAULT_BUDGETS["high"]),
        ({"thinking_token_budget": 7}, 7),
        ({"thinking_token_budget": 0, "reasoning_effort": "high"}, 0),  # the explicit budget wins
        ({}, None),
    ],
)
def test_the_board_gets_the_budget_with_the_models_markers(
    thinking_model: tuple[int, int], fields: dict[str, Any], tokens: int | None
) -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        assert client.post("/v1/chat/completions", json=chat(n=2, **fields)).status_code == 200
    expected = None if tokens is None else ThinkingBudget(tokens, *thinking_model)
    assert [s.job.sampling.thinking for s in daemon.submitted] == [expected, expected]


def test_the_responses_apis_effort_is_chats(thinking_model: tuple[int, int]) -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        body = {"model": ALIAS, "input": "hi", "reasoning": {"effort": "medium"}}
        assert client.post("/v1/responses", json=body).status_code == 200
    assert daemon.submitted[0].job.sampling.thinking == ThinkingBudget(DEFAULT_BUDGETS["medium"], *thinking_model)


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"reasoning_effort": "low"}, "reasoning_effort: this model's tokenizer has no <think>"),
        ({"thinking_token_budget": 5}, "thinking_token_budget: this model's tokenizer has no <think>"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
    ],
)
def test_what_cannot_be_bounded_is_400_naming_the_field(fields: dict[str, Any], where: str) -> None:
    daemon = FakeDaemon("a")  # the plain byte tokenizer: no think markers
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(**fields))
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(where), resp.text
    assert daemon.submitted == []


def test_the_gateways_budgets_per_effort_are_used() -> None:
    ids = {"<think>": 5, "</think>": 6}
    got = thinking_budget(None, "medium", {"low": 1, "medium": 2, "high": 3}, ids.get)
    assert got == ThinkingBudget(2, open_token_id=5, close_token_id=6)
    assert thinking_budget(None, None, DEFAULT_BUDGETS, ids.get) is None


JSON = {"type": "json_object"}


@pytest.mark.parametrize(
    ("fields", "tokens"),
    [
        ({"response_format": JSON}, MAX_BUDGET),  # constrained, no bound asked: free thinking
        ({"response_format": JSON, "thinking_token_budget": 5}, 5),  # a bound asked wins
        ({"response_format": JSON, "chat_template_kwargs": {"enable_thinking": False}}, None),
        ({"tools": [TOOL]}, MAX_BUDGET),  # `auto` is constrained too
        ({"tools": [TOOL], "tool_choice": "none"}, None),  # not constrained
    ],
)
def test_a_constrained_answer_may_think_before_its_grammar(
    thinking_model: tuple[int, int], fields: dict[str, Any], tokens: int | None
) -> None:
    """Without a budget the board would hold the answer to its grammar from the first token, which
    forbids `<think>`: an unbounded budget tells it the markers instead."""
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        assert client.post("/v1/chat/completions", json=chat(**fields)).status_code == 200
    (submitted,) = daemon.submitted
    assert submitted.job.sampling.constraint is not None or "tool_choice" in fields
    assert submitted.job.sampling.thinking == (None if tokens is None else ThinkingBudget(tokens, *thinking_model))


def test_no_free_thinking_when_a_marker_is_a_stop_token(thinking_model: tuple[int, int]) -> None:
    assert free_thinking({"<think>": 7, "</think>": 8}.get, (8,)) is None
    assert free_thinking({"<think>": 7}.get, ()) is None
    assert free_thinking({"<think>": 7, "</think>": 8}.get, (1,)) == ThinkingBudget(MAX_BUDGET, 7, 8)
