"""`calctl bench` as a real process against a real calsim daemon (tiny, time scale 0) and against
the real gateway in front of it: every measured request completes, the output tokens are exactly
the requested `max_tokens` (`--ignore-eos`), the device figures are read from the daemon (tokens
generated over the measured window only, warm-up excluded), and the table and the plot are
written. No wall-clock figure is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

BENCH_DEADLINE_S = 180.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`calctl bench ARGS --json OUT --no-progress`, which must succeed; its output and report."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALCULET_")}
    cmd = [sys.executable, "-m", "calculet.ops.calctl", "bench", *args, "--json", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=BENCH_DEADLINE_S)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc, json.loads(out.read_text())


def check_device(report: dict[str, Any], target: str, tokens: int) -> None:
    (board,) = report["device"]["boards"]
    assert board["target"] == target and board["error"] is None, board
    assert board["generated_tokens"] == tokens  # the measured window's tokens, not the warm-up's
    assert 0.0 < board["busy_ratio"] <= 1.0
    assert board["phases_s"]["compute"] > 0.0
    assert report["device"]["busy_ratio"] == board["busy_ratio"]


def test_bench_against_a_daemon(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    plot = tmp_path / "bench.png"
    proc, report = run_bench(
        tmp_path, "--daemon", daemon.target, "--model", "tiny", "--requests", "20", "--concurrency", "4",
        "--prompt-len", "4:12", "--output-len", "8", "--ignore-eos", "--warmup", "2", "--plot", str(plot),
    )  # fmt: skip
    counts = report["counts"]
    assert (counts["requests"], counts["completed"], counts["failed"], counts["warmup_failed"]) == (20, 20, 0, 0)
    assert counts["output_tokens"] == 20 * 8
    assert 20 * 4 <= counts["prompt_tokens"] <= 20 * 12
    assert report["errors"] == []
    latency = report["latency_ms"]
    assert latency["ttft"]["count"] == latency["tpot"]["count"] == latency["e2e"]["count"] == 20
    assert 0 < latency["itl"]["count"] <= 20 * 7  # per token after each request's first chunk
    assert latency["ttft"]["p50"] <= latency["e2e"]["p50"]
    check_device(report, daemon.target, 20 * 8)
    assert "TTFT" in proc.stdout and "device over the run" in proc.stdout
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_bench_through_the_gateway_open_loop_with_a_prompt_file(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    gateway = start_gateway("--daemon", daemon.target)
    max_tokens = [3, 5, 2, 7, 4]
    lines = [
        {"prompt": "Hello there, how are you?", "max_tokens": max_tokens[0]},
        {"prompt_tokens": [72, 101, 108, 108, 111], "max_tokens": max_tokens[1]},
        {"prompt": "Count: one two three", "max_tokens": max_tokens[2]},
        {"prompt_tokens": [10, 20, 30], "max_tokens": max_tokens[3]},
        {"prompt": "z", "max_tokens": max_tokens[4]},
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    warmup, requests = 3, 20
    proc, report = run_bench(
        tmp_path, "--gateway", f"unix:{gateway.socket}", "--model", "tiny", "--prompts", str(prompts),
        "--requests", str(requests), "--warmup", str(warmup), "--rate", "200", "--burstiness", "0.5",
        "--ignore-eos", "--slo", "ttft:600000,tpot:600000",
    )  # fmt: skip
    expected_tokens = sum(max_tokens[i % len(lines)] for i in range(warmup, warmup + requests))
    counts = report["counts"]
    assert (counts["requests"], counts["completed"], counts["failed"]) == (requests, requests, 0)
    assert counts["output_tokens"] == counts["requested_output_tokens"] == expected_tokens
    assert report["goodput"]["good_requests"] == requests  # objectives of ten minutes: every request meets them
    assert report["latency_ms"]["e2e"]["count"] == requests
    assert report["config"]["target"] == {
        "kind": "gateway", "address": f"unix:{gateway.socket}", "status_daemons": [daemon.target]
    }  # fmt: skip
    assert report["config"]["schedule"] == {"mode": "open", "rate": 200.0, "burstiness": 0.5, "seed": 0}
    check_device(report, daemon.target, expected_tokens)
    assert "open loop, 200.0 req/s" in proc.stdout
