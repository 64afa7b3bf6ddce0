"""Scorer: the device work ahead of a new prompt on a board.

Prompt tokens still to prefill there (others' from the last report, this gateway's placements that
have no first token yet) at the package's prefill cost per token. Decode work of running jobs is
not counted: it interleaves with a prefill rather than preceding it.
"""

from __future__ import annotations

from calculet.gateway.fleet.scoring.inputs import BoardView, RouteRequest


def work_ahead_ms(request: RouteRequest, board: BoardView) -> float:
    """pending_tokens * per_token_ms.

    Args:
        request: the choice (unused: the work ahead is the same for any request).
        board: the candidate.
    Returns:
        Estimated milliseconds.
    """
    del request
    return board.pending_tokens * board.per_token_ms
