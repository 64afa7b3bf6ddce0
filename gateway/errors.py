"""The gateway's one error mapping: `ErrorKind` -> HTTP status and OpenAI error body (DESIGN.md §6).

Every failure the gateway reports is a `CalculetError` (raised by the gateway itself or rebuilt by
`calculet.client` from a daemon's gRPC status). `error_response` turns one into OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`, with the status of the table below and a
`Retry-After` header for 429. FastAPI's exception handlers (see `api/app.py`) call only this; any
other exception is a bug and becomes a 500 with a generic message (the detail goes to the log).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.responses import Response

from calculet.daemon.errors import CalculetError, ErrorKind, NotFound, Overloaded

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


def error_body(err: CalculetError, *, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for `err`."""
    _, kind_type = HTTP_OF_KIND[err.kind]
    code = "model_not_found" if isinstance(err, ModelNotFound) else err.kind.value
    return {"error": {"message": str(err), "type": kind_type, "param": param, "code": code}}


def http_status(err: CalculetError) -> int:
    return HTTP_OF_KIND[err.kind][0]


def retry_after_header(err: CalculetError) -> dict[str, str]:
    """`Retry-After` (whole seconds, at least 1) for an OVERLOADED error; {} for other kinds."""
    if err.kind is not ErrorKind.OVERLOADED:
        return {}
    hint = err.retry_after_s if isinstance(err, Overloaded) else None
    seconds = DEFAULT_RETRY_AFTER_S if hint is None or not math.isfinite(hint) else hint
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def error_response(err: CalculetError) -> Response:
    """The HTTP response for `err` (JSON body, status, Retry-After when overloaded)."""
    return Response(
        orjson.dumps(error_body(err)),
        status_code=http_status(err),
        media_type="application/json",
        headers=retry_after_header(err),
    )


def internal_error_response() -> Response:
    """A bug's response: no detail leaks to the client; the caller logs the exception."""
    return error_response(CalculetError("internal error in the gateway; see its log", kind=ErrorKind.INTERNAL))
