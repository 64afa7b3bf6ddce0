"""`calctl bench suite --quick` as a real process on the tiny preset with a tiny matrix: it builds the
packages, starts a real fleet per configuration (daemons + gateway), runs every `calctl bench` of
the matrix, and writes the suite JSON, the markdown report and the plot. Checked: structure and
counts (every run present, every request completed with exactly its output tokens), the relative
figures and the limit present and finite, the host CPU read, no fleet left behind. No wall-clock
figure is asserted."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.integration.calctl_process import run_calctl

pytestmark = pytest.mark.integration

SUITE_DEADLINE_S = 180.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED_RUNS = [
    "serial.short.c1.gateway", "serial.short.c1.daemon", "serial.short.c2.gateway", "serial.short.c2.daemon",
    "if2-b4.short.c1.gateway", "if2-b4.short.c1.daemon", "if2-b4.short.c2.gateway", "if2-b4.short.c2.daemon",
    "if2-b4.mixed.c1.gateway", "if2-b4.mixed.c2.gateway",
]  # fmt: skip


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def check_run(run: dict[str, Any]) -> None:
    assert run["error"] is None, run["error"]
    report = run["report"]
    counts = report["counts"]
    assert (counts["requests"], counts["completed"], counts["failed"]) == (3, 3, 0)
    assert counts["output_tokens"] == 3 * run["workload"]["output"]  # --ignore-eos: exactly max_tokens
    assert run["command"].startswith("calctl bench --") and "--timing-package" in run["command"]
    tm = report["timing_model"]
    assert tm["time_scale"] == 0.05 and tm["policy"] == ("serial" if run["config"] == "serial" else "continuous")
    assert finite(tm["limit"]["output_tokens_per_s"]) and tm["limit"]["output_tokens_per_s"] > 0
    assert [b["decode_batch"] for b in tm["limit_by_batch"]] == ([1] if run["config"] == "serial" else [4])
    for name in ("ttft", "tpot", "e2e"):
        assert tm["relative"][name]["count"] == 3 and finite(tm["relative"][name]["p50"]), name
    assert finite(tm["relative"]["throughput"]) and finite(tm["relative"]["busy_of_wall"])
    assert finite(tm["tpot_excess_ms"]["p50"])
    assert finite(run["host_cpu"]["us_per_token_serving"]) and finite(run["host_cpu"]["host_busy"])


def test_quick_suite_on_the_tiny_preset(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    proc = run_calctl(
        "bench", "suite", "--quick", "--preset", "tiny", "--dir", str(out), "--decode-batches", "4",
        "--configs", "serial,if2-b4", "--concurrency", "1,2", "--requests", "3", "--time-scale", "0.05",
        timeout=SUITE_DEADLINE_S,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads((out / "suite.json").read_text())
    assert doc["schema"] == "calculet.bench-suite/1" and doc["mode"] == "quick" and doc["preset"] == "tiny"
    assert [c["name"] for c in doc["configs"]] == ["serial", "if2-b4"]
    assert all(c["error"] is None and c["time_scale"] == 0.05 for c in doc["configs"])
    assert [r["name"] for r in doc["runs"]] == EXPECTED_RUNS
    for run in doc["runs"]:
        check_run(run)
    mixed = [r for r in doc["runs"] if r["workload"]["name"] == "mixed"]
    assert all(r["workload"]["long_fraction"] == 0.1 and r["workload"]["long_prompt"] > 64 for r in mixed)
    report = (out / "report.md").read_text()
    assert "### workload `short`" in report and "### workload `mixed`" in report
    assert all(r["command"] in report for r in doc["runs"])
    assert (out / "plots" / "short.png").read_bytes()[:8] == PNG_MAGIC
    assert not list((out / "fleets").glob("*/*.sock"))  # every fleet stopped and cleaned up
    assert "wrote" in proc.stdout and proc.stderr == ""
