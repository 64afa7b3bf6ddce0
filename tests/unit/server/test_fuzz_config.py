"""Fuzzing the daemon's and the gateway's config file readers: random TOML text and random
`[daemon]` / `[gateway]` tables with known keys and values of any TOML type. Whatever the file holds,
start-up either gets a configuration or an `InvalidArgument` (a `CalculetError`) naming the problem;
no other exception type may escape (it would crash the process with a traceback instead of exit 2)."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.common.errors import CalculetError
from calculet.daemon import settings as daemon_settings
from calculet.gateway import config as gateway_config
from calculet.gateway import main as gateway_main

FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], max_examples=200
)

DAEMON_KEYS = [
    *daemon_settings.FLAG_SETTINGS,
    *daemon_settings.TABLE_SETTINGS,
    "device-profile",
    "time-scale",
    "bogus_key",
]
GATEWAY_KEYS = [*sorted(gateway_config.KEYS), "dns_interval", "max_attempts", "bogus-key"]


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal (\uXXXX escapes) is a TOML basic string


def _toml_value(value: Any) -> str:
    """`value` as an inline TOML value (floats include nan and ±inf, which TOML spells out)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


INT64 = st.integers(-(2**63), 2**63 - 1)
SCALARS = st.one_of(
    st.booleans(),
    INT64,
    st.sampled_from([0, 1, -1, 2, 2**31 - 1, 2**31, 2**48, 2**48 + 1, 2**63 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "calsim", "DEBUG", "info", "unix:", "unix:/tmp/x.sock", "127.0.0.1:0", "/", ".", "/dev/null"]),
    st.sampled_from(["calsim-dev", "host:99999", "[::1]:1", "\x00", "continuous", "a=b"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _table_text(name: str, table: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in table.items())


RAW_TEXT = st.one_of(
    st.text(max_size=200),
    st.builds(lambda body: "[daemon]\n" + body, st.text(max_size=120)),
    st.builds(lambda body: "[gateway]\n" + body, st.text(max_size=120)),
    st.sampled_from(["daemon = 1", "gateway = 1", "daemon = []", "[daemon]\n[daemon]", "[gateway.x]\ny = 1"]),
)


def _write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "config.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    return path


def _daemon_start(path: Path) -> None:
    """The daemon's start-up checks in `main`'s order, up to (not including) the board lock."""
    args = daemon_settings.build_parser().parse_args(["--config", str(path)])
    merged = daemon_settings.merged_settings(args)
    daemon_settings.log_level(merged)
    config = daemon_settings.config_from(merged)
    daemon_settings.text_setting(merged, "listen", f"unix:run/board{config.board}.sock")
    daemon_settings.int_setting(merged, "max_message_bytes", daemon_settings.DEFAULT_MAX_MESSAGE_BYTES, 1)
    daemon_settings.runtime_dir(merged, {})


def _gateway_start(path: Path) -> None:
    args = gateway_main.build_parser().parse_args(["--config", str(path)])
    gateway_config.config_from(gateway_main.settings_from(args))


def _only_calculet_errors(start: Any, path: Path) -> None:
    with contextlib.suppress(CalculetError):  # anything else escapes and fails the example
        start(path)


@pytest.mark.parametrize("start", [_daemon_start, _gateway_start], ids=["daemon", "gateway"])
@FUZZ
@given(text=st.one_of(RAW_TEXT, st.binary(max_size=100)))
def test_random_config_text_gives_a_config_or_invalid_argument(tmp_path: Path, start: Any, text: str | bytes) -> None:
    _only_calculet_errors(start, _write(tmp_path, text))


@FUZZ
@given(table=st.dictionaries(st.sampled_from(DAEMON_KEYS), VALUES, max_size=6))
def test_random_daemon_table_gives_a_config_or_invalid_argument(tmp_path: Path, table: dict[str, Any]) -> None:
    _only_calculet_errors(_daemon_start, _write(tmp_path, _table_text("daemon", table)))


@FUZZ
@given(table=st.dictionaries(st.sampled_from(GATEWAY_KEYS), VALUES, max_size=6))
def test_random_gateway_table_gives_a_config_or_invalid_argument(tmp_path: Path, table: dict[str, Any]) -> None:
    _only_calculet_errors(_gateway_start, _write(tmp_path, _table_text("gateway", table)))


@FUZZ
@given(settings_=st.dictionaries(st.sampled_from(DAEMON_KEYS), VALUES, max_size=6))
def test_daemon_config_from_random_merged_settings(settings_: dict[str, Any]) -> None:
    """`config_from` on settings as `merged_settings` leaves them (models a table of path strings)."""
    settings_ = dict(settings_)
    models = settings_.get("models")
    if not isinstance(models, dict) or not all(isinstance(p, str) for p in models.values()):
        settings_.pop("models", None)
    with contextlib.suppress(CalculetError):
        daemon_settings.config_from(settings_)
