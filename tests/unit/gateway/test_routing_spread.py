"""Where choices land over fake boards: a burst spreads evenly because every pick counts on its
board before anything awaits (and piles up without that), the service learns each board's
package once and tokenizes once per package, a board holding the prompt's prefix wins until its
lanes are full or its queued prefill work outweighs the saving, and `--routing load` ignores
prefixes; during a rollout, a prompt is tokenized once per package and goes to a package that takes
it."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from calculet.common.errors import InvalidArgument
from calculet.common.prefix import block_hashes
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.routing.router import Router
from calculet.gateway.serving.service import Prepared
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import completion, counts, fill, no_placements, routed, run_all, start_service, until

BOTH_MODES = pytest.mark.parametrize("mode", list(RoutingMode))
LONG_PROMPT = [(i * 31) % 250 + 1 for i in range(200)]  # 3 full blocks (192 tokens) + 8


def sixteen_lane_boards() -> list[FakeDaemon]:
    return [FakeDaemon(f"b{i}", lanes=16) for i in range(4)]


@BOTH_MODES
def test_64_picks_on_4_boards_of_16_lanes_go_16_each_with_reserve_at_pick(mode: RoutingMode) -> None:
    async def scenario() -> None:
        fleet, _ = await start_service(*sixteen_lane_boards())
        for seed in range(5):
            router = Router(fleet, mode, random.Random(seed))
            request = await routed(fleet, [72, 105, 33, 10])
            placements = [router.place(request) for _ in range(64)]  # one event-loop turn, no await
            assert all(p is not None for p in placements)
            assert Counter(p.board.target for p in placements if p is not None) == {f"b{i}": 16 for i in range(4)}
            assert set(counts(fleet).values()) == {(16, 16 * 4)}
            for placement in placements:
                assert placement is not None
                placement.release()
            assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_without_counting_at_pick_the_same_burst_piles_up(mode: RoutingMode) -> None:
    # What happened when a pick was counted only after awaits: every request of a burst saw the
    # same counts, so where they went was chance, and some board got more than its 16 lanes while
    # lanes stood free elsewhere.
    async def scenario() -> None:
        fleet, _ = await start_service(*sixteen_lane_boards())
        request = await routed(fleet, [72, 105, 33, 10])
        for seed in range(5):
            router = Router(fleet, mode, random.Random(seed))
            chosen = Counter(c[0].target for c in (router.choose(request) for _ in range(64)) if c is not None)
            assert sum(chosen.values()) == 64 and max(chosen.values()) > 16
        await fleet.close()

    asyncio.run(scenario())


def test_boards_whose_reports_name_one_package_share_one_getmodel() -> None:
    async def scenario() -> None:
        daemons = sixteen_lane_boards()
        for daemon in daemons:
            daemon.reports_package = True
        fleet, service = await start_service(*daemons)
        burst = [service.prepare_completion(completion(f"request {i}", max_tokens=3, seed=i), "") for i in range(16)]
        prepared: list[Prepared] = list(await asyncio.gather(*burst))
        assert sum(d.get_model_calls for d in daemons) == 1, "one tokenizer download for the package, not one a board"
        assert len({id(p.text) for p in prepared}) == 1
        for p in prepared:
            await run_all(p)
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_burst_through_the_service_spreads_and_asks_each_board_its_package_once() -> None:
    async def scenario() -> None:
        daemons = sixteen_lane_boards()
        fleet, service = await start_service(*daemons)
        burst = [service.prepare_completion(completion(f"request {i}", max_tokens=3, seed=i), "") for i in range(64)]
        prepared: list[Prepared] = list(await asyncio.gather(*burst))
        assert {t: jobs for t, (jobs, _) in counts(fleet).items()} == {f"b{i}": 16 for i in range(4)}
        assert [d.get_model_calls for d in daemons] == [1, 1, 1, 1]  # concurrent requests shared one call
        assert len({id(p.text) for p in prepared}) == 1  # one tokenizer for the package
        for p in prepared:
            await run_all(p)
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_board_holding_the_prefix_wins_until_its_lanes_are_full() -> None:
    async def scenario() -> None:
        warm = FakeDaemon("warm", prefix_hashes=frozenset(block_hashes(LONG_PROMPT)))
        fleet, service = await start_service(warm, FakeDaemon("c1"), FakeDaemon("c2"))
        held = [await service.prepare_completion(completion(LONG_PROMPT, max_tokens=3), "") for _ in range(5)]
        boards = [p.runners[0].placement.board.target for p in held]  # type: ignore[union-attr]
        # 192 of 200 tokens cached (192 ms at the fallback 1 ms/token) beats an idle board until
        # warm's 4 lanes are taken; then a lane there is about turnover / 4 = 2.5 s away.
        assert boards[:4] == ["warm"] * 4 and boards[4] != "warm"
        assert counts(fleet)["warm"] == (4, 4 * 8)  # each counts only its 8 uncached tokens
        for p in held:
            p.close()
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())


def test_a_board_holding_the_prefix_loses_when_its_queued_prefill_outweighs_the_saving() -> None:
    async def scenario() -> None:
        warm = FakeDaemon("warm", prefix_hashes=frozenset(block_hashes(LONG_PROMPT)), prefill_ms_per_token=1.0)
        cold = FakeDaemon("cold", prefill_ms_per_token=1.0)
        fleet, service = await start_service(warm, cold)
        request = await routed(fleet, LONG_PROMPT)
        reported = fleet.boards["warm"]
        for pending, winner in ((150, "warm"), (250, "cold")):  # the saving: 192 tokens = 192 ms
            warm.pending_prefill_tokens = pending  # other gateways' prompts waiting for prefill there
            warm.report_now()
            await until(fleet, lambda: reported.pending(ALIAS) == warm.pending_prefill_tokens, "warm's report")
            assert {service.router.choose(request)[0].target for _ in range(20)} == {winner}  # type: ignore[index]
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_routing_load_ignores_the_prefix(mode: RoutingMode) -> None:
    async def scenario() -> None:
        warm = FakeDaemon("warm", prefix_hashes=frozenset(block_hashes(LONG_PROMPT)))
        fleet, service = await start_service(warm, FakeDaemon("c1"), FakeDaemon("c2"), mode=mode)
        request = await routed(fleet, LONG_PROMPT)
        fill(fleet, service.router, request, "warm", 3)  # 3 of its 4 lanes taken, the others idle
        chosen = {service.router.choose(request)[0].target for _ in range(30)}  # type: ignore[index]
        assert chosen == ({"warm"} if mode is RoutingMode.PREFIX else {"c1", "c2"})
        await fleet.close()

    asyncio.run(scenario())


def test_a_rollout_tokenizes_once_per_package_and_routes_to_a_package_that_takes_the_prompt() -> None:
    async def scenario() -> None:
        # Two packages of one alias: "new" on one board with a short context, "old" on two boards
        # that are busier (other gateways' prompts wait there for 200 ms of prefill).
        new = FakeDaemon("new", package_hash="pkg-new", context=100)
        olds = [FakeDaemon(f"old{i}", package_hash="pkg-old", pending_prefill_tokens=200) for i in range(2)]
        fleet, service = await start_service(new, *olds)
        short = await service.prepare_completion(completion(list(range(1, 51)), max_tokens=4), "")
        # Both packages take it; the package whose best board ranks best serves it: "new".
        assert short.text.facts.package_hash == "pkg-new"
        assert short.runners[0].placement.board.target == "new"  # type: ignore[union-attr]
        long = await service.prepare_completion(completion(list(range(1, 151)), max_tokens=4), "")
        # Too long for "new"'s context: "old" takes it, however busy.
        assert long.text.facts.package_hash == "pkg-old"
        assert long.runners[0].placement.board.target in {"old0", "old1"}  # type: ignore[union-attr]
        assert [d.get_model_calls for d in (new, *olds)] == [1, 1, 1]
        for prepared in (short, long):
            texts, _, _ = await run_all(prepared)
            assert len(texts[0]) == 4
        with pytest.raises(InvalidArgument, match="context is 512 tokens"):  # the package on most boards
            await service.prepare_completion(completion(list(range(1, 251)) * 3, max_tokens=4), "")
        assert no_placements(fleet)
        await fleet.close()

    asyncio.run(scenario())
