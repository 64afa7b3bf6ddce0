"""`Board`: the gateway's live picture of one daemon, fed by its WatchLoad and health streams.

Ownership: a `Board` owns its `DaemonConnection` and the two watcher tasks reading it; the
`Fleet` owns the boards (creates, starts and removes them). Requests borrow a board between
`acquire` and `release` so the router counts this gateway's jobs there as they are now, not as
the last load report (once a second) had them.

States (one table, `BOARD_TRANSITIONS`): CONNECTING until the first load report; UP while both
streams flow; DOWN when either breaks (the watchers reconnect with capped exponential backoff,
so a restarted daemon is back within seconds); REMOVED when discovery drops it (terminal).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from enum import Enum

from calculet.client.types import LoadReport, ModelLoad, ServingStatus
from calculet.daemon.errors import CalculetError
from calculet.daemon.lifecycle import Lifecycle, table
from calculet.gateway.fleet.connection import DaemonConnection

log = logging.getLogger("calculet.gateway.board")

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0


class BoardState(Enum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    REMOVED = "removed"


BOARD_TRANSITIONS = table(
    [
        (BoardState.CONNECTING, [BoardState.UP, BoardState.DOWN, BoardState.REMOVED]),
        (BoardState.UP, [BoardState.DOWN, BoardState.REMOVED]),
        (BoardState.DOWN, [BoardState.UP, BoardState.REMOVED]),
    ]
)


class Board:
    """One daemon as the router sees it.

    Args:
        conn: the connection (owned from now on; closed by `stop`).
        on_change: called after every change of state, health or load report.
    """

    def __init__(self, conn: DaemonConnection, on_change: Callable[[], None] = lambda: None) -> None:
        self.conn = conn
        self._on_change = on_change
        self.target = conn.target
        self.life = Lifecycle(f"board {conn.target}", BoardState.CONNECTING, BOARD_TRANSITIONS, self._logged)
        self.report: LoadReport | None = None
        self.health = ServingStatus.NOT_SERVING
        self.placed = 0  # jobs of this gateway running here now
        self._placed_at_report = 0  # `placed` when the current report arrived
        self.epoch = 0  # times the board came UP: a new epoch after DOWN may be a restarted daemon
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def name(self) -> str:
        return self.report.board if self.report is not None and self.report.board else self.target

    @property
    def state(self) -> BoardState:
        return self.life.state

    def start(self) -> None:
        """Start the watcher tasks (inside the running loop)."""
        self._tasks = [
            asyncio.create_task(self._follow(self._read_load, "WatchLoad"), name=f"load {self.target}"),
            asyncio.create_task(self._follow(self._read_health, "health"), name=f"health {self.target}"),
        ]

    async def stop(self) -> None:
        """REMOVED: stop watching and close the connection (streams of running jobs end)."""
        if self.state is not BoardState.REMOVED:
            self.life.move(BoardState.REMOVED)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.conn.close()

    # ---- what the router reads --------------------------------------------------------

    def model(self, alias: str) -> ModelLoad | None:
        if self.report is None:
            return None
        return next((m for m in self.report.models if m.alias == alias), None)

    def can_serve(self, alias: str) -> bool:
        """UP, SERVING, and the model READY here (per the latest report)."""
        if self.state is not BoardState.UP or self.health is not ServingStatus.SERVING:
            return False
        m = self.model(alias)
        return m is not None and m.ready

    def load(self, alias: str) -> float:
        """Queued + running jobs per lane: what the last report counted beyond this gateway's own
        jobs then (other gateways'), plus this gateway's jobs now. Reports come once a second, so
        a job that ended since is not counted, and one placed since is."""
        m = self.model(alias)
        if m is None:
            return float("inf")
        others = max(0, m.queue_depth + m.running - self._placed_at_report)
        return (others + self.placed) / max(1, m.lanes_total)

    def placed_load(self, alias: str) -> float:
        """Jobs this gateway has running here per lane: exact and never stale, so it breaks ties
        between boards whose (lagging) reports look alike."""
        m = self.model(alias)
        return self.placed / max(1, m.lanes_total) if m is not None else float("inf")

    def acquire(self) -> None:
        self.placed += 1

    def release(self) -> None:
        self.placed -= 1

    def mark_down(self, why: str) -> None:
        """A request saw the board fail (e.g. a dead channel) before the watchers did."""
        if self.state is BoardState.UP:
            log.warning("board %s: down (%s)", self.target, why)
            self.life.move(BoardState.DOWN)
            self._notify()

    # ---- watchers --------------------------------------------------------------------

    async def _follow(self, read: Callable[[], Awaitable[bool]], what: str) -> None:
        backoff = BACKOFF_INITIAL_S
        while self.state is not BoardState.REMOVED:
            try:
                if await read():
                    backoff = BACKOFF_INITIAL_S  # it worked for a while: reconnect fast next time
                why = f"{what} stream ended"
            except CalculetError as err:
                why = f"{what}: {err}"
            if self.state is BoardState.REMOVED:
                return
            if self.state is not BoardState.DOWN:
                log.warning("board %s: down (%s)", self.target, why)
                self.life.move(BoardState.DOWN)
            self.report, self.health = None, ServingStatus.NOT_SERVING
            self._notify()
            # Jitter spreads the reconnects of many gateways after a daemon restart.
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _read_load(self) -> bool:
        """Follow WatchLoad; True if at least one report came."""
        got = False
        async for report in self.conn.watch_load():
            got = True
            self.report, self._placed_at_report = report, self.placed
            if self.state is not BoardState.UP:
                self.life.move(BoardState.UP)
                self.epoch += 1
            self._notify()
        return got

    async def _read_health(self) -> bool:
        """Follow the health Watch; True if at least one status came."""
        got = False
        async for status in self.conn.watch_health():
            got = True
            self.health = status
            self._notify()
        return got

    def _notify(self) -> None:
        self._on_change()

    def _logged(self, old: BoardState, new: BoardState) -> None:
        log.info("board %s: %s -> %s", self.target, old.value, new.value)
