"""Concurrency, batching and ping/pong never change a request's tokens (the oracle)."""

from __future__ import annotations

import pytest

from calculet.client import DaemonClient

from .helpers import assert_idle_soon
from .oracle import make_requests, run_concurrent, run_sequential

pytestmark = pytest.mark.integration


def _device_jobs(target: str) -> int:
    with DaemonClient(target) as client:
        return int(client.status().device_counters.submitted)


def _assert_idle(target: str) -> None:
    with DaemonClient(target) as client:
        assert_idle_soon(client)


@pytest.mark.parametrize("policy", ["continuous", "serial"])
def test_concurrent_tiny_requests_equal_sequential_runs(start_daemon, policy: str) -> None:
    daemon = start_daemon("--model", "tiny=tiny", "--policy", policy, "--max-inflight", "2")
    reqs = make_requests(24, vocab=512, seed=7)
    before = _device_jobs(daemon.target)  # the golden warm-up check ran some already
    reference = run_sequential(daemon.target, "tiny", reqs)
    jobs_sequential = _device_jobs(daemon.target) - before
    concurrent = run_concurrent(daemon.target, "tiny", reqs)
    jobs_concurrent = _device_jobs(daemon.target) - before - jobs_sequential
    for i, (want, got) in enumerate(zip(reference, concurrent, strict=True)):
        assert got == want, f"request {i}: concurrent run differs from its sequential run"
    assert sum(map(len, reference)) > 24 * 3
    if policy == "continuous":
        assert jobs_concurrent < jobs_sequential, "continuous batching should need fewer device jobs"
    else:
        assert jobs_concurrent == jobs_sequential, "the serial policy runs one sequence per job"
    _assert_idle(daemon.target)


def test_concurrent_synthetic_qwen_requests_equal_sequential_runs(start_daemon) -> None:
    """Also on a board without lane selection (fixed slots, docs/daemon.md): the same tokens as the
    default board's sequential runs, on decode batches padded to the highest slot."""
    daemon = start_daemon("--model", "qwen=qwen", "--max-inflight", "2")
    reqs = make_requests(24, vocab=151_936, seed=11, max_prompt=120, max_out=32)
    reference = run_sequential(daemon.target, "qwen", reqs)
    concurrent = run_concurrent(daemon.target, "qwen", reqs)
    assert concurrent == reference
    assert any(tok >= 100_000 for toks in reference for tok in toks), "full 151,936 vocab in use"
    _assert_idle(daemon.target)
    fixed = start_daemon(
        "--model", "qwen=qwen", "--device-option", "lane_selection=false", "--device-option", "inactive_rows=all"
    )
    assert run_concurrent(fixed.target, "qwen", reqs) == reference, "fixed slots changed a token"
    with DaemonClient(fixed.target) as client:
        status = client.status()
    caps, slots = status.device.capabilities, status.models[0].slots
    assert not caps.lane_selection and caps.inactive_rows == "all"
    assert slots.fixed and 0 < slots.active_rows < slots.compiled_rows  # idle slots were masked
    _assert_idle(fixed.target)
