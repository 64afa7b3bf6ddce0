"""Target parsing, channel options, call metadata and client settings (no server needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.client.channel import (
    MAX_SOCKET_PATH_BYTES,
    ClientSettings,
    Transport,
    call_metadata,
    channel_options,
    parse_target,
)
from calculet.common.errors import InvalidArgument

SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12).filter(
    lambda s: s not in {".", ".."}
)


@given(st.lists(SEGMENT, min_size=1, max_size=4))
def test_absolute_unix_urls_dial_the_same_path(parts: list[str]) -> None:
    path = "/" + "/".join(parts) + ".sock"
    for text in (f"unix://{path}", f"unix:{path}", path):
        target = parse_target(text)
        assert target.transport is Transport.UNIX
        assert target.address == path
        assert target.grpc_target == f"unix://{path}"
        assert target.text == text


@given(st.lists(SEGMENT, min_size=1, max_size=4))
def test_relative_unix_paths_stay_relative(parts: list[str]) -> None:
    path = "/".join(parts) + ".sock"
    for text in (f"unix:{path}", path):
        target = parse_target(text)
        assert (target.transport, target.address, target.grpc_target) == (Transport.UNIX, path, f"unix:{path}")


@given(st.sampled_from(["localhost", "10.0.0.7", "board-3.calculet.svc", "[::1]", "[fe80::1]"]), st.integers(1, 65535))
def test_host_port_is_tcp(host: str, port: int) -> None:
    target = parse_target(f"{host}:{port}")
    assert (target.transport, target.grpc_target, target.address) == (Transport.TCP, f"{host}:{port}", f"{host}:{port}")


@pytest.mark.parametrize(
    "text",
    [
        "",
        " unix:a.sock",
        "unix:a.sock\n",
        "unix:",
        "unix://",
        "unix://relative.sock",
        "unix:dir/",
        "unix:a\x00b.sock",
        "localhost",
        "localhost:",
        ":50051",
        "localhost:0",
        "localhost:65536",
        "localhost:http",
        "localhost:-1",
        "::1:50051",
        "host name:80",
        "dns:///host:80",
    ],
)
def test_bad_targets_are_invalid_arguments(text: str) -> None:
    with pytest.raises(InvalidArgument, match="target"):
        parse_target(text)


def test_socket_paths_longer_than_sun_path_are_refused() -> None:
    fits = "/" + "a" * (MAX_SOCKET_PATH_BYTES - len("/.sock")) + ".sock"
    assert parse_target(fits).address == fits
    with pytest.raises(InvalidArgument, match="longer than"):
        parse_target("/a" + fits)


def test_channel_options_keep_grpcs_default_receive_limit_and_enable_keepalive() -> None:
    options = dict(channel_options())
    # Like any stock client: every daemon answer fits 4 MiB (GetModel streams its tokenizer in pieces).
    assert "grpc.max_receive_message_length" not in options
    assert options["grpc.max_send_message_length"] > 0
    assert options["grpc.keepalive_time_ms"] > options["grpc.keepalive_timeout_ms"] > 0


def test_token_becomes_a_bearer_authorization_header() -> None:
    assert call_metadata(None) == ()
    assert call_metadata("s3cr3t-Token_1") == (("authorization", "Bearer s3cr3t-Token_1"),)


@pytest.mark.parametrize("token", ["", "two words", "tab\there", "caf\u00e9", "new\nline"])
def test_unprintable_tokens_are_refused(token: str) -> None:
    with pytest.raises(InvalidArgument, match="token"):
        call_metadata(token)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), True, "30"])
def test_bad_timeouts_are_refused(timeout: object) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        ClientSettings.build("unix:a.sock", timeout=timeout, token=None, max_reattach=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_reattach", [-1, 1.5, True])
def test_bad_reattach_budgets_are_refused(max_reattach: object) -> None:
    with pytest.raises(InvalidArgument, match="max_reattach"):
        ClientSettings.build("unix:a.sock", timeout=1.0, token=None, max_reattach=max_reattach)  # type: ignore[arg-type]


def test_settings_carry_the_parsed_target_and_metadata() -> None:
    settings = ClientSettings.build("run/b.sock", timeout=2, token="t", max_reattach=0)
    assert settings.target.grpc_target == "unix:run/b.sock"
    assert settings.timeout == 2.0
    assert settings.metadata == (("authorization", "Bearer t"),)
