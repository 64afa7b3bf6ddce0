"""`Fleet`: the set of boards, kept in step with discovery, and the packages they serve.

Ownership: the fleet owns every `Board` (and through it each connection) from `sync` adding it
until `sync` removes it or `close`. A removed board is stopped only once no placement of this
gateway is left on it (`released`, told by every `BoardClaim` at its release), so its streams are
not cut by the gateway itself (they fail over if the daemon really went away).

Packages: `packages` (`PackageCatalog`) knows which package each board serves an alias from and
holds each package's text and costs, from GetModel, once per board generation and once per
package hash. Data flow: service -> candidates -> `packages.identify` -> render and tokenize once
per package -> router places the choices on boards serving that package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from calculet.gateway.fleet.board import Board, BoardState
from calculet.gateway.fleet.connection import DaemonConnection
from calculet.gateway.fleet.discovery import Discovery
from calculet.gateway.fleet.packages import PackageCatalog

log = logging.getLogger("calculet.gateway.fleet")

ConnectionFactory = Callable[[str], DaemonConnection]


class Fleet:
    """The boards behind this gateway.

    Args:
        discovery: where the boards are.
        connect: opens a `DaemonConnection` to a target (inside the running loop).
        refresh_s: seconds between discovery rounds.
    """

    def __init__(self, discovery: Discovery, connect: ConnectionFactory, refresh_s: float = 10.0) -> None:
        self.discovery = discovery
        self._connect = connect
        self._refresh_s = refresh_s
        self.boards: dict[str, Board] = {}
        self._retiring: dict[str, Board] = {}
        self.packages = PackageCatalog()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()  # retired boards being stopped

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """First discovery round, then the periodic one in the background."""
        await self.sync()
        if self.discovery.dns:
            self._task = asyncio.create_task(self._refresh(), name="discovery")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        boards = [*self.boards.values(), *self._retiring.values()]
        self.boards, self._retiring = {}, {}
        await asyncio.gather(*(b.stop() for b in boards), *self._stopping, return_exceptions=True)

    async def sync(self) -> None:
        """One discovery round: add new targets, retire vanished ones."""
        targets = await self.discovery.targets()
        for target in targets:
            if target not in self.boards:
                board = Board(self._connect(target), self.notify)
                self.boards[target] = board
                board.start()
                log.info("board %s: added", target)
        for target in [t for t in self.boards if t not in targets]:
            board = self.boards.pop(target)
            log.info("board %s: removed from discovery", target)
            board.life.move(BoardState.REMOVED)
            self._retiring[target] = board
            await self._stop_if_idle(board)
        self.notify()

    def released(self, board: Board) -> None:
        """A placement on `board` was released; stop the board (in a task of its own) if it was
        retired and no placement is left on it."""
        if board.placed == 0 and self._retiring.get(board.target) is board:
            del self._retiring[board.target]
            task = asyncio.get_running_loop().create_task(board.stop(), name=f"stop {board.target}")
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def _stop_if_idle(self, board: Board) -> None:
        if board.placed == 0 and self._retiring.pop(board.target, None) is not None:
            await board.stop()

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.sync()
            except Exception:  # a bug here must not end discovery for the process' lifetime
                log.exception("discovery round failed")

    # ---- change notification ---------------------------------------------------------

    def notify(self) -> None:
        """Wake everyone in `wait_changed`: a board's state or report changed, or (placement) a
        waiter came or left, a switch ended."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> None:
        """Wait until some board's state or report changes, at most `timeout` seconds."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    # ---- what requests ask -----------------------------------------------------------

    def serving(self, alias: str) -> list[Board]:
        return [b for b in self.boards.values() if b.can_serve(alias)]

    def known_models(self) -> dict[str, int]:
        """alias -> number of boards where it is ready."""
        counts: dict[str, int] = {}
        for board in self.boards.values():
            if board.state is not BoardState.UP or board.report is None:
                continue
            for m in board.report.models:
                counts[m.alias] = counts.get(m.alias, 0) + (1 if board.can_serve(m.alias) else 0)
        return counts

    def any_up(self) -> bool:
        return any(b.state is BoardState.UP for b in self.boards.values())
