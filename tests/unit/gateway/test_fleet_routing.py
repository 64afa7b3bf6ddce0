"""Fleet, discovery and router over fake boards: only Ready boards serving the request's package
get work; under either routing mode (`prefix`, the TTFT estimate, and `load`) the less loaded
board wins (this gateway's jobs counted as they are now, not as a lagging report had them, and
other gateways' as the report had them), a free lane anywhere beats queueing, sessions stick
while their board has room; DNS changes add and retire boards (a retired board is stopped once
its last placement is released)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from calculet.common.errors import IllegalTransition
from calculet.common.lifecycle import Lifecycle
from calculet.gateway.fleet.board import BOARD_TRANSITIONS, BoardState
from calculet.gateway.fleet.discovery import Discovery, HostsFileResolver, Resolver
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.routing.policy import RoutingMode
from calculet.gateway.routing.router import Router
from calculet.gateway.routing.scoring.inputs import RouteRequest
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import fill, routed, start_service, until

BOTH_MODES = pytest.mark.parametrize("mode", list(RoutingMode))


def picks(router: Router, request: RouteRequest, count: int) -> Counter[str]:
    """Where `count` picks of `request` go (chosen, not placed: the state does not change)."""
    chosen = [router.choose(request) for _ in range(count)]
    return Counter(c[0].target for c in chosen if c is not None)


@BOTH_MODES
def test_only_ready_boards_serving_the_package_are_candidates(mode: RoutingMode) -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a"), FakeDaemon("b")
        other = FakeDaemon("other", package_hash="pkg-b")  # another tokenizer: never for these tokens
        fleet, service = await start_service(a, b, other, mode=mode)
        request = await routed(fleet)
        assert set(picks(service.router, request, 60)) == {"a", "b"}
        a.set_ready(False)  # drained
        await until(fleet, lambda: not fleet.boards["a"].can_serve(ALIAS), "a draining")
        assert picks(service.router, request, 50) == {"b": 50}
        b.kill()
        await until(fleet, lambda: fleet.boards["b"].state is BoardState.DOWN, "b down")
        assert service.router.choose(request) is None and service.router.place(request) is None
        assert service.router.choose(RouteRequest.build("other-model", "pkg-a", [1, 2])) is None
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_the_less_loaded_board_wins(mode: RoutingMode) -> None:
    async def scenario() -> None:
        busy, idle = FakeDaemon("busy", queue_depth=8), FakeDaemon("idle")
        fleet, _ = await start_service(busy, idle)
        router = Router(fleet, mode, random.Random(1))
        request = await routed(fleet)
        assert picks(router, request, 20) == {"idle": 20}
        # Jobs this gateway placed count before the daemon's next report shows them.
        fill(fleet, router, request, "idle", 40)
        assert picks(router, request, 20) == {"busy": 20}
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_a_lagging_report_does_not_hide_a_lane_this_gateway_freed(mode: RoutingMode) -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a"), FakeDaemon("b")
        fleet, _ = await start_service(a, b)
        router = Router(fleet, mode, random.Random(3))
        request = await routed(fleet)
        placed = {d.target: fill(fleet, router, request, d.target, d.lanes) for d in (a, b)}
        for daemon in (a, b):  # this gateway filled both boards, and their reports say so
            daemon.running = daemon.lanes
            daemon.report_now()
        await until(fleet, lambda: _reported_running(fleet, "a") == _reported_running(fleet, "b") == 4, "reports")
        placed["a"][0].release(completed=True)  # a job on a ended; a's report still says 4 running
        assert fleet.boards["a"].load(ALIAS) == 0.75 and fleet.boards["b"].load(ALIAS) == 1.0
        assert picks(router, request, 40) == {"a": 40}
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_other_gateways_jobs_in_the_report_still_count(mode: RoutingMode) -> None:
    async def scenario() -> None:
        shared, ours = FakeDaemon("shared", running=4), FakeDaemon("ours")
        fleet, _ = await start_service(shared, ours)
        router = Router(fleet, mode, random.Random(4))
        request = await routed(fleet)
        fill(fleet, router, request, "ours", 2)
        assert fleet.boards["shared"].load(ALIAS) == 1.0 and fleet.boards["ours"].load(ALIAS) == 0.5
        assert picks(router, request, 40) == {"ours": 40}
        await fleet.close()

    asyncio.run(scenario())


def test_other_gateways_prefill_work_in_the_report_counts_beyond_this_gateways_own() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a", prefill_ms_per_token=1.0), FakeDaemon("b", prefill_ms_per_token=1.0)
        fleet, _ = await start_service(a, b)
        router = Router(fleet, RoutingMode.PREFIX, random.Random(6))
        request = await routed(fleet)
        mine = fill(fleet, router, request, "a", 1, started=False)[0]
        mine_tokens = mine.tokens
        a.pending_prefill_tokens = 500 + mine_tokens  # the report counts this gateway's job too
        a.report_now()
        await until(fleet, lambda: _reported_pending(fleet, "a") == 500 + mine_tokens, "a's report")
        assert fleet.boards["a"].pending(ALIAS) == 500 + mine_tokens  # not twice
        mine.first_token()  # its prefill is done; the report (a second old) still counts it
        assert fleet.boards["a"].pending(ALIAS) == 500
        assert picks(router, request, 20) == {"b": 20}  # 500 ms of others' prefill ahead on a
        a.pending_prefill_tokens = 0
        a.report_now()
        await until(fleet, lambda: _reported_pending(fleet, "a") == 0, "a's next report")
        assert fleet.boards["a"].pending(ALIAS) == 0
        mine.release()
        assert set(picks(router, request, 40)) == {"a", "b"}
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_a_free_lane_anywhere_beats_queueing_behind_a_full_board(mode: RoutingMode) -> None:
    async def scenario() -> None:
        boards = [FakeDaemon(f"b{i}") for i in range(4)]
        fleet, _ = await start_service(*boards)
        router = Router(fleet, mode, random.Random(5))
        request = await routed(fleet)
        held = {b.target: fill(fleet, router, request, b.target, 4) for b in boards}  # all full
        held["b2"].pop().release(completed=True)
        # Two choices alone would miss b2 half the time (3 of the 6 pairs leave it out).
        assert picks(router, request, 60) == {"b2": 60}
        fill(fleet, router, request, "b2", 1)  # all full: still an answer (the daemon queues it)
        assert router.choose(request) is not None
        held["b1"].pop().release(completed=True)
        held["b3"].pop().release(completed=True)  # free lanes on two: both used
        assert set(picks(router, request, 60)) == {"b1", "b3"}
        await fleet.close()

    asyncio.run(scenario())


@BOTH_MODES
def test_sessions_stick_to_one_board_and_spread_over_boards(mode: RoutingMode) -> None:
    async def scenario() -> None:
        boards = [FakeDaemon(f"b{i}") for i in range(4)]
        fleet, _ = await start_service(*boards)
        router = Router(fleet, mode, random.Random(2))
        await routed(fleet)
        homes = {}
        for s in range(40):
            request = RouteRequest.build(ALIAS, "pkg-a", [72, 105], session=f"s{s}")
            targets = set(picks(router, request, 5))
            assert len(targets) == 1
            homes[s] = targets.pop()
        assert len(set(homes.values())) >= 3  # rendezvous hashing spreads sessions
        # A full home board does not hold its sessions hostage.
        full = homes[0]
        request = RouteRequest.build(ALIAS, "pkg-a", [72, 105], session="s0")
        fill(fleet, router, request, full, 100)
        assert full not in picks(router, request, 20)
        await fleet.close()

    asyncio.run(scenario())


def _reported_running(fleet: Fleet, target: str) -> int:
    model = fleet.boards[target].model(ALIAS)
    return -1 if model is None else model.running


def _reported_pending(fleet: Fleet, target: str) -> int:
    model = fleet.boards[target].model(ALIAS)
    return -1 if model is None else model.pending_prefill_tokens


class ScriptedResolver(Resolver):
    def __init__(self) -> None:
        self.answers: dict[str, list[str] | OSError] = {}

    async def resolve(self, host: str, port: int) -> list[str]:
        answer = self.answers[host]
        if isinstance(answer, OSError):
            raise answer
        return list(answer)


def test_dns_changes_add_and_retire_boards() -> None:
    async def scenario() -> None:
        resolver = ScriptedResolver()
        resolver.answers["boards"] = ["10.0.0.1", "10.0.0.2"]
        made: dict[str, FakeDaemon] = {}

        def connect(target: str) -> FakeDaemon:
            made[target] = FakeDaemon(target)
            return made[target]

        fleet = Fleet(Discovery(["unix:static.sock"], ["boards:7000"], resolver), connect, refresh_s=3600)
        await fleet.start()
        assert sorted(fleet.boards) == ["10.0.0.1:7000", "10.0.0.2:7000", "unix:static.sock"]
        resolver.answers["boards"] = OSError("SERVFAIL")  # a hiccup keeps what was known
        await fleet.sync()
        assert sorted(fleet.boards) == ["10.0.0.1:7000", "10.0.0.2:7000", "unix:static.sock"]
        resolver.answers["boards"] = ["10.0.0.2", "10.0.0.3"]
        leaving = fleet.boards["10.0.0.1:7000"]
        await until(fleet, lambda: leaving.state is BoardState.UP, "10.0.0.1 up")
        router = Router(fleet)
        request = await routed(fleet)
        running = fill(fleet, router, request, leaving.target, 2)  # requests still run there
        await fleet.sync()
        assert sorted(fleet.boards) == ["10.0.0.2:7000", "10.0.0.3:7000", "unix:static.sock"]
        assert leaving.state is BoardState.REMOVED and not made["10.0.0.1:7000"].closed
        running[0].release(completed=True)
        assert not made["10.0.0.1:7000"].closed  # one is left
        running[1].release()  # the last request left: now it is stopped and closed
        running[1].release()  # a second release changes nothing
        assert leaving.placed == 0
        await until(fleet, lambda: made["10.0.0.1:7000"].closed, "retired board closed")
        await fleet.close()
        assert all(d.closed for d in made.values())

    asyncio.run(scenario())


def test_hosts_file_resolver(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# boards\n127.0.0.2 boards other\n127.0.0.3   boards # second\nbad-address boards\n::1 boards\n")

    async def scenario() -> list[str]:
        return await HostsFileResolver(hosts).resolve("boards", 1)

    assert asyncio.run(scenario()) == ["127.0.0.2", "127.0.0.3", "::1"]
    d = Discovery([], ["boards:9"], HostsFileResolver(hosts))
    assert asyncio.run(d.targets()) == ["127.0.0.2:9", "127.0.0.3:9", "[::1]:9"]


def test_board_lifecycle_table() -> None:
    life = Lifecycle("board", BoardState.CONNECTING, BOARD_TRANSITIONS)
    for state in (BoardState.UP, BoardState.DOWN, BoardState.UP, BoardState.REMOVED):
        life.move(state)
    assert not any(life.can_move(target) for target in BoardState)  # a retired board never serves again
    with pytest.raises(IllegalTransition):
        Lifecycle("board", BoardState.CONNECTING, BOARD_TRANSITIONS).move(BoardState.CONNECTING)
