"""The one table between error kinds, gRPC status codes and the wire's `ErrorKind` enum.

Shared by the daemon (`daemon/server/errors.py` aborts calls with `GRPC_CODE[kind]`, through
`calculet.daemon.wire`, which re-exports these names) and the client (`calculet.client.errors`
reads `KIND_OF_CODE` and rebuilds the typed error with `error_from_kind`). It imports only the
stdlib-only `calculet.common.errors`, grpc and the generated `common_pb2`, so importing it pulls in
neither the daemon's engine nor numpy. Data flow: daemon `CalculetError` -> `GRPC_CODE` -> gRPC
status -> `KIND_OF_CODE` -> `error_from_kind` -> the same `CalculetError` class in the client.
`ErrorKind` values on the wire equal gRPC status codes (common.proto).
"""

from __future__ import annotations

import grpc

from calculet.common.errors import (
    Aborted,
    CalculetError,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from calculet.v1 import common_pb2

GRPC_CODE: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.ABORTED: grpc.StatusCode.ABORTED,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}
KIND_OF_CODE: dict[grpc.StatusCode, ErrorKind] = {code: kind for kind, code in GRPC_CODE.items()}
ERROR_CLASS: dict[ErrorKind, type[CalculetError]] = {
    ErrorKind.INVALID_ARGUMENT: InvalidArgument,
    ErrorKind.NOT_FOUND: NotFound,
    ErrorKind.OVERLOADED: Overloaded,
    ErrorKind.UNAVAILABLE: Unavailable,
    ErrorKind.DEADLINE_EXCEEDED: DeadlineExceeded,
    ErrorKind.PERMISSION_DENIED: PermissionDenied,
    ErrorKind.UNAUTHENTICATED: Unauthenticated,
    ErrorKind.FAILED_PRECONDITION: FailedPrecondition,
    ErrorKind.ABORTED: Aborted,
    ErrorKind.CANCELLED: Cancelled,
}
# Trailing metadata of a RESOURCE_EXHAUSTED status: seconds after which a retry may succeed.
RETRY_AFTER_KEY = "calculet-retry-after-s"
DEFAULT_RETRY_AFTER_S = 1.0


def kind_to_pb(kind: ErrorKind) -> int:
    """The wire `ErrorKind` number of `kind` (equal to its gRPC status code)."""
    return int(common_pb2.ErrorKind.Value(f"ERROR_KIND_{kind.name}"))


def kind_from_pb(value: int) -> ErrorKind:
    """The kind of a wire `ErrorKind` number; unknown numbers (a newer peer) read as INTERNAL
    rather than failing the whole stream."""
    try:
        name = common_pb2.ErrorKind.Name(value).removeprefix("ERROR_KIND_")
    except ValueError:
        return ErrorKind.INTERNAL
    return ErrorKind[name] if name in ErrorKind.__members__ else ErrorKind.INTERNAL


def error_from_kind(kind: ErrorKind, message: str, retry_after_s: float | None = None) -> CalculetError:
    """Rebuild the typed error of `kind` (the class the daemon raised).

    Args:
        kind: what went wrong.
        message: the error's message.
        retry_after_s: for OVERLOADED, the retry hint (None = `DEFAULT_RETRY_AFTER_S`); ignored otherwise.

    Returns:
        An instance of the `calculet.common.errors` class of `kind`; a plain `CalculetError` with
        that kind for kinds without their own class (INTERNAL).
    """
    cls = ERROR_CLASS.get(kind)
    if cls is Overloaded:
        return Overloaded(message, retry_after_s=DEFAULT_RETRY_AFTER_S if retry_after_s is None else retry_after_s)
    if cls is None:
        return CalculetError(message, kind=kind)
    return cls(message)
