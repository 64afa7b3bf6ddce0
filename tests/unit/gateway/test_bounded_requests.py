"""Bounded requests (docs/gateway.md, "Bounded requests"): what one HTTP request may make the
gateway hold or the fleet run is bounded, and each refusal comes before any work with its own status.

Each case failed before the bounds existed: a body of any size was read whole (a 100 MB one got the
gateway killed), an unknown role was rendered, and a request of more prompts than the fleet admits
was placed choice by choice until the boards refused some of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest
from starlette.testclient import TestClient

from calculet.gateway.api.schemas import MAX_MESSAGES, MAX_PROMPTS, ROLES
from calculet.gateway.serving.service import CHARS_SAFETY_FACTOR
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import gateway as app_over

LIMIT = 64 * 1024


@contextmanager
def gateway(*daemons: FakeDaemon, max_body_bytes: int = LIMIT) -> Iterator[TestClient]:
    with app_over(*daemons, max_body_bytes=max_body_bytes) as client:
        yield client


def chat(content: str, **fields: object) -> dict[str, object]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **fields}


def error_of(resp: object) -> dict[str, object]:
    return orjson.loads(resp.content)["error"]  # type: ignore[attr-defined]


def test_a_body_over_the_limit_is_413_by_its_content_length() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", content=orjson.dumps(chat("x" * LIMIT)))
        assert resp.status_code == 413
        err = error_of(resp)
        assert err["code"] == "request_too_large" and str(LIMIT) in str(err["message"])
        ok = client.post("/v1/chat/completions", json=chat("hi"))
        assert ok.status_code == 200
    assert len(daemon.submitted) == 1  # only the small request reached a board


def test_a_body_without_a_length_is_cut_off_at_the_limit() -> None:
    body = orjson.dumps(chat("y" * (4 * LIMIT)))
    sent: list[int] = []

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), 4096):
            sent.append(i)
            yield body[i : i + 4096]

    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", content=pieces(), headers={"content-type": "application/json"})
        assert resp.status_code == 413 and error_of(resp)["code"] == "request_too_large"
    assert daemon.submitted == []


def test_a_body_at_the_limit_is_served() -> None:
    body = orjson.dumps(chat("z" * 300))
    daemon = FakeDaemon("a")
    with gateway(daemon, max_body_bytes=len(body)) as client:
        assert client.post("/v1/chat/completions", content=body).status_code == 200


def test_an_unknown_role_is_400_naming_it() -> None:
    body = {"model": ALIAS, "messages": [{"role": "wizard", "content": "hi"}]}
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 400
        assert "'wizard'" in str(error_of(resp)["message"]) and "messages.0.role" in str(error_of(resp)["message"])
        for role in ROLES:
            ok = client.post("/v1/chat/completions", json={**body, "messages": [{"role": role, "content": "hi"}]})
            assert ok.status_code == 200, (role, ok.content)
    assert len(daemon.submitted) == len(ROLES)


def test_developer_renders_as_system() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        for role in ("developer", "system"):
            body = {"model": ALIAS, "messages": [{"role": role, "content": "be brief"}], "max_tokens": 1}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert daemon.submitted[0].job.prompt_tokens == daemon.submitted[1].job.prompt_tokens


def test_too_many_messages_and_prompts_are_refused_before_any_work() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon, max_body_bytes=4 << 20) as client:
        messages = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
        resp = client.post("/v1/chat/completions", json={"model": ALIAS, "messages": messages})
        assert resp.status_code == 400 and "messages" in str(error_of(resp)["message"])
        prompts = ["a"] * (MAX_PROMPTS + 1)
        resp = client.post("/v1/completions", json={"model": ALIAS, "prompt": prompts, "max_tokens": 1})
        assert resp.status_code == 400 and f"at most {MAX_PROMPTS}" in str(error_of(resp)["message"])
    assert daemon.submitted == []


def test_a_prompt_too_long_in_characters_is_refused_untokenized(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = FakeDaemon("a", context=16)
    with gateway(daemon, max_body_bytes=4 << 20) as client:
        assert client.post("/v1/completions", json={"model": ALIAS, "prompt": "ab", "max_tokens": 1}).status_code == 200
        text = client.app.state.service.fleet.packages.known(
            next(iter(client.app.state.service.fleet.boards.values())), ALIAS
        ).text  # type: ignore[attr-defined]
        bound = 16 * text.max_token_chars * CHARS_SAFETY_FACTOR

        def never(_: str) -> list[int]:
            raise AssertionError("tokenized a prompt that cannot fit")

        monkeypatch.setattr(text, "encode", never)
        resp = client.post("/v1/completions", json={"model": ALIAS, "prompt": "q" * (bound + 1), "max_tokens": 1})
        assert resp.status_code == 400
        assert f"{bound + 1} characters cannot fit" in str(error_of(resp)["message"])
    assert len(daemon.submitted) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_more_choices_than_the_fleet_admits_are_refused_whole(stream: bool) -> None:
    boards = [FakeDaemon("a", lanes=4, queue_limit=8, running=2), FakeDaemon("b", lanes=4, queue_limit=8)]
    room = (4 + 8 - 2) + (4 + 8)
    with gateway(*boards) as client:
        body = {"model": ALIAS, "prompt": ["p"] * (room + 1), "max_tokens": 1, "stream": stream}
        resp = client.post("/v1/completions", json=body)
        assert resp.status_code == 429
        assert resp.headers["retry-after"] == "1"
        assert f"needs {room + 1} jobs" in str(error_of(resp)["message"])
        assert all(b.submitted == [] for b in boards)  # nothing placed: refused as a unit
        prompts = ["p"] * (room // 2)
        resp = client.post("/v1/completions", json={**body, "prompt": prompts, "n": 2})
        assert resp.status_code == 200  # exactly what the boards admit
    assert sum(len(b.submitted) for b in boards) == room


def test_boards_that_do_not_report_their_bound_are_not_judged() -> None:
    boards = [FakeDaemon("a", lanes=1), FakeDaemon("b", lanes=1)]  # queue_limit 0: an older daemon
    with gateway(*boards) as client:
        resp = client.post("/v1/completions", json={"model": ALIAS, "prompt": ["p"] * 10, "max_tokens": 1})
        assert resp.status_code == 200
    assert sum(len(b.submitted) for b in boards) == 10
