"""Arrival schedules: the closed loop never has more than N in flight (a fake backend counts), the
open loop sends at its offsets (a fake clock, nothing sleeps), and the gamma inter-arrivals have
the requested mean rate and shape over many seeded draws (burstiness 1 = exponential)."""

from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.schedule import ClosedLoop, OpenLoop, arrival_offsets, gamma_gaps
from calculet.ops.bench.workload import BenchRequest


def _requests(n: int) -> list[BenchRequest]:
    return [BenchRequest(i, 4, prompt_tokens=(1, 2)) for i in range(n)]


class CountingBackend:
    """Holds each request for a few loop turns (more for some), counting what is in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent: list[int] = []

    async def send(self, request: BenchRequest) -> RequestRecord:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.sent.append(request.index)
        for _ in range(1 + request.index % 5):
            await asyncio.sleep(0)
        self.in_flight -= 1
        record = RequestRecord(request.index, request.max_tokens, 0.0)
        record.arrived(0.5, 1)
        record.finish(1.0, 1)
        return record


@pytest.mark.parametrize(("concurrency", "requests"), [(1, 7), (4, 30), (8, 3)])
def test_closed_loop_keeps_at_most_n_in_flight_and_sends_each_request_once(concurrency: int, requests: int) -> None:
    backend = CountingBackend()
    records = asyncio.run(ClosedLoop(concurrency).run(_requests(requests), backend.send))
    assert backend.max_in_flight == min(concurrency, requests)
    assert sorted(backend.sent) == list(range(requests))
    assert [r.index for r in records] == list(range(requests))  # in request order


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_open_loop_sends_each_request_at_its_offset_whatever_is_in_flight() -> None:
    fake = FakeClock()
    sent_at: list[float] = []

    async def send(request: BenchRequest) -> RequestRecord:
        sent_at.append(fake.now - 100.0)
        await asyncio.sleep(0)
        return RequestRecord(request.index, 1, fake.now)

    schedule = OpenLoop(4.0, 0.5, seed=11, clock=fake.clock, sleep=fake.sleep)
    records = asyncio.run(schedule.run(_requests(12), send))
    gaps = gamma_gaps(11, 4.0, 0.5, random.Random("calctl-bench:11:arrivals"))
    expected, at = [0.0], 0.0
    for gap in gaps:
        at += gap
        expected.append(at)
    assert sent_at == pytest.approx(expected)
    assert [r.index for r in records] == list(range(12))


def test_constant_arrivals_at_infinite_burstiness_and_all_at_once_at_infinite_rate() -> None:
    assert arrival_offsets(4, 2.0, math.inf, seed=0) == [0.0, 0.5, 1.0, 1.5]
    assert arrival_offsets(3, math.inf, 1.0, seed=0) == [0.0, 0.0, 0.0]
    assert arrival_offsets(0, 2.0, 1.0, seed=0) == []


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_requested_mean_rate_and_shape(burstiness: float) -> None:
    rate = 5.0
    gaps = gamma_gaps(40_000, rate, burstiness, random.Random(7))
    mean = statistics.fmean(gaps)
    assert 1.0 / mean == pytest.approx(rate, rel=0.03)
    # a gamma of shape k has squared coefficient of variation 1/k
    cv2 = statistics.pvariance(gaps) / mean**2
    assert cv2 == pytest.approx(1.0 / burstiness, rel=0.1)


def test_burstiness_one_is_the_exponential_distribution() -> None:
    rate, n = 3.0, 5000
    gaps = sorted(gamma_gaps(n, rate, 1.0, random.Random(3)))
    # Kolmogorov-Smirnov distance to the exponential CDF 1 - exp(-rate x); 1.36/sqrt(n) is the 5 % level
    distance = max(max((i + 1) / n - cdf, cdf - i / n) for i, cdf in enumerate(1 - math.exp(-rate * g) for g in gaps))
    assert distance < 1.36 / math.sqrt(n)


def test_arrivals_repeat_for_a_seed_and_differ_between_seeds() -> None:
    assert arrival_offsets(50, 10.0, 1.0, seed=5) == arrival_offsets(50, 10.0, 1.0, seed=5)
    assert arrival_offsets(50, 10.0, 1.0, seed=5) != arrival_offsets(50, 10.0, 1.0, seed=6)


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (math.nan, 1.0)])
def test_bad_rates_are_refused(rate: float, burstiness: float) -> None:
    with pytest.raises(InvalidArgument, match="must be > 0"):
        OpenLoop(rate, burstiness)
    with pytest.raises(InvalidArgument, match="must be > 0"):
        gamma_gaps(3, rate, burstiness, random.Random(0))


def test_closed_loop_needs_a_client() -> None:
    with pytest.raises(InvalidArgument, match="concurrency: must be at least 1, got 0"):
        ClosedLoop(0)


def test_schedules_describe_themselves_for_the_report() -> None:
    assert ClosedLoop(3).describe() == {"mode": "closed", "concurrency": 3}
    assert OpenLoop(math.inf, 2.0, 9).describe() == {"mode": "open", "rate": "inf", "burstiness": 2.0, "seed": 9}
