"""`Fleet`: the set of boards, kept in step with discovery, and the model texts they serve.

Ownership: the fleet owns every `Board` (and through it each connection) from `sync` adding it
until `sync` removes it or `close`. A removed board is stopped only once no request of this
gateway still runs on it, so its streams are not cut by the gateway itself (they fail over if the
daemon really went away).

Model texts: a model's tokenizer and chat template come from a board's GetModel and are cached by
package hash (boards running the same package share one `ModelText`; a rollout with two packages
of one alias keeps two). Data flow: router picks a board -> `model_text(board, alias)` -> encode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from calculet.daemon.errors import Unavailable
from calculet.gateway.fleet.board import Board, BoardState
from calculet.gateway.fleet.connection import DaemonConnection
from calculet.gateway.fleet.discovery import Discovery
from calculet.gateway.text.model_text import ModelFacts, ModelText

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
        self._texts: dict[str, ModelText] = {}  # package hash -> text
        self._board_models: dict[tuple[str, str, int], str] = {}  # (target, alias, generation) -> package hash
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._text_lock = asyncio.Lock()  # one GetModel + tokenizer build at a time, not one per request

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
        await asyncio.gather(*(b.stop() for b in boards), return_exceptions=True)

    async def sync(self) -> None:
        """One discovery round: add new targets, retire vanished ones."""
        targets = await self.discovery.targets()
        for target in targets:
            if target not in self.boards:
                board = Board(self._connect(target), self._notify)
                self.boards[target] = board
                board.start()
                log.info("board %s: added", target)
        for target in [t for t in self.boards if t not in targets]:
            board = self.boards.pop(target)
            log.info("board %s: removed from discovery", target)
            board.life.move(BoardState.REMOVED)
            self._retiring[target] = board
            await self._stop_if_idle(board)
        self._notify()

    async def released(self, board: Board) -> None:
        """A request left `board`; stop it if it was retired and is now idle."""
        board.release()
        if board.target in self._retiring:
            await self._stop_if_idle(board)

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

    def _notify(self) -> None:
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

    def cached_text(self, board: Board, alias: str) -> ModelText | None:
        m = board.model(alias)
        if m is None:
            return None
        digest = self._board_models.get((board.target, alias, m.generation))
        return self._texts.get(digest) if digest is not None else None

    async def model_text(self, board: Board, alias: str) -> ModelText:
        """The tokenizer/template of `alias` as `board` serves it (GetModel once per package).

        Raises:
            CalculetError: GetModel failed (NotFound, Unavailable) or the package's text is broken.
        """
        cached = self.cached_text(board, alias)
        if cached is not None:
            return cached
        async with self._text_lock:
            return self.cached_text(board, alias) or await self._fetch_text(board, alias)

    async def _fetch_text(self, board: Board, alias: str) -> ModelText:
        info = await board.conn.get_model(alias)
        if not info.tokenizer_json:
            raise Unavailable(f"model {alias!r} on {board.name} has no tokenizer yet")
        text = self._texts.get(info.package_hash)
        if text is None:
            facts = ModelFacts(
                alias=alias,
                package_hash=info.package_hash,
                vocab_size=info.vocab_size,
                context=info.context,
                eos_token_ids=tuple(info.eos_token_ids),
                bos_token_id=info.bos_token_id,
            )
            # Building a 150k-token tokenizer takes a moment: keep it off the event loop.
            text = await asyncio.to_thread(ModelText, facts, info.tokenizer_json, info.chat_template)
            self._texts[info.package_hash] = text
        self._board_models[(board.target, alias, info.generation)] = info.package_hash
        return text
