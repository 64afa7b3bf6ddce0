"""The gateway's side of the daemons' access planes: the access settings (`--api-key-file`,
`--daemon-token-file`, `--daemon-ca`, `--daemon-cert`, `--daemon-key`, `--daemon-server-name` and
their `[gateway]` keys) checked at start-up; `ClientConnection` sending the inference token on every
call it makes (Submit, Wait, GetModel, WatchLoad, health Watch) and reporting a daemon's refusal of
its credentials as UNAVAILABLE; and `connection_factory` using TLS for host:port daemons only.
Daemons are the in-process gRPC fake of the client tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from calculet.client import SamplingParams, ServingStatus, TlsConfig
from calculet.common.errors import InvalidArgument, NotFound, Unavailable
from calculet.gateway import main as gateway_main
from calculet.gateway.config import GatewayConfig, config_from, read_config
from calculet.gateway.fleet.connection import ChoiceSubmit, ClientConnection
from calculet.gateway.main import build_parser, connection_factory, settings_from
from tests.unit.client.conftest import MetadataRecorder, serve
from tests.unit.client.fake_daemon import Failure, FakeDaemon, completion_tokens
from tests.unit.client.pki import SERVER_NAME, Pki, make_pki

TOKEN = "gw-inference-token"
JOB = ChoiceSubmit(model="tiny", prompt_tokens=(4, 5), sampling=SamplingParams(seed=7), max_tokens=4)


def _from_args(argv: list[str]) -> GatewayConfig:
    return config_from(settings_from(build_parser().parse_args(["--daemon", "unix:a.sock", *argv])))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Access files with PEM-looking content (enough for the start-up checks)."""
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    return {
        "keys": _write(tmp_path / "api-keys", "# clients\nsk-one\nsk-two\n"),
        "token": _write(tmp_path / "token", f"# inference plane\n{TOKEN}\nolder-token\n"),
        "ca": _write(tmp_path / "ca.pem", pem),
        "cert": _write(tmp_path / "gw.pem", pem),
        "key": _write(tmp_path / "gw.key", "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"),
    }


# ---- settings ----------------------------------------------------------------------------


def test_access_flags(files: dict[str, Path]) -> None:
    cfg = _from_args(
        [
            "--api-key-file", str(files["keys"]), "--daemon-token-file", str(files["token"]),
            "--daemon-ca", str(files["ca"]), "--daemon-cert", str(files["cert"]), "--daemon-key", str(files["key"]),
            "--daemon-server-name", "board.internal",
        ]
    )  # fmt: skip
    assert cfg.api_keys == (b"sk-one", b"sk-two")
    assert cfg.daemon_token == TOKEN  # the file's first token
    assert cfg.daemon_tls == TlsConfig(str(files["ca"]), str(files["cert"]), str(files["key"]), "board.internal")
    for secret in ("sk-one", "sk-two", TOKEN):
        assert secret not in repr(cfg)


def test_access_keys_in_the_config_file(tmp_path: Path, files: dict[str, Path]) -> None:
    path = _write(
        tmp_path / "gw.toml",
        f"""[gateway]
daemons = ["10.0.0.7:50051"]
api_key_file = "{files["keys"]}"
daemon-token-file = "{files["token"]}"
daemon_ca = "{files["ca"]}"
daemon-server-name = "board.internal"
""",
    )
    cfg = config_from(read_config(path))
    assert cfg.api_keys == (b"sk-one", b"sk-two") and cfg.daemon_token == TOKEN
    assert cfg.daemon_tls == TlsConfig(ca_file=str(files["ca"]), server_name="board.internal")
    flagged = config_from(
        settings_from(build_parser().parse_args(["--config", str(path), "--daemon-server-name", "x"]))
    )
    assert flagged.daemon_tls == TlsConfig(ca_file=str(files["ca"]), server_name="x")  # the flag wins


def test_without_access_settings_nothing_changes() -> None:
    cfg = _from_args([])
    assert (cfg.api_keys, cfg.daemon_token, cfg.daemon_tls) == ((), None, None)


def test_the_server_name_alone_turns_tls_on_with_the_system_roots() -> None:
    assert _from_args(["--daemon-server-name", "board.internal"]).daemon_tls == TlsConfig(server_name="board.internal")


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--api-key-file", "{tmp}/none"], r"api-key-file .*/none: cannot be read"),
        (["--api-key-file", "{empty}"], "api-key-file .*: holds no key"),
        (["--daemon-token-file", "{tmp}/none"], r"daemon-token-file .*/none: cannot be read"),
        (["--daemon-token-file", "{empty}"], "daemon-token-file .*: holds no token"),
        (["--daemon-ca", "{tmp}/none"], r"daemon-ca .*/none: cannot be read"),
        (["--daemon-ca", "{empty}"], "daemon-ca .*: not a PEM file"),
        (["--daemon-cert", "{cert}"], "daemon-cert, daemon-key: give both"),
        (["--daemon-key", "{key}"], "daemon-cert, daemon-key: give both"),
        (["--daemon-cert", "{cert}", "--daemon-key", "{tmp}/none"], r"daemon-key .*/none: cannot be read"),
        (["--daemon-server-name", "two words"], "daemon-server-name: must be a non-empty host name"),
    ],
)
def test_bad_access_settings_are_refused(tmp_path: Path, files: dict[str, Path], argv: list[str], match: str) -> None:
    empty = _write(tmp_path / "empty", "# nothing here\n")
    names = {"tmp": tmp_path, "empty": empty, "cert": files["cert"], "key": files["key"]}
    with pytest.raises(InvalidArgument, match=match):
        _from_args([arg.format(**names) for arg in argv])


def test_main_refuses_an_unreadable_key_file_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gateway_main.main(["--daemon", "unix:a.sock", "--api-key-file", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("calculet-gateway: api-key-file ")


# ---- ClientConnection --------------------------------------------------------------------


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[tuple[str, FakeDaemon, MetadataRecorder]]:
    fake, recorder = FakeDaemon(), MetadataRecorder()
    server, _ = serve(fake, f"unix://{tmp_path / 'd.sock'}", interceptors=[recorder])
    try:
        yield f"unix://{tmp_path / 'd.sock'}", fake, recorder
    finally:
        fake.open_all_gates()
        server.stop(grace=None).wait(5)


def _use(connect: Callable[[], ClientConnection]) -> list[int]:
    """Everything the gateway does with a board: its streams, a model, a job to its end (the
    connection made inside the loop, as the fleet does)."""
    return asyncio.run(_session(connect))


async def _session(connect: Callable[[], ClientConnection]) -> list[int]:
    conn = connect()
    try:
        async with contextlib.aclosing(conn.watch_load()) as reports:  # type: ignore[type-var]
            await anext(reports)
        async with contextlib.aclosing(conn.watch_health()) as statuses:  # type: ignore[type-var]
            assert await anext(statuses) is ServingStatus.SERVING
        await conn.get_model("tiny")
        stream = await conn.start(JOB, ())
        return [token async for chunk in stream.chunks() for token in chunk.tokens]
    finally:
        await conn.close()


def test_the_connection_sends_the_token_on_every_call(recorded: tuple[str, FakeDaemon, MetadataRecorder]) -> None:
    target, _, recorder = recorded
    tokens = _use(lambda: ClientConnection(target, load_interval_ms=100, token=TOKEN))
    assert tokens == completion_tokens([4, 5], 0, 4)
    assert set(recorder.methods()) == {"WatchLoad", "Watch", "GetModel", "Submit", "Follow"}  # waits share Follow
    assert {auth for _, auth in recorder.calls} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
def test_a_daemon_refusing_the_gateways_credentials_is_unavailable(
    recorded: tuple[str, FakeDaemon, MetadataRecorder], code: grpc.StatusCode
) -> None:
    target, fake, _ = recorded
    fake.fail["Submit"] = fake.fail["GetModel"] = Failure(code, "the token is not one of the inference plane")

    async def scenario() -> None:
        conn = ClientConnection(target, token="observe-token")
        try:
            with pytest.raises(Unavailable, match=r"refused the gateway's credentials.*--daemon-token-file"):
                await conn.start(JOB, ())
            with pytest.raises(Unavailable, match="refused the gateway's credentials"):
                await conn.get_model("tiny")
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_other_refusals_keep_their_kind(recorded: tuple[str, FakeDaemon, MetadataRecorder]) -> None:
    target, _, _ = recorded

    async def scenario() -> None:
        conn = ClientConnection(target, token=TOKEN)
        try:
            with pytest.raises(NotFound):
                await conn.get_model("no-such-model")
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_tls_goes_to_tcp_daemons_only(
    recorded: tuple[str, FakeDaemon, MetadataRecorder], pki: Pki, tmp_path: Path
) -> None:
    unix_target, _, _ = recorded
    tls_fake, tls_recorder = FakeDaemon(), MetadataRecorder()
    credentials = grpc.ssl_server_credentials(
        [(pki.read("server_key"), pki.read("server_cert"))], root_certificates=pki.read("ca"), require_client_auth=True
    )
    server, port = serve(tls_fake, "127.0.0.1:0", credentials=credentials, interceptors=[tls_recorder])
    token_file = _write(tmp_path / "token", TOKEN + "\n")
    cfg = _from_args(
        [
            "--daemon-token-file", str(token_file), "--daemon-ca", str(pki.ca), "--daemon-cert", str(pki.client_cert),
            "--daemon-key", str(pki.client_key), "--daemon-server-name", SERVER_NAME,
        ]
    )  # fmt: skip
    connect = connection_factory(cfg)
    try:
        # The Unix-socket fake is plaintext: it answers only if the factory did not use TLS there.
        assert _use(lambda: connect(unix_target)) == completion_tokens([4, 5], 0, 4)
        # The TCP fake wants mutual TLS: it answers only if the factory used the whole TLS config.
        assert _use(lambda: connect(f"127.0.0.1:{port}")) == completion_tokens([4, 5], 0, 4)
    finally:
        server.stop(grace=None).wait(5)
    assert {auth for _, auth in tls_recorder.calls} == {f"Bearer {TOKEN}"}
