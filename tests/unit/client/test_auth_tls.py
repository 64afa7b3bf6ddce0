"""Access planes on the client side: the bearer token on every call (unary, streams, the Wait that
`generate` re-attaches, health checks) for both clients, and TLS (`TlsConfig`): settings checked at
construction, files read once, server-name override, mutual TLS, and refusals of a wrong CA or a
missing client certificate. TLS servers are in-process gRPC servers on 127.0.0.1 with a throwaway
PKI (`pki.py`; those tests skip when no certificate generator is installed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from calculet.client import AsyncDaemonClient, DaemonClient, ServingStatus, TlsConfig
from calculet.client.channel import ClientSettings, channel_options, read_tls
from calculet.common.errors import InvalidArgument, Unavailable

from .conftest import MetadataRecorder, serve
from .fake_daemon import FakeDaemon, completion_tokens
from .pki import SERVER_NAME, Pki, make_pki

TOKEN = "inference-tok_3"
BEARER = f"Bearer {TOKEN}"
# What each client session below calls: unary and streaming Daemon RPCs plus the health service;
# a generation streams on Wait (sync client) or on the async client's shared Follow call.
EXPECTED_METHODS = {"Submit", "Check", "GetModel", "Status", "Health", "WatchLoad", "Watch", "Cancel", "Load"}


@pytest.fixture
def recorded(tmp_path: Path, fake: FakeDaemon) -> Iterator[tuple[str, MetadataRecorder]]:
    """A plaintext fake daemon on a Unix socket whose server records every call's metadata."""
    recorder = MetadataRecorder()
    server, _ = serve(fake, f"unix://{tmp_path / 'r.sock'}", interceptors=[recorder])
    try:
        yield f"unix://{tmp_path / 'r.sock'}", recorder
    finally:
        fake.open_all_gates()
        server.stop(grace=None).wait(5)


def _sync_session(client: DaemonClient, fake: FakeDaemon) -> None:
    fake.next_breaks = {1}  # the Wait stream breaks once: generate checks the channel, re-attaches
    assert client.generate("tiny", [8, 9], max_tokens=6).result() == completion_tokens([8, 9], 0, 6)
    client.get_model("tiny")
    client.status()
    client.health()
    with contextlib.closing(client.watch_load(100)) as reports:  # type: ignore[type-var]
        next(reports)
    with contextlib.closing(client.watch_health()) as statuses:  # type: ignore[type-var]
        assert next(statuses) is ServingStatus.SERVING
    client.cancel(client.submit("tiny", [1]).job_id)
    client.load_and_wait("tiny2", "packages/tiny")


async def _async_session(client: AsyncDaemonClient, fake: FakeDaemon) -> None:
    fake.next_breaks = {1}
    gen = await client.generate("tiny", [8, 9], max_tokens=6)
    assert await gen.result() == completion_tokens([8, 9], 0, 6)
    await client.get_model("tiny")
    await client.status()
    await client.health()
    async with contextlib.aclosing(client.watch_load(100)) as reports:  # type: ignore[type-var]
        await anext(reports)
    async with contextlib.aclosing(client.watch_health()) as statuses:  # type: ignore[type-var]
        assert await anext(statuses) is ServingStatus.SERVING
    await client.cancel((await client.submit("tiny", [1])).job_id)
    await client.load_and_wait("tiny2", "packages/tiny")


def _assert_every_call_carries(recorder: MetadataRecorder, expected: str | None, stream: str = "Wait") -> None:
    methods = recorder.methods()
    assert set(methods) >= EXPECTED_METHODS | {stream}, sorted((EXPECTED_METHODS | {stream}) - set(methods))
    assert methods.count(stream) == 2  # the first stream and the re-attached one
    assert [(m, auth) for m, auth in recorder.calls if auth != expected] == []


def test_the_sync_client_sends_the_token_on_every_call(
    recorded: tuple[str, MetadataRecorder], fake: FakeDaemon
) -> None:
    target, recorder = recorded
    with DaemonClient(target, timeout=10.0, token=TOKEN) as client:
        _sync_session(client, fake)
    _assert_every_call_carries(recorder, BEARER)


def test_the_async_client_sends_the_token_on_every_call(
    recorded: tuple[str, MetadataRecorder], fake: FakeDaemon
) -> None:
    target, recorder = recorded

    async def main() -> None:
        async with AsyncDaemonClient(target, timeout=10.0, token=TOKEN) as client:
            await _async_session(client, fake)

    asyncio.run(main())
    _assert_every_call_carries(recorder, BEARER, stream="Follow")


def test_without_a_token_no_call_carries_authorization(
    recorded: tuple[str, MetadataRecorder], fake: FakeDaemon
) -> None:
    target, recorder = recorded
    with DaemonClient(target, timeout=10.0) as client:
        _sync_session(client, fake)
    _assert_every_call_carries(recorder, None)


# ---- TLS settings (no server) -------------------------------------------------------------


def _pem(path: Path, body: str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n") -> Path:
    path.write_text(body)
    return path


def test_tls_files_are_read_into_the_settings(tmp_path: Path) -> None:
    ca, cert, key = _pem(tmp_path / "ca.pem"), _pem(tmp_path / "c.pem"), _pem(tmp_path / "c.key", "-----BEGIN KEY-")
    tls = TlsConfig(ca_file=ca, cert_file=str(cert), key_file=key, server_name="board-1.internal")
    settings = ClientSettings.build("10.0.0.7:50051", timeout=1.0, token=None, max_reattach=0, tls=tls)
    assert settings.tls is not None
    assert settings.tls.root_certificates == ca.read_bytes()
    assert settings.tls.certificate_chain == cert.read_bytes()
    assert settings.tls.private_key == key.read_bytes()
    assert settings.tls.server_name == "board-1.internal"
    assert "BEGIN KEY" not in repr(settings.tls)  # the key never shows in a repr or a log line
    assert ClientSettings.build("10.0.0.7:50051", timeout=1.0, token=None, max_reattach=0).tls is None
    system_roots = read_tls(TlsConfig())  # no CA file: the system's trusted roots
    assert (system_roots.root_certificates, system_roots.certificate_chain, system_roots.private_key) == (None,) * 3


def test_the_server_name_override_is_a_channel_option() -> None:
    assert dict(channel_options("daemon.test"))["grpc.ssl_target_name_override"] == "daemon.test"
    assert "grpc.ssl_target_name_override" not in dict(channel_options())


@pytest.mark.parametrize("client_class", [DaemonClient, AsyncDaemonClient])
def test_an_unreadable_tls_file_is_invalid_argument_naming_the_path(tmp_path: Path, client_class: type) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(InvalidArgument, match=r"ca_file .*no-such-ca\.pem"):
        client_class("127.0.0.1:50051", tls=TlsConfig(ca_file=missing))
    with pytest.raises(InvalidArgument, match=r"cert_file .*dir-not-file"):
        (tmp_path / "dir-not-file").mkdir()
        client_class("127.0.0.1:50051", tls=TlsConfig(cert_file=tmp_path / "dir-not-file", key_file=missing))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: TlsConfig(ca_file=_pem(d / "ca.pem", "not a certificate")), r"ca_file .*ca\.pem: not a PEM"),
        (lambda d: TlsConfig(cert_file=_pem(d / "c.pem")), "cert_file and key_file go together"),
        (lambda d: TlsConfig(key_file=_pem(d / "c.key")), "cert_file and key_file go together"),
        (lambda d: TlsConfig(server_name=""), "server_name"),
        (lambda d: TlsConfig(server_name="two words"), "server_name"),
        (lambda d: {"ca_file": "ca.pem"}, "TlsConfig"),
    ],
)
def test_bad_tls_settings_are_refused(tmp_path: Path, make, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=match):
        DaemonClient("127.0.0.1:50051", tls=make(tmp_path))


# ---- TLS against a server -----------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def _tls_server(
    fake: FakeDaemon, pki: Pki, *, client_auth: bool = False, recorder: MetadataRecorder | None = None
) -> tuple[grpc.Server, str]:
    credentials = grpc.ssl_server_credentials(
        [(pki.read("server_key"), pki.read("server_cert"))],
        root_certificates=pki.read("ca") if client_auth else None,
        require_client_auth=client_auth,
    )
    server, port = serve(fake, "127.0.0.1:0", credentials=credentials, interceptors=[recorder] if recorder else [])
    return server, f"127.0.0.1:{port}"


@contextlib.contextmanager
def _running(server: grpc.Server) -> Iterator[None]:
    try:
        yield
    finally:
        server.stop(grace=None).wait(5)


def test_tls_with_the_server_name_override_carries_calls_and_the_token(fake: FakeDaemon, pki: Pki) -> None:
    recorder = MetadataRecorder()
    server, target = _tls_server(fake, pki, recorder=recorder)
    with _running(server):
        tls = TlsConfig(ca_file=pki.ca, server_name=SERVER_NAME)
        with DaemonClient(target, timeout=5.0, token=TOKEN, tls=tls) as client:
            assert client.generate("tiny", [3], max_tokens=3).result() == completion_tokens([3], 0, 3)
    assert {auth for _, auth in recorder.calls} == {BEARER}


def test_tls_files_are_read_once_at_construction(tmp_path: Path, fake: FakeDaemon, pki: Pki) -> None:
    server, target = _tls_server(fake, pki)
    with _running(server):
        ca = tmp_path / "copy-of-ca.pem"
        ca.write_bytes(pki.read("ca"))
        with DaemonClient(target, timeout=5.0, tls=TlsConfig(ca_file=ca, server_name=SERVER_NAME)) as client:
            ca.unlink()  # the channel (and its reconnects) use what was read
            client.health()


def test_tls_refusals_are_unavailable(fake: FakeDaemon, pki: Pki) -> None:
    server, target = _tls_server(fake, pki)
    with _running(server):
        for tls in (
            TlsConfig(ca_file=pki.ca),  # 127.0.0.1 is not the name in the certificate
            TlsConfig(ca_file=pki.other_ca, server_name=SERVER_NAME),  # not signed by the trusted CA
            None,  # plaintext to a TLS port
        ):
            with DaemonClient(target, timeout=5.0, tls=tls) as client, pytest.raises(Unavailable):
                client.health()


def test_mutual_tls_needs_the_client_certificate(fake: FakeDaemon, pki: Pki) -> None:
    server, target = _tls_server(fake, pki, client_auth=True)
    with _running(server):
        without = TlsConfig(ca_file=pki.ca, server_name=SERVER_NAME)
        with DaemonClient(target, timeout=5.0, tls=without) as client, pytest.raises(Unavailable):
            client.health()
        mutual = TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key, server_name=SERVER_NAME)
        with DaemonClient(target, timeout=5.0, tls=mutual) as client:
            client.health()

        async def main() -> list[int]:
            async with AsyncDaemonClient(target, timeout=5.0, token=TOKEN, tls=mutual) as client:
                return await (await client.generate("tiny", [5], max_tokens=4)).result()

        assert asyncio.run(main()) == completion_tokens([5], 0, 4)
