"""Usage's `prompt_tokens_details.cached_tokens`: the daemon Final's `usage.cached_tokens` of each
prompt's first choice (each prompt counted once, as prompt_tokens is; after a failover the last
attempt's figure), carried by `ChoiceEnd`, in chat and text completions, whole and streamed; and
`/ready`'s view of what the router sees of each board (jobs, pending prefill, prefix blocks)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from calculet.common.prefix import block_hashes
from calculet.gateway.api import formats
from calculet.gateway.serving.service import Prepared
from calculet.gateway.text.model_text import ModelFacts, ModelText
from tests.unit.gateway.fakes import ALIAS, CHAT_TEMPLATE, CONTEXT, EOS, FakeDaemon, byte_tokenizer_json
from tests.unit.gateway.harness import completion, gateway, run_all, start_service

LONG = [(i * 37) % 250 + 1 for i in range(150)]  # 2 full blocks (128 tokens) + 22
OTHER = [(i * 11) % 250 + 1 for i in range(70)]  # 1 full block + 6
TEXT = ModelText(ModelFacts(ALIAS, "pkg-a", 300, CONTEXT, (EOS,)), byte_tokenizer_json(), CHAT_TEMPLATE)
MESSAGES = [{"role": "user", "content": "a question long enough to fill more than one block of tokens " * 2}]


def holding(*prompts: list[int]) -> frozenset[int]:
    return frozenset(h for p in prompts for h in block_hashes(p))


def test_usage_object_has_openais_shape() -> None:
    assert formats.usage(10, 5, 4) == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert formats.usage(3, 1)["prompt_tokens_details"] == {"cached_tokens": 0}


def test_cached_tokens_count_each_prompts_first_choice_capped_at_the_prompt() -> None:
    prepared = Prepared(ALIAS, TEXT, [[1] * 100, [2] * 50], [], "id", choices_per_prompt=3)
    # choices 0-2 serve prompt 0, 3-5 prompt 1; only 0 and 3 count.
    assert prepared.cached_token_count({0: 64, 1: 99, 2: 99, 3: 0, 4: 64}) == 64
    assert prepared.cached_token_count({0: 64, 3: 49}) == 64 + 49
    assert prepared.cached_token_count({0: 500}) == 100  # resumed tokens after a failover do not count
    assert prepared.cached_token_count({}) == 0


def test_choice_end_carries_the_finals_cached_tokens() -> None:
    async def scenario() -> None:
        fleet, service = await start_service(FakeDaemon("a", prefix_hashes=holding(LONG)))
        _, ends, _ = await run_all(await service.prepare_completion(completion(LONG, max_tokens=4), ""))
        assert ends[0].cached_tokens == 128
        _, ends, _ = await run_all(await service.prepare_completion(completion(OTHER, max_tokens=4), ""))
        assert ends[0].cached_tokens == 0
        await fleet.close()

    asyncio.run(scenario())


def test_a_stop_string_end_still_reports_the_cached_tokens() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", prefix_hashes=holding(LONG))
        fleet, service = await start_service(a)
        first = await service.prepare_completion(completion(LONG, max_tokens=30, seed=3), "")
        texts, _, _ = await run_all(first)
        stop = texts[0][5:7]
        prepared = await service.prepare_completion(completion(LONG, max_tokens=30, seed=3, stop=[stop]), "")
        _, ends, _ = await run_all(prepared)
        assert ends[0].finish_reason == "stop" and a.submitted[-1].cancelled
        assert ends[0].cached_tokens == 128
        await fleet.close()

    asyncio.run(scenario())


def test_after_a_failover_the_last_attempts_figure_counts() -> None:
    async def scenario() -> None:
        # a holds both blocks (wins the prompt) and dies after 3 tokens; b holds only the first.
        a = FakeDaemon("a", prefix_hashes=holding(LONG), die_after=3)
        b = FakeDaemon("b", prefix_hashes=frozenset(block_hashes(LONG)[:1]))
        fleet, service = await start_service(a, b)
        prepared = await service.prepare_completion(completion(LONG, max_tokens=8), "")
        assert prepared.runners[0].placement.board.target == "a"  # type: ignore[union-attr]
        _, ends, _ = await run_all(prepared)
        assert prepared.runners[0].failovers == 1
        assert ends[0].cached_tokens == 64
        await fleet.close()

    asyncio.run(scenario())


def streamed(client: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", path, json=body) as sse:
        assert sse.status_code == 200
        return [orjson.loads(line[6:]) for line in sse.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("stream", [False, True])
def test_http_usage_reports_cached_tokens_for_chat_and_completions(stream: bool) -> None:
    chat_prompt = TEXT.encode(TEXT.render_chat(MESSAGES))
    assert len(chat_prompt) > 64
    daemon = FakeDaemon("a", prefix_hashes=holding(LONG, OTHER, chat_prompt))
    cases: list[tuple[str, dict[str, Any], int, int]] = [
        ("/v1/completions", {"prompt": LONG, "n": 2}, len(LONG), 128),
        ("/v1/completions", {"prompt": [LONG, OTHER]}, len(LONG) + len(OTHER), 128 + 64),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES},
            len(chat_prompt),
            min(len(chat_prompt) // 64 * 64, len(chat_prompt) - 1),
        ),
    ]
    with gateway(daemon) as client:
        for path, fields, prompt_tokens, cached in cases:
            body = {"model": ALIAS, "max_tokens": 3, **fields}
            if stream:
                used = streamed(client, path, body)[-1]["usage"]
            else:
                answer = client.post(path, json=body)
                assert answer.status_code == 200, answer.text
                used = answer.json()["usage"]
            assert used["prompt_tokens"] == prompt_tokens
            assert used["prompt_tokens_details"] == {"cached_tokens": cached}
            assert used["total_tokens"] == prompt_tokens + used["completion_tokens"]


def test_ready_shows_what_the_router_sees_of_each_board() -> None:
    daemon = FakeDaemon("a", prefix_hashes=holding(LONG, OTHER), pending_prefill_tokens=7, running=2)
    with gateway(daemon) as client:
        body = client.get("/ready").json()
    assert body["boards"] == {"a": "up"}
    assert body["routing"] == {
        "a": {ALIAS: {"jobs": 2, "own_jobs": 0, "pending_prefill_tokens": 7, "prefix_blocks": 3}}
    }
