"""`Router`: which board gets the next choice, counted there before anything awaits (docs/gateway.md;
the shape of llm-d's endpoint picker: filters, then a policy over scored candidates).

Filters, in order: the board serves the model (its latest report says READY on a SERVING board,
its health Watch says SERVING, its streams are up), it is not excluded (the boards a choice
already failed on), and it serves the request's package (the one whose tokenizer made the
tokens; `PackageCatalog.known`). Then the policy (`--routing`, `RoutingMode`): `prefix`
(`TtftPolicy`: the lowest estimated time to first token) or `load` (`LoadPolicy`: the load-only
rule of before).

Reserve at pick: `place` chooses a board and creates its `BoardClaim` in one synchronous step,
which counts the choice's job and uncached prompt tokens on the board at once, so the next pick,
even in the same event-loop turn, sees it: a burst of 64 requests on 4 boards of 16 lanes goes
16/16/16/16 instead of wherever the last load report pointed them all. The caller owns the
placement (`placement.py`).

Turnover: a placement released by a choice that completed is a sample of how long a choice
holds a lane (`Turnover`, per alias), which the lane-wait scorer uses.

Pick-time prefix view: a placement carries its prompt's block hashes; when its choice completes, the
board's `SentPrefixes` records them, and the board's view merges them into what its last report
advertised until the board confirms them or the bound passes (`sent_prefixes.py`). So a
conversation's next turn, sent before the board's report of the parked lane arrives, still finds
the board that holds its prefix.
"""

from __future__ import annotations

import dataclasses
import random
import time
import weakref
from collections.abc import Callable, Collection

from calculet.gateway.fleet.board import Board
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.fleet.packages import ModelPackage
from calculet.gateway.routing.claim import BoardClaim
from calculet.gateway.routing.load_policy import LoadPolicy
from calculet.gateway.routing.policy import RoutingMode, RoutingPolicy
from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest
from calculet.gateway.routing.scoring.prefix import uncached_tokens
from calculet.gateway.routing.sent_prefixes import CONFIRM_WITHIN_S, SentPrefixes
from calculet.gateway.routing.ttft_policy import TtftPolicy
from calculet.gateway.routing.turnover import Turnover


def make_policy(mode: RoutingMode, rng: random.Random | None = None) -> RoutingPolicy:
    """The policy of a `--routing` mode.

    Args:
        mode: prefix or load.
        rng: the policy's randomness (seeded in tests).
    Returns:
        The policy.
    """
    return TtftPolicy(rng) if mode is RoutingMode.PREFIX else LoadPolicy(rng)


class Router:
    """Picks boards for choices and counts each pick on its board.

    Args:
        fleet: the boards and their packages.
        mode: the routing policy (prefix by default).
        rng: the policy's randomness (seeded in tests).
        clock: monotonic seconds, for choice durations (the turnover) and the pick-time view's bound.
        confirm_within_s: how long a board may take to advertise a completed choice's prompt before
            the pick-time view stops counting it (`sent_prefixes.CONFIRM_WITHIN_S`).
    """

    def __init__(
        self,
        fleet: Fleet,
        mode: RoutingMode = RoutingMode.PREFIX,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        confirm_within_s: float = CONFIRM_WITHIN_S,
    ) -> None:
        self._fleet = fleet
        self.mode = mode
        self.policy = make_policy(mode, rng)
        self.turnover = Turnover()
        self._clock = clock
        self._confirm_within_s = confirm_within_s
        # Per board object and model: a board that discovery drops takes its views along.
        self._sent: weakref.WeakKeyDictionary[Board, dict[str, SentPrefixes]] = weakref.WeakKeyDictionary()

    def candidates(self, alias: str, exclude: Collection[str] = ()) -> list[Board]:
        """Boards serving `alias` now (ready, not draining, streams up), less `exclude` (targets)."""
        return [b for b in self._fleet.serving(alias) if b.target not in exclude]

    def eligible(self, request: RouteRequest, exclude: Collection[str] = ()) -> list[tuple[Board, BoardView]]:
        """The candidates that also serve the request's package, each with its view now.

        Args:
            request: the choice.
            exclude: targets to leave out.
        Returns:
            (board, view) pairs; boards whose package is not known yet are left out
            (`PackageCatalog.identify` learns them).
        """
        found = []
        for board in self.candidates(request.alias, exclude):
            package = self._fleet.packages.known(board, request.alias)
            if package is not None and package.package_hash == request.package_hash:
                found.append((board, self._view(board, request.alias, package)))
        return found

    def choose(self, request: RouteRequest, exclude: Collection[str] = ()) -> tuple[Board, BoardView] | None:
        """The board the policy picks for `request`, without counting it anywhere.

        Args:
            request: the choice.
            exclude: targets to leave out.
        Returns:
            (board, its view), or None when no eligible board is left.
        """
        eligible = self.eligible(request, exclude)
        if not eligible:
            return None
        chosen = self.policy.choose(request, [view for _, view in eligible])
        return next((board, view) for board, view in eligible if view is chosen)

    def place(self, request: RouteRequest, exclude: Collection[str] = ()) -> BoardClaim | None:
        """Choose a board for `request` and count the choice there, in one synchronous step.

        Args:
            request: the choice.
            exclude: targets to leave out.
        Returns:
            The placement, owned by the caller from now on (release it exactly once: the
            choice ended there, failed there or moves on), or None when no eligible board is left.
        """
        chosen = self.choose(request, exclude)
        if chosen is None:
            return None
        board, view = chosen
        tokens = uncached_tokens(request, view)
        return BoardClaim(board, request.alias, tokens, self._clock(), self._released, request.block_hashes)

    def sent_prefixes(self, board: Board, alias: str) -> SentPrefixes | None:
        """The pick-time view of `alias` on `board` (None before a choice of it completed there)."""
        return self._sent.get(board, {}).get(alias)

    def _view(self, board: Board, alias: str, package: ModelPackage) -> BoardView:
        costs = package.costs
        view = board.view(
            alias,
            fixed_ms=costs.prefill_fixed_ms,
            per_token_ms=costs.prefill_ms_per_token,
            turnover_ms=self.turnover.ms(alias),
        )
        sent = self.sent_prefixes(board, alias)
        if sent is None or self.mode is not RoutingMode.PREFIX or not _reuses_prefixes(board, alias):
            return view
        hashes, tips = sent.held(view.prefix_hashes | view.prefix_tips, self._clock(), board.epoch)
        if not tips:
            return view
        return dataclasses.replace(view, prefix_hashes=view.prefix_hashes | hashes, prefix_tips=view.prefix_tips | tips)

    def _released(self, placement: BoardClaim, completed: bool) -> None:
        now = self._clock()
        if completed:
            self.turnover.observe(placement.alias, now - placement.placed_at)
            if placement.blocks and _reuses_prefixes(placement.board, placement.alias):
                # its lane parks with this prompt: the board reports it soon
                views = self._sent.setdefault(placement.board, {})
                sent = views.setdefault(placement.alias, SentPrefixes(self._confirm_within_s))
                sent.parked(placement.blocks, now, placement.board.epoch)
        self._fleet.released(placement.board)


def _reuses_prefixes(board: Board, alias: str) -> bool:
    """The board's last report of `alias` carries prefix blocks: its prefix reuse is on. A board that
    reports none (reuse off, or its package's prefill not proven to run at an offset) parks no lane,
    so the pick-time view must not draw a conversation's next turn there."""
    model = board.model(alias)
    return model is not None and model.prefix_reuse
