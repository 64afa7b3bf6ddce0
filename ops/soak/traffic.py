"""Sending the pool through the soak gateway: an open loop for the run, a closed loop to calibrate.

- `run_open(rate, until_s)`: arrivals at Poisson times (`ops/bench/schedule.gamma_gaps`, shape 1)
  at `rate` per second until `until_s` on the timeline, however many are in flight; each arrival
  is a spec drawn from the pool with a seeded generator. A conversation is one arrival: its turns
  follow each other, each carrying the answer the previous turn returned; a turn that is not `ok`
  ends it (the next turn would not be the reference's request).
- `run_closed(concurrency, seconds)`: `concurrency` clients, each sending its next spec when the
  previous one finished, for `seconds`; returns arrivals completed per second (the calibration
  at time scale 0, where the emulation is host-bound and the timing model says nothing).

`run_open(..., side=(specs, rate))` also sends `specs` (the `long_context` kind) as Poisson
arrivals of their own at `rate` per second, beside the main loop (`capacity.long_context_rate`).

`run_for(model, book, specs)`: the given specs sent at once to another catalog model, answers
judged against that model's references (a `model_switch` fault's burst; its points count as kind
`switch`), waited for.

Every request is judged on arrival of its end (`classify` against `ReferenceBook`) into a `Tally`.
A `timeout` spec's client timeout is its fraction times `typical_e2e_s` (None: no timeout yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence

import openai

from calculet.ops.bench.schedule import gamma_gaps
from calculet.ops.soak.classify import RequestClass, classify
from calculet.ops.soak.exchange import send
from calculet.ops.soak.mix import ClientMove, RequestSpec
from calculet.ops.soak.points import point_of
from calculet.ops.soak.references import ReferenceBook
from calculet.ops.soak.tally import Tally
from calculet.ops.soak.timeline import Timeline

SWITCH_KIND = "switch"  # the kind of a model switch's burst requests in the tally


class TrafficRunner:
    """Sends pool requests and judges them (module docstring).

    Args:
        client: `AsyncOpenAI` on the soak gateway, `max_retries=0`.
        model: the model alias.
        pool: the request pool.
        book: the reference answers of the pool.
        timeline: the run's clock (points are stamped on it).
        lost_timeout_s: a request without a complete answer by then is lost.
        seed: the draws of arrivals and specs.
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        pool: Sequence[RequestSpec],
        book: ReferenceBook,
        timeline: Timeline,
        *,
        lost_timeout_s: float,
        seed: int,
    ) -> None:
        self.client = client
        self.model = model
        self.pool = list(pool)
        self.book = book
        self.timeline = timeline
        self.lost_timeout_s = lost_timeout_s
        self.seed = seed
        self.typical_e2e_s: float | None = None
        self.tally = Tally()
        self.e2e_samples: list[float] = []  # ok non-streamed single requests (calibration's typical e2e)
        self.sent = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def run_open(
        self,
        rate: float,
        until_s: float,
        stop: asyncio.Event,
        side: tuple[Sequence[RequestSpec], float] | None = None,
    ) -> None:
        """Open-loop arrivals until `until_s` or `stop` (module docstring); does not wait for them."""
        if side is not None and side[0] and side[1] > 0:
            specs, side_rate = side
            await asyncio.gather(
                self._arrivals(self.pool, rate, until_s, stop, "arrivals"),
                self._arrivals(list(specs), side_rate, until_s, stop, "side"),
            )
            return
        await self._arrivals(self.pool, rate, until_s, stop, "arrivals")

    async def _arrivals(
        self, pool: Sequence[RequestSpec], rate: float, until_s: float, stop: asyncio.Event, name: str
    ) -> None:
        """Poisson arrivals of `pool`'s specs at `rate` until `until_s` or `stop`."""
        rng = random.Random(f"calctl-soak:{self.seed}:{name}")
        picks = random.Random(f"calctl-soak:{self.seed}:picks" + ("" if name == "arrivals" else f":{name}"))
        at = self.timeline.now()
        while True:
            at += gamma_gaps(1, rate, 1.0, rng)[0]
            if at >= until_s:
                break
            delay = at - self.timeline.now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            self._launch(pool[picks.randrange(len(pool))])

    async def run_closed(self, concurrency: int, seconds: float) -> float:
        """Closed loop for `seconds`; returns completed arrivals per second (module docstring)."""
        picks = random.Random(f"calctl-soak:{self.seed}:calibration")
        start = self.timeline.now()
        deadline = start + seconds
        done = 0

        async def client() -> None:
            nonlocal done
            while self.timeline.now() < deadline:
                await self._run_spec(self.pool[picks.randrange(len(self.pool))])
                done += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return done / max(1e-9, self.timeline.now() - start)

    async def wait_in_flight(self, timeout_s: float) -> int:
        """Wait for the requests under way (each is bounded by the lost timeout); returns how many
        were still running at `timeout_s` (then cancelled)."""
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)

    async def run_for(self, model: str, book: ReferenceBook, specs: Sequence[RequestSpec]) -> int:
        """Send `specs` to `model` at once and wait for them (module docstring); returns how many."""
        await asyncio.gather(*(self._run_spec(spec, model, book) for spec in specs))
        return len(specs)

    def _launch(self, spec: RequestSpec) -> None:
        task = asyncio.create_task(self._run_spec(spec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_spec(self, spec: RequestSpec, model: str | None = None, book: ReferenceBook | None = None) -> None:
        self.sent += 1
        number = self.sent
        references = (book or self.book).answers(spec)
        kind = spec.kind if model is None else SWITCH_KIND
        answers: tuple[str, ...] = ()
        timeout = None
        if spec.move is ClientMove.TIMEOUT and self.typical_e2e_s is not None:
            timeout = max(0.01, spec.timeout_fraction * self.typical_e2e_s)
        for turn in range(spec.turns):
            got = await send(
                self.client,
                spec.body(model or self.model, turn, answers),
                lost_timeout_s=self.lost_timeout_s,
                disconnect_after=spec.disconnect_after,
                client_timeout_s=timeout,
                request_id=f"soak-{number}-{spec.key}-{turn + 1}",
                clock=self.timeline.clock,
            )
            judgement = classify(got, references[turn])
            point = point_of(got, judgement, kind, self.timeline.origin)
            self.tally.add(point, judgement, got.request_id or spec.key, turn)
            if judgement.cls is not RequestClass.OK:
                return
            if not got.stream and spec.n == 1 and spec.turns == 1 and got.end is not None:
                self.e2e_samples.append(got.end - got.start)
            answers += (got.texts[0],)
