"""The gateway's one error mapping: `ErrorKind` -> HTTP status and OpenAI error body (docs/architecture.md "Errors").

Every failure the gateway reports is a `CalculetError` (raised by the gateway itself or rebuilt by
`calculet.client` from a daemon's gRPC status). `error_response` turns one into OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`, with the status of the table below, a
`Retry-After` header for 429 (and for a 503 that names when to come back: a request that waited
for a model past its deadline) and `WWW-Authenticate: Bearer` for 401. A few errors carry a type
and code of their own (`OPENAI_OF_CLASS`): an unknown model, a missing or wrong API key, a model
placement can never put on a board, a body over the size limit (which also has its own status,
413, `HTTP_OF_CLASS`). FastAPI's
exception handlers (see `api/app.py`) and the API-key middleware (`api/auth.py`) call only this;
any other exception is a bug and becomes a 500 with a generic message (the detail goes to the log).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.responses import Response

from calculet.common.errors import (
    CalculetError,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    Unauthenticated,
    Unavailable,
)

# kind -> (HTTP status, OpenAI error type)
HTTP_OF_KIND: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_ARGUMENT: (400, "invalid_request_error"),
    ErrorKind.FAILED_PRECONDITION: (400, "invalid_request_error"),
    ErrorKind.NOT_FOUND: (404, "invalid_request_error"),  # OpenAI's type for an unknown model
    ErrorKind.OVERLOADED: (429, "rate_limit_error"),
    ErrorKind.UNAVAILABLE: (503, "service_unavailable_error"),
    ErrorKind.DEADLINE_EXCEEDED: (504, "timeout_error"),
    ErrorKind.PERMISSION_DENIED: (403, "permission_error"),
    ErrorKind.UNAUTHENTICATED: (401, "authentication_error"),
    ErrorKind.ABORTED: (500, "server_error"),
    ErrorKind.CANCELLED: (499, "cancelled"),
    ErrorKind.INTERNAL: (500, "server_error"),
}
DEFAULT_RETRY_AFTER_S = 1.0


class ModelNotFound(NotFound):
    """No board knows the requested model (404, code `model_not_found`)."""

    kind = ErrorKind.NOT_FOUND


class ModelNotPlaceable(FailedPrecondition):
    """A catalog model that no board of the fleet can ever take (400, code `model_not_placeable`):
    refused at once, never queued (docs/models.md)."""

    kind = ErrorKind.FAILED_PRECONDITION


class ModelWaitExpired(Unavailable):
    """A request waited for its model to get a board past the deadline (503 with Retry-After)."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTooLarge(InvalidArgument):
    """A request body over the gateway's `max-body-bytes` (413, code `request_too_large`), refused
    before it is read whole."""

    kind = ErrorKind.INVALID_ARGUMENT


class InvalidApiKey(Unauthenticated):
    """An HTTP request without a valid API key (401; OpenAI's `invalid_request_error`, code
    `invalid_api_key`)."""

    kind = ErrorKind.UNAUTHENTICATED


# Errors that OpenAI reports with a type and code of their own: class -> (type, or None for the
# kind's type of HTTP_OF_KIND; code). Any other error's code is its kind.
OPENAI_OF_CLASS: dict[type[CalculetError], tuple[str | None, str]] = {
    ModelNotFound: (None, "model_not_found"),
    ModelNotPlaceable: (None, "model_not_placeable"),
    InvalidApiKey: ("invalid_request_error", "invalid_api_key"),
    RequestTooLarge: (None, "request_too_large"),
}
# Errors whose HTTP status is not their kind's: class -> status.
HTTP_OF_CLASS: dict[type[CalculetError], int] = {RequestTooLarge: 413}


def error_body(err: CalculetError, *, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for `err`."""
    _, kind_type = HTTP_OF_KIND[err.kind]
    own_type, code = OPENAI_OF_CLASS.get(type(err), (None, err.kind.value))
    return {"error": {"message": str(err), "type": own_type or kind_type, "param": param, "code": code}}


def http_status(err: CalculetError) -> int:
    return HTTP_OF_CLASS.get(type(err), HTTP_OF_KIND[err.kind][0])


def retry_after_header(err: CalculetError) -> dict[str, str]:
    """`Retry-After` (whole seconds, at least 1) for an OVERLOADED error and for a model wait that
    expired; {} otherwise."""
    if err.kind is not ErrorKind.OVERLOADED and not isinstance(err, ModelWaitExpired):
        return {}
    hint = err.retry_after_s if isinstance(err, Overloaded | ModelWaitExpired) else None
    seconds = DEFAULT_RETRY_AFTER_S if hint is None or not math.isfinite(hint) else hint
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def authenticate_header(err: CalculetError) -> dict[str, str]:
    """`WWW-Authenticate: Bearer` for an UNAUTHENTICATED error (RFC 9110: a 401 names its scheme)."""
    return {"WWW-Authenticate": "Bearer"} if err.kind is ErrorKind.UNAUTHENTICATED else {}


def error_response(err: CalculetError) -> Response:
    """The HTTP response for `err` (JSON body, status, Retry-After when overloaded,
    WWW-Authenticate when unauthenticated)."""
    return Response(
        orjson.dumps(error_body(err)),
        status_code=http_status(err),
        media_type="application/json",
        headers=retry_after_header(err) | authenticate_header(err),
    )


def internal_error_response() -> Response:
    """A bug's response: no detail leaks to the client; the caller logs the exception."""
    return error_response(CalculetError("internal error in the gateway; see its log", kind=ErrorKind.INTERNAL))
