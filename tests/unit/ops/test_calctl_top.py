"""`calctl top` against a fake daemon: N refreshes with --iterations (a table each, or JSON lines),
the live view on a terminal, Ctrl-C as a clean stop, the exit status of the last refresh, and the
bad values of its flags."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from calculet.ops.commands import top
from tests.unit.client.fake_daemon import FakeDaemon

from .calctl_fakes import calctl, served, usage_error


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[str]:
    with served(FakeDaemon(), tmp_path / "d.sock") as target:
        yield target


def test_iterations_print_one_table_each(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, err = calctl(capsys, "top", "--daemon", daemon, "--iterations", "3", "--interval", "0.1")
    assert (code, err) == (0, "")
    assert [line.split("refresh ")[1].split(",")[0] for line in out.splitlines() if "calctl top:" in line] == [
        "1", "2", "3",
    ]  # fmt: skip
    assert out.count("tiny g3 READY") == 3


def test_json_lines(capsys: pytest.CaptureFixture[str], daemon: str, tmp_path: Path) -> None:
    gone = f"unix:{tmp_path / 'gone.sock'}"
    code, out, err = calctl(capsys, "--json", "top", "--daemon", daemon, "--daemon", gone, "--iterations", "2")
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) == 2 and [r["health"] for r in documents[-1]["boards"]] == ["serving", "unreachable"]
    assert code == 1 and err.startswith("calctl: 1 of 2 boards unreachable") and err.count("\n") == 1


def test_ctrl_c_stops_cleanly_with_the_last_refresh_shown(
    capsys: pytest.CaptureFixture[str], daemon: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(top.time, "sleep", interrupted)
    code, out, err = calctl(capsys, "top", "--daemon", daemon)  # no --iterations: until Ctrl-C
    assert (code, err) == (0, "") and out.count("calctl top:") == 1 and "tiny g3 READY" in out


def test_a_terminal_gets_the_live_view(
    capsys: pytest.CaptureFixture[str], daemon: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(top, "console", lambda: Console(file=screen, force_terminal=True, width=160))
    code, _, _ = calctl(capsys, "top", "--daemon", daemon, "--iterations", "2", "--interval", "0.1")
    drawn = screen.getvalue()
    assert code == 0 and "refresh 2" in drawn and "\x1b[" in drawn  # redrawn with cursor movements


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("top", "--interval", "0"), "at least 0.1"),
        (("top", "--interval", "nan"), "at least 0.1"),
        (("top", "--interval", "often"), "expected a number"),
        (("top", "--iterations", "0"), "must be >= 1"),
        (("top", "--iterations", "1.5"), "expected an integer"),
        (("top", "--gateway", "http://g:1", "--daemon", "unix:a.sock"), "not both"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)
