"""Assertions shared by the integration tests."""

from __future__ import annotations

import subprocess
import time

from calculet.client import DaemonClient

LANE_FREE = 1
LANE_PARKED = 5  # a finished job's KV kept warm: held by no job, free for admission


def idle_problems(client: DaemonClient) -> list[str]:
    status = client.status()
    problems = []
    if status.jobs:
        problems.append(f"jobs left: {[j.job_id for j in status.jobs]}")
    if status.inflight_submissions:
        problems.append(f"{status.inflight_submissions} device jobs in flight")
    if status.buffer_pool.in_use or status.buffer_pool.quarantined:
        problems.append(f"buffers in use {status.buffer_pool.in_use}, quarantined {status.buffer_pool.quarantined}")
    for m in status.models:
        busy = [lane.index for lane in m.lanes if lane.state not in (LANE_FREE, LANE_PARKED) or lane.job_id]
        if busy:
            problems.append(f"model {m.alias} gen {m.generation}: lanes held {busy}")
    return problems


def assert_idle_soon(client: DaemonClient, timeout: float = 10.0) -> None:
    """Lanes, buffers and jobs all back to idle (polls: completions finish asynchronously)."""
    deadline = time.monotonic() + timeout
    while (problems := idle_problems(client)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not problems, problems


def one_clear_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """A refused start: exactly one `calculet-daemon:` line on stderr, no traceback, naming `words`."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("calculet-daemon:")]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
