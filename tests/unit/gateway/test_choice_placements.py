"""No placement leaks: every count a choice puts on a board (one job, its uncached prompt tokens)
goes back to 0 however the choice ends (done, stop string, several choices, a failover, refusals
retried elsewhere, every board refusing, an error no board can fix, the reader leaving, a request
whose events are never read or whose reader is cancelled at any point, a request prepared for an
HTTP caller that is gone), and a failover's new board
is counted before its Submit, with the prompt and the resumed tokens as its prefill work."""

from __future__ import annotations

import asyncio

import pytest

from calculet.common.errors import CalculetError, InvalidArgument, Overloaded, Unavailable
from calculet.gateway.api.streaming import unless_disconnected
from calculet.gateway.routing.claim import ClaimState
from calculet.gateway.serving.choice import RetryPolicy
from calculet.gateway.serving.service import Prepared
from tests.unit.gateway.fakes import FakeDaemon, model_token
from tests.unit.gateway.harness import completion, counts, no_placements, run_all, start_service, until

PROMPT = [72, 105, 33]


def test_counts_while_running_and_none_after_a_normal_end_or_a_stop_string() -> None:
    async def scenario() -> None:
        step = asyncio.Semaphore(0)
        a = FakeDaemon("a", step=step)
        fleet, service = await start_service(a)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=5, n=3, seed=1), "")
        assert counts(fleet) == {"a": (3, 3 * len(PROMPT))}  # counted at prepare, before any Submit
        events = prepared.events()
        step.release()  # one token: the choice that takes it has started, the others still prefill
        await anext(events)
        assert counts(fleet)["a"] == (3, 2 * len(PROMPT))
        for _ in range(3 * 5):
            step.release()
        async for _ in events:
            pass
        assert no_placements(fleet)
        # A stop string ends the choice (its job cancelled) without a leak either.
        a.step = None
        full = bytes(model_token(2, PROMPT, i) for i in range(10)).decode()
        stopped = await service.prepare_completion(completion(PROMPT, max_tokens=10, seed=2, stop=[full[3:5]]), "")
        _, ends, _ = await run_all(stopped)
        assert ends[0].finish_reason == "stop" and no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_failover_releases_the_dead_board_and_counts_the_new_one_before_its_submit() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", die_after=3)
        step = asyncio.Semaphore(0)
        b = FakeDaemon("b", ready=False, step=step)
        fleet, service = await start_service(a, b, policy=RetryPolicy(6, 30.0))
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=8, seed=4), "")
        assert counts(fleet) == {"a": (1, 3), "b": (0, 0)}
        b.set_ready(True)
        await until(fleet, lambda: fleet.boards["b"].can_serve("fake"), "b ready")
        task = asyncio.create_task(run_all(prepared))
        await until(fleet, lambda: len(b.submitted) == 1, "the failover's submit on b")
        # b waits for its first token: it counts the job and re-prefills prompt + 3 resumed tokens.
        assert counts(fleet) == {"a": (0, 0), "b": (1, len(PROMPT) + 3)}
        for _ in range(8):
            step.release()
        await task
        assert prepared.runners[0].failovers == 1 and no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("refusals", "outcome"),
    [
        ([Overloaded("full", retry_after_s=1.0)] * 2, None),  # a refuses both choices: b serves them
        ([Overloaded("full", retry_after_s=1.0)] * 8, Overloaded),  # every board keeps refusing
        ([Unavailable("draining")] * 8, Unavailable),
        ([InvalidArgument("no board would take this")] * 2, InvalidArgument),  # not retried
    ],
)
def test_refusals_leave_no_counts(refusals: list[CalculetError], outcome: type[Exception] | None) -> None:
    async def scenario() -> None:
        b_refuses = list(refusals) if outcome is not None else []
        a, b = FakeDaemon("a", refuse=list(refusals)), FakeDaemon("b", refuse=b_refuses)
        fleet, service = await start_service(a, b)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=4, n=2), "")
        if outcome is None:
            _, ends, _ = await run_all(prepared)
            assert sorted(ends) == [0, 1]
        else:
            with pytest.raises(outcome):
                await run_all(prepared)
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("n", [1, 3])
def test_the_reader_leaving_mid_stream_releases_every_choice(n: int) -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", step=asyncio.Semaphore(2))
        fleet, service = await start_service(a, FakeDaemon("b", step=asyncio.Semaphore(2)))
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=100, n=n), "")
        events = prepared.events()
        await anext(events)
        await events.aclose()  # the HTTP client went away
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_request_whose_events_are_never_read_releases_on_close() -> None:
    async def scenario() -> None:
        fleet, service = await start_service(FakeDaemon("a"), FakeDaemon("b"))
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=4, n=3), "")
        assert sum(jobs for jobs, _ in counts(fleet).values()) == 3
        prepared.close()
        prepared.close()
        assert no_placements(fleet)
        assert all(r.placement is None for r in prepared.runners)
        await fleet.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("turns", range(6))
def test_a_reader_cancelled_at_any_point_leaves_no_counts(turns: int) -> None:
    async def scenario() -> None:
        step = asyncio.Semaphore(1)
        fleet, service = await start_service(FakeDaemon("a", step=step), FakeDaemon("b", step=step))
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=50, n=3), "")
        placements = [r.placement for r in prepared.runners]
        events = prepared.events()
        reader = asyncio.create_task(anext(events))
        for _ in range(turns):  # let the event loop run `turns` rounds: the choices get that far
            await asyncio.sleep(0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await events.aclose()
        prepared.close()  # what the HTTP layer does on the way out (a no-op once the events ran)
        assert no_placements(fleet)
        assert all(p is not None and p.state is ClaimState.RELEASED for p in placements)
        await fleet.close()

    asyncio.run(scenario())


class _Connection:
    """The ASGI side of an HTTP request: `receive` returns a disconnect once `leave` is set."""

    def __init__(self) -> None:
        self.leave = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self.leave.wait()
        return {"type": "http.disconnect"}


def test_a_request_prepared_for_a_caller_that_is_gone_is_released() -> None:
    async def scenario() -> None:
        fleet, service = await start_service(FakeDaemon("a"), FakeDaemon("b"))
        connection = _Connection()
        gate = asyncio.Event()

        async def prepare() -> Prepared:
            await gate.wait()  # the caller is cancelled while this waits; then it finishes anyway
            return await service.prepare_completion(completion(PROMPT, max_tokens=4, n=2), "")

        caller = asyncio.create_task(unless_disconnected(connection, prepare(), Prepared.close))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the caller is waiting on the work
        caller.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await until(fleet, lambda: no_placements(fleet), "placements of the abandoned request released")

        # The client leaves first: the work is cancelled, its placements never made.
        slow = asyncio.Event()

        async def never() -> Prepared:
            await slow.wait()
            return await service.prepare_completion(completion(PROMPT), "")

        connection.leave.set()
        with pytest.raises(CalculetError, match="client disconnected"):
            await unless_disconnected(connection, never(), Prepared.close)  # type: ignore[arg-type]
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())
