"""Acceptance of today's calbin: `calctl up --preset qwen3-30b-a3b-b1`, with nothing else said,
validates the package (built as `calctl up` builds it), serves it with the serial policy (one KV
lane: `calculet.ops.serving_defaults`) and answers a 30,000-token prompt and a conversation past
40,000 tokens through the real gateway. One board at time scale 0: the 30,000-token prefill is one
modelled job of about 1,030 s (docs/performance.md) that takes no wall time.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from calculet.client import DaemonClient
from calculet.v1 import observe_pb2

pytestmark = pytest.mark.integration

PRESET = "qwen3-30b-a3b-b1"
TIMEOUT_S = 120.0
PROMPT_WORDS = 30_000  # " hello" is one token: 30,000 of them plus the chat template's 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chat(port: int, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    # Greedy: an unseeded sampled answer may draw the stop token before `max_tokens` (seen once), and
    # the first test counts the tokens it asked for.
    body = {"model": PRESET, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
    return answer


@dataclass(frozen=True)
class Up:
    """The running `calctl up`: its gateway port, its `--dir` and its output so far."""

    port: int
    run: Path
    out: Path

    def banner(self) -> str:
        return self.out.read_text(errors="replace")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[Up]:
    """`calctl up --boards 1 --preset qwen3-30b-a3b-b1 --time-scale 0` (nothing else), serving; at the
    end it must stop on Ctrl-C with exit 0."""
    root = tmp_path_factory.mktemp("up-b1")
    fleet = Up(_free_port(), root / "run", root / "up.out")
    # The package as `calctl up` builds it (the session's copy: the build is paid once per run); it
    # still validates it.
    shutil.copytree(models_root / PRESET, fleet.run / "models" / PRESET)
    cmd = [
        sys.executable, "-m", "calculet.ops.calctl", "up", "--boards", "1", "--preset", PRESET,
        "--time-scale", "0", "--port", str(fleet.port), "--dir", str(fleet.run),
    ]  # fmt: skip
    with fleet.out.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while "Stop with Ctrl-C" not in fleet.banner():
            assert proc.poll() is None and time.monotonic() < deadline, fleet.banner()
            time.sleep(0.1)
        yield fleet
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=TIMEOUT_S)
    assert code == 0, fleet.banner()


def test_calctl_up_serves_a_30000_token_prompt_on_todays_calbin_without_tuning(up: Up) -> None:
    banner = up.banner()
    assert "== policy serial (auto:" in banner and "one KV lane" in banner
    assert "warning submodel.label_ignored: prefill: the vendor labels it 'llm_decode'" in banner
    answer = _chat(up.port, [{"role": "user", "content": " hello" * PROMPT_WORDS}], 4)
    usage = answer["usage"]
    assert usage["prompt_tokens"] >= 30_000 and usage["completion_tokens"] == 4
    with DaemonClient(f"unix:{up.run / 'board0.sock'}") as board:
        status = board.status()
    (model,) = status.models
    assert model.alias == PRESET and len(model.lanes) == 1
    assert status.policy == observe_pb2.POLICY_SERIAL


def test_a_conversation_grows_past_40000_tokens(up: Up) -> None:
    messages: list[dict[str, str]] = []
    for words in (20_000, 10_000, 10_000):
        messages.append({"role": "user", "content": " world" * words})
        answer = _chat(up.port, messages, 16)
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    assert 40_000 <= answer["usage"]["prompt_tokens"] <= 40_960 - 16
