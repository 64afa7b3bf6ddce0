"""Scorer: the request's own prefill on a board: only what the board does not already hold.

This is the prefix-reuse term: a board whose lanes hold the prompt's first k blocks prefills
64 * k tokens fewer.
"""

from __future__ import annotations

from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest
from calculet.gateway.routing.scoring.prefix import uncached_tokens


def own_prefill_ms(request: RouteRequest, board: BoardView) -> float:
    """fixed_ms + uncached tokens * per_token_ms.

    Args:
        request: the choice.
        board: the candidate.
    Returns:
        Estimated milliseconds.
    """
    return board.fixed_ms + uncached_tokens(request, board) * board.per_token_ms
