"""Assertions shared by the integration tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import psutil
import pytest

from calculet.client import DaemonClient

# Thread pools and channels grow lazily up to their bounds (asyncio's default executor starts a
# worker when concurrent blocking calls need one; a gateway opens its operate channel at its first
# switch), so a busier run may keep one or two more threads or descriptors than its warm-up needed.
# A leak grows with the work (one per request, fault or switch): the tests that use this run dozens
# of those after their baseline, far past this slack.
LAZY_GROWTH = 2
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


def process_usage(pid: int) -> tuple[int, int]:
    """(open fds, threads) of a process."""
    proc = psutil.Process(pid)
    return proc.num_fds(), proc.num_threads()


def usage_back_to(pid: int, baseline: tuple[int, int], timeout: float = 10.0) -> tuple[int, int]:
    """(fds, threads) once both are within `LAZY_GROWTH` of `baseline`, or as they are at the
    deadline (peers close their ends of finished connections asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        now = process_usage(pid)
        if within(now, baseline) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def within(usage: tuple[int, int], baseline: tuple[int, int]) -> bool:
    """No more fds and threads than `baseline` plus `LAZY_GROWTH` each."""
    return all(now <= base + LAZY_GROWTH for now, base in zip(usage, baseline, strict=True))


def poll(condition: Callable[[], bool], what: str, timeout: float) -> None:
    """Re-check `condition` until it holds (a real process changes on its own, nothing to wait on);
    fail the test with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)
