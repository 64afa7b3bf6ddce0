"""`TtftPolicy` (`--routing prefix`, the default): the lowest estimated time to first token wins.

Each candidate's estimate is the sum of the scorers (`scoring.estimate`). Candidates within
max(5 %, 5 ms) of the best are near-ties, and only among them does anything else decide: the
session's rendezvous-hash board when the request has a session key, else the board with the fewest
jobs per lane (a random one of those when several have as few). Estimates are coarse (reports
lag by up to a second, costs are declared, not measured), so a difference within the margin is
noise; outside it the estimate alone decides, so a board holding the prompt's prefix keeps its
sessions until its lanes are full or its queued prefill work outweighs the saving.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from fractions import Fraction

from calculet.gateway.routing.policy import RoutingPolicy, affinity
from calculet.gateway.routing.scoring.estimate import estimate_ms
from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest
from calculet.gateway.routing.scoring.prefix import cached_tokens

log = logging.getLogger(__name__)

NEAR_TIE_FRACTION = 0.05
NEAR_TIE_MS = 5.0


def near_ties(scored: Sequence[tuple[float, BoardView]]) -> list[BoardView]:
    """The boards whose estimate is within max(5 % of the best, 5 ms) of the best.

    Args:
        scored: (estimate in ms, board) pairs, not empty.
    Returns:
        The near-ties, in the given order (the best among them).
    """
    best = min(ms for ms, _ in scored)
    margin = max(NEAR_TIE_FRACTION * best, NEAR_TIE_MS)
    return [board for ms, board in scored if ms <= best + margin]


def break_tie(near: Sequence[BoardView], session: str, rng: random.Random) -> BoardView:
    """One of the near-ties: the session's rendezvous-hash board, else the fewest jobs per lane
    (random among equals).

    Args:
        near: the near-ties, not empty.
        session: the request's affinity key ("" = none).
        rng: where the randomness comes from.
    Returns:
        The chosen board.
    """
    if session:
        return max(near, key=lambda board: affinity(session, board.target))
    loads = [Fraction(board.jobs, max(1, board.lanes)) for board in near]
    least = min(loads)
    return rng.choice([board for board, load in zip(near, loads, strict=True) if load == least])


class TtftPolicy(RoutingPolicy):
    """Lowest estimated time to first token; near-ties broken by session, then load.

    Args:
        rng: randomness among equal near-ties (seeded in tests).
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, request: RouteRequest, boards: Sequence[BoardView]) -> BoardView:
        scored = [(estimate_ms(request, board), board) for board in boards]
        chosen = break_tie(near_ties(scored), request.session, self._rng)
        if log.isEnabledFor(logging.DEBUG):  # why a request went where it did (--log-level debug)
            log.debug("route %d tokens -> %s: %s", request.tokens, chosen.target, "; ".join(_why(request, scored)))
        return chosen

    def rank(self, request: RouteRequest, board: BoardView) -> float:
        return estimate_ms(request, board)


def _why(request: RouteRequest, scored: Sequence[tuple[float, BoardView]]) -> list[str]:
    """One line per candidate: its estimate and the inputs behind it."""
    return [
        f"{b.target} est {ms:.0f} ms cached {cached_tokens(request, b)} pending {b.pending_tokens}"
        f"/{b.pending_short_tokens} short jobs {b.jobs}/{b.lanes} cold {b.cold_lanes} tips {len(b.prefix_tips)}"
        for ms, b in scored
    ]
