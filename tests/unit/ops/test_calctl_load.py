"""`calctl load` on a terminal: a progress bar over the load's phases fed by the Load stream (the
fake daemon's VALIDATING, CONFIGURING, WARMING, READY), each message also printed as a line; a
failed load stops the bar at its phase and exits 1; --json stays one JSON object per line. While a
phase carries bytes (`BytesDaemon`: VALIDATING hashes 2 MB) a byte row shows them, its first and
last counts printed as lines, the ones between only moving the bar; --json gains the two fields."""

from __future__ import annotations

import argparse
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rich.console import Console

from calculet.ops.commands import daemon_load
from calculet.ops.commands.daemon_load import switch_target
from calculet.v1 import common_pb2, operate_pb2
from tests.unit.client.fake_daemon import FakeDaemon

from .calctl_fakes import calctl, served

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TOTAL = 2_000_000


class BytesDaemon(FakeDaemon):
    """The fake daemon, its VALIDATING phase followed by byte counts as the real daemon sends them:
    0, some throttled counts, the total, then the closing VALIDATING message with the full count."""

    def Load(self, request: operate_pb2.LoadRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        for p in super().Load(request, context):
            if p.state == common_pb2.MODEL_STATE_CONFIGURING:
                for done in (0, 500_000, 1_000_000, TOTAL):
                    yield self._counted(p, "hashing the files of tiny", done)
                yield self._counted(p, "validated tiny (0 warnings)", TOTAL)
            yield p

    @staticmethod
    def _counted(p: operate_pb2.LoadProgress, message: str, done: int) -> operate_pb2.LoadProgress:
        return operate_pb2.LoadProgress(
            state=common_pb2.MODEL_STATE_VALIDATING,
            generation=p.generation,
            message=message,
            elapsed_s=0.02,
            bytes_done=done,
            bytes_total=TOTAL,
        )


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


@pytest.fixture
def bytes_daemon(tmp_path: Path) -> Iterator[str]:
    with served(BytesDaemon(), tmp_path / "b.sock") as target:
        yield target


def test_a_phase_with_bytes_gets_a_byte_row(
    capsys: pytest.CaptureFixture[str], bytes_daemon: str, screen: io.StringIO
) -> None:
    code, _, err = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", bytes_daemon)
    drawn = ANSI.sub("", screen.getvalue())
    assert (code, err) == (0, "")
    assert "validating bytes" in drawn and "2.0/2.0 MB" in drawn  # the byte row (DownloadColumn)
    assert "hashing the files of tiny  (0 bytes / 2.0 MB)" in drawn  # the first count, as a line
    assert "hashing the files of tiny  (2.0 MB / 2.0 MB)" in drawn  # the last
    assert "validated tiny (0 warnings)  (2.0 MB / 2.0 MB)" in drawn
    assert "(500.0 kB / 2.0 MB)" not in drawn and "(1.0 MB / 2.0 MB)" not in drawn  # midway: the bar only
    assert "t2 generation 4: READY" in drawn and "3/3 phases" in drawn


def test_without_a_terminal_every_count_is_a_line(capsys: pytest.CaptureFixture[str], bytes_daemon: str) -> None:
    code, out, _ = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", bytes_daemon)
    counts = re.findall(r"VALIDATING +generation 4  .*\((.*) / 2\.0 MB\)", out)
    assert code == 0 and counts == ["0 bytes", "500.0 kB", "1.0 MB", "2.0 MB", "2.0 MB"]
    assert re.search(r"CONFIGURING +generation 4  configuring 2 chips$", out, re.M)  # no bytes, no count


def test_json_carries_the_byte_fields(capsys: pytest.CaptureFixture[str], bytes_daemon: str) -> None:
    code, out, _ = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", bytes_daemon, "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    counted = [(r["bytes_done"], r["bytes_total"]) for r in rows if r["bytes_total"] != "0"]
    halfway = [("0", "2000000"), ("500000", "2000000"), ("1000000", "2000000")]
    assert code == 0 and counted == [*halfway, ("2000000", "2000000"), ("2000000", "2000000")]
    assert (rows[-1]["bytes_done"], rows[-1]["bytes_total"]) == ("0", "0")  # uint64: strings in proto3 JSON


@pytest.mark.parametrize("text", ["qwen", "qwen@", "@3", "qwen@x", "qwen@-1"])
def test_switch_from_needs_alias_at_generation(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="ALIAS@GENERATION"):
        switch_target(text)


def test_switch_from_splits_at_the_last_at_sign() -> None:
    assert switch_target("team/qwen@v2@12") == ("team/qwen@v2", 12)
