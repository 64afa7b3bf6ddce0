"""`calctl status` over many boards against fake daemons (in-process gRPC servers) and a stand-in
gateway (an HTTP server answering /ready): the table and the `--json` rows (figures from the
StatusResponse, utilisation null when the daemon reports none), an unreachable board as a row with
its error and exit 1, the gateway's boards, and the usage errors."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from rich.console import Console

from calculet.ops.commands.board_rows import board_row, utilization
from calculet.ops.commands.status_view import render_status
from calculet.v1 import observe_pb2
from tests.unit.client import fake_daemon
from tests.unit.client.fake_daemon import FakeDaemon, status_response

from .calctl_fakes import calctl, served, usage_error


@pytest.fixture
def boards(tmp_path: Path) -> Iterator[tuple[list[str], list[FakeDaemon]]]:
    fakes = [FakeDaemon(), FakeDaemon()]
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(served(f, tmp_path / f"b{i}.sock")) for i, f in enumerate(fakes)]
        yield targets, fakes


def with_utilization(
    tokens_per_second: float, recent: float, since_start: float, window: float
) -> Callable[..., object]:
    def respond(fake: FakeDaemon) -> observe_pb2.StatusResponse:
        status = status_response(fake)
        status.utilization.CopyFrom(
            observe_pb2.DeviceUtilization(
                tokens_per_second=tokens_per_second, recent_busy_ratio=recent, busy_ratio=since_start,
                recent_window_seconds=window,
            )
        )  # fmt: skip
        return status

    return respond


def test_a_row_from_a_status(boards: tuple[list[str], list[FakeDaemon]]) -> None:
    row = board_row("unix:x.sock", status_response(boards[1][0]))
    assert (row.name, row.health, row.queue, row.inflight, row.resets) == ("fake-0", "serving", 8, 1, 1)
    ((model),) = row.models
    row_model = (model.alias, model.generation, model.state, model.lanes_used, model.lanes_parked, model.lanes_total)
    assert row_model == ("tiny", 3, "ready", 3, 1, 5), "used: held by a job; the parked lane is free"
    assert (row.tokens_per_second, row.busy_ratio) == (None, None), "no utilisation reported: null, not 0"


@pytest.mark.parametrize(("window", "busy"), [(10.0, 0.75), (0.0, 0.25)])
def test_the_busy_ratio_is_the_recent_one_when_there_is_a_window(
    boards: tuple[list[str], list[FakeDaemon]], window: float, busy: float
) -> None:
    status = with_utilization(42.5, 0.75, 0.25, window)(boards[1][0])
    assert isinstance(status, observe_pb2.StatusResponse)
    assert utilization(status) == (42.5, busy)


def test_many_daemons_one_row_each_and_an_unreachable_one_exits_1(
    capsys: pytest.CaptureFixture[str],
    boards: tuple[list[str], list[FakeDaemon]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (first, second), fakes = boards
    fakes[1].draining = True
    monkeypatch.setattr(fake_daemon, "status_response", with_utilization(42.5, 0.75, 0.5, 10.0))
    missing = f"unix:{tmp_path / 'gone.sock'}"
    code, out, err = calctl(capsys, "status", "--daemon", first, "--daemon", missing, "--daemon", second)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith(f"calctl: 1 of 3 boards unreachable: {missing} (unavailable: ")
    lines = out.splitlines()
    header = next(line for line in lines if "board" in line and "busy %" in line)
    assert all(name in header for name in ("health", "models", "lanes", "queue", "in flight", "tokens/s", "resets"))
    serving = next(line for line in lines if "SERVING" in line)
    assert all(fact in serving for fact in ("tiny g3 READY", "3/5", "42.5", "75%"))
    assert any("DRAINING" in line for line in lines)
    assert any("UNREACHABLE" in line for line in lines)

    code, out, err = calctl(capsys, "status", "--json", "--daemon", first, "--daemon", missing, "--daemon", second)
    rows = json.loads(out)["boards"]
    assert code == 1 and [r["target"] for r in rows] == [first, missing, second]
    assert [r["health"] for r in rows] == ["serving", "unreachable", "draining"]
    assert rows[0] == {
        "target": first, "name": "fake-0", "health": "serving",
        "models": [{"alias": "tiny", "generation": 3, "state": "ready", "lanes_used": 3, "lanes_parked": 1,
                    "lanes_total": 5}],
        "queue": 8, "inflight": 1, "tokens_per_second": 42.5, "busy_ratio": 0.75, "resets": 1, "error": None,
    }  # fmt: skip
    assert rows[1]["error"].startswith("unavailable: ") and rows[1]["models"] == []
    assert {rows[1][k] for k in ("queue", "inflight", "tokens_per_second", "busy_ratio", "resets")} == {None}


def test_one_daemon_json_is_the_same_shape(
    capsys: pytest.CaptureFixture[str], boards: tuple[list[str], list[FakeDaemon]]
) -> None:
    target = boards[0][0]
    code, out, _ = calctl(capsys, "status", "--json", "--daemon", target)
    (row,) = json.loads(out)["boards"]
    assert code == 0 and row["target"] == target and row["health"] == "serving"


class _Gateway(BaseHTTPRequestHandler):
    reply: ClassVar[tuple[int, bytes]] = (200, b"{}")
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        status, body = type(self).reply
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, type[_Gateway]]]:
    handler = type("Gateway", (_Gateway,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_gateway_lists_the_boards(
    capsys: pytest.CaptureFixture[str],
    boards: tuple[list[str], list[FakeDaemon]],
    gateway: tuple[str, type[_Gateway]],
    tmp_path: Path,
) -> None:
    url, handler = gateway
    (first, second), _ = boards
    body = {"status": "not_ready", "boards": {second: "up", first: "down"}, "models": {"tiny": 0}}
    handler.reply = (503, json.dumps(body).encode())  # /ready's 503 still lists the boards
    key = tmp_path / "api-key"
    key.write_text("# ops\nsk-ops\n")
    code, out, _ = calctl(capsys, "status", "--json", "--gateway", url, "--api-key-file", str(key))
    assert code == 0 and [r["target"] for r in json.loads(out)["boards"]] == sorted([first, second])
    assert handler.seen == ["Bearer sk-ops"]


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (404, b"not here", "GET /ready answered 404"),
        (200, b"[1, 2]", "did not answer with a boards object"),
        (200, b'{"boards": {}}', "knows no boards"),
    ],
)
def test_a_gateway_that_does_not_list_boards_is_one_line(
    capsys: pytest.CaptureFixture[str], gateway: tuple[str, type[_Gateway]], status: int, body: bytes, message: str
) -> None:
    url, handler = gateway
    handler.reply = (status, body)
    code, out, err = calctl(capsys, "status", "--gateway", url)
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"calctl: unavailable: gateway {url}: ") and message in err


def test_an_unreachable_gateway_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = calctl(capsys, "status", "--gateway", f"unix:{tmp_path / 'none.sock'}")
    assert (code, out) == (1, "") and err.startswith("calctl: unavailable: gateway unix:") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("status", "--gateway", "http://g:8000", "--daemon", "unix:a.sock"), "--daemon or --gateway, not both"),
        (("status", "--api-key-file", "k"), "--api-key-file goes with --gateway"),
        (("status", "--full"), "--full goes with --json and one daemon"),
        (("status", "--json", "--full", "--daemon", "unix:a.sock", "--daemon", "unix:b.sock"), "--full goes with"),
        (("status", "--gateway", "g:8000"), "expected http://HOST:PORT"),
        (("status", "--gateway", "unix:"), "expected http://HOST:PORT"),
        (("status", "--daemon", "nowhere"), "target 'nowhere'"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)


def test_the_detailed_view_shows_the_utilisation_when_the_daemon_reports_it(
    capsys: pytest.CaptureFixture[str], boards: tuple[list[str], list[FakeDaemon]], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = boards[0][0]
    code, out, _ = calctl(capsys, "status", "--daemon", target)
    assert code == 0 and "utilisation: not reported by this daemon" in out
    monkeypatch.setattr(fake_daemon, "status_response", with_utilization(42.5, 0.75, 0.5, 10.0))
    code, out, _ = calctl(capsys, "status", "--daemon", target)
    assert "utilisation: device busy 75% over the last 10 s (50% since start), 42.5 tokens/s" in out


def test_a_model_without_prefill_at_an_offset_says_so_and_why(boards: tuple[list[str], list[FakeDaemon]]) -> None:
    status = status_response(boards[1][0])
    reason = "prefill submodel prefill does not declare prefill_at_offset"
    status.models[0].prefill_offset.CopyFrom(
        observe_pb2.PrefillOffsetStatus(verdict=observe_pb2.PREFILL_OFFSET_VERDICT_UNDECLARED, reason=reason)
    )
    console = Console(width=300, record=True)
    console.print(render_status(status))
    assert f"prefill at an offset undeclared: chunked prefill and prefix reuse off ({reason})" in console.export_text()
    status.models[0].prefill_offset.verdict = observe_pb2.PREFILL_OFFSET_VERDICT_PROVEN
    console = Console(width=300, record=True)
    console.print(render_status(status))
    assert "prefill at an offset" not in console.export_text()


def test_one_board_shows_its_warnings(boards: tuple[list[str], list[FakeDaemon]]) -> None:
    status = status_response(boards[1][0])
    status.warnings.append("device memory above its baseline: chip 0 holds 4,096 B DRAM and 0 B SRAM above it")
    console = Console(width=300, record=True)
    console.print(render_status(status))
    assert "WARNING: device memory above its baseline: chip 0 holds 4,096 B DRAM" in console.export_text()


def test_one_board_shows_each_models_memory_planned_beside_measured_and_its_d2d(
    boards: tuple[list[str], list[FakeDaemon]],
) -> None:
    status = status_response(boards[1][0])
    model = status.models[0]
    model.memory.add(chip=0, planned_dram_bytes=3 << 30, planned_sram_bytes=2 << 20, dram_bytes=(3 << 30) + (1 << 20),
                     sram_bytes=2 << 20, measured=True)  # fmt: skip
    model.memory.add(chip=1, planned_dram_bytes=1 << 30, planned_sram_bytes=0, measured=False)
    status.utilization.CopyFrom(
        observe_pb2.DeviceUtilization(compute_seconds=4.0, d2d_seconds=1.0, d2d_bytes=3 << 20, recent_window_seconds=1)
    )
    console = Console(width=300, record=True)
    console.print(render_status(status))
    text = console.export_text()
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("│ tiny")]
    assert [w for w in rows[-2] if w != "│"] == ["tiny", "3", "0", "3.000", "3.001", "+1.0", "2.00", "2.00"]
    assert [w for w in rows[-1] if w != "│"] == ["tiny", "3", "1", "1.000", "-", "-", "0.00", "-"]
    assert "D2D 3.0 MiB in 1.000 s (25.0% of compute)" in text
