"""A board's estimated time to first token for a request: the sum of the scorers.

    est_ttft(b) = work_ahead_ms + own_prefill_ms + lane_wait_ms

One decode step (the package's `decode_step_ms`) follows the prefill on every candidate alike, so
it is left out: the candidates of one request all serve the same package.
"""

from __future__ import annotations

from collections.abc import Sequence

from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest, Scorer
from calculet.gateway.routing.scoring.lane_wait import lane_wait_ms
from calculet.gateway.routing.scoring.own_prefill import own_prefill_ms
from calculet.gateway.routing.scoring.work_ahead import work_ahead_ms

SCORERS: tuple[Scorer, ...] = (work_ahead_ms, own_prefill_ms, lane_wait_ms)


def estimate_ms(request: RouteRequest, board: BoardView, scorers: Sequence[Scorer] = SCORERS) -> float:
    """The estimated milliseconds until `request`'s first token on `board`.

    Args:
        request: the choice.
        board: the candidate.
        scorers: the terms to add (all of them by default).
    Returns:
        Their sum.
    """
    return sum(score(request, board) for score in scorers)
