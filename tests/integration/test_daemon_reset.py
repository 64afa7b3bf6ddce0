"""Issue 7, items 3, 5 and 6: the operator Reset RPC against real daemons.

- A successful operator reset clears an exhausted automatic-reset budget and the board serves
  again (it stayed NOT_SERVING until a restart).
- An operator CCU reset is not a device anomaly: ping/pong (max_inflight 2) stays.
- ResetResult counts the jobs the reset hit and what became of them (they were always 0).
- One reset at a time: concurrent Resets are refused with FAILED_PRECONDITION while one runs.
"""

from __future__ import annotations

import threading
import time

import pytest

from calculet.client import DaemonClient
from calculet.common.errors import CalculetError, FailedPrecondition, Unavailable
from calculet.v1 import common_pb2

from .helpers import assert_idle_soon

pytestmark = pytest.mark.integration

PROMPT = (5, 9, 2, 7, 11)
POLL_S = 20.0


def _generate(client: DaemonClient, seed: int, max_tokens: int = 6) -> list[int]:
    return list(client.generate("tiny", PROMPT, max_tokens=max_tokens, seed=seed, temperature=0.8, ignore_eos=True))


def _wait_until(what: str, check) -> None:  # type: ignore[no-untyped-def]
    """Poll `check()` until true (the daemon's threads move on their own), failing after POLL_S."""
    deadline = time.monotonic() + POLL_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _hang_next_job_and_submit(client: DaemonClient, seed: int) -> str:
    """Plan a hang for the next device job, submit one request and wait until its job is on the device."""
    client.inject_fault("hang")
    job = client.submit("tiny", PROMPT, max_tokens=6, seed=seed, temperature=0.8, ignore_eos=True).job_id
    _wait_until("the hung job to be in flight", lambda: client.status().inflight_submissions == 1)
    return job


@pytest.mark.parametrize("kind", ["ccu", "configuration"])
def test_operator_reset_clears_an_exhausted_reset_budget_and_the_board_serves_again(start_daemon, kind: str) -> None:
    # A hang is found by the job timeout, in wall time: 2 s, never reached by an ordinary job on a
    # loaded machine (0.5 s could be, and a slow job then used up the budget early).
    daemon = start_daemon("--model", "tiny=tiny", "--fault-injection", "--job-timeout", "2")
    with DaemonClient(daemon.target) as client:
        reference = _generate(client, seed=1)
        for attempt in range(3):  # each hang costs one automatic reset and is recovered
            client.inject_fault("hang")
            assert _generate(client, seed=1) == reference, f"hang {attempt} was not recovered"
        client.inject_fault("hang")  # the fourth: the budget (3 per 10 min) is used up
        with pytest.raises(Unavailable):
            _generate(client, seed=1)
        health = client.health()
        assert health.status == common_pb2.SERVING_STATUS_NOT_SERVING and health.reset_budget.exhausted
        with pytest.raises(Unavailable, match="waits for an operator"):  # says why, not "device lost"
            client.submit("tiny", PROMPT, max_tokens=2, seed=1)

        result = client.reset(kind, "operator clears the exhausted budget")

        assert result.ok, result
        assert result.health_before == common_pb2.SERVING_STATUS_NOT_SERVING
        assert result.health_after == common_pb2.SERVING_STATUS_SERVING, result
        health = client.health()
        assert health.status == common_pb2.SERVING_STATUS_SERVING, health
        assert not health.reset_budget.exhausted and health.reset_budget.used == 0
        assert _generate(client, seed=1) == reference, "the board must serve again after the reset"
        client.inject_fault("hang")  # the budget really is fresh: a hang is reset and recovered again
        assert _generate(client, seed=1) == reference
        assert_idle_soon(client)  # the hung job's buffers were given back too


def test_operator_ccu_reset_is_not_an_anomaly_and_reports_the_jobs_it_hit(start_daemon) -> None:
    daemon = start_daemon("--model", "tiny=tiny", "--fault-injection")
    with DaemonClient(daemon.target) as client:
        reference = _generate(client, seed=3)
        assert client.status().max_inflight == 2
        job = _hang_next_job_and_submit(client, seed=3)

        result = client.reset("ccu", "operator unsticks a hung job")

        assert result.ok, result
        assert (result.inflight_jobs, result.recovered_jobs, result.failed_jobs) == (1, 1, 0), result
        tokens = [t for e in client.wait(job) for t in getattr(e, "tokens", ())]
        assert tokens == reference, "the job the reset hit must continue with undisturbed tokens"
        assert client.status().max_inflight == 2, "an operator reset must not drop ping/pong"
        assert _generate(client, seed=3) == reference
        assert client.status().max_inflight == 2
        assert_idle_soon(client)


def test_concurrent_resets_run_one_at_a_time_and_the_board_serves_afterwards(start_daemon) -> None:
    # Time scale 0.01: a 300 s modelled delay is 3 s of wall time, the window in which the first
    # reset is still in progress (its victim re-prefills in that slow job); other jobs take ~0.
    daemon = start_daemon("--model", "tiny=tiny", "--fault-injection", "--time-scale", "0.01")
    callers = 8
    with DaemonClient(daemon.target) as client:
        reference = _generate(client, seed=4)
        job = _hang_next_job_and_submit(client, seed=4)
        client.inject_fault("slow_job", delay_ms=300_000)  # the victim's re-prefill
        barrier = threading.Barrier(callers)
        outcomes: list[object] = [None] * callers

        def reset(i: int) -> None:
            with DaemonClient(daemon.target) as own:
                barrier.wait()
                try:
                    outcomes[i] = own.reset("ccu", f"storm {i}")
                except CalculetError as exc:
                    outcomes[i] = exc

        threads = [threading.Thread(target=reset, args=(i,)) for i in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ok = [o for o in outcomes if not isinstance(o, CalculetError) and getattr(o, "ok", False)]
        refused = [o for o in outcomes if isinstance(o, FailedPrecondition)]
        assert len(ok) == 1 and len(refused) == callers - 1, outcomes
        assert all("reset in progress" in str(o) for o in refused), refused
        assert (ok[0].inflight_jobs, ok[0].recovered_jobs, ok[0].failed_jobs) == (1, 1, 0), ok[0]
        tokens = [t for e in client.wait(job) for t in getattr(e, "tokens", ())]
        assert tokens == reference
        assert client.health().status == common_pb2.SERVING_STATUS_SERVING
        assert client.reset("ccu", "after the storm").ok, "the gate must be free again"
        assert _generate(client, seed=4) == reference
        assert client.status().max_inflight == 2
        assert_idle_soon(client)


def test_status_reports_the_last_reset_and_each_models_package_hash(start_daemon, models_root) -> None:  # type: ignore[no-untyped-def]
    # Status' ResetSummary.last_kind/last_at/last_ok and ModelStatus.package_hash were never set.
    import hashlib

    daemon = start_daemon("--model", "tiny=tiny")
    with DaemonClient(daemon.target) as client:
        before = client.status()
        assert not before.resets.HasField("last_at") and before.resets.last_kind == common_pb2.RESET_KIND_UNSPECIFIED
        manifest = (models_root / "tiny" / "calculet-package.json").read_bytes()
        assert before.models[0].package_hash == hashlib.sha256(manifest).hexdigest()
        started = time.time()
        assert client.reset("ccu", "status test").ok
        after = client.status().resets
        assert after.last_kind == common_pb2.RESET_KIND_CCU and after.last_ok
        assert after.last_at.ToSeconds() >= int(started) and after.count == before.resets.count + 1
