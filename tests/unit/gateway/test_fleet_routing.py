"""Fleet, discovery and router over fake boards: only Ready boards get work, the two choices
prefer the less loaded board (this gateway's jobs counted as they are now, not as a lagging report
had them), a free lane anywhere beats queueing, sessions stick, DNS changes add and retire boards."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from calculet.daemon.errors import IllegalTransition
from calculet.daemon.lifecycle import Lifecycle
from calculet.gateway.fleet.board import BOARD_TRANSITIONS, BoardState
from calculet.gateway.fleet.discovery import Discovery, HostsFileResolver, Resolver
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.fleet.router import Router
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import start_service, until


def test_only_ready_boards_are_candidates() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a"), FakeDaemon("b")
        fleet, service = await start_service(a, b)
        a.set_ready(False)  # drained
        await until(fleet, lambda: not fleet.boards["a"].can_serve(ALIAS), "a draining")
        picks = Counter(service.router.pick(ALIAS).target for _ in range(50))  # type: ignore[union-attr]
        assert picks == {"b": 50}
        b.kill()
        await until(fleet, lambda: fleet.boards["b"].state is BoardState.DOWN, "b down")
        assert service.router.pick(ALIAS) is None
        assert service.router.pick("other-model") is None
        await fleet.close()

    asyncio.run(scenario())


def test_two_choices_prefer_the_less_loaded_board() -> None:
    async def scenario() -> None:
        busy, idle = FakeDaemon("busy", queue_depth=8), FakeDaemon("idle")
        fleet, _ = await start_service(busy, idle)
        router = Router(fleet, random.Random(1))
        assert all(router.pick(ALIAS).target == "idle" for _ in range(20))  # type: ignore[union-attr]
        # Jobs this gateway placed count before the daemon's next report shows them.
        fleet.boards["idle"].placed = 40
        assert router.pick(ALIAS).target == "busy"  # type: ignore[union-attr]
        await fleet.close()

    asyncio.run(scenario())


def test_a_lagging_report_does_not_hide_a_lane_this_gateway_freed() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a"), FakeDaemon("b")
        fleet, _ = await start_service(a, b)
        router = Router(fleet, random.Random(3))
        for daemon in (a, b):  # this gateway fills both boards, and their reports say so
            for _ in range(daemon.lanes):
                fleet.boards[daemon.target].acquire()
            daemon.running = daemon.lanes
            daemon.report_now()
        await until(fleet, lambda: _reported_running(fleet, "a") == _reported_running(fleet, "b") == 4, "reports")
        fleet.boards["a"].release()  # a job on a ended; a's report still says 4 running
        assert fleet.boards["a"].load(ALIAS) == 0.75 and fleet.boards["b"].load(ALIAS) == 1.0
        assert Counter(router.pick(ALIAS).target for _ in range(40)) == {"a": 40}  # type: ignore[union-attr]
        await fleet.close()

    asyncio.run(scenario())


def test_other_gateways_jobs_in_the_report_still_count() -> None:
    async def scenario() -> None:
        shared, ours = FakeDaemon("shared", running=4), FakeDaemon("ours")
        fleet, _ = await start_service(shared, ours)
        router = Router(fleet, random.Random(4))
        fleet.boards["ours"].placed = 2
        assert fleet.boards["shared"].load(ALIAS) == 1.0 and fleet.boards["ours"].load(ALIAS) == 0.5
        assert Counter(router.pick(ALIAS).target for _ in range(40)) == {"ours": 40}  # type: ignore[union-attr]
        await fleet.close()

    asyncio.run(scenario())


def test_a_free_lane_anywhere_beats_queueing_behind_a_full_board() -> None:
    async def scenario() -> None:
        boards = [FakeDaemon(f"b{i}") for i in range(4)]
        fleet, _ = await start_service(*boards)
        router = Router(fleet, random.Random(5))
        for board in fleet.boards.values():
            board.placed = 4  # full
        fleet.boards["b2"].placed = 3
        # Two choices alone would miss b2 half the time (3 of the 6 pairs leave it out).
        assert Counter(router.pick(ALIAS).target for _ in range(60)) == {"b2": 60}  # type: ignore[union-attr]
        fleet.boards["b2"].placed = 4  # all full: still an answer (the daemon queues it)
        assert router.pick(ALIAS) is not None
        fleet.boards["b1"].placed, fleet.boards["b3"].placed = 3, 3  # free lanes on two: both used
        assert set(Counter(router.pick(ALIAS).target for _ in range(60))) == {"b1", "b3"}  # type: ignore[union-attr]
        await fleet.close()

    asyncio.run(scenario())


def test_sessions_stick_to_one_board_and_spread_over_boards() -> None:
    async def scenario() -> None:
        boards = [FakeDaemon(f"b{i}") for i in range(4)]
        fleet, _ = await start_service(*boards)
        router = Router(fleet, random.Random(2))
        homes = {}
        for s in range(40):
            targets = {router.pick(ALIAS, session=f"s{s}").target for _ in range(5)}  # type: ignore[union-attr]
            assert len(targets) == 1
            homes[s] = targets.pop()
        assert len(set(homes.values())) >= 3  # rendezvous hashing spreads sessions
        # A full home board does not hold its sessions hostage.
        full = homes[0]
        fleet.boards[full].placed = 100
        assert router.pick(ALIAS, session="s0").target != full  # type: ignore[union-attr]
        await fleet.close()

    asyncio.run(scenario())


def _reported_running(fleet: Fleet, target: str) -> int:
    model = fleet.boards[target].model(ALIAS)
    return -1 if model is None else model.running


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
        leaving.acquire()  # a request still runs there
        await fleet.sync()
        assert sorted(fleet.boards) == ["10.0.0.2:7000", "10.0.0.3:7000", "unix:static.sock"]
        assert leaving.state is BoardState.REMOVED and not made["10.0.0.1:7000"].closed
        await fleet.released(leaving)  # the last request left: now it is closed
        assert made["10.0.0.1:7000"].closed
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
