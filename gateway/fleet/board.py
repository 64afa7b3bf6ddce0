"""`Board`: the gateway's live picture of one daemon, fed by its WatchLoad and health streams.

Ownership: a `Board` owns its `DaemonConnection` and the two watcher tasks reading it; the
`Fleet` owns the boards (creates, starts and removes them). This gateway's work on a board is
counted by `BoardClaim`s (`placement.py`, the only caller of the `count_*` methods): jobs placed
here now, and the prompt tokens of those still waiting for their first token, so the router sees
this gateway's work as it is now, not as the last load report (once a second) had it. Other
gateways' work is what the last report counted beyond this gateway's own at the time it arrived.

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
from calculet.common.errors import CalculetError
from calculet.common.lifecycle import Lifecycle, table
from calculet.gateway.fleet.connection import DaemonConnection
from calculet.gateway.routing.scoring.inputs import BoardView

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
        self.placed = 0  # jobs of this gateway placed here now
        self.pending_tokens = 0  # prompt tokens of those placements still waiting for their first token
        self.pending_short_tokens = 0  # of those, short prefills' (the daemon serves them first)
        self._placed_at_report = 0  # `placed` when the current report arrived
        self._pending_at_report = 0  # `pending_tokens` when the current report arrived
        self._pending_short_at_report = 0  # `pending_short_tokens` when the current report arrived
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

    def jobs(self, alias: str) -> int:
        """Queued + running jobs of `alias` here: what the last report counted beyond this
        gateway's own jobs then (other gateways'), plus this gateway's jobs now. Reports come once
        a second, so a job that ended since is not counted, and one placed since is. 0 without a
        report of the model."""
        m = self.model(alias)
        if m is None:
            return self.placed
        return max(0, m.queue_depth + m.running - self._placed_at_report) + self.placed

    def admission_room(self, alias: str) -> int | None:
        """Jobs of `alias` this board would admit now: its lanes and admission queue bound less
        the jobs it holds (`jobs`); None when its report does not give the bound (an older
        daemon) or does not have the model."""
        m = self.model(alias)
        if m is None or m.queue_limit == 0:
            return None
        return max(0, m.lanes_total + m.queue_limit - self.jobs(alias))

    def pending(self, alias: str) -> int:
        """Prompt tokens still to prefill here: other gateways' (the last report's count beyond
        this gateway's own then, as `jobs` does) plus this gateway's placements without a first
        token now."""
        m = self.model(alias)
        others = 0 if m is None else max(0, m.pending_prefill_tokens - self._pending_at_report)
        return others + self.pending_tokens

    def pending_short(self, alias: str) -> int:
        """Of `pending`, the tokens of short prefills (counted the same way)."""
        m = self.model(alias)
        others = 0 if m is None else max(0, m.pending_short_prefill_tokens - self._pending_short_at_report)
        return others + self.pending_short_tokens

    def short_bound(self, alias: str) -> int:
        """The daemon's short-prefill bound for `alias` (0: not reported)."""
        m = self.model(alias)
        return m.short_prefill_tokens if m is not None else 0

    def load(self, alias: str) -> float:
        """`jobs` per lane (inf when the model is not reported here)."""
        m = self.model(alias)
        return self.jobs(alias) / max(1, m.lanes_total) if m is not None else float("inf")

    def view(self, alias: str, *, fixed_ms: float, per_token_ms: float, turnover_ms: float) -> BoardView:
        """This board as the scorers see it, now.

        Args:
            alias: the model.
            fixed_ms / per_token_ms: the package's prefill cost.
            turnover_ms: how long a lane stays taken.
        Returns:
            A snapshot (plain numbers).
        """
        m = self.model(alias)
        return BoardView(
            target=self.target,
            lanes=max(1, m.lanes_total) if m is not None else 1,
            jobs=self.jobs(alias),
            own_jobs=self.placed,
            pending_tokens=self.pending(alias),
            prefix_hashes=m.prefix_hashes if m is not None else frozenset(),
            fixed_ms=fixed_ms,
            per_token_ms=per_token_ms,
            turnover_ms=turnover_ms,
            prefix_tips=m.prefix_tips if m is not None else frozenset(),
            cold_lanes=max(0, m.lanes_total - self.jobs(alias) - m.parked_lanes) if m is not None else 0,
            pending_short_tokens=self.pending_short(alias),
            short_tokens=self.short_bound(alias),
        )

    # ---- what placements count (only `BoardClaim` calls these) ----------------------------

    def count_placement(self, tokens: int, short: bool) -> None:
        """A choice was placed here: one job, `tokens` prompt tokens to prefill (`short`: a short
        prefill, by the daemon's bound)."""
        self.placed += 1
        self.pending_tokens += tokens
        self.pending_short_tokens += tokens if short else 0

    def count_first_token(self, tokens: int, short: bool) -> None:
        """A placed choice's first token came: its `tokens` are prefilled."""
        self.pending_tokens -= tokens
        self.pending_short_tokens -= tokens if short else 0

    def uncount_placement(self, pending_tokens: int, short: bool) -> None:
        """A placed choice left: one job fewer, and its `pending_tokens` if it never started."""
        self.placed -= 1
        self.pending_tokens -= pending_tokens
        self.pending_short_tokens -= pending_tokens if short else 0

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
            self.report, self._placed_at_report, self._pending_at_report = report, self.placed, self.pending_tokens
            self._pending_short_at_report = self.pending_short_tokens
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
