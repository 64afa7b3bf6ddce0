"""`calctl bench suite --multiturn` as a real process on the tiny preset at CI size: it builds the
package, starts a real fleet per configuration (1 and 2 boards; prefix reuse off and on; load and
prefix routing), runs the multi-turn bench on each and writes the suite JSON, the report with issue
19's targets and the plot. Checked: structure and counts (every configuration started with its
flags, every turn of every user completed with exactly its answer tokens, every target present with
a verdict or a reason), the outputs, no fleet left behind. Whether the targets are met is not this
test's business, nor any wall-clock figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.calctl_process import run_calctl

pytestmark = pytest.mark.integration

SUITE_DEADLINE_S = 300.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
USERS_PER_BOARD, TURNS, ANSWER = 2, 3, 6
CONFIGS = ["mt-x1-off-load", "mt-x1-on-load", "mt-x2-off-load", "mt-x2-on-load", "mt-x2-on-prefix"]


def test_mt_suite(tmp_path: Path) -> None:
    """(Short names: the boards' Unix socket paths must stay under 108 bytes.)"""
    out = tmp_path / "s"
    proc = run_calctl(
        "bench", "suite", "--multiturn", "--preset", "tiny", "--decode-batches", "4", "--dir", str(out),
        "--boards", "1,2", "--users-per-lane", "0.5", "--turns", str(TURNS), "--system-tokens", "32",
        "--user-tokens", "8", "--answer-tokens", str(ANSWER), "--think-time", "0", "--time-scale", "0.05",
        timeout=SUITE_DEADLINE_S,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads((out / "suite.json").read_text())
    assert doc["schema"] == "calculet.bench-suite/1" and doc["mode"] == "multiturn" and doc["preset"] == "tiny"
    assert doc["multiturn"]["turns"] == TURNS and doc["multiturn"]["answer_tokens"] == ANSWER
    assert [c["name"] for c in doc["configs"]] == CONFIGS
    for config in doc["configs"]:
        assert config["error"] is None and config["time_scale"] == 0.05
        reuse = "on" if config["prefix_reuse"] else "off"
        assert config["daemon_flags"][-2:] == ["--prefix-reuse", reuse]
        assert config["gateway_flags"] == ["--routing", config["routing"]]
    assert [r["config"] for r in doc["runs"]] == CONFIGS
    for run in doc["runs"]:
        assert run["error"] is None, run["error"]
        users = USERS_PER_BOARD * run["boards"]
        report = run["report"]
        counts = report["counts"]
        assert (counts["requests"], counts["completed"], counts["failed"]) == (users * TURNS, users * TURNS, 0)
        assert counts["output_tokens"] == users * TURNS * ANSWER
        mt = report["multiturn"]
        assert (mt["users"], mt["turns"], mt["skipped"]) == (users, TURNS, 0)
        assert [row["completed"] for row in mt["per_turn"]] == [users] * TURNS
        assert all(row["modelled_uncached_ttft_ms"] is not None for row in mt["per_turn"])
        if not run["prefix_reuse"]:
            assert mt["cached_share"] == 0.0  # reuse off: nothing may come from a cache
        assert (
            run["command"].startswith("calctl bench --gateway http://127.0.0.1:")
            and "--workload multiturn" in run["command"]
        )
    names = [(t["name"], t["runs"]) for t in doc["targets"]]
    assert names == [
        ("cache", "mt-x1-on-load"), ("ttft", "mt-x1-on-load"), ("cache", "mt-x2-on-load"), ("ttft", "mt-x2-on-load"),
        ("cache", "mt-x2-on-prefix"), ("ttft", "mt-x2-on-prefix"),
        ("reuse", "mt-x1-on-load / mt-x1-off-load"), ("reuse", "mt-x2-on-prefix / mt-x2-off-load"),
        ("scaling", "mt-x2-on-prefix / mt-x1-on-load"),
    ]  # fmt: skip
    assert all(t["met"] in (True, False) and t["measured"] is not None for t in doc["targets"])
    report_md = (out / "report.md").read_text()
    assert "## Targets of issue 19" in report_md and all(r["command"] in report_md for r in doc["runs"])
    assert (out / "plots" / "multiturn.png").read_bytes()[:8] == PNG_MAGIC
    assert not list((out / "fleets").glob("*/*.sock"))  # every fleet stopped and cleaned up
    assert "wrote" in proc.stdout and proc.stderr == ""
