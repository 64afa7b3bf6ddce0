"""Before a fleet starts: a run's estimate (the limit of the requests it will send) and the automatic
time scale, against values worked out by hand (timing_factories.py; test_limit.py for the limit);
and the host CPU figures of a run."""

from __future__ import annotations

import os

import pytest

from calculet.ops.bench.limit import Policy, RequestShape, Serving, workload_limit
from calculet.ops.bench.suite.cpu import CpuMeter, CpuSample, cpu_json
from calculet.ops.bench.suite.estimate import RunEstimate, auto_time_scale, estimate
from calculet.ops.bench.suite.fleet import daemon_flags, job_timeout_s
from calculet.ops.bench.suite.matrix import FleetSpec, SuiteRun, WorkloadSpec

from .timing_factories import device_model

FIXED = WorkloadSpec("fixed", (10, 10), 3, (2,))


def run_on(boards: int, requests: int) -> SuiteRun:
    fleet = FleetSpec("f", Policy.CONTINUOUS, 1, 2, boards)
    return SuiteRun(fleet, FIXED, 2 * boards, "gateway", requests, warmup=1)


def test_a_run_estimate() -> None:
    one = estimate(run_on(1, 2), device_model(), seed=0)
    assert one.limit.rows == 2  # two clients, two lanes
    assert one.modelled_s == pytest.approx(0.11045)  # two requests, prompt 10, output 3, in-flight 1
    assert one.longest_request_s == pytest.approx(0.0325 + 0.03345 + 0.012)
    assert one.fleet_tokens_per_s == pytest.approx(6 / 0.11045)
    two = estimate(run_on(2, 4), device_model(), seed=0)  # twice the requests over two boards
    assert two.limit.rows == 2 and two.modelled_s == pytest.approx(0.11045)
    assert two.fleet_tokens_per_s == pytest.approx(2 * 12 / 0.2209)


def at_rate(tokens_per_s: float) -> RunEstimate:
    limit = workload_limit(device_model(), [RequestShape(1, 1)], Serving(Policy.CONTINUOUS, 1), 1)
    return RunEstimate(run_on(1, 1), limit, 1.0, 1.0, tokens_per_s)


@pytest.mark.parametrize(
    ("rates", "floor", "expected"),
    [
        ([300.0], None, 1.0),  # 0.3 s of CPU a second on 1 of 2 cores allowed: the floor
        ([300.0, 1500.0], None, 1.5),  # the peak: 1.5 CPU-s a second -> 1.5x slower
        ([1234.0], None, 1.25),  # rounded up to 0.05
        ([58.0], 0.05, 0.1),  # a lower floor (the length grid's fleet)
        ([20.0], 0.05, 0.05),
    ],
)
def test_the_automatic_time_scale(rates: list[float], floor: float | None, expected: float) -> None:
    scale = auto_time_scale([at_rate(r) for r in rates], host_s_per_token=1e-3, cpus=2, floor=floor)
    assert scale == pytest.approx(expected)


def test_the_daemon_flags_and_job_deadline() -> None:
    est = estimate(run_on(1, 2), device_model(), seed=0)
    assert job_timeout_s([est], 1.0) == pytest.approx(30 + 2 * 0.07795)
    long = RunEstimate(est.run, est.limit, 1.0, 1800.0, 1.0)
    assert job_timeout_s([est, long], 0.5) == pytest.approx(2 * 1800 * 0.5 + 30)
    flags = daemon_flags(FleetSpec("f", Policy.CONTINUOUS, 2, 16, 1), 42.0)
    assert flags == ("--max-inflight", "2", "--admission-timeout", "86400", "--job-timeout", "42")


def test_host_cpu_figures() -> None:
    before = CpuSample({"daemons": 1.0, "gateway": 0.5, "client": 2.0}, host_busy_s=10.0, host_total_s=20.0)
    after = CpuSample({"daemons": 1.6, "gateway": 0.7, "client": 2.1}, host_busy_s=13.8, host_total_s=24.0)
    cpu = cpu_json(before, after, tokens=400, server_roles=("daemons", "gateway"))
    assert cpu["seconds"] == pytest.approx({"daemons": 0.6, "gateway": 0.2, "client": 0.1})
    assert cpu["us_per_token_serving"] == pytest.approx(0.8 / 400 * 1e6)
    assert cpu["us_per_token_all"] == pytest.approx(0.9 / 400 * 1e6)
    assert cpu["host_busy"] == pytest.approx(0.95) and cpu["host_limited"] is True
    none = cpu_json(before, before, tokens=0, server_roles=("daemons",))
    assert none["us_per_token_serving"] is None and none["host_busy"] is None and none["host_limited"] is False


def test_the_meter_reads_live_processes_and_skips_gone_ones() -> None:
    meter = CpuMeter({"client": [os.getpid()], "gone": [2**22 + 12345]})
    first = meter.sample()
    sum(i * i for i in range(200_000))  # some CPU; the figure may still not move on a coarse clock
    second = meter.sample()
    assert second.roles["client"] >= first.roles["client"] > 0.0
    assert second.roles["gone"] == 0.0
    assert second.host_total_s >= first.host_total_s
