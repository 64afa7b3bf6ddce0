"""A conversation's next turn, sent the moment its answer ended, goes back to the board that holds
its prefix before that board's report of the parked lane arrives (the router's pick-time view,
`gateway/routing/sent_prefixes.py`), and stops being drawn there once the board fails to confirm it
within the bound or stops advertising it."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from calculet.common.prefix import block_hashes
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.routing.router import Router
from calculet.gateway.routing.scoring.inputs import RouteRequest
from calculet.gateway.routing.sent_prefixes import CONFIRM_WITHIN_S
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import no_placements, routed, start_service, until

TURN1 = [(i * 37) % 250 + 20 for i in range(300)]  # 4 full blocks and 44 tokens
TURN2 = [*TURN1, *range(30, 130)]  # the answer and the next message


def picks(router: Router, request: RouteRequest, count: int) -> Counter[str]:
    chosen = [router.choose(request) for _ in range(count)]
    return Counter(c[0].target for c in chosen if c is not None)


def advertised(fleet: Fleet, target: str) -> frozenset[int]:
    board = fleet.boards[target]
    model = board.model(ALIAS)
    return model.prefix_hashes if model is not None else frozenset()


def test_the_next_turn_finds_its_board_in_the_window_before_the_boards_report() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a", prefill_ms_per_token=1.0), FakeDaemon("b", prefill_ms_per_token=1.0)
        fleet, _ = await start_service(a, b)
        now = [10.0]
        router = Router(fleet, RoutingMode.PREFIX, random.Random(7), clock=lambda: now[0])
        turn1, turn2 = await routed(fleet, TURN1), await routed(fleet, TURN2)
        first = router.place(turn1, exclude=["b"])
        assert first is not None and first.blocks == turn1.block_hashes
        first.first_token()
        now[0] = 14.0
        first.release(completed=True)
        # Neither board's report holds anything: only this gateway's own view can send turn 2 home.
        assert advertised(fleet, "a") == advertised(fleet, "b") == frozenset()
        assert picks(router, turn2, 40) == {"a": 40}
        second = router.place(turn2)
        assert second is not None and second.board.target == "a" and second.tokens == len(TURN2) - 256
        second.release()  # failed there: it records nothing, the first turn's entry stays
        now[0] = 14.0 + CONFIRM_WITHIN_S  # a never confirmed it within the bound: it attracts no more
        assert set(picks(router, turn2, 60)) == {"a", "b"}
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_confirmed_prefix_counts_while_advertised_and_not_after_its_lane_is_evicted() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a", prefill_ms_per_token=1.0), FakeDaemon("b", prefill_ms_per_token=1.0)
        fleet, _ = await start_service(a, b)
        now = [10.0]
        router = Router(fleet, RoutingMode.PREFIX, random.Random(8), clock=lambda: now[0])
        turn1, turn2 = await routed(fleet, TURN1), await routed(fleet, TURN2)
        first = router.place(turn1, exclude=["b"])
        assert first is not None
        first.release(completed=True)
        # a parks the lane: its report holds the prompt's blocks and a tip inside the answer as
        # sampled, which turn 2 re-renders differently (so that tip alone does not match it).
        answer_tip = block_hashes([*TURN1, *range(200, 220)])[-1]
        a.prefix_hashes = frozenset({*turn1.block_hashes, answer_tip})
        a.report_now()
        await until(fleet, lambda: advertised(fleet, "a") == a.prefix_hashes, "a's report of the parked lane")
        now[0] = 100.0  # long past the bound: confirmed, it still counts
        assert picks(router, turn2, 40) == {"a": 40}
        sent = router.sent_prefixes(fleet.boards["a"], ALIAS)
        assert sent is not None and len(sent) == 1
        a.prefix_hashes = frozenset()  # the lane was evicted (or the board dropped its parked KV)
        a.report_now()
        await until(fleet, lambda: advertised(fleet, "a") == frozenset(), "a's report without it")
        assert set(picks(router, turn2, 60)) == {"a", "b"} and len(sent) == 0
        await fleet.close()

    asyncio.run(scenario())


def test_a_board_without_prefix_reuse_draws_no_next_turn() -> None:
    # Its reports carry no prefix blocks (reuse off, or its package's prefill not proven to run at
    # an offset: docs/daemon.md, "Prefill at an offset"): it parks nothing, so the view records nothing.
    async def scenario() -> None:
        a = FakeDaemon("a", prefill_ms_per_token=1.0, prefix_reuse=False)
        b = FakeDaemon("b", prefill_ms_per_token=1.0)
        fleet, _ = await start_service(a, b)
        router = Router(fleet, RoutingMode.PREFIX, random.Random(10), clock=lambda: 10.0)
        turn1, turn2 = await routed(fleet, TURN1), await routed(fleet, TURN2)
        first = router.place(turn1, exclude=["b"])
        assert first is not None
        first.release(completed=True)
        assert router.sent_prefixes(fleet.boards["a"], ALIAS) is None
        assert set(picks(router, turn2, 60)) == {"a", "b"}  # within the bound, yet no pull to a
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_load_routing_ignores_the_view() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a", prefill_ms_per_token=1.0), FakeDaemon("b", prefill_ms_per_token=1.0)
        fleet, _ = await start_service(a, b)
        router = Router(fleet, RoutingMode.LOAD, random.Random(9))
        turn1, turn2 = await routed(fleet, TURN1), await routed(fleet, TURN2)
        first = router.place(turn1, exclude=["b"])
        assert first is not None
        first.release(completed=True)
        assert set(picks(router, turn2, 60)) == {"a", "b"}
        await fleet.close()

    asyncio.run(scenario())
