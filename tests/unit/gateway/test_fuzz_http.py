"""Fuzzing the gateway's HTTP bodies: arbitrary JSON values and request-shaped objects with wrong types
and extreme values POSTed to /v1/chat/completions and /v1/completions over fake boards. Every body
gets a valid answer or an OpenAI-shaped error with a client-facing status (never FastAPI's 422, never
a 500), and the app keeps serving afterwards. The app runs in-process (Starlette's TestClient)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from calculet.gateway.api.app import create_app
from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import serving

ALLOWED = {200, 400, 401, 404, 429, 503}
PATHS = ("/v1/chat/completions", "/v1/completions")
FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], max_examples=150
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # raise_server_exceptions=False: a bug must show as the 500 a client would get, not as a raise here.
    with TestClient(create_app(serving(FakeDaemon("board-0"))), raise_server_exceptions=False) as c:
        yield c


EXTREME_NUMBERS = st.sampled_from(
    [
        0,
        -1,
        1,
        2,
        2**31 - 1,
        2**31,
        2**32,
        2**53 + 1,
        2**63 - 1,
        2**63,
        2**64,
        -(2**63),
        10**30,
        -(10**30),
        0.0,
        -0.0,
        0.5,
        -0.5,
        1e-300,
        1e300,
        -1e300,
        1.7976931348623157e308,
        2.5,
        3.0,
        1.0000001,
    ]
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    EXTREME_NUMBERS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["", ALIAS, "user", "assistant", "system", "tool", "\x00", "\ud7ff", "🙂" * 10, "x" * 5000]),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "", "USER"]), "content": JSON}
    ),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=40)}),
    st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.lists(st.fixed_dictionaries({"type": JSON, "text": JSON}), max_size=3)}
    ),
    JSON,
)


def _request_shaped(fields: list[str], required: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict]:  # type: ignore[type-arg]
    """A body with the schema's field names, some of their values of the wrong type or extreme."""
    return st.fixed_dictionaries(
        {"model": st.one_of(st.just(ALIAS), st.just(ALIAS), JSON_SCALARS), **required},
        optional={name: JSON_SCALARS | JSON for name in fields if name not in required and name != "model"},
    )


CHAT_BODIES = _request_shaped(
    list(ChatCompletionRequest.model_fields), {"messages": st.one_of(st.lists(MESSAGE, max_size=3), JSON)}
)
COMPLETION_BODIES = _request_shaped(
    list(CompletionRequest.model_fields),
    {"prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-(2**40), 2**40), max_size=8), JSON)},
)
SMALL = {"max_tokens": 4, "n": 1}
VALID_CHAT = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], **SMALL}
VALID_COMPLETION = {"model": ALIAS, "prompt": "hi", **SMALL}


def _bound(body: Any) -> Any:
    """Keep generation small when the body happens to be valid (the fuzz is about parsing, not length)."""
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens", "n", "best_of"):
            if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > 8:
                body[key] = 8
    return body


def _check(client: TestClient, path: str, raw: bytes) -> None:
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code in ALLOWED, f"{path} answered {response.status_code} to {raw[:300]!r}: {response.text}"
    if response.status_code != 200:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str) and "code" in error and "param" in error
    else:
        assert "internal error" not in response.text, f"a stream ended with an internal error for {raw[:300]!r}"


def _json_text(body: Any) -> bytes:
    """JSON text of `body`; integers beyond 64 bits are written out (the stdlib can, orjson cannot)."""
    return json.dumps(body, allow_nan=True).encode()


@FUZZ
@given(path=st.sampled_from(PATHS), body=JSON)
@example(path=PATHS[0], body=VALID_CHAT)
@example(path=PATHS[1], body=VALID_COMPLETION)
@example(path=PATHS[1], body={**VALID_COMPLETION, "max_tokens": 2**64})
@example(path=PATHS[0], body={**VALID_CHAT, "messages": []})
@example(path=PATHS[0], body={**VALID_CHAT, "temperature": "hot"})
@example(path=PATHS[1], body={**VALID_COMPLETION, "prompt": [2**40]})
def test_any_json_body_gets_an_answer_or_a_clear_error(client: TestClient, path: str, body: Any) -> None:
    _check(client, path, _json_text(_bound(body)))


@FUZZ
@given(body=CHAT_BODIES, stream=st.booleans())
def test_chat_shaped_bodies_get_an_answer_or_a_clear_error(client: TestClient, body: dict, stream: bool) -> None:  # type: ignore[type-arg]
    body.setdefault("stream", stream)
    _check(client, PATHS[0], _json_text(_bound(body)))


@FUZZ
@given(body=COMPLETION_BODIES, stream=st.booleans())
def test_completion_shaped_bodies_get_an_answer_or_a_clear_error(client: TestClient, body: dict, stream: bool) -> None:  # type: ignore[type-arg]
    body.setdefault("stream", stream)
    _check(client, PATHS[1], _json_text(_bound(body)))


@FUZZ
@given(path=st.sampled_from(PATHS), raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
@example(path=PATHS[0], raw=b"")
@example(path=PATHS[1], raw=b'{"model": "fake", "prompt": "hi", "temperature": NaN}')
@example(path=PATHS[1], raw=b'{"model": "fake", "prompt": "hi", "max_tokens": Infinity}')
@example(path=PATHS[0], raw=b"\xff\xfe")
@example(path=PATHS[0], raw=b"[" * 10_000)
def test_any_bytes_get_a_clear_error(client: TestClient, path: str, raw: bytes) -> None:
    _check(client, path, raw)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_a_clear_error(client: TestClient, value: float) -> None:
    for field in ("temperature", "top_p", "max_tokens", "presence_penalty"):
        _check(client, PATHS[1], _json_text({**VALID_COMPLETION, field: value}))


def test_the_gateway_still_serves_after_the_fuzzing(client: TestClient) -> None:
    for path, body in zip(PATHS, (VALID_CHAT, VALID_COMPLETION), strict=True):
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"]
    assert client.get("/health").status_code == 200
