"""Translate failed gRPC calls into the typed domain errors (`calculet.common.errors`).

Owns the client half of docs/architecture.md "Errors": a `grpc.RpcError` (sync) or `grpc.aio.AioRpcError`
carries a status code, details and trailing metadata; `error_from_rpc` maps the code to an
`ErrorKind` through `calculet.common.error_codes.KIND_OF_CODE` (the one table, shared with the
daemon) and rebuilds the typed error with `error_codes.error_from_kind`, reading the retry hint
of RESOURCE_EXHAUSTED from the trailing metadata `calculet-retry-after-s`. Codes the daemon never
sends on purpose (UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS, ...) become a `CalculetError` of
kind INTERNAL.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import grpc

from calculet.common.error_codes import KIND_OF_CODE, RETRY_AFTER_KEY, error_from_kind
from calculet.common.errors import CalculetError, ErrorKind

log = logging.getLogger(__name__)


@runtime_checkable
class RpcStatus(Protocol):
    """What both `grpc.Call` errors (sync) and `grpc.aio.AioRpcError` expose."""

    def code(self) -> grpc.StatusCode: ...

    def details(self) -> str | None: ...

    def trailing_metadata(self) -> Any: ...


def error_from_rpc(err: grpc.RpcError, method: str) -> CalculetError:
    """The typed domain error for a failed call.

    Args:
        err: the exception gRPC raised (sync or aio).
        method: the RPC name, used when the status has no details.

    Returns:
        An instance of the `calculet.common.errors` class of the code's kind (`Overloaded` with
        `retry_after_s` from the trailing metadata, or its default when absent).
    """
    if not isinstance(err, RpcStatus):
        # A bare RpcError without a status is a gRPC-internal failure, not a daemon answer.
        return CalculetError(f"{method}: {err!r}", kind=ErrorKind.INTERNAL)
    code = err.code()
    kind = KIND_OF_CODE.get(code, ErrorKind.INTERNAL)
    message = " ".join((err.details() or "").split()) or f"{method} failed with {code.name}"
    if kind is ErrorKind.INTERNAL:
        message = f"{message} ({code.name})"
    retry_after_s = retry_after(err.trailing_metadata()) if kind is ErrorKind.OVERLOADED else None
    return error_from_kind(kind, message, retry_after_s)


def retry_after(metadata: Iterable[Any] | None) -> float | None:
    """The `calculet-retry-after-s` hint (decimal seconds) from trailing metadata, if valid.

    Args:
        metadata: (key, value) pairs: sync gRPC's `_Metadatum` tuples or a `grpc.aio.Metadata`.

    A malformed hint is logged and ignored: the call's own error matters more than its hint.
    """
    for key, value in metadata or ():
        if key != RETRY_AFTER_KEY:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
        log.warning("ignoring malformed %s trailing metadata %r", RETRY_AFTER_KEY, text)
    return None
