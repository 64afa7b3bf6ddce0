"""calctl's global flags before or after the command (`global_flags.hoist_global_flags`): the
rearranged command lines, the same answer from both positions against the fake daemon, and the
documented rule for a flag given twice (a usage error, except the fleet commands' --daemon)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.ops.commands.global_flags import hoist_global_flags
from tests.unit.client.fake_daemon import FakeDaemon

from .calctl_fakes import calctl, served, usage_error

COMMANDS = [("status",), ("health",), ("load",), ("package", "validate"), ("package", "build-sim")]


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


@pytest.fixture
def daemon(tmp_path: Path, fake: FakeDaemon) -> Iterator[str]:
    with served(fake, tmp_path / "d.sock") as target:
        yield target


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--daemon", "X", "--json", "status"], ["status", "--daemon=X", "--json"]),
        (["--daemon=X", "status", "--daemon", "Y"], ["status", "--daemon=X", "--daemon", "Y"]),
        (["--json", "package", "validate", "DIR"], ["package", "validate", "--json", "DIR"]),
        (["--tls-ca", "ca.pem", "load", "a", "p"], ["load", "--tls-ca=ca.pem", "a", "p"]),
        (["--token-file", "t", "--gateway", "unix:g.sock", "status"], ["status", "--token-file=t",
                                                                        "--gateway=unix:g.sock"]),
        (["status", "--daemon", "X"], ["status", "--daemon", "X"]),  # nothing to move
        (["--help"], ["--help"]),
        (["--daemon", "X"], ["--daemon", "X"]),  # no command: argparse reports it
        (["--daemon", "X", "nosuch"], ["--daemon", "X", "nosuch"]),
        (["--verbose", "--json", "status"], ["--verbose", "--json", "status"]),  # unknown first: left alone
        (["--daemon"], ["--daemon"]),
    ],
)  # fmt: skip
def test_hoisting(argv: list[str], expected: list[str]) -> None:
    assert hoist_global_flags(argv, COMMANDS) == expected


def test_global_flags_before_or_after_the_command_give_the_same_answer(
    capsys: pytest.CaptureFixture[str], daemon: str
) -> None:
    before = calctl(capsys, "--daemon", daemon, "--json", "health")
    after = calctl(capsys, "health", "--daemon", daemon, "--json")
    mixed = calctl(capsys, "--json", "health", "--daemon", daemon)
    assert before == after == mixed
    code, out, _ = before
    assert code == 0 and json.loads(out)["status"] == "SERVING_STATUS_SERVING"


def test_global_flags_reach_nested_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, _ = calctl(capsys, "--json", "package", "validate", str(empty))  # no manifest
    assert code == 1 and json.loads(out)["ok"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--daemon", "unix:a.sock", "health", "--daemon", "unix:b.sock"), "--daemon given twice"),
        (("drain", "--daemon", "unix:a.sock", "--daemon", "unix:b.sock"), "--daemon given twice"),
        (("--token-file", "a", "resume", "--token-file", "b"), "--token-file given twice"),
        (("--tls-ca", "a", "--tls-ca", "b", "health"), "--tls-ca given twice"),
        (("--daemon", "unix:a.sock", "package", "validate", "."), "unrecognized arguments: --daemon=unix:a.sock"),
        (("--daemon", "unix:a.sock"), "COMMAND"),
    ],
)
def test_a_flag_given_twice_or_where_it_does_not_belong_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    assert message in usage_error(capsys, *argv)


def test_json_twice_is_harmless(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, _ = calctl(capsys, "--json", "resume", "--json", "--daemon", daemon)
    assert code == 0 and json.loads(out) == {"was_draining": False}
