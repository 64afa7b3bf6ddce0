"""Typed domain errors shared by the daemon, the client and the gateway (docs/architecture.md "Errors").

Every error the serving stack raises on purpose is a `CalculetError` carrying an `ErrorKind`.
Transport layers map the kind, in one place each, to a gRPC status code or an HTTP status;
nothing else decides codes. An exception that is not a `CalculetError` is a bug and surfaces
as INTERNAL.
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    """What went wrong, from the caller's point of view."""

    INVALID_ARGUMENT = "invalid_argument"  # bad params, token id >= vocab, prompt too long
    NOT_FOUND = "not_found"  # unknown model alias, unknown job id
    OVERLOADED = "overloaded"  # queue full, admission deadline passed, no free capacity
    UNAVAILABLE = "unavailable"  # model not ready, draining, board unhealthy
    DEADLINE_EXCEEDED = "deadline_exceeded"
    PERMISSION_DENIED = "permission_denied"
    UNAUTHENTICATED = "unauthenticated"
    FAILED_PRECONDITION = "failed_precondition"  # package invalid, conflicting operation
    ABORTED = "aborted"  # unrecoverable job failure
    CANCELLED = "cancelled"  # the job was cancelled by its owner
    INTERNAL = "internal"  # a bug; never raised on purpose


class CalculetError(Exception):
    """Base of every deliberate error.

    Args:
        message: one sentence an operator or API user can act on.
        kind: overrides the class default when one class serves several kinds.
    """

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, *, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    def __str__(self) -> str:
        return self.message


class InvalidArgument(CalculetError):
    kind = ErrorKind.INVALID_ARGUMENT


class NotFound(CalculetError):
    kind = ErrorKind.NOT_FOUND


class Overloaded(CalculetError):
    """Capacity is exhausted; `retry_after_s` hints when to try again."""

    kind = ErrorKind.OVERLOADED

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(CalculetError):
    kind = ErrorKind.UNAVAILABLE


class DeadlineExceeded(CalculetError):
    kind = ErrorKind.DEADLINE_EXCEEDED


class PermissionDenied(CalculetError):
    kind = ErrorKind.PERMISSION_DENIED


class Unauthenticated(CalculetError):
    kind = ErrorKind.UNAUTHENTICATED


class FailedPrecondition(CalculetError):
    kind = ErrorKind.FAILED_PRECONDITION


class Aborted(CalculetError):
    kind = ErrorKind.ABORTED


class Cancelled(CalculetError):
    kind = ErrorKind.CANCELLED


class IllegalTransition(CalculetError):
    """A lifecycle was asked to move along an edge its table does not have (a bug or a race)."""

    kind = ErrorKind.FAILED_PRECONDITION
