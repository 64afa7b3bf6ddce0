"""The gateway's `/metrics` over fake boards, in-process (Starlette's TestClient, no processes):
every HTTP request is counted by route and status (unknown paths as "other", refusals of the API-key
check too), completions move the TTFT, e2e and token metrics by the right amounts, retries and
failovers are counted apart, and each board's up gauge follows its connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from starlette.testclient import TestClient

from calculet.common.errors import Unavailable
from calculet.common.telemetry.registry import CONTENT_TYPE
from calculet.gateway.api.app import create_app
from calculet.gateway.serving.service import GatewayService
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import start_service
from tests.unit.telemetry.scrape import Scrape, delta

COMPLETION = {"model": ALIAS, "prompt": "Hello there", "max_tokens": 5, "seed": 1}


@contextmanager
def gateway(*daemons: FakeDaemon, api_keys: tuple[bytes, ...] = ()) -> Iterator[TestClient]:
    async def make_service() -> AsyncIterator[GatewayService]:
        fleet, service = await start_service(*daemons)
        try:
            yield service
        finally:
            await fleet.close()

    with TestClient(create_app(make_service, api_keys=api_keys), raise_server_exceptions=True) as client:
        yield client


def scrape(client: TestClient) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    return Scrape(response.text)


def test_requests_and_completions_move_the_metrics(tmp_path: object) -> None:
    with gateway(FakeDaemon("board-a")) as client:
        before = scrape(client)
        prompt_tokens = 0
        for _ in range(2):
            answer = client.post("/v1/completions", json=COMPLETION).json()
            prompt_tokens += answer["usage"]["prompt_tokens"]
        body = {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/completions", json=body) as sse:
            lines = [line for line in sse.iter_lines() if line.startswith("data: {")]
        prompt_tokens += int(lines[-1].split('"prompt_tokens":')[1].split(",")[0])
        assert client.get("/no/such/path").status_code == 404
        after = scrape(client)

    assert delta(after, before, "calculet_gateway_requests_total", route="/v1/completions", status="200") == 3
    assert delta(after, before, "calculet_gateway_requests_total", route="other", status="404") == 1
    assert delta(after, before, "calculet_gateway_requests_total", route="/metrics", status="200") == 1  # `before`
    assert delta(after, before, "calculet_gateway_time_to_first_token_seconds_count", model=ALIAS) == 3
    assert delta(after, before, "calculet_gateway_e2e_request_latency_seconds_count", route="/v1/completions") == 3
    assert delta(after, before, "calculet_gateway_e2e_request_latency_seconds_count", route="other") == 0
    assert delta(after, before, "calculet_gateway_generation_tokens_total", model=ALIAS) == 3 * 5
    assert delta(after, before, "calculet_gateway_prompt_tokens_total", model=ALIAS) == prompt_tokens > 0
    assert after.one("calculet_gateway_board_up", board="board-a") == 1
    assert after.one("calculet_gateway_board_jobs", board="board-a") == 0
    assert after.one("calculet_gateway_boards", state="up") == 1
    assert after.value("calculet_gateway_retries_total") == after.value("calculet_gateway_failovers_total") == 0


def test_a_mid_stream_failover_is_counted_as_one() -> None:
    plan = [2]  # whichever board gets the job dies after 2 tokens; the other finishes it
    with gateway(FakeDaemon("a", die_plan=plan), FakeDaemon("b", die_plan=plan)) as client:
        answer = client.post("/v1/completions", json=COMPLETION)
        s = scrape(client)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
    assert s.one("calculet_gateway_failovers_total", model=ALIAS) == 1
    assert s.value("calculet_gateway_retries_total") == 0
    assert sorted(s.one("calculet_gateway_board_up", board=b) for b in ("a", "b")) == [0, 1]  # one died


def test_retries_before_the_first_token_are_counted_and_the_final_status_too() -> None:
    # Each board refuses once: the second attempt is one retry, then no board is left: 503.
    boards = [FakeDaemon(name, refuse=[Unavailable("draining")]) for name in ("a", "b")]
    with gateway(*boards) as client:
        assert client.post("/v1/completions", json=COMPLETION).status_code == 503
        s = scrape(client)
    assert s.one("calculet_gateway_retries_total", model=ALIAS) == 1
    assert s.one("calculet_gateway_requests_total", route="/v1/completions", status="503") == 1
    assert s.value("calculet_gateway_time_to_first_token_seconds_count") == 0


def test_refusals_of_the_api_key_check_are_counted() -> None:
    with gateway(FakeDaemon("a"), api_keys=(b"sk-key",)) as client:
        assert client.post("/v1/completions", json=COMPLETION).status_code == 401
        s = scrape(client)  # /metrics needs no key
    assert s.one("calculet_gateway_requests_total", route="/v1/completions", status="401") == 1
