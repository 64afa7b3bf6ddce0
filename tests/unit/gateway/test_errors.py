"""The gateway's one error mapping (docs/architecture.md "Errors"): ErrorKind -> HTTP status, OpenAI's error
body, and Retry-After for 429."""

from __future__ import annotations

import math

import orjson
import pytest

from calculet.common.errors import (
    Aborted,
    CalculetError,
    DeadlineExceeded,
    ErrorKind,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from calculet.gateway.errors import (
    ModelNotFound,
    ModelNotPlaceable,
    ModelWaitExpired,
    error_body,
    error_response,
    http_status,
    internal_error_response,
    retry_after_header,
)

# docs/architecture.md "Errors", "gateway HTTP" column.
DESIGN_STATUS = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.DEADLINE_EXCEEDED: 504,
    ErrorKind.PERMISSION_DENIED: 403,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.ABORTED: 500,
    ErrorKind.INTERNAL: 500,
}
CLASSES = {
    InvalidArgument: 400,
    NotFound: 404,
    Overloaded: 429,
    Unavailable: 503,
    DeadlineExceeded: 504,
    PermissionDenied: 403,
    Unauthenticated: 401,
    Aborted: 500,
}


def _body(response) -> dict:  # type: ignore[no-untyped-def]
    return orjson.loads(response.body)


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.value)
def test_every_kind_has_a_status_and_an_openai_body(kind: ErrorKind) -> None:
    err = CalculetError(f"something about {kind.value}", kind=kind)
    response = error_response(err)
    status = http_status(err)
    assert response.status_code == status
    if kind in DESIGN_STATUS:
        assert status == DESIGN_STATUS[kind]
    else:  # not in the design's table (FAILED_PRECONDITION, CANCELLED): still a client/server error
        assert 400 <= status <= 599
    assert response.media_type == "application/json"
    body = _body(response)
    assert list(body) == ["error"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] == f"something about {kind.value}"
    assert isinstance(body["error"]["type"], str) and body["error"]["type"]
    assert body["error"]["param"] is None
    assert body["error"]["code"] == kind.value
    assert body == error_body(err)


@pytest.mark.parametrize("cls, status", list(CLASSES.items()), ids=lambda x: getattr(x, "__name__", str(x)))
def test_error_classes_map_by_their_kind(cls: type[CalculetError], status: int) -> None:
    assert error_response(cls("boom")).status_code == status


def test_invalid_argument_is_openais_invalid_request_error() -> None:
    assert _body(error_response(InvalidArgument("max_tokens: too big")))["error"]["type"] == "invalid_request_error"


def test_param_is_carried() -> None:
    assert error_body(InvalidArgument("bad"), param="temperature")["error"]["param"] == "temperature"


def test_model_not_found() -> None:
    err = ModelNotFound("model 'nope' is not served")
    response = error_response(err)
    assert response.status_code == 404
    body = _body(response)["error"]
    assert body["code"] == "model_not_found"
    assert body["message"] == "model 'nope' is not served"
    # A plain NotFound (an unknown job, say) keeps the generic code.
    assert _body(error_response(NotFound("no job 7")))["error"]["code"] == ErrorKind.NOT_FOUND.value


@pytest.mark.parametrize("hint, expected", [(2.2, 3), (3.0, 3), (0.4, 1), (1.0, 1), (59.01, 60)])
def test_overloaded_has_retry_after_in_whole_seconds(hint: float, expected: int) -> None:
    response = error_response(Overloaded("queue full", retry_after_s=hint))
    assert response.status_code == 429
    assert response.headers["Retry-After"] == str(expected)
    assert response.headers["retry-after"] == str(expected)  # header names are case-insensitive


@pytest.mark.parametrize("hint", [None, 0.0, -5.0, math.nan, math.inf, -math.inf])
def test_a_missing_or_silly_hint_still_gives_at_least_one_second(hint: float | None) -> None:
    err = Overloaded("queue full") if hint is None else Overloaded("queue full", retry_after_s=hint)
    value = error_response(err).headers["Retry-After"]
    assert value.isdigit() and int(value) >= 1


def test_overloaded_kind_without_a_hint_gets_a_retry_after() -> None:
    err = CalculetError("rebuilt from RESOURCE_EXHAUSTED", kind=ErrorKind.OVERLOADED)
    value = error_response(err).headers["Retry-After"]
    assert value.isdigit() and int(value) >= 1


@pytest.mark.parametrize("kind", [k for k in ErrorKind if k is not ErrorKind.OVERLOADED], ids=lambda k: k.value)
def test_other_errors_have_no_retry_after(kind: ErrorKind) -> None:
    err = CalculetError("x", kind=kind)
    assert retry_after_header(err) == {}
    assert "retry-after" not in error_response(err).headers


def test_internal_error_leaks_no_detail() -> None:
    response = internal_error_response()
    assert response.status_code == 500
    body = _body(response)["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] == ErrorKind.INTERNAL.value
    assert "Traceback" not in body["message"]


def test_a_model_wait_past_its_deadline_is_503_with_retry_after() -> None:
    response = error_response(ModelWaitExpired("model 'b' got no board within 120 s", retry_after_s=120.0))
    assert response.status_code == 503 and response.headers["Retry-After"] == "120"
    assert _body(response)["error"]["code"] == ErrorKind.UNAVAILABLE.value


def test_a_model_that_cannot_be_placed_is_400_with_its_own_code() -> None:
    response = error_response(ModelNotPlaceable("model 'b' cannot be placed: every board refused its package"))
    body = _body(response)["error"]
    assert response.status_code == 400 and body["code"] == "model_not_placeable" and "refused" in body["message"]
    assert "retry-after" not in response.headers
