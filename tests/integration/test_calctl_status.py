"""`calctl status` and `calctl top` over real daemons (calsim, time scale 0) and a real gateway: the
`--json` document's keys and types are pinned from live boards (docs/operations.md, "calctl status
--json"), the gateway's boards are the ones listed, an unreachable board is a row with its error
and exit 1, and `top --iterations N` refreshes N times and stops."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.calctl_process import run_calctl
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

ROW_TYPES: dict[str, type | tuple[type, ...]] = {
    "target": str,
    "name": str,
    "health": str,
    "models": list,
    "queue": int,
    "inflight": int,
    "tokens_per_second": float,
    "busy_ratio": float,
    "resets": int,
    "error": type(None),
}
MODEL_TYPES: dict[str, type] = {
    "alias": str,
    "generation": int,
    "state": str,
    "lanes_used": int,
    "lanes_parked": int,
    "lanes_total": int,
}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 8, "seed": 3}


def _fleet(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess]
) -> tuple[list[DaemonProcess], GatewayProcess]:
    daemons = [start_daemon("--model", "tiny=tiny") for _ in range(2)]
    gateway = start_gateway(*[flag for d in daemons for flag in ("--daemon", d.target)])
    gateway.wait_until(lambda body: body.get("models", {}).get("tiny") == 2, "both boards ready")
    return daemons, gateway


def test_status_json_from_the_gateways_boards_is_the_documented_shape(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess]
) -> None:
    daemons, gateway = _fleet(start_daemon, start_gateway)
    with gateway.http() as http:
        for seed in range(4):
            assert http.post("/v1/chat/completions", json={**CHAT, "seed": seed}).status_code == 200

    proc = run_calctl("status", "--json", "--gateway", f"unix:{gateway.socket}")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert list(document) == ["boards"]
    rows = document["boards"]
    assert [row["target"] for row in rows] == sorted(d.target for d in daemons)
    for row in rows:
        assert list(row) == list(ROW_TYPES), row
        for key, kind in ROW_TYPES.items():
            assert isinstance(row[key], kind), (key, row[key])
        assert row["health"] == "serving" and row["name"] and row["resets"] == 0
        (model,) = row["models"]
        assert {k: type(v) for k, v in model.items()} == MODEL_TYPES
        assert (model["alias"], model["state"], model["lanes_used"]) == ("tiny", "ready", 0)
        assert model["generation"] >= 1 and model["lanes_total"] >= 1
        assert 0.0 <= row["busy_ratio"] <= 1.0 and row["tokens_per_second"] >= 0.0


def test_an_unreachable_board_is_a_row_and_exit_1(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    missing = f"unix:{tmp_path / 'gone.sock'}"
    proc = run_calctl("status", "--json", "--daemon", daemon.target, "--daemon", missing)
    assert proc.returncode == 1
    up, down = json.loads(proc.stdout)["boards"]
    assert (up["health"], up["error"]) == ("serving", None)
    assert (down["target"], down["health"], down["models"]) == (missing, "unreachable", [])
    assert down["error"].startswith("unavailable: ") and down["tokens_per_second"] is None
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"calctl: 1 of 2 boards unreachable: {missing}")

    table = run_calctl("--daemon", daemon.target, "--daemon", missing, "status")
    assert table.returncode == 1 and "UNREACHABLE" in table.stdout and "tiny g1 READY" in table.stdout


def test_top_refreshes_the_table_n_times(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess]
) -> None:
    daemons, gateway = _fleet(start_daemon, start_gateway)
    proc = run_calctl("top", "--gateway", f"unix:{gateway.socket}", "--iterations", "3", "--interval", "0.1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("tokens/s") == 3, proc.stdout  # one table per refresh
    assert proc.stdout.count("SERVING") == 3 * len(daemons), proc.stdout
    proc = run_calctl("top", "--json", "--daemon", daemons[0].target, "--iterations", "2", "--interval", "0.1")
    documents = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(documents) == 2
    assert all(doc["boards"][0]["target"] == daemons[0].target for doc in documents)
