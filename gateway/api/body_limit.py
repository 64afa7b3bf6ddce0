"""`BodyLimit`: a request body over the gateway's limit is refused with 413 before it is read whole.

A body that declares its size (Content-Length) over the limit is answered at once, before a byte of
it is read; one without (chunked) is counted as the route reads it, which stops with
`RequestTooLarge` once the count passes the limit. Either way the gateway holds at most the limit
of any one body. The answer is the gateway's own error shape through `errors.error_response`
(FastAPI's own `max_body_size` answers in plain text).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.gateway.errors import RequestTooLarge, error_response


class BodyLimit:
    """ASGI middleware bounding every HTTP request body.

    Args:
        app: the application it wraps.
        max_bytes: the largest body served.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def too_large(self) -> RequestTooLarge:
        return RequestTooLarge(f"body: over the gateway's limit of {self.max_bytes} bytes (max-body-bytes)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(self.too_large())(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self.too_large()  # the route's read fails; the app's handler answers 413
            return message

        await self.app(scope, counted, send)
