"""`calctl load` on a terminal: a progress bar over the load's phases fed by the Load stream (the
fake daemon's VALIDATING, CONFIGURING, WARMING, READY), each message also printed as a line; a
failed load stops the bar at its phase and exits 1; --json stays one JSON object per line."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from calculet.ops.commands import daemon_load
from tests.unit.client.fake_daemon import FakeDaemon

from .calctl_fakes import calctl, served

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[str]:
    with served(FakeDaemon(), tmp_path / "d.sock") as target:
        yield target


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What calctl draws, as if stdout were a 120-column terminal."""
    out = io.StringIO()
    monkeypatch.setattr(daemon_load, "console", lambda: Console(file=out, force_terminal=True, width=120))
    return out


def test_a_terminal_gets_a_bar_over_the_phases(
    capsys: pytest.CaptureFixture[str], daemon: str, screen: io.StringIO
) -> None:
    code, _, err = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", daemon)
    drawn = ANSI.sub("", screen.getvalue())
    assert (code, err) == (0, "")
    for state in ("VALIDATING", "CONFIGURING", "WARMING", "READY"):
        assert re.search(rf"s  {state} +generation 4", drawn), state  # the line printed above the bar
    assert "t2 generation 4: READY" in drawn and "3/3 phases" in drawn


def test_a_failed_load_stops_the_bar_and_exits_1(
    capsys: pytest.CaptureFixture[str], daemon: str, screen: io.StringIO
) -> None:
    code, _, err = calctl(capsys, "load", "bad", "packages/broken", "--daemon", daemon)
    drawn = ANSI.sub("", screen.getvalue())
    assert code == 1 and err == "calctl: failed_precondition: param_blk0.bin: hash mismatch\n"
    assert "bad generation 4: FAILED" in drawn and "0/3 phases" in drawn and "3/3 phases" not in drawn


def test_json_is_unchanged_on_a_terminal(capsys: pytest.CaptureFixture[str], daemon: str, screen: io.StringIO) -> None:
    code, out, _ = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", daemon, "--json")
    states = [json.loads(line)["state"] for line in out.splitlines()]
    assert code == 0 and states[-1] == "MODEL_STATE_READY" and len(states) == 4
    assert screen.getvalue() == ""
