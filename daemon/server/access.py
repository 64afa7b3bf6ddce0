"""Access planes: who may call which RPC (docs/daemon.md "Access planes"), checked in one interceptor.

Every RPC of `calculet.v1.Daemon` belongs to one plane: inference (Submit, Wait, Cancel, GetModel),
observe (Health, Status, WatchLoad) or operate (Load, Unload, Drain, Resume, Reset, InjectFault).
grpc.health.v1 and reflection stay open (probes). When token files are configured, a call must carry
`authorization: Bearer <token>` metadata with a token of its plane: an operate token is good on every
plane, an observe token on observe, an inference token on inference and on WatchLoad (a gateway
routes on load reports and holds an inference token only). No token: UNAUTHENTICATED; a token of
another plane: PERMISSION_DENIED, both through the one error table. Tokens are compared in constant
time. With no token file at all the planes are open (a Unix socket with mode 0660 is the default
boundary; TCP needs TLS unless `--insecure`).
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import grpc

from calculet.common.errors import CalculetError, InvalidArgument, PermissionDenied, Unauthenticated
from calculet.daemon.server.errors import abort_with


class Plane(Enum):
    INFERENCE = "inference"
    OBSERVE = "observe"
    OPERATE = "operate"


_SERVICE = "/calculet.v1.Daemon/"
METHOD_PLANE: dict[str, Plane] = {
    **{m: Plane.INFERENCE for m in ("Submit", "Wait", "Follow", "Cancel", "GetModel")},
    **{m: Plane.OBSERVE for m in ("Health", "Status", "WatchLoad")},
    **{m: Plane.OPERATE for m in ("Load", "Unload", "Drain", "Resume", "Reset", "InjectFault")},
}
# Which tokens a plane accepts besides its own.
_ALSO_ACCEPTS: dict[Plane, tuple[Plane, ...]] = {
    Plane.INFERENCE: (Plane.OPERATE,),
    Plane.OBSERVE: (Plane.OPERATE,),
    Plane.OPERATE: (),
}
_GATEWAY_METHODS = ("WatchLoad",)  # observe-plane methods an inference token may call


def plane_of(method: str) -> Plane | None:
    """The plane of a full method name, or None when it is open (health, reflection).

    Raises:
        PermissionDenied: a method of the Daemon service this table does not know (fail closed).
    """
    if not method.startswith(_SERVICE):
        return None
    name = method.removeprefix(_SERVICE)
    if name not in METHOD_PLANE:
        raise PermissionDenied(f"{name} belongs to no access plane")
    return METHOD_PLANE[name]


@dataclass(frozen=True)
class AccessPolicy:
    """The bearer tokens each plane accepts (bytes, compared in constant time)."""

    tokens: Mapping[Plane, tuple[bytes, ...]]

    @property
    def enabled(self) -> bool:
        return any(self.tokens.values())

    def check(self, method: str, token: bytes | None) -> None:
        """Raises: Unauthenticated (no token), PermissionDenied (not a token of the method's plane)."""
        plane = plane_of(method)
        if plane is None or not self.enabled:
            return
        if not token:
            raise Unauthenticated(f"{method}: send `authorization: Bearer <token>` of the {plane.value} plane")
        planes = [plane, *_ALSO_ACCEPTS[plane]]
        if method.removeprefix(_SERVICE) in _GATEWAY_METHODS:
            planes.append(Plane.INFERENCE)
        # Compare against every candidate, so the time does not tell which plane a token belongs to.
        matched = [hmac.compare_digest(token, t) for p in Plane for t in self.tokens.get(p, ()) if p in planes]
        if not any(matched):
            raise PermissionDenied(f"{method}: the token is not one of the {plane.value} plane")


def read_tokens(path: Path) -> tuple[bytes, ...]:
    """One token per line; blank lines and `#` comments ignored.

    Raises:
        InvalidArgument: the file cannot be read or holds no token.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"token file {path}: {exc}") from None
    tokens = tuple(line.strip().encode() for line in lines if line.strip() and not line.strip().startswith("#"))
    if not tokens:
        raise InvalidArgument(f"token file {path}: holds no token")
    return tokens


def load_policy(files: Mapping[Plane, Path | None]) -> AccessPolicy:
    """The policy from each plane's token file (None: that plane has no token of its own).

    Raises:
        InvalidArgument: a file cannot be read or is empty.
    """
    return AccessPolicy({plane: read_tokens(path) for plane, path in files.items() if path is not None})


def bearer(metadata: Any) -> bytes | None:
    """The bearer token of a call's invocation metadata, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            return token.strip().encode() if scheme.lower() == "bearer" and token.strip() else None
    return None


class BearerAuth(grpc.aio.ServerInterceptor):
    """Refuse a call whose bearer token is missing or of another plane, before its handler runs."""

    def __init__(self, policy: AccessPolicy) -> None:
        self.policy = policy

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        try:
            self.policy.check(details.method, bearer(details.invocation_metadata))
        except CalculetError as exc:
            return _refusing(handler, exc)
        return handler


def _refusing(handler: grpc.RpcMethodHandler, error: CalculetError) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only aborts with `error`."""
    kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
    kind = next(k for k in kinds if getattr(handler, k) is not None)
    if inspect.isasyncgenfunction(getattr(handler, kind)) or kind.endswith("_stream"):

        async def stream(_request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await abort_with(context, error)
            yield  # pragma: no cover - abort raises

        behavior: Callable[..., Any] = stream
    else:

        async def unary(_request: Any, context: grpc.aio.ServicerContext) -> Any:
            await abort_with(context, error)

        behavior = unary
    make = getattr(grpc, f"{kind}_rpc_method_handler")
    refused: grpc.RpcMethodHandler = make(
        behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
    return refused


@dataclass(frozen=True)
class ServerSecurity:
    """How the daemon's listener is protected.

    Attributes:
        policy: bearer tokens per plane (none: planes open).
        tls_cert / tls_key: PEM server certificate and key (required for TCP unless `insecure`).
        tls_client_ca: PEM CA; when given, clients must present a certificate it signed (mTLS).
        insecure: allow plain TCP (the operator said so explicitly).
        socket_mode: permissions of a Unix socket (0660: owner and group).
    """

    policy: AccessPolicy = AccessPolicy({})
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    insecure: bool = False
    socket_mode: int = 0o660

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("tls: give both --tls-cert and --tls-key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls: --tls-client-ca needs --tls-cert and --tls-key")

    def tcp_credentials(self, target: str) -> grpc.ServerCredentials | None:
        """The TLS credentials of a TCP listener; None for plain TCP (only with `insecure`).

        Raises:
            InvalidArgument: plain TCP without `insecure`, or an unreadable certificate file.
        """
        if self.tls_cert is None or self.tls_key is None:
            if not self.insecure:
                raise InvalidArgument(
                    f"listen: TCP {target} needs TLS (--tls-cert and --tls-key) or an explicit --insecure"
                )
            return None
        ca = _read(self.tls_client_ca) if self.tls_client_ca is not None else None
        return grpc.ssl_server_credentials(
            [(_read(self.tls_key), _read(self.tls_cert))], root_certificates=ca, require_client_auth=ca is not None
        )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"tls file {path}: {exc.strerror}") from None
