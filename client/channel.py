"""Daemon addresses and the gRPC channels to them, shared by the sync and async clients.

Owns: parsing a target string into what gRPC dials (`parse_target`), the channel options every
client uses (send limit, keepalive, reconnect backoff; the receive limit stays gRPC's default),
TLS (`TlsConfig` -> `read_tls` -> `TlsMaterial`, the files read once when a client is built), and
the per-call metadata (`authorization: Bearer <token>`). Data flow: `DaemonClient(target, token=,
tls=)` -> `ClientSettings.build` -> `open_channel`/`open_aio_channel` (secure when TLS is
configured) -> the client's stub; every call carries `ClientSettings.metadata`.

Accepted targets:
- `unix:///abs/path.sock` (absolute), `unix:relative.sock` or `unix:/abs/path.sock`;
- a bare filesystem path ending in `.sock` (relative or absolute), taken as a Unix socket;
- `host:port` or `[v6-address]:port` (TCP; plaintext unless a `TlsConfig` is given).

The token: one place builds the metadata (`call_metadata`) and each client sends it from its few
call sites (`_unary`, `_stream`, `_wait_ready`, `watch_health`), so unary calls, every stream and
the Wait that `generate` re-attaches all carry it. It is per-call metadata rather than gRPC call
credentials because gRPC sends call credentials only over secure channels, and a daemon on a Unix
socket (or started with --insecure) is reached in plaintext but may still check tokens.

Readiness (`wait_ready`, `wait_ready_async`): before re-attaching a broken stream the clients
block until the channel carries calls again, by sending the standard `grpc.health.v1` Check with
`wait_for_ready` and the client's timeout. Any answer that comes from the daemon (SERVING or not,
even UNIMPLEMENTED or UNAUTHENTICATED) proves the connection is up; only UNAVAILABLE and
DEADLINE_EXCEEDED mean it is not. (`grpc.channel_ready_future` would do the same for the sync
channel, but its connectivity-polling thread races with `channel.close()` and dies with
"Channel closed!" when a client is closed shortly after.)
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.common.errors import InvalidArgument, Unavailable

# The receive limit stays gRPC's default (4 MiB), as on any stock client: the daemon sends nothing
# larger (GetModel streams tokenizer.json in 1 MiB pieces). Nothing the client sends comes near
# the send limit.
MAX_SEND_MESSAGE_BYTES = 16 * 1024 * 1024
# Pings only while a call is open: they detect a dead TCP peer under a long Wait/WatchLoad stream
# or a long Unload/Drain. Just above gRPC servers' default minimum ping interval (5 min,
# grpc.http2.min_recv_ping_interval_without_data_ms): a server answers pings that come more often
# with no data in between with GOAWAY "too_many_pings", failing every call on the connection.
# (A Unix socket peer that dies closes the socket at once; keepalive matters for TCP only.)
KEEPALIVE_TIME_MS = 330_000
KEEPALIVE_TIMEOUT_MS = 10_000
# A restarted daemon should be found within seconds, not gRPC's default of up to 2 minutes.
INITIAL_RECONNECT_BACKOFF_MS = 250
MAX_RECONNECT_BACKOFF_MS = 5_000
USER_AGENT = "calculet-client"
# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107

_PORT = re.compile(r"[0-9]{1,5}")
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


class Transport(Enum):
    UNIX = "unix"
    TCP = "tcp"


@dataclass(frozen=True)
class Target:
    """A parsed daemon address.

    Attributes:
        text: the string the caller gave (for messages).
        grpc_target: what the gRPC channel dials.
        transport: Unix socket or TCP.
        address: the socket path, or "host:port".
    """

    text: str
    grpc_target: str
    transport: Transport
    address: str


def parse_target(text: str) -> Target:
    """Parse a daemon target (forms in the module docstring).

    Raises:
        InvalidArgument: empty, unsupported scheme, `unix://` with a relative path, socket path
            longer than the kernel allows, host without port, port outside 1..65535.
    """
    if not text or text.strip() != text or "\x00" in text:
        raise InvalidArgument(f"target {text!r}: must be non-empty, without surrounding blanks or NUL")
    if text.startswith("unix://"):
        path = text.removeprefix("unix://")
        if not path.startswith("/"):
            raise InvalidArgument(
                f"target {text!r}: unix:// needs an absolute path (use unix:{path} for a relative one)"
            )
        return _unix(text, path)
    if text.startswith("unix:"):
        return _unix(text, text.removeprefix("unix:"))
    if text.endswith(".sock"):
        return _unix(text, text)
    return _tcp(text)


def _unix(text: str, path: str) -> Target:
    if not path or path.endswith("/"):
        raise InvalidArgument(f"target {text!r}: no socket path")
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        raise InvalidArgument(f"target {text!r}: socket path longer than {MAX_SOCKET_PATH_BYTES} bytes")
    grpc_target = f"unix://{path}" if path.startswith("/") else f"unix:{path}"
    return Target(text, grpc_target, Transport.UNIX, path)


def _tcp(text: str) -> Target:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(f"target {text!r}: expected unix:PATH, a path ending in .sock, or host:port")
    if not _HOST.fullmatch(host):
        raise InvalidArgument(f"target {text!r}: bad host {host!r} (bracket IPv6 addresses: [::1]:port)")
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise InvalidArgument(f"target {text!r}: port must be an integer in 1..65535")
    return Target(text, text, Transport.TCP, text)


def channel_options(server_name: str | None = None) -> list[tuple[str, int | str]]:
    """The options every client channel is opened with (see the constants above), plus the TLS
    name override when `server_name` is given."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ("grpc.primary_user_agent", USER_AGENT),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the daemon (a daemon on TCP requires it unless started with --insecure).

    Attributes:
        ca_file: PEM bundle of the CA(s) that signed the daemon's certificate; None = the system's
            trusted roots.
        cert_file / key_file: PEM client certificate (chain) and its private key, for mutual TLS
            (both or neither).
        server_name: the name the daemon's certificate must carry (also sent as SNI) instead of the
            target's host, e.g. when dialling an IP address or a Unix socket.
    """

    ca_file: PathLike | None = None
    cert_file: PathLike | None = None
    key_file: PathLike | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class TlsMaterial:
    """A `TlsConfig` with its files read (PEM bytes), ready to build channel credentials."""

    root_certificates: bytes | None
    certificate_chain: bytes | None
    private_key: bytes | None = field(repr=False)
    server_name: str | None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


def read_tls(tls: TlsConfig) -> TlsMaterial:
    """Read and check the files of `tls` (once; the channel never reads them again).

    Raises:
        InvalidArgument: not a `TlsConfig`; cert_file without key_file or the reverse; a file that
            cannot be read or holds no PEM block (the message names the path); a server_name that
            is empty or not printable ASCII without spaces.
    """
    if not isinstance(tls, TlsConfig):
        raise InvalidArgument(f"tls: must be a calculet.client.TlsConfig, got {type(tls).__name__}")
    if (tls.cert_file is None) != (tls.key_file is None):
        raise InvalidArgument("tls: cert_file and key_file go together (mutual TLS needs both)")
    name = None if tls.server_name is None else check_server_name("tls server_name", tls.server_name)
    return TlsMaterial(
        root_certificates=read_pem_file("tls ca_file", tls.ca_file),
        certificate_chain=read_pem_file("tls cert_file", tls.cert_file),
        private_key=read_pem_file("tls key_file", tls.key_file),
        server_name=name,
    )


def check_server_name(what: str, name: object) -> str:
    """`name` if it can be a TLS server name. Raises: InvalidArgument: empty, not a string, or not
    printable ASCII without spaces (`what` names the setting)."""
    if not isinstance(name, str) or not name or not all("!" <= ch <= "~" for ch in name):
        raise InvalidArgument(f"{what}: must be a non-empty host name, got {name!r}")
    return name


def read_pem_file(what: str, path: PathLike | None) -> bytes | None:
    """The bytes of the PEM file `path` (None for None); `what` names it in errors.

    Raises:
        InvalidArgument: the file cannot be read or holds no PEM block (the message names the path).
    """
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except (OSError, TypeError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InvalidArgument(f"{what} {path}: cannot be read: {reason}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgument(f"{what} {path}: not a PEM file (no -----BEGIN line)")
    return data


def open_channel(target: Target, tls: TlsMaterial | None = None) -> grpc.Channel:
    """A sync channel to `target` (TLS when `tls` is given); the caller owns it and must close it."""
    if tls is None:
        return grpc.insecure_channel(target.grpc_target, options=channel_options())
    return grpc.secure_channel(target.grpc_target, tls.credentials(), options=channel_options(tls.server_name))


def open_aio_channel(target: Target, tls: TlsMaterial | None = None) -> grpc.aio.Channel:
    """An asyncio channel to `target` (TLS when `tls` is given), bound to the running event loop;
    the caller closes it."""
    if tls is None:
        return grpc.aio.insecure_channel(target.grpc_target, options=channel_options())
    return grpc.aio.secure_channel(target.grpc_target, tls.credentials(), options=channel_options(tls.server_name))


_NOT_CONNECTED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def wait_ready(channel: grpc.Channel, target: Target, timeout: float, metadata: tuple[tuple[str, str], ...]) -> None:
    """Block until `channel` is connected to the daemon, at most `timeout` seconds.

    Raises:
        Unavailable: not connected within the timeout.
    """
    check = health_pb2_grpc.HealthStub(channel).Check
    try:
        check(health_pb2.HealthCheckRequest(), timeout=timeout, metadata=metadata, wait_for_ready=True)
    except grpc.RpcError as err:
        _raise_if_not_connected(err, target, timeout)


async def wait_ready_async(
    channel: grpc.aio.Channel, target: Target, timeout: float, metadata: tuple[tuple[str, str], ...]
) -> None:
    """`wait_ready` for an asyncio channel. Raises: Unavailable: not connected within the timeout."""
    check = health_pb2_grpc.HealthStub(channel).Check
    try:
        await check(health_pb2.HealthCheckRequest(), timeout=timeout, metadata=metadata, wait_for_ready=True)
    except grpc.RpcError as err:
        _raise_if_not_connected(err, target, timeout)


def _raise_if_not_connected(err: grpc.RpcError, target: Target, timeout: float) -> None:
    code = err.code() if isinstance(err, grpc.Call | grpc.aio.AioRpcError) else grpc.StatusCode.UNKNOWN
    if code in _NOT_CONNECTED:
        raise Unavailable(f"daemon at {target.text} did not accept calls again within {timeout:g} s") from err
    # Any other status was sent by the daemon: the channel is connected, which is all we asked.


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Metadata sent with every call: the bearer token when one is configured.

    Raises:
        InvalidArgument: the token is empty or not printable ASCII without spaces (it would not
            survive as an HTTP/2 header value).
    """
    if token is None:
        return ()
    if not token or not all("!" <= ch <= "~" for ch in token):
        raise InvalidArgument("token: must be non-empty printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)


@dataclass(frozen=True)
class ClientSettings:
    """What a client is configured with, checked once for both client flavours.

    Attributes:
        target: the parsed daemon address.
        timeout: seconds allowed for each unary call (streams have no deadline).
        metadata: sent with every call (the bearer token).
        max_reattach: Wait re-attaches allowed in a row without progress (see generation.py).
        tls: the TLS files, read; None = plaintext.
    """

    target: Target
    timeout: float
    metadata: tuple[tuple[str, str], ...] = field(repr=False)
    max_reattach: int
    tls: TlsMaterial | None = None

    @classmethod
    def build(
        cls, target: str, *, timeout: float, token: str | None, max_reattach: int, tls: TlsConfig | None = None
    ) -> ClientSettings:
        """Raises: InvalidArgument: bad target or token, timeout not a finite number > 0,
        max_reattach not an integer >= 0, bad TLS settings or files (see `read_tls`)."""
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
            raise InvalidArgument(f"timeout: must be a finite number of seconds, got {timeout!r}")
        if timeout <= 0:
            raise InvalidArgument(f"timeout: must be > 0 seconds, got {timeout}")
        if isinstance(max_reattach, bool) or not isinstance(max_reattach, int) or max_reattach < 0:
            raise InvalidArgument(f"max_reattach: must be an integer >= 0, got {max_reattach!r}")
        material = None if tls is None else read_tls(tls)
        return cls(parse_target(target), float(timeout), call_metadata(token), max_reattach, material)
