"""The one place where domain errors become gRPC statuses (DESIGN.md section 6).

`map_errors` wraps every servicer method: a `CalculetError` aborts the call with the code of its
kind (RESOURCE_EXHAUSTED also carries `calculet-retry-after-s`); anything else is a bug, logged with
its traceback and reported as INTERNAL. Nothing is swallowed. The status message travels as one
HTTP/2 header, so it is cut to `MAX_DETAILS_CHARS`: a message quoting a huge input (a 100 KB job id)
would otherwise break the header limit and reach the caller as RESOURCE_EXHAUSTED instead of its code.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from calculet.daemon.errors import CalculetError, Overloaded
from calculet.daemon.wire import GRPC_CODE, RETRY_AFTER_KEY

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
MAX_DETAILS_CHARS = 1024


def _details(message: str) -> str:
    return message if len(message) <= MAX_DETAILS_CHARS else message[: MAX_DETAILS_CHARS - 3] + "..."


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """Abort the RPC with the status that `exc` maps to (raises grpc's abort exception)."""
    if isinstance(exc, CalculetError):
        if isinstance(exc, Overloaded):
            context.set_trailing_metadata(((RETRY_AFTER_KEY, f"{exc.retry_after_s:g}"),))
        await context.abort(GRPC_CODE[exc.kind], _details(exc.message))
    log.error("internal error in RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, _details(f"internal error: {type(exc).__name__}: {exc}"))


def _is_abort(exc: BaseException) -> bool:
    # context.abort raises grpc.aio.AbortError; it already carries the status.
    return isinstance(exc, grpc.aio.AbortError)


def map_errors(method: F) -> F:
    """Decorate a servicer method (unary coroutine or async generator)."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as exc:
                if _is_abort(exc):
                    raise
                await abort_with(context, exc)

        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:
            if _is_abort(exc):
                raise
            await abort_with(context, exc)

    return unary  # type: ignore[return-value]
