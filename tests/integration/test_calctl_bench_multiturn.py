"""`calctl bench --workload multiturn` as a real process through a real gateway in front of a real
calsim daemon (tiny, time scale 0): 2 users x 3 turns, every turn completed with exactly its answer
tokens, the per-turn figures present with the right counts, each turn's prompt longer than the
last (it carries the conversation), the workload's texts at their token targets, the device's
tokens those of the measured window. The share served from cache is only checked to be a share:
whether the daemon reuses prefixes is not this test's business. No wall-clock figure is asserted."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess
from tests.integration.test_calctl_bench import PNG_MAGIC, check_device, run_bench

pytestmark = pytest.mark.integration

USERS, TURNS, SYSTEM, USER, ANSWER = 2, 3, 32, 8, 6


def test_multiturn_conversations_through_the_gateway(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    gateway = start_gateway("--daemon", daemon.target)
    plot = tmp_path / "turns.png"
    proc, report = run_bench(
        tmp_path, "--gateway", f"unix:{gateway.socket}", "--model", "tiny", "--workload", "multiturn",
        "--users", str(USERS), "--turns", str(TURNS), "--system-tokens", str(SYSTEM), "--user-tokens", str(USER),
        "--answer-tokens", str(ANSWER), "--think-time", "0", "--warmup", "1", "--slo", "ttft:600000",
        "--plot", str(plot),
    )  # fmt: skip
    requests = USERS * TURNS
    counts = report["counts"]
    assert (counts["requests"], counts["completed"], counts["failed"], counts["warmup_failed"]) == (
        requests,
        requests,
        0,
        0,
    )
    assert counts["output_tokens"] == counts["requested_output_tokens"] == requests * ANSWER
    assert report["goodput"]["good_requests"] == requests  # a ten-minute TTFT objective: all good
    assert report["goodput"]["output_tokens"] == requests * ANSWER
    assert report["latency_ms"]["ttft"]["count"] == report["latency_ms"]["tpot"]["count"] == requests
    config = report["config"]
    assert config["schedule"] == {"mode": "conversations", "users": USERS, "turns": TURNS}
    assert config["target"]["api"] == "chat" and config["ignore_eos"] is True
    assert config["workload"]["measured_tokens"] == {"system": SYSTEM, "user_min": USER, "user_max": USER}
    mt = report["multiturn"]
    assert (mt["users"], mt["turns"], mt["skipped"]) == (USERS, TURNS, 0)
    rows = mt["per_turn"]
    assert [row["turn"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert (row["sent"], row["completed"], row["failed"], row["skipped"]) == (USERS, USERS, 0, 0)
        assert row["output_tokens"] == USERS * ANSWER and row["ttft_ms"]["count"] == USERS
        assert 0.0 <= row["cached_share"] <= 1.0
    # each turn carries the whole conversation: the system prompt and the first message at least,
    # and then more than the previous turn's prompt and answer
    assert rows[0]["prompt_tokens"] >= USERS * (SYSTEM + USER)
    for before, after in itertools.pairwise(rows):
        assert after["prompt_tokens"] > before["prompt_tokens"] + before["output_tokens"]
        assert after["carried_tokens"] == before["prompt_tokens"] + before["output_tokens"]
    assert sum(row["prompt_tokens"] for row in rows) == counts["prompt_tokens"]
    assert 0 <= mt["cache_reported"] <= requests and 0.0 <= mt["cached_share"] <= 1.0
    assert [t["name"] for t in mt["targets"]] == ["cache", "ttft"]
    check_device(report, daemon.target, requests * ANSWER)
    assert "by turn: 2 users x 3 turns" in proc.stdout
    assert plot.read_bytes()[:8] == PNG_MAGIC
