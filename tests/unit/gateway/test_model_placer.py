"""Placement by demand, the loop (`ModelPlacer`) over boards whose reports the test writes: the
snapshot it decides from, the per-model queue (full, expired, refused, left), and the switches it
runs (compare-and-swap expectation, a lost race, a package every board refuses)."""

from __future__ import annotations

import asyncio

import pytest

from calculet.client.types import LoadReport, ModelLoad, ModelState, ServingStatus
from calculet.common.errors import Aborted, FailedPrecondition, Overloaded, Unavailable
from calculet.gateway.errors import ModelNotPlaceable, ModelWaitExpired
from calculet.gateway.fleet.board import Board, BoardState
from calculet.gateway.fleet.catalog import CatalogModel
from calculet.gateway.fleet.connection import SwitchDone
from calculet.gateway.fleet.discovery import Discovery
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.placement.placer import (
    RETRY_S,
    ModelPlacer,
    PlacementObserver,
    PlacerSettings,
    board_slots,
    demand_of,
    placement_impossible,
)
from calculet.gateway.placement.policy import PlacementPolicy
from calculet.gateway.placement.waiters import QueueBounds
from tests.unit.gateway.fakes import FakeDaemon

CATALOG = (CatalogModel("a", "pkg/a"), CatalogModel("b", "pkg/b"), CatalogModel("c", "pkg/c"))
LANES = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Seen(PlacementObserver):
    def __init__(self) -> None:
        self.switches: list[tuple[str, str]] = []
        self.waits: list[tuple[str, str]] = []

    def model_switched(self, model: str, result: str, seconds: float, phases: object) -> None:
        self.switches.append((model, result))

    def model_waited(self, model: str, seconds: float, outcome: str) -> None:
        self.waits.append((model, outcome))


def serve(
    board: Board, *models: tuple[str, int], status: ServingStatus = ServingStatus.SERVING, running: int = 0
) -> None:
    """Give `board` a report of `models` (alias, generation), all READY."""
    loads = tuple(
        ModelLoad(alias, gen, ModelState.READY, True, 0, running, LANES - running, LANES) for alias, gen in models
    )
    board.report = LoadReport(board.target, status, 1, loads)


def fleet_of(*models: tuple[str, int] | None) -> tuple[Fleet, list[FakeDaemon]]:
    """A fleet (not started) of boards `board0..`, UP and SERVING, each serving one model or none."""
    fleet = Fleet(Discovery([], []), lambda t: FakeDaemon(t))
    daemons = []
    for i, model in enumerate(models):
        daemon = FakeDaemon(f"board{i}")
        board = Board(daemon)
        board.life.move(BoardState.UP)
        board.health = ServingStatus.SERVING
        serve(board, *([model] if model else []))
        fleet.boards[daemon.target] = board
        daemons.append(daemon)
    return fleet, daemons


def placer_of(
    fleet: Fleet, clock: Clock, *, wait_s: float = 5.0, queue: int = 4, residency: float = 60.0
) -> ModelPlacer:
    settings = PlacerSettings(PlacementPolicy(residency, 300.0), QueueBounds(queue, wait_s), "test gateway")
    return ModelPlacer(fleet, CATALOG, settings, Seen(), clock)


def test_the_snapshot_skips_drained_and_shared_boards_and_remembers_when_a_model_got_ready() -> None:
    fleet, _ = fleet_of(("a", 3), ("b", 1), None, ("c", 2))
    boards = fleet.boards
    serve(boards["board1"], ("b", 1), status=ServingStatus.NOT_SERVING)  # drained by an operator
    serve(boards["board3"], ("c", 2), ("a", 4))  # two models: co-resident, never switched
    since: dict[tuple[str, str, int], float] = {}
    slots = board_slots(boards.values(), 50.0, since, {})
    assert [(s.target, s.model, s.generation, s.ready_at) for s in slots] == [
        ("board0", "a", 3, 50.0),
        ("board2", None, 0, float("-inf")),
    ]
    again = board_slots(boards.values(), 90.0, since, {})
    assert again[0].ready_at == 50.0  # first seen ready at 50, not now


def test_demand_counts_queued_requests_and_jobs_beyond_the_lanes() -> None:
    fleet, _ = fleet_of(("a", 1), ("a", 2))
    serve(fleet.boards["board0"], ("a", 1), running=LANES)
    board0 = fleet.boards["board0"]
    board0.report = LoadReport(
        "board0", ServingStatus.SERVING, 2, (ModelLoad("a", 1, ModelState.READY, True, 3, LANES, 0, LANES),)
    )
    demand = demand_of("a", fleet.boards.values(), 2, 10.0, 99.0)
    assert (demand.waiting, demand.running, demand.last_request_at) == (2 + 3, LANES + 3, 99.0)
    idle = demand_of("b", fleet.boards.values(), 0, 10.0, 99.0)
    assert (idle.waiting, idle.running, idle.last_request_at) == (0, 0, 10.0)


def test_a_catalog_that_keeps_every_board_for_others_makes_a_model_unplaceable() -> None:
    catalog = {
        m.alias: m
        for m in (
            CatalogModel("a", "pa", min_boards=1),
            CatalogModel("b", "pb", pinned=("x",)),
            CatalogModel("c", "pc"),
        )
    }
    assert placement_impossible("c", 3, catalog) is None
    reason = placement_impossible("c", 2, catalog)
    assert reason is not None and "keeps all 2 board(s)" in reason


def test_a_waiter_gets_the_switched_board_and_the_switch_names_what_it_replaces() -> None:
    asyncio.run(_a_waiter_gets_the_switched_board_and_the_switch_names_what_it_replaces())


async def _a_waiter_gets_the_switched_board_and_the_switch_names_what_it_replaces() -> None:
    clock = Clock()
    fleet, daemons = fleet_of(("a", 3), ("b", 1))
    placer = placer_of(fleet, clock)
    clock.now += 120  # both models resident past the residency; idle since the placer started
    daemons[0].switch_answers.append(SwitchDone(7, {"validate": 0.1}))
    placer.start()
    try:
        waiter = asyncio.create_task(
            placer.wait_for_board("c", lambda: any(b.model("c") for b in fleet.boards.values()))
        )
        await _until(fleet, lambda: bool(daemons[0].switches or daemons[1].switches))
        switched = daemons[0].switches[0] if daemons[0].switches else daemons[1].switches[0]
        target = fleet.boards["board0" if daemons[0].switches else "board1"]
        assert switched.alias == "c" and switched.package == "pkg/c" and switched.requester == "test gateway"
        assert (switched.from_alias, switched.from_generation) == (
            target.report.models[0].alias,
            target.report.models[0].generation,
        )
        assert not waiter.done()
        serve(target, ("c", 7))
        fleet.notify()
        await asyncio.wait_for(waiter, 5)
    finally:
        await placer.close()
    seen = placer.observer
    assert isinstance(seen, Seen) and ("c", "ok") in seen.switches and seen.waits == [("c", "served")]
    assert placer.waiters.counts() == {}


def test_a_full_queue_answers_429_and_an_expired_wait_503() -> None:
    asyncio.run(_a_full_queue_answers_429_and_an_expired_wait_503())


async def _a_full_queue_answers_429_and_an_expired_wait_503() -> None:
    clock = Clock()
    fleet, _ = fleet_of(("a", 1))
    placer = placer_of(fleet, clock, queue=1, wait_s=0.2)
    first = asyncio.create_task(placer.wait_for_board("c", lambda: False))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as full:
        await placer.wait_for_board("c", lambda: False)
    assert full.value.retry_after_s > 0
    clock.now += 1.0  # past the wait bound
    fleet.notify()
    with pytest.raises(ModelWaitExpired) as expired:
        await asyncio.wait_for(first, 5)
    assert expired.value.retry_after_s == 0.2
    assert placer.waiters.counts() == {}
    seen = placer.observer
    assert isinstance(seen, Seen) and seen.waits == [("c", "full"), ("c", "expired")]


def test_a_waiter_that_leaves_takes_its_demand_with_it() -> None:
    asyncio.run(_a_waiter_that_leaves_takes_its_demand_with_it())


async def _a_waiter_that_leaves_takes_its_demand_with_it() -> None:
    clock = Clock()
    fleet, daemons = fleet_of(("a", 1))
    placer = placer_of(fleet, clock)
    assert placer.decide() is None  # the board's first look: a@1 was ready before it
    serve(fleet.boards["board0"], ("a", 2))  # a new generation, ready now: fresh, nothing may take it
    waiter = asyncio.create_task(placer.wait_for_board("c", lambda: False))
    await asyncio.sleep(0)
    assert placer.waiters.count("c") == 1 and placer.decide() is None
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    clock.now += 1000  # the residency is long over, but nobody waits any more
    assert placer.waiters.count("c") == 0 and placer.decide() is None
    assert daemons[0].switches == []


def test_a_lost_race_is_not_a_refusal_but_every_board_refusing_the_package_is() -> None:
    asyncio.run(_a_lost_race_is_not_a_refusal_but_every_board_refusing_the_package_is())


async def _a_lost_race_is_not_a_refusal_but_every_board_refusing_the_package_is() -> None:
    clock = Clock()
    fleet, daemons = fleet_of(("a", 1), ("b", 1))
    placer = placer_of(fleet, clock, residency=0.0)
    daemons[0].switch_answers.append(Aborted("switch expected a@1 but the board serves a@2"))
    daemons[1].switch_answers.append(Aborted("switch expected b@1 but the board serves b@2"))
    for daemon in daemons:
        daemon.switch_answers.append(FailedPrecondition("load of 'c' failed: package does not fit"))
    placer.start()
    try:
        with pytest.raises(ModelNotPlaceable) as refused:
            await asyncio.wait_for(placer.wait_for_board("c", lambda: False), 10)
    finally:
        await placer.close()
    assert "every board refused its package" in str(refused.value) and "does not fit" in str(refused.value)
    seen = placer.observer
    assert isinstance(seen, Seen) and ("c", "lost") in seen.switches and ("c", "refused") in seen.switches
    with pytest.raises(ModelNotPlaceable):  # the next request is refused at once
        await placer.wait_for_board("c", lambda: False)


async def _until(fleet: Fleet, condition: object) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await fleet.wait_changed(0.05)


def test_an_unreachable_board_rests_but_is_not_counted_as_refusing_the_package() -> None:
    asyncio.run(_an_unreachable_board_rests_but_is_not_counted_as_refusing_the_package())


async def _an_unreachable_board_rests_but_is_not_counted_as_refusing_the_package() -> None:
    clock = Clock()
    fleet, daemons = fleet_of(("a", 1))
    placer = placer_of(fleet, clock, residency=0.0)
    daemons[0].switch_answers.append(Unavailable("board0 is restarting"))
    waiter = asyncio.create_task(placer.wait_for_board("c", lambda: False))
    await asyncio.sleep(0)
    plan = placer.decide()
    assert plan is not None
    placer._launch(plan)  # one switch, without the loop
    await _until(fleet, lambda: not placer.switching)
    assert placer.refusal("c") is None and placer.decide() is None  # resting, not refused
    clock.now += RETRY_S + 1
    assert placer.decide() is not None  # tried again after the rest
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    seen = placer.observer
    assert isinstance(seen, Seen) and seen.switches == [("c", "failed")]


def test_the_placer_forgets_generations_a_board_no_longer_serves() -> None:
    """State stays bounded however many switches a long-lived gateway sees."""
    clock = Clock()
    fleet, _ = fleet_of(("a", 1))
    placer = placer_of(fleet, clock)
    for generation in range(2, 50):
        serve(fleet.boards["board0"], ("a", generation))
        placer.decide()
    assert list(placer._ready_since) == [("board0", "a", 49)]  # only what the board reports now
