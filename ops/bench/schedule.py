"""When requests are sent: a closed loop of N clients, or an open loop of arrivals at a rate.

- `ClosedLoop(n)`: n workers, each sends its next request as soon as its previous one finished, so
  exactly min(n, remaining) requests are in flight and never more.
- `OpenLoop(rate, burstiness, seed)`: request i is sent at offset_i = sum of the first i
  inter-arrival gaps (request 0 at once), whatever is in flight. Gaps are gamma distributed with
  shape = burstiness and scale = 1 / (rate * burstiness), so their mean is 1/rate for any
  burstiness; burstiness 1 is the exponential (a Poisson process), below 1 burstier, above 1 more
  even, infinity a constant 1/rate. An infinite rate sends everything at once. The gaps come from
  a `random.Random` seeded with `seed`, so a run's arrival times repeat (vLLM's `get_request` does
  the same draws, but rescales them so the last arrival lands at n/rate; we keep the raw process).

Data flow: the runner calls `schedule.run(requests, send)`; `send` (a backend's) never raises for a
failed request, it returns the failed record; the records come back in request order. The clock and
sleep of `OpenLoop` are injectable so tests can check the dispatch times without waiting.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.workload import BenchRequest

SendFn = Callable[[BenchRequest], Coroutine[Any, Any, RequestRecord]]


def gamma_gaps(count: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """`count` inter-arrival gaps in seconds (see the module docstring).

    Raises:
        InvalidArgument: rate or burstiness not > 0.
    """
    if not rate > 0 or not burstiness > 0:
        raise InvalidArgument(f"rate and burstiness must be > 0, got {rate} and {burstiness}")
    if math.isinf(rate):
        return [0.0] * count
    if math.isinf(burstiness):
        return [1.0 / rate] * count
    scale = 1.0 / (rate * burstiness)
    return [rng.gammavariate(burstiness, scale) for _ in range(count)]


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send offsets from the start: 0 for the first request, then the running sum of the gaps."""
    gaps = gamma_gaps(max(count - 1, 0), rate, burstiness, random.Random(f"calctl-bench:{seed}:arrivals"))
    offsets, at = [0.0] if count else [], 0.0
    for gap in gaps:
        at += gap
        offsets.append(at)
    return offsets


class ArrivalSchedule(ABC):
    """How a run's requests are released."""

    @abstractmethod
    async def run(self, requests: Sequence[BenchRequest], send: SendFn) -> list[RequestRecord]:
        """Send every request by this schedule and wait for all of them.

        Args:
            requests: the requests, in order.
            send: sends one request and returns its record (failed ones included).

        Returns:
            The records, in the order of `requests`.

        Raises:
            Whatever `send` raises (a bug: failures of requests are records, not exceptions).
        """

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The schedule's settings for the JSON report."""


class ClosedLoop(ArrivalSchedule):
    """`concurrency` clients, each sending its next request when its previous one finished."""

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise InvalidArgument(f"concurrency: must be at least 1, got {concurrency}")
        self.concurrency = concurrency

    async def run(self, requests: Sequence[BenchRequest], send: SendFn) -> list[RequestRecord]:
        records: list[RequestRecord | None] = [None] * len(requests)
        pending = iter(enumerate(requests))

        async def client() -> None:
            for position, request in pending:  # one iterator shared by the clients of one loop
                records[position] = await send(request)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(self.concurrency, len(requests))):
                group.create_task(client())
        return [r for r in records if r is not None]

    def describe(self) -> dict[str, Any]:
        return {"mode": "closed", "concurrency": self.concurrency}


class OpenLoop(ArrivalSchedule):
    """Requests sent at `arrival_offsets(rate, burstiness, seed)` from the start, however many are
    in flight."""

    def __init__(
        self,
        rate: float,
        burstiness: float = 1.0,
        seed: int = 0,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not rate > 0 or not burstiness > 0:
            raise InvalidArgument(f"rate and burstiness must be > 0, got {rate} and {burstiness}")
        self.rate, self.burstiness, self.seed = rate, burstiness, seed
        self._clock, self._sleep = clock, sleep

    async def run(self, requests: Sequence[BenchRequest], send: SendFn) -> list[RequestRecord]:
        offsets = arrival_offsets(len(requests), self.rate, self.burstiness, self.seed)
        tasks: list[asyncio.Task[RequestRecord]] = []
        async with asyncio.TaskGroup() as group:
            start = self._clock()
            for offset, request in zip(offsets, requests, strict=True):
                delay = start + offset - self._clock()
                if delay > 0:
                    await self._sleep(delay)
                tasks.append(group.create_task(send(request)))
                await asyncio.sleep(0)  # let it start (and stamp its send time) before the next one
        return [task.result() for task in tasks]

    def describe(self) -> dict[str, Any]:
        return {"mode": "open", "rate": _number(self.rate), "burstiness": _number(self.burstiness), "seed": self.seed}


def _number(value: float) -> float | str:
    """JSON has no infinity: "inf" stands for it."""
    return "inf" if math.isinf(value) else value
