"""Fleet, discovery and router over fake boards: only Ready boards get work, the two choices
prefer the less loaded board, sessions stick, DNS changes add and retire boards."""

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
