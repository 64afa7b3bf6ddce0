"""The answer memory's metrics at the gateway's `/metrics` (fake boards, in-process): assistant
messages spliced (hits) and not held (misses), prompts that fell back to the plain encoding, and
the memory's size in tokens and answers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.testclient import TestClient

from calculet.gateway.api.app import create_app
from calculet.gateway.serving.service import GatewayService
from calculet.gateway.text.answer_memory import AnswerMemory
from calculet.gateway.text.answer_splice import placeholder
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import serving
from tests.unit.telemetry.scrape import Scrape, delta

QUESTION = {"role": "user", "content": "Tell me about lanes."}


@contextmanager
def gateway() -> Iterator[TestClient]:
    def remembering(service: GatewayService) -> None:
        service.answers = AnswerMemory(100_000)  # opt-in (off by default)

    with TestClient(
        create_app(serving(FakeDaemon("board-a"), setup=remembering)), raise_server_exceptions=True
    ) as client:
        yield client


def scrape(client: TestClient) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200
    return Scrape(response.text)


def ask(client: TestClient, messages: list[dict[str, str]], seed: int) -> dict[str, Any]:
    body = {"model": ALIAS, "messages": messages, "max_tokens": 6, "seed": seed}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_hits_misses_fallbacks_and_size() -> None:
    names = [f"calculet_gateway_answer_memory_{n}_total" for n in ("hits", "misses", "fallbacks")]
    with gateway() as client:
        start = scrape(client)
        assert start.value("calculet_gateway_answer_memory_tokens") == 0
        first = ask(client, [QUESTION], seed=1)["choices"][0]["message"]["content"]
        after_first = scrape(client)
        assert after_first.value("calculet_gateway_answer_memory_tokens") == 6  # max_tokens, kept whole
        assert after_first.value("calculet_gateway_answer_memory_entries") == 1

        said = {"role": "assistant", "content": first}
        unknown = {"role": "assistant", "content": "Never said by this gateway."}
        second = [QUESTION, said, {"role": "user", "content": "And?"}, unknown, {"role": "user", "content": "So?"}]
        ask(client, second, seed=2)
        after_second = scrape(client)
        assert [delta(after_second, after_first, n, model=ALIAS) for n in names] == [1, 1, 0]

        # A user message holding the assistant message's placeholder: the splice cannot be trusted.
        third = [{"role": "user", "content": placeholder(1)}, said, {"role": "user", "content": "And?"}]
        ask(client, third, seed=3)
        after_third = scrape(client)
        assert [delta(after_third, after_second, n, model=ALIAS) for n in names] == [0, 0, 1]
        assert after_third.value("calculet_gateway_answer_memory_tokens") == 18  # three answers of 6
        assert after_third.value("calculet_gateway_answer_memory_entries") == 3
