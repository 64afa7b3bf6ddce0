"""The one place where domain errors become gRPC statuses (docs/architecture.md "Errors").

`map_errors` wraps every servicer method: a `CalculetError` aborts the call with the code of its
kind (RESOURCE_EXHAUSTED also carries `calculet-retry-after-s`); anything else is a bug, logged with
its traceback and reported as INTERNAL. Nothing is swallowed. The status message travels as one
HTTP/2 header, so it is cut to `MAX_DETAILS_CHARS`: a message quoting a huge input (a 100 KB job id)
would otherwise break the header limit and reach the caller as RESOURCE_EXHAUSTED instead of its code.

`StrictDecoding` is the server interceptor for requests that do not parse as their type (bad wire
format, bad UTF-8): grpc would answer UNKNOWN for the deserializer's exception, so each method's
deserializer returns an `Undecodable` marker instead and the method refuses it with INVALID_ARGUMENT
before its servicer sees it. It covers every service on the server (Daemon, grpc.health.v1,
reflection) whose methods are coroutines or async generators.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from calculet.common.errors import CalculetError, InvalidArgument, Overloaded
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


# ---- requests that do not parse --------------------------------------------------------------


class Undecodable:
    """What a `StrictDecoding` deserializer returns for bytes that do not parse as the request type."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


class StrictDecoding(grpc.aio.ServerInterceptor):
    """Answer INVALID_ARGUMENT, not grpc's UNKNOWN, for a request that does not parse as its type.

    Wrapped handlers are cached per method name (the handlers a server holds do not change).
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = await continuation(details)
            if handler is None:  # unknown method (the stubs say otherwise): grpc answers UNIMPLEMENTED
                return handler
            wrapped = self._wrapped[method] = strict_handler(handler, method)
        return wrapped


def strict_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """`handler` with a deserializer that cannot raise and a behavior that refuses what it could not parse.

    A handler whose behavior is neither a coroutine nor an async generator function (a sync one run
    in a thread pool) is returned unchanged.
    """
    parse = handler.request_deserializer
    kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
    kind = next(k for k in kinds if getattr(handler, k) is not None)
    behavior = getattr(handler, kind)
    if parse is None or not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        return handler

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as exc:  # protobuf's DecodeError, or whatever another parser raises
            return Undecodable(InvalidArgument(f"request to {method} does not parse: {exc}"))

    checked = _checking_requests(behavior) if kind.startswith("stream_") else _refusing_undecodable(behavior)
    make = getattr(grpc, f"{kind}_rpc_method_handler")
    wrapped: grpc.RpcMethodHandler = make(
        checked, request_deserializer=deserialize, response_serializer=handler.response_serializer
    )
    return wrapped


async def _refuse_if_undecodable(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        await abort_with(context, request.error)


def _refusing_undecodable(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """A unary-request behavior that aborts with INVALID_ARGUMENT for an `Undecodable` request."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await _refuse_if_undecodable(request, context)
            async for item in behavior(request, context):
                yield item

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:  # also writers (context.write)
        await _refuse_if_undecodable(request, context)
        return await behavior(request, context)

    return unary


def _checking_requests(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """A stream-request behavior whose request iterator aborts at the first `Undecodable` request."""

    async def checked(requests: AsyncIterable[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for request in requests:
            await _refuse_if_undecodable(request, context)
            yield request

    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: AsyncIterable[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(checked(requests, context), context):
                yield item

        return stream

    async def unary(requests: AsyncIterable[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(checked(requests, context), context)

    return unary
