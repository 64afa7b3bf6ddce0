"""Scorer: the device work ahead of a new prompt on a board.

Prompt tokens still to prefill there (others' from the last report, this gateway's placements that
have no first token yet) at the package's prefill cost per token. The daemon serves short prefills
first (at most its `short_tokens` left to prefill: a conversation's next turn), so a short request
waits only for the short prefills pending there, a long one for all of it. Decode work of running
jobs is not counted: it interleaves with a prefill rather than preceding it.
"""

from __future__ import annotations

from calculet.gateway.routing.scoring.inputs import BoardView, RouteRequest
from calculet.gateway.routing.scoring.prefix import uncached_tokens


def work_ahead_ms(request: RouteRequest, board: BoardView) -> float:
    """pending_tokens * per_token_ms, only short prefills' tokens for a short request.

    Args:
        request: the choice.
        board: the candidate.
    Returns:
        Estimated milliseconds.
    """
    short = board.short_tokens > 0 and uncached_tokens(request, board) <= board.short_tokens
    return (board.pending_short_tokens if short else board.pending_tokens) * board.per_token_ms
