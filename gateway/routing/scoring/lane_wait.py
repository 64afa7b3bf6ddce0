"""Scorer: the wait for a free KV lane on a board.

With a lane free (lanes - jobs >= 1) there is none. Otherwise the request is the
(jobs - lanes + 1)-th in line for a lane; with `lanes` lanes each turning over every
`turnover_ms`, one frees every turnover_ms / lanes on average, so the wait is about
(jobs - lanes + 1) / lanes * turnover_ms.
"""

from __future__ import annotations

from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest


def lane_wait_ms(request: RouteRequest, board: BoardView) -> float:
    """0 with a free lane, else (jobs - lanes + 1) / lanes * turnover_ms.

    Args:
        request: the choice (unused: any request needs one lane).
        board: the candidate.
    Returns:
        Estimated milliseconds.
    """
    del request
    lanes = max(1, board.lanes)
    if lanes - board.jobs >= 1:
        return 0.0
    return (board.jobs - lanes + 1) / lanes * board.turnover_ms
