"""Structured outputs on the HTTP API (docs/gateway.md "Structured outputs"): `response_format`
and vLLM's `structured_outputs` reach the boards as one `Constraint` per choice, and their bad
shapes are 400s naming the field before any board is asked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calculet.client import Constraint
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import gateway

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def submitted_constraint(path: str, body: dict[str, Any]) -> Constraint | None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.text
    constraints = {s.job.sampling.constraint for s in daemon.submitted}
    assert len(daemon.submitted) == body.get("n", 1) and len(constraints) == 1  # every choice the same
    return constraints.pop()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, Constraint.of_json_object()),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "r", "schema": SCHEMA, "strict": True},
                }
            },
            Constraint.of_json_schema(SCHEMA),
        ),
        ({"structured_outputs": {"json": SCHEMA}}, Constraint.of_json_schema(SCHEMA)),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, Constraint.of_json_schema(json.dumps(SCHEMA))),
        ({"structured_outputs": {"json_object": True}}, Constraint.of_json_object()),
        ({"structured_outputs": {"regex": "[a-z]{1,5}"}}, Constraint.of_regex("[a-z]{1,5}")),
        ({"structured_outputs": {"choice": ["yes", "no"]}, "n": 2}, Constraint.of_choice(["yes", "no"])),
        ({"structured_outputs": {"grammar": 'start: "a"+'}}, Constraint.of_lark('start: "a"+')),
    ],
)
def test_chat_fields_become_the_boards_constraint(fields: dict[str, Any], expected: Constraint | None) -> None:
    got = submitted_constraint("/v1/chat/completions", chat(**fields))
    if expected is not None and expected.kind == "json_schema":
        assert got is not None and got.kind == "json_schema" and json.loads(got.text) == json.loads(expected.text)
    else:
        assert got == expected


def test_completions_take_structured_outputs() -> None:
    body = {"model": ALIAS, "prompt": "hi", "max_tokens": 2, "structured_outputs": {"choice": ["a", "b"]}}
    assert submitted_constraint("/v1/completions", body) == Constraint.of_choice(["a", "b"])


BAD: list[tuple[dict[str, Any], str]] = [
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r"}}}, "response_format.json_schema.schema"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": "json"}, "structured_outputs"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "response_format, structured_outputs",
    ),
    (
        {"response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {"name": "f"}}]},
        "response_format",
    ),
]


@pytest.mark.parametrize(("fields", "where"), BAD)
def test_bad_shapes_are_400_naming_the_field(fields: dict[str, Any], where: str) -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=chat(**fields))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"].startswith(f"{where}"), resp.json()
    assert daemon.submitted == []


def test_a_constraint_with_tools_not_offered_is_served() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    got = submitted_constraint(
        "/v1/chat/completions", chat(response_format={"type": "json_object"}, tools=tools, tool_choice="none")
    )
    assert got == Constraint.of_json_object()


def test_response_format_stays_refused_on_completions() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        body = {"model": ALIAS, "prompt": "hi", "response_format": {"type": "json_object"}}
        resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 400 and "structured_outputs" in resp.json()["error"]["message"]
    assert daemon.submitted == []
