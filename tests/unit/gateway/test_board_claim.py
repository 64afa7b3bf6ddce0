"""`BoardClaim`: a pick counted on its board at once (one job, its uncached prompt tokens), its
first token moving the tokens out of the board's pending prefill work, and exactly one release
however often it is asked for; the lifecycle table; the router's turnover samples."""

from __future__ import annotations

import asyncio
import random

import pytest

from calculet.client.types import LoadReport, ModelLoad, ModelState, ServingStatus
from calculet.common.errors import IllegalTransition
from calculet.common.lifecycle import Lifecycle
from calculet.gateway.fleet.board import Board
from calculet.gateway.routing.claim import CLAIM_TRANSITIONS, BoardClaim, ClaimState
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.routing.router import Router
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import counts, no_placements, routed, start_service


def test_a_placement_counts_until_its_single_release() -> None:
    board = Board(FakeDaemon("a"))
    released: list[tuple[BoardClaim, bool]] = []
    first = BoardClaim(board, ALIAS, 120, 0.0, lambda p, done: released.append((p, done)))
    second = BoardClaim(board, ALIAS, 30, 0.0, lambda p, done: released.append((p, done)))
    assert (board.placed, board.pending_tokens) == (2, 150)
    first.first_token()
    first.first_token()  # every further chunk: nothing more
    assert first.state is ClaimState.STREAMING and (board.placed, board.pending_tokens) == (2, 30)
    first.release(completed=True)
    first.release()  # a `finally` after the explicit release: nothing more
    assert (board.placed, board.pending_tokens) == (1, 30) and released == [(first, True)]
    second.release()  # never started: its tokens leave with it
    second.first_token()  # a late chunk after the release changes nothing
    assert (board.placed, board.pending_tokens) == (0, 0) and released == [(first, True), (second, False)]
    assert second.state is ClaimState.RELEASED


def test_placement_lifecycle_table() -> None:
    life = Lifecycle("placement", ClaimState.PREFILLING, CLAIM_TRANSITIONS)
    life.move(ClaimState.STREAMING)
    life.move(ClaimState.RELEASED)
    assert not any(life.can_move(s) for s in ClaimState)  # released is terminal
    with pytest.raises(IllegalTransition):
        Lifecycle("placement", ClaimState.STREAMING, CLAIM_TRANSITIONS).move(ClaimState.PREFILLING)


def test_router_place_counts_before_returning_and_samples_turnover_of_completed_choices() -> None:
    async def scenario() -> None:
        fleet, _ = await start_service(FakeDaemon("a"), FakeDaemon("b"))
        now = [100.0]
        router = Router(fleet, RoutingMode.PREFIX, random.Random(0), clock=lambda: now[0])
        request = await routed(fleet, list(range(1, 101)))
        placement = router.place(request)
        assert placement is not None and placement.tokens == 100 and placement.placed_at == 100.0
        assert counts(fleet)[placement.board.target] == (1, 100)  # counted before any await
        now[0] = 103.5
        placement.release(completed=True)
        assert router.turnover.ms(ALIAS) == 3500.0
        failed = router.place(request)
        assert failed is not None
        now[0] = 200.0
        failed.release()  # not completed (failed, cancelled, moved): no sample
        assert router.turnover.ms(ALIAS) == 3500.0 and no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_short_placement_counts_in_the_short_pending_work_until_its_first_token_or_release() -> None:
    board = Board(FakeDaemon("short-board"))
    board.report = LoadReport(
        "short-board", ServingStatus.SERVING, 0,
        (ModelLoad("m", 1, ModelState.READY, True, 0, 0, 16, 16, short_prefill_tokens=512),),
    )  # fmt: skip
    released: list[bool] = []
    short = BoardClaim(board, "m", 200, 0.0, lambda _p, done: released.append(done))
    long = BoardClaim(board, "m", 1300, 0.0, lambda _p, done: released.append(done))
    assert (short.short, long.short) == (True, False)
    assert (board.pending("m"), board.pending_short("m")) == (1500, 200)
    short.first_token()
    assert (board.pending("m"), board.pending_short("m")) == (1300, 0)
    long.release()
    short.release(completed=True)
    assert (board.placed, board.pending("m"), board.pending_short("m")) == (0, 0, 0) and released == [False, True]
