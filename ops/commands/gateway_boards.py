"""The boards a gateway serves from, for `calctl status|top|rollout --gateway URL`; not a command
itself (no COMMAND).

Owns: the `--gateway URL` form (`http://HOST:PORT`, `https://...`, or `unix:PATH` of the gateway's
socket), the optional `--api-key-file` (the first key is sent as `Authorization: Bearer`; /ready is
open on today's gateways, the key is for gateways that close it), and reading the gateway's
`GET /ready` answer, `{"status", "boards": {target: state}, "models": {alias: ready boards}}`, which
it returns with 200 or 503 alike. Data flow: `Gateway.from_args(args)` -> `Gateway.ready()` ->
`.targets()` (the daemon addresses, sorted) and `.ready_boards(alias)`. Failures raise the typed
`Unavailable` (unreachable, not a gateway's answer) or `InvalidArgument` (bad URL, key file).

The targets are the daemon addresses as the gateway dials them: calctl must be able to reach them
the same way (a relative Unix socket path is relative to the gateway's working directory).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from calculet.common.errors import Unavailable
from calculet.common.secret_files import read_secret_lines

UNIX_BASE_URL = "http://gateway"
DEFAULT_TIMEOUT_S = 10.0


def gateway_url_type(text: str) -> str:
    """argparse type: `http://...`, `https://...` or `unix:PATH`. Raises argparse.ArgumentTypeError."""
    if text.startswith("unix:") and text.removeprefix("unix:"):
        return text
    if text.startswith(("http://", "https://")) and len(text.split("://", 1)[1].strip("/")) > 0:
        return text.rstrip("/")
    raise argparse.ArgumentTypeError(f"{text!r}: expected http://HOST:PORT, https://HOST:PORT or unix:PATH")


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway",
        type=gateway_url_type,
        metavar="URL",
        help="take the boards from this gateway's GET /ready (http://HOST:PORT or unix:PATH); instead of --daemon",
    )
    parser.add_argument(
        "--api-key-file", metavar="FILE", help="API key sent to the gateway (first line that is not a # comment)"
    )


@dataclass(frozen=True)
class Gateway:
    """A gateway to ask for its boards.

    Attributes:
        url: as given (`http(s)://...` or `unix:PATH`).
        api_key: sent as a bearer key when set.
        timeout: seconds per HTTP request.
    """

    url: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Gateway:
        """Raises: InvalidArgument: the API key file cannot be read or holds no key."""
        key_file = getattr(args, "api_key_file", None)
        key = read_secret_lines(Path(key_file), "api-key-file")[0] if key_file else None
        return cls(args.gateway, key)

    def ready(self) -> dict[str, Any]:
        """The gateway's /ready answer (200 or 503).

        Raises:
            Unavailable: no answer, another status, or a body without a `boards` object.
        """
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            with self._client() as client:
                reply = client.get("/ready", headers=headers)
        except httpx.HTTPError as err:
            raise Unavailable(f"gateway {self.url}: {err or type(err).__name__}") from None
        if reply.status_code not in (200, 503):
            raise Unavailable(f"gateway {self.url}: GET /ready answered {reply.status_code}: {reply.text[:200]}")
        try:
            body = reply.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("boards"), dict):
            raise Unavailable(f"gateway {self.url}: GET /ready did not answer with a boards object")
        return body

    def targets(self) -> list[str]:
        """The daemon addresses the gateway knows, sorted. Raises: as `ready`; Unavailable when it
        knows none."""
        targets = sorted(str(t) for t in self.ready()["boards"])
        if not targets:
            raise Unavailable(f"gateway {self.url}: knows no boards")
        return targets

    def ready_boards(self, alias: str) -> int:
        """How many boards the gateway would route `alias` to now. Raises: as `ready`."""
        models = self.ready().get("models")
        count = models.get(alias, 0) if isinstance(models, dict) else 0
        return int(count) if isinstance(count, int) else 0

    def _client(self) -> httpx.Client:
        if self.url.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=self.url.removeprefix("unix:"))
            return httpx.Client(transport=transport, base_url=UNIX_BASE_URL, timeout=self.timeout, trust_env=False)
        return httpx.Client(base_url=self.url, timeout=self.timeout, trust_env=False)
