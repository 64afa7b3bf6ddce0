"""How calctl authenticates to a daemon: the token from --token-file (never a flag value) or
CALCULET_TOKEN, sent as a bearer token on every call; TLS settings from flags or CALCULET_TLS_*;
every bad setting one `calctl: invalid_argument:` line naming it; a plaintext call to a TCP address
that fails says that TLS may be what is missing."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.client.fake_daemon import FakeDaemon

from .calctl_fakes import calctl, served


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


@pytest.fixture
def daemon(tmp_path: Path, fake: FakeDaemon) -> Iterator[str]:
    with served(fake, tmp_path / "d.sock") as target:
        yield target


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CALCULET_TOKEN", "CALCULET_DAEMON", "CALCULET_TLS_CA", "CALCULET_TLS_CERT", "CALCULET_TLS_KEY",
                 "CALCULET_TLS_SERVER_NAME"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_the_token_file_is_sent_on_every_call_and_beats_the_environment(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALCULET_TOKEN", "from-env")
    token = tmp_path / "operate.token"
    token.write_text("# operators\n\n  op-7c1  \nsecond-token\n")
    assert calctl(capsys, "--token-file", str(token), "rollout", "tiny", "packages/tiny", "--daemon", daemon)[0] == 0
    methods = {name for name, _, _ in fake.calls}
    assert {"Status", "Drain", "Load", "Resume", "Health"} <= methods
    assert {md.get("authorization") for _, _, md in fake.calls} == {"Bearer op-7c1"}
    assert calctl(capsys, "resume", "--daemon", daemon)[0] == 0
    assert fake.calls_of("Resume")[-1][1]["authorization"] == "Bearer from-env"


@pytest.mark.parametrize(
    ("setup", "argv", "words"),
    [
        ({"CALCULET_TOKEN": "two words"}, (), ["CALCULET_TOKEN", "printable ASCII"]),
        ({}, ("--token-file", "{tmp}/none"), ["token-file", "cannot be read"]),
        ({}, ("--token-file", "{tmp}/empty"), ["token-file", "holds no token"]),
        ({"CALCULET_TLS_CERT": "c.pem"}, (), ["--tls-cert given without --tls-ca"]),
        ({}, ("--tls-server-name", "daemon.test"), ["--tls-server-name given without --tls-ca"]),
        ({"CALCULET_TLS_CA": "{tmp}/none.pem"}, (), ["tls ca_file", "none.pem", "cannot be read"]),
        ({}, ("--tls-ca", "{tmp}/empty"), ["not a PEM file"]),
    ],
)
def test_a_bad_access_setting_is_one_line(
    capsys: pytest.CaptureFixture[str],
    daemon: str,
    fake: FakeDaemon,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setup: dict[str, str],
    argv: tuple[str, ...],
    words: list[str],
) -> None:
    (tmp_path / "empty").write_text("# nothing here\n")
    for name, value in setup.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    code, out, err = calctl(capsys, "health", "--daemon", daemon, *(a.format(tmp=tmp_path) for a in argv))
    assert (code, out) == (1, "") and err.count("\n") == 1 and err.startswith("calctl: invalid_argument: ")
    assert all(word in err for word in words), err
    assert fake.calls == [], "nothing is dialled with a bad setting"


def test_plaintext_to_a_tcp_address_hints_at_tls(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code, out, err = calctl(capsys, "health", "--daemon", f"127.0.0.1:{port}")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith("calctl: unavailable: ") and "dialled in plaintext: give --tls-ca" in err
