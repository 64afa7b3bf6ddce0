"""`WorkerHeader`: with `--workers N`, every response names the worker that answered it
(`x-calculet-worker: I`), so a client, a test or an operator reading a trace knows which process's
view routed it. A pure ASGI middleware: streamed bodies pass through untouched."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.gateway.workers.identity import WORKER_HEADER


class WorkerHeader:
    """Adds `x-calculet-worker: <index>` to every HTTP response of `app`."""

    def __init__(self, app: ASGIApp, index: int) -> None:
        self.app = app
        self.header = (WORKER_HEADER.encode("latin-1"), str(index).encode("latin-1"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, sending)
