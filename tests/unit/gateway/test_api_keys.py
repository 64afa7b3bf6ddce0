"""API keys on the HTTP API (`--api-key-file`): /v1/* needs `Authorization: Bearer <key>`, answered
401 in OpenAI's shape (`invalid_request_error` / `invalid_api_key`) through the one error table
otherwise; /health, /ready and /metrics stay open; keys compared in constant time against every
candidate. The app runs in-process (Starlette's TestClient) over fake boards."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from calculet.common.errors import InvalidArgument, Unauthenticated
from calculet.gateway.api import auth
from calculet.gateway.api.app import create_app
from calculet.gateway.api.auth import ApiKeyAuth, bearer_key, key_matches, read_api_keys
from calculet.gateway.errors import InvalidApiKey, error_response
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import serving

KEYS = (b"sk-first-key", b"sk-second-key")


def _app(keys: tuple[bytes, ...]) -> TestClient:
    return TestClient(create_app(serving(FakeDaemon("board-0")), api_keys=keys), raise_server_exceptions=True)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with _app(KEYS) as c:  # the context runs the lifespan: the fleet is up inside it
        yield c


def _auth(key: bytes | str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key.decode() if isinstance(key, bytes) else key}"}


def _assert_invalid_api_key(response, message: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    }


COMPLETION = {"model": ALIAS, "prompt": "hi", "max_tokens": 3, "seed": 1}


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", COMPLETION),
        ("POST", "/v1/chat/completions", {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/v1/no-such-route", None),
    ],
)
def test_v1_without_a_key_is_401_missing(client: TestClient, method: str, path: str, body: object) -> None:
    _assert_invalid_api_key(client.request(method, path, json=body), auth.MISSING)


@pytest.mark.parametrize(
    "headers",
    [
        _auth("sk-wrong"),
        _auth("sk-first-ke"),  # a prefix of a key
        _auth("sk-first-key-and-more"),  # a key and more
        {"Authorization": "Basic c2stZmlyc3Qta2V5"},  # another scheme
        {"Authorization": "Bearer"},  # no key at all
        {"Authorization": "sk-first-key"},  # no scheme
    ],
)
def test_v1_with_a_wrong_key_is_401(client: TestClient, headers: dict[str, str]) -> None:
    response = client.get("/v1/models", headers=headers)
    scheme_ok = headers["Authorization"].startswith("Bearer ")
    _assert_invalid_api_key(response, auth.INCORRECT if scheme_ok else auth.MISSING)


def test_v1_with_a_right_key_is_served(client: TestClient) -> None:
    for key in KEYS:
        models = client.get("/v1/models", headers=_auth(key))
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [ALIAS]
    done = client.post("/v1/completions", json=COMPLETION, headers=_auth(KEYS[1]))
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
    with client.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}, headers=_auth(KEYS[0])) as sse:
        assert sse.status_code == 200
        assert list(sse.iter_lines())[-2:] == ["data: [DONE]", ""]
    lower = client.get("/v1/models", headers={"authorization": "bearer  sk-first-key "})  # scheme case, blanks
    assert lower.status_code == 200
    unknown = client.get("/v1/no-such-route", headers=_auth(KEYS[0]))
    assert unknown.status_code == 404  # past the key check, routing answers


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probes_stay_open(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200, response.text


def test_without_keys_the_api_is_open() -> None:
    with _app(()) as client:
        assert client.get("/v1/models").status_code == 200
        assert client.post("/v1/completions", json=COMPLETION).status_code == 200


# ---- the pieces -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers, key",
    [
        ([], None),
        ([(b"authorization", b"Bearer abc")], b"abc"),
        ([(b"Authorization", b"bearer abc ")], b"abc"),
        ([(b"authorization", b"Bearer")], None),
        ([(b"authorization", b"Bearer   ")], None),
        ([(b"authorization", b"Token abc")], None),
        ([(b"x-api-key", b"abc")], None),
    ],
)
def test_bearer_key(headers: list[tuple[bytes, bytes]], key: bytes | None) -> None:
    assert bearer_key(headers) == key


def test_the_key_is_compared_with_every_candidate_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", recording)
    keys = (b"k1", b"k2", b"k3")
    assert key_matches(b"k1", keys)  # the first matches: the others are compared all the same
    assert compared == [(b"k1", b"k1"), (b"k1", b"k2"), (b"k1", b"k3")]
    compared.clear()
    assert not key_matches(b"nope", keys)
    assert len(compared) == 3


def test_the_middleware_needs_a_key() -> None:
    with pytest.raises(InvalidArgument, match="at least one key"):
        ApiKeyAuth(lambda *_: None, ())  # type: ignore[arg-type]


def test_invalid_api_key_goes_through_the_error_table() -> None:
    response = error_response(InvalidApiKey("incorrect API key provided"))
    assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    assert orjson.loads(response.body)["error"] == {
        "message": "incorrect API key provided", "type": "invalid_request_error", "param": None,
        "code": "invalid_api_key",
    }  # fmt: skip
    # Any other UNAUTHENTICATED error keeps the kind's type and code.
    plain = orjson.loads(error_response(Unauthenticated("no")).body)["error"]
    assert (plain["type"], plain["code"]) == ("authentication_error", "unauthenticated")


def test_read_api_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team A\nsk-a\n\n   sk-b  \n# sk-commented-out\n\t\n")
    assert read_api_keys(path) == (b"sk-a", b"sk-b")


@pytest.mark.parametrize(
    "body, match",
    [
        (None, r"api-key-file .*/keys: cannot be read"),
        ("", "holds no key"),
        ("# only a comment\n\n", "holds no key"),
        ("sk-a\nsk b\n", "line 2 is not printable ASCII"),
        ("sk-\u00e9\n", "line 1 is not printable ASCII"),
    ],
)
def test_bad_api_key_files_are_refused(tmp_path: Path, body: str | None, match: str) -> None:
    path = tmp_path / "keys"
    if body is not None:
        path.write_text(body)
    with pytest.raises(InvalidArgument, match=match):
        read_api_keys(path)
