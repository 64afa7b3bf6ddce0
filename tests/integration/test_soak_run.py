"""`calctl soak` for real, 4 board-minutes on the tiny preset at time scale 0.5, i.e. 2 wall minutes
(the fault kinds of today's daemon, one fault cycle and the start of the next): two fault-injecting
boards and the gateway, a clean reference fleet for the oracle, the open loop, SIGKILLs, a lost
device, a submit-error streak, a rollout. Checked from the report: no request lost or crossed,
failures within the policy, every board back SERVING, and the report has its windows, process
samples, faults and restarts. Nothing here depends on the machine's speed: no wall-clock or latency
figure is asserted (the soak calibrates its own rate, and runs at under a third of its default load
so that a machine slowed by other work after the calibration stays within it; drift and growth are
not judged on a 4-minute run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calculet.ops.soak.policy import MAX_ALLOWED_RATE
from tests.integration.calctl_process import run_calctl

pytestmark = pytest.mark.integration

DEADLINE_S = 1500.0  # references, calibration, 2 wall minutes of soak and the wind-down, on a busy machine


@pytest.mark.timeout(DEADLINE_S + 60)
def test_a_two_minute_soak_loses_nothing_and_reports_everything(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    # Load 0.2, not the default 0.7: the rate is calibrated once, and a test machine's speed moves
    # under the other tests (a CI run saw 12 % OVERLOADED at 0.7 while a SIGKILL left one board
    # to carry 1.4x its calibrated capacity; at 0.2 the survivor carries 0.4 of it). The boards are
    # paced (time scale 0.5: a tiny decode step is 8.6 ms of wall), so the capacity is mostly the
    # boards' and not whatever the host has free: at time scale 0 the soak took that share of the
    # machine (57-75 s of CPU), paced about 40 s, and a few hundred requests still meet every
    # fault. A pool of 40 (every request class) halves the references, and the calibration runs
    # for 5 s, not the 15 s floor a run judged on its latency needs.
    argv = ["soak", "--duration", "4m", "--preset", "tiny", "--time-scale", "0.5", "--pool", "40", "--load", "0.2"]
    argv += ["--calibration", "5s"]
    argv += ["--out", str(out)]
    proc = run_calctl(*argv, timeout=DEADLINE_S)
    assert (out / "soak.json").exists(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report = json.loads((out / "soak.json").read_text())
    explain = f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr}"

    for phase in ("calibration", "soak"):
        counts = report["requests"][phase]
        assert counts["by_class"]["lost"] == 0 and counts["by_class"]["crossed"] == 0, (phase, counts, explain)
        assert counts["failed_disallowed"] == 0, (phase, counts["examples"], explain)
        assert counts["allowed_rate"] is None or counts["allowed_rate"] <= MAX_ALLOWED_RATE, (phase, counts)
    soak = report["requests"]["soak"]
    assert soak["by_class"]["ok"] > 0 and soak["by_class"]["cancelled"] > 0, soak
    assert report["boards_at_end"] == {"board0": True, "board1": True}, explain
    assert not any("not SERVING" in r or "harness" in r for r in report["verdict"]["reasons"]), explain

    assert len(report["windows"]) == 20 and all("ttft_ms" in w and "counts" in w for w in report["windows"])
    assert {p["role"] for p in report["processes"]} == {"gateway", "daemon"}
    assert all(p["samples"] and len(p["samples"][0]) == 5 for p in report["processes"])
    gateway_rows = next(p["samples"] for p in report["processes"] if p["role"] == "gateway")
    assert all(0 <= row[4] <= row[2] for row in gateway_rows), "inbound connections are some of its fds"
    assert max(row[4] for row in gateway_rows) > 0, "the clients' connections to the gateway are seen"
    injected = [f for f in report["faults"] if f["outcome"] in ("injected", "killed", "rolled out")]
    assert {f["kind"] for f in injected} >= {"ccu_exception", "nan_logits", "submit_error", "hang", "sigkill"}, report[
        "faults"
    ]
    assert any(r["cause"] == "SIGKILL (fault)" and r["restarted_pid"] for r in report["restarts"]), report["restarts"]
    assert report["capacity"]["method"] == "calibrated" and report["capacity"]["rate_arrivals_per_s"] > 0
    assert report["verdict"]["result"] in ("PASS", "FAIL") and (out / "soak.png").exists()
