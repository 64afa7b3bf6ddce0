"""API keys for the HTTP API: `--api-key-file`, checked before any route runs.

Data flow: `read_api_keys` (at start-up, from `config.config_from`) -> `create_app(api_keys=...)`
installs `ApiKeyAuth`, a plain ASGI middleware around the whole app. Every HTTP request outside
`OPEN_PATHS` (so all of /v1/*, and any unknown path) must carry `Authorization: Bearer <key>` with
one of the keys, else it is answered 401 through the one error table (`errors.InvalidApiKey`:
OpenAI's `invalid_request_error` / `invalid_api_key`) without reaching a route. /health, /ready
and /metrics stay open for probes and scrapers.

The presented key is compared with every configured key by `hmac.compare_digest`, without stopping
at a match, so the time taken does not tell which bytes of which key were right.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from calculet.common.errors import InvalidArgument
from calculet.common.secret_files import read_secret_lines
from calculet.gateway.errors import InvalidApiKey, error_response

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
MISSING = "missing API key: send the header `Authorization: Bearer <key>`"
INCORRECT = "incorrect API key provided"


def read_api_keys(path: Path) -> tuple[bytes, ...]:
    """The API keys of `path`, one a line. Raises: InvalidArgument (see `read_secret_lines`)."""
    return tuple(key.encode() for key in read_secret_lines(path, "api-key-file"))


def bearer_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The key of the request's `Authorization: Bearer <key>` header (ASGI raw headers), if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, key = value.strip().partition(b" ")
            key = key.strip()
            return key if scheme.lower() == b"bearer" and key else None
    return None


def key_matches(presented: bytes, keys: Sequence[bytes]) -> bool:
    """Whether `presented` is one of `keys`, comparing with every key in constant time."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    return matched


class ApiKeyAuth:
    """ASGI middleware: refuse HTTP requests outside `OPEN_PATHS` without a valid bearer key.

    Args:
        app: the application it guards.
        keys: the accepted keys (at least one).
    """

    def __init__(self, app: ASGIApp, keys: Sequence[bytes]) -> None:
        if not keys:
            raise InvalidArgument("ApiKeyAuth needs at least one key")
        self.app = app
        self.keys = tuple(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            refusal = self.refusal(scope["headers"])
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> InvalidApiKey | None:
        """The error for a request with these headers, or None when its key is accepted."""
        presented = bearer_key(headers)
        if presented is None:
            return InvalidApiKey(MISSING)
        if not key_matches(presented, self.keys):
            return InvalidApiKey(INCORRECT)
        return None
