"""A gateway answered by a function, for the bench's HTTP backends (no sockets): `sse(...)` builds an
event-stream answer, `send_through` runs one request through a backend bound to it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import httpx

from calculet.ops.bench.gateway_backend import GatewayAddress

ADDRESS = GatewayAddress.parse("http://gw.test:8000")
Handler = Callable[[httpx.Request], httpx.Response]
R = TypeVar("R")
Q = TypeVar("Q", contravariant=True)


class Backend(Protocol[Q, R]):
    def send(self, request: Q) -> Awaitable[R]: ...

    def close(self) -> Awaitable[None]: ...


def sse(*parts: str, status: int = 200) -> Handler:
    """A handler answering every request with `parts` as one text/event-stream body."""
    return lambda request: httpx.Response(status, text="".join(parts), headers={"content-type": "text/event-stream"})


def send_through(handler: Handler, make: Callable[[httpx.AsyncClient], Backend[Q, R]], request: Q) -> R:
    """`make(http).send(request)` over an httpx client whose transport is `handler`; the backend is closed."""

    async def go() -> R:
        backend = make(httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url=ADDRESS.base_url))
        try:
            return await backend.send(request)
        finally:
            await backend.close()

    return asyncio.run(go())
