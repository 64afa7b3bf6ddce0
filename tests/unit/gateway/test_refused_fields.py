"""OpenAI fields the gateway knows and does not serve are refused with a 400 naming them, before
any board is asked (docs/gateway.md "Request fields"); their harmless values, and fields nobody
here knows, are accepted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import gateway


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


REFUSED: list[tuple[str, Any]] = [
    ("logit_bias", {"50256": -100}),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}),
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("function_call", "auto"),
    ("reasoning_effort", "low"),
    ("verbosity", "low"),
    ("store", True),
    ("service_tier", "flex"),
    ("prompt_cache_retention", "24h"),
    ("guided_json", {"type": "object"}),
    ("guided_regex", "[a-z]+"),
    ("guided_choice", ["yes", "no"]),
    ("guided_grammar", "root ::= 'x'"),
]


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_field_not_served_is_400_naming_it(field: str, value: Any) -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(**{field: value}))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"].startswith(f"{field}: ")
    assert daemon.submitted == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("logit_bias", {"1": 5}), ("response_format", {"type": "json_object"}), ("guided_json", {"type": "object"})],
)
def test_sampling_refusals_hold_in_completions_too(field: str, value: Any) -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        body = {"model": ALIAS, "prompt": "hi", "max_tokens": 2, field: value}
        resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(f"{field}: ")
    assert daemon.submitted == []


ACCEPTED: dict[str, Any] = {
    "response_format": {"type": "text"},
    "logit_bias": {},
    "modalities": ["text"],
    "audio": None,
    "store": False,
    "service_tier": "auto",
    "metadata": {"team": "a"},
    "safety_identifier": "u-1",
    "prompt_cache_key": "conv-1",
    "prompt_cache_retention": "in_memory",
    "some_future_field": {"anything": 1},  # unknown: ignored
}


def test_the_harmless_values_and_unknown_fields_are_accepted() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(**ACCEPTED))
    assert resp.status_code == 200, resp.text
    assert len(daemon.submitted) == 1


def test_prompt_cache_key_is_the_affinity_key_in_place_of_user() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        for fields in ({"prompt_cache_key": "k"}, {"user": "k"}, {"user": "other", "prompt_cache_key": "k"}, {}):
            assert client.post("/v1/chat/completions", json=chat(**fields)).status_code == 200
    sessions = [s.job.session_id for s in daemon.submitted]
    assert sessions[0] == sessions[1] == sessions[2] != "" and sessions[3] == ""
