"""Structured outputs end to end: the official `openai` client's `parse()` with a Pydantic model, and
vLLM's `structured_outputs`, against a real gateway over a real daemon (calsim's tiny package). The
synthetic model writes random tokens, so every answer that parses and validates was made so by the
board's constrained decoding (docs/daemon.md "Constrained decoding")."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.integration.gateway_process import GatewayProcess
from tests.integration.local_fleet import local_fleet

pytestmark = pytest.mark.integration


class Verdict(BaseModel):
    answer: Literal["yes", "no", "maybe"]
    confidence: int = Field(ge=0, le=9)
    checked: bool


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[GatewayProcess]:
    boards = [["--board", "0", "--model", "tiny=tiny"]]
    with local_fleet(tmp_path_factory.mktemp("structured"), models_root, boards) as (_, gateway):
        yield gateway


def test_the_official_clients_parse_gets_a_valid_object_every_time(fleet: GatewayProcess) -> None:
    client = fleet.openai()
    for seed in range(10):
        done = client.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": "Is it?"}],
            response_format=Verdict,
            max_tokens=64,
            seed=seed,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Verdict), choice.message.content


def test_json_object_and_structured_outputs_hold_streamed_and_not(fleet: GatewayProcess) -> None:
    client = fleet.openai()
    text = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=48,
        seed=3,
        extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
    )
    assert text.choices[0].message.content in ("red", "green", "blue")
    stream = client.completions.create(
        model="tiny",
        prompt="code:",
        max_tokens=16,
        seed=4,
        stream=True,
        extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{2}"}},
    )
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", streamed), streamed
    obj = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=96,
        seed=5,
        response_format={"type": "json_object"},
    )
    if obj.choices[0].finish_reason == "stop":  # a free object may run to max_tokens: then it is cut
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    else:
        assert obj.choices[0].finish_reason == "length"


def test_a_schema_the_board_cannot_compile_is_400(fleet: GatewayProcess) -> None:
    with fleet.http() as http:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "structured_outputs": {"regex": "(unclosed"},
        }
        resp = http.post("/v1/chat/completions", json=body)
        assert resp.status_code == 400, resp.text
        assert "constraint.regex" in resp.json()["error"]["message"]
        ok = http.post("/v1/chat/completions", json={**body, "structured_outputs": {"choice": ["a"]}})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "a"
